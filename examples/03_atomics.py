"""Atomics on other ranks' memory: every rank adds into one counter on rank 0, keeps a max on
every rank, and claims a ticket with compare-and-swap.

    python -m iris.run -n 2 examples/03_atomics.py
"""
import sys

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def atomics_kernel(counter, best, ticket, got, me, world, heap_bases, adds):
    for _ in range(adds):  # contended: every program of every rank hits rank 0's counter
        iris.atomic_add(counter, 1, me, 0, heap_bases, sem="relaxed", scope="sys")
    for r in range(world):
        iris.atomic_max(best, me * 10 + tl.program_id(0), me, r, heap_bases, scope="sys")
    # ticket on rank 0: the first CAS from -1 wins; the others see the winner's number
    old = iris.atomic_cas(ticket, -1, me * 100 + tl.program_id(0), me, 0, heap_bases, sem="acq_rel", scope="sys")
    tl.store(got + tl.program_id(0), old)


def main() -> int:
    ctx = iris.iris(heap_size=1 << 24)
    me, world, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    programs, adds = 4, 50
    counter, best = ctx.zeros(1, dtype=torch.int32), ctx.full((1,), -1, dtype=torch.int32)
    ticket = ctx.full((1,), -1, dtype=torch.int32)
    got = torch.zeros(programs, dtype=torch.int32, device=dev)
    ctx.barrier()
    atomics_kernel[(programs,)](counter, best, ticket, got, me, world, ctx.get_heap_bases(), adds)
    ctx.barrier()

    total = ctx.peer_view(counter, 0).item()
    winner = ctx.peer_view(ticket, 0).item()
    ok_add = total == world * programs * adds
    ok_max = best.item() == (world - 1) * 10 + programs - 1
    ok_cas = winner >= 0 and all(g in (-1, winner) for g in got.tolist())
    print(f"rank {me}: counter on rank 0 = {total} (want {world * programs * adds}): {'ok' if ok_add else 'WRONG'}; "
          f"max here = {best.item()}: {'ok' if ok_max else 'WRONG'}; ticket won by {winner}, "
          f"my programs saw {got.tolist()}: {'ok' if ok_cas else 'WRONG'}", flush=True)
    ctx.close()
    return 0 if ok_add and ok_max and ok_cas else 1


if __name__ == "__main__":
    sys.exit(main())
