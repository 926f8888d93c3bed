"""A job whose allocations add up to several times the device's memory, run by freeing and trimming.

    python -m iris.run -n 2 examples/10_memory_constrained.py [--rounds 8] [--budget-gib G]

Each round every rank allocates its budget on a vmem heap larger than the device, fills it,
checks its peer's data through the heap, frees it and trims. On a GPU the budget defaults to
30% of the device, so two ranks sharing one GPU pass through several times its memory.
"""
import argparse

import torch

import iris


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--budget-gib", type=float, default=None, help="per rank per round (default: 30%% of the device)")
    ap.add_argument("--pieces", type=int, default=4)
    args = ap.parse_args()

    ctx = iris.iris(heap_size=1 << 40, allocator="vmem")  # 1 TiB of address space, far above device memory
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    free, device_total = ctx.driver.mem_info()
    budget = int(args.budget_gib * (1 << 30)) if args.budget_gib else (
        int(0.3 * device_total) if ctx.get_device().type == "cuda" else 256 << 20)
    piece = budget // args.pieces // 4 * 4
    keep = ctx.full((1024,), float(r))  # lives through every round and every trim
    peak = lifetime = 0
    for round_ in range(args.rounds):
        held = [ctx.full((piece // 4,), float(1000 * round_ + 10 * r + i), dtype=torch.float32)
                for i in range(args.pieces)]
        lifetime += piece * args.pieces
        peak = max(peak, ctx.heap.alloc.committed)
        ctx.barrier()
        peer = (r + 1) % w
        for i, t in enumerate(held):
            expect = float(1000 * round_ + 10 * peer + i)
            seen = ctx.peer_view(t, peer)
            if not (bool((seen[:1 << 16] == expect).all()) and bool((seen[-(1 << 16):] == expect).all())):
                raise SystemExit(f"rank {r}: round {round_} piece {i}: peer data wrong")
        ctx.barrier()
        for t in held:
            ctx.free(t)
        del held, seen
        released = ctx.trim()
        if r == 0:
            print(f"round {round_}: allocated {piece * args.pieces / 2**30:.2f} GiB per rank, trimmed {released / 2**30:.2f} GiB")
    if not bool((keep == float(r)).all()):
        raise SystemExit(f"rank {r}: the tensor kept across rounds changed")
    totals = ctx.heap.group.allgather((peak, lifetime))
    if r == 0:
        job_lifetime = sum(t[1] for t in totals)
        print(f"device memory {device_total / 2**30:.1f} GiB; peak committed per rank "
              f"{[round(p / 2**30, 2) for p, _ in totals]} GiB; lifetime allocations of the job "
              f"{job_lifetime / 2**30:.1f} GiB = {job_lifetime / device_total:.2f}x the device")
        print("checked: peer data every round, the long-lived tensor after every trim")
    ctx.close()


if __name__ == "__main__":
    main()
