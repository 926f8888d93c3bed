"""Producer/consumer in a ring: put a tile into the next rank, signal it (release); wait for the
previous rank's signal (acquire), read the tile, acknowledge. Repeated many times in one kernel.

    python -m iris.run -n 2 examples/04_message_passing.py
"""
import sys

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def ring_kernel(buf, ready, ack, bad, me, nxt, prv, heap_bases, rounds, TILE: tl.constexpr):
    lanes = tl.arange(0, TILE)
    errors = tl.zeros([TILE], tl.int32)
    for i in range(rounds):
        iris.wait(ack, i, me, me, heap_bases, cmp="ge")            # next rank has read my last tile
        iris.store(buf + lanes, i * TILE + lanes + me, me, nxt, heap_bases)
        iris.signal(ready, i + 1, me, nxt, heap_bases)               # release: the tile is visible first
        iris.wait(ready, i + 1, me, me, heap_bases, cmp="ge")       # acquire: previous rank's tile i
        errors += (tl.load(buf + lanes) != i * TILE + lanes + prv).to(tl.int32)
        iris.signal(ack, 1, me, prv, heap_bases, op="add")           # previous rank may write again
    tl.store(bad + lanes, errors)


def main() -> int:
    ctx = iris.iris(heap_size=1 << 24)
    me, world, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    rounds = 100 if dev.type == "cpu" else 10000  # the host runs kernels in Triton's interpreter
    tile = 64
    buf = ctx.full((tile,), -1, dtype=torch.int32)
    ready, ack = ctx.zeros(1, dtype=torch.int32), ctx.zeros(1, dtype=torch.int32)
    bad = torch.full((tile,), -1, dtype=torch.int32, device=dev)
    ctx.barrier()
    ring_kernel[(1,)](buf, ready, ack, bad, me, (me + 1) % world, (me - 1) % world, ctx.get_heap_bases(), rounds,
                      TILE=tile)
    ctx.barrier()
    stale = int(bad.sum())
    ok = stale == 0 and ready.item() == rounds and ack.item() == rounds
    print(f"rank {me}: {rounds} tiles of {tile} int32 from rank {(me - 1) % world}, {stale} stale lanes, "
          f"flags ready={ready.item()} ack={ack.item()}: {'ok' if ok else 'WRONG'}", flush=True)
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
