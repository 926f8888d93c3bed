"""Allocate on the symmetric heap, write into the next rank's copy two ways, barrier, check.

    python -m iris.run -n 2 examples/00_heap_basics.py
"""
import sys

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def put_kernel(src, dst, n, me, to, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    iris.put(src + offs, dst + offs, me, to, heap_bases, mask=offs < n)


def main() -> int:
    ctx = iris.iris(heap_size=1 << 24)
    me, world = ctx.get_rank(), ctx.get_num_ranks()
    nxt, prv = (me + 1) % world, (me - 1) % world
    n = 1000
    a = ctx.full((n,), -1.0)                   # same offset on every rank
    b = ctx.full((n,), -1.0)
    mine = torch.arange(n, dtype=torch.float32, device=ctx.get_device()) + 1000 * me
    ctx.barrier()                              # every rank has poisoned its copies

    ctx.peer_view(a, nxt).copy_(mine)          # host code writes the next rank's copy of a
    put_kernel[(triton.cdiv(n, 256),)](mine, b, n, me, nxt, ctx.get_heap_bases(), BLOCK=256)  # a kernel, b
    ctx.barrier()

    want = torch.arange(n, dtype=torch.float32, device=ctx.get_device()) + 1000 * prv
    ok = torch.equal(a, want) and torch.equal(b, want)
    print(f"rank {me}/{world}: heap of {ctx.heap_size} bytes at {ctx.get_heap_bases()[me].item():#x}; "
          f"a (peer_view) and b (kernel put) hold rank {prv}'s {n} values: {'ok' if ok else 'WRONG'}", flush=True)
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
