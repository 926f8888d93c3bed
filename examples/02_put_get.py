"""iris.put pushes a local tile into the next rank's heap; iris.get pulls the previous rank's tile.

    python -m iris.run -n 2 examples/02_put_get.py
"""
import sys

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def put_get_kernel(src, inbox, pulled, n, me, nxt, prv, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    iris.put(src + offs, inbox + offs, me, nxt, heap_bases, mask=mask)      # mine -> next's inbox
    iris.get(src + offs, pulled + offs, me, prv, heap_bases, mask=mask)     # previous's src -> my pulled


def main() -> int:
    ctx = iris.iris(heap_size=1 << 24)
    me, world, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    nxt, prv = (me + 1) % world, (me - 1) % world
    n = 4096 + 17
    src = ctx.randint(-1000, 1000, (n,), generator=torch.Generator(device=dev).manual_seed(me), dtype=torch.int32)
    inbox = ctx.full((n,), -7, dtype=torch.int32)
    pulled = torch.full((n,), -7, dtype=torch.int32, device=dev)  # get's destination need not be on the heap
    ctx.barrier()
    put_get_kernel[(triton.cdiv(n, 1024),)](src, inbox, pulled, n, me, nxt, prv, ctx.get_heap_bases(), BLOCK=1024)
    ctx.barrier()

    want = ctx.peer_view(src, prv)  # the previous rank's src, read on the host
    ok_put, ok_get = torch.equal(inbox, want), torch.equal(pulled, want)
    print(f"rank {me}: rank {prv} put {n} int32 into my inbox: {'ok' if ok_put else 'WRONG'}; "
          f"I got rank {prv}'s {n} int32: {'ok' if ok_get else 'WRONG'}", flush=True)
    ctx.close()
    return 0 if ok_put and ok_get else 1


if __name__ == "__main__":
    sys.exit(main())
