"""iris.load reads the next rank's copy; iris.store writes into it. Masked lanes stay untouched.

    python -m iris.run -n 2 examples/01_load_store.py
"""
import sys

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def load_store_kernel(x, seen, y, n, me, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = iris.load(x + offs, me, peer, heap_bases, mask=mask)       # peer's x, into this rank
    tl.store(seen + offs, v, mask=mask)
    iris.store(y + offs, v * 2, me, peer, heap_bases, mask=mask)    # into peer's y


def main() -> int:
    ctx = iris.iris(heap_size=1 << 24)
    me, world, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    nxt, prv = (me + 1) % world, (me - 1) % world
    n, cap = 777, 1024
    x = ctx.arange(cap, dtype=torch.float32).add_(10000 * me)  # in place: `x + c` would leave the heap
    y = ctx.full((cap,), -1.0)
    seen = torch.full((cap,), -1.0, device=dev)
    ctx.barrier()
    load_store_kernel[(triton.cdiv(n, 256),)](x, seen, y, n, me, nxt, ctx.get_heap_bases(), BLOCK=256)
    ctx.barrier()

    base = torch.arange(cap, dtype=torch.float32, device=dev)
    untouched = torch.full((cap - n,), -1.0, device=dev)
    ok_load = torch.equal(seen[:n], base[:n] + 10000 * nxt) and torch.equal(seen[n:], untouched)
    ok_store = torch.equal(y[:n], 2 * (base[:n] + 10000 * me)) and torch.equal(y[n:], untouched)
    print(f"rank {me}: loaded {n} of rank {nxt}'s values: {'ok' if ok_load else 'WRONG'}; "
          f"rank {prv} stored its neighbour's values x2 into my y: {'ok' if ok_store else 'WRONG'}; "
          f"{cap - n} masked lanes untouched", flush=True)
    ctx.close()
    return 0 if ok_load and ok_store else 1


if __name__ == "__main__":
    sys.exit(main())
