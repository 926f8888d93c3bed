"""Cost of one collective allocation: iris's torch and vmem heaps against torch symmetric memory.

    python -m iris.run -n 2 benchmarks/alloc_cost.py [--sizes-mib 1] [--counts 1 10 100 1000]

For each count N of 1 MiB allocations: the time per allocation inside already-mapped memory,
with heap growth (vmem: a fresh heap, chunks created and exchanged as they are needed), and
for torch's symm_mem.empty + rendezvous, all in the same run. Writes benchmarks/results/.
"""
import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import init_torch_distributed, write_result  # noqa: E402

import iris  # noqa: E402


def _timed_allocs(ctx, n, nbytes):
    """Per-allocation seconds for n allocations, synchronised at the ends."""
    times, keep = [], []
    ctx.barrier()
    for _ in range(n):
        t0 = time.perf_counter()
        keep.append(ctx.empty(nbytes, dtype=torch.uint8))
        times.append(time.perf_counter() - t0)
    for t in keep:
        ctx.free(t)
    return times


def _summary(times):
    n = len(times)
    tail = times[-max(1, n // 10):]
    head = times[:max(1, n // 10)]
    return {"n": n, "mean_us": 1e6 * statistics.fmean(times), "median_us": 1e6 * statistics.median(times),
            "first10pct_mean_us": 1e6 * statistics.fmean(head), "last10pct_mean_us": 1e6 * statistics.fmean(tail)}


def bench_iris(allocator, counts, nbytes, heap_size):
    rows = []
    for n in counts:
        # inside mapped memory: back n blocks once, free them, then time n allocations into them
        with iris.iris(heap_size=heap_size, allocator=allocator) as ctx:
            warm = ctx.empty(n * nbytes + (4 << 20), dtype=torch.uint8)
            ctx.free(warm)
            before = dict(ctx.heap.stats)
            row = {"allocator": allocator, "case": "inside mapped", **_summary(_timed_allocs(ctx, n, nbytes))}
            row["exchanges"] = ctx.heap.stats["exchanges"] - before["exchanges"]
            rows.append(row)
        if allocator == "vmem":  # growth: a fresh heap backs chunks as the allocations arrive
            with iris.iris(heap_size=heap_size, allocator=allocator) as ctx:
                row = {"allocator": allocator, "case": "with growth", **_summary(_timed_allocs(ctx, n, nbytes))}
                row["exchanges"] = ctx.heap.stats["exchanges"]
                row["chunk_bytes"] = ctx.heap.alloc.chunk
                rows.append(row)
    return rows


def bench_symm_mem(counts, nbytes):
    import torch.distributed._symmetric_memory as symm_mem
    rows = []
    group = dist.group.WORLD
    for n in counts:
        keep, times = [], []
        dist.barrier()
        for _ in range(n):
            t0 = time.perf_counter()
            t = symm_mem.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", torch.cuda.current_device()))
            keep.append((t, symm_mem.rendezvous(t, group)))
            times.append(time.perf_counter() - t0)
        rows.append({"allocator": "torch symm_mem", "case": "empty + rendezvous", **_summary(times)})
        del keep
        torch.cuda.synchronize()
        dist.barrier()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 10, 100, 1000])
    ap.add_argument("--size-mib", type=float, default=1.0)
    ap.add_argument("--heap-gib", type=float, default=8.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rank, world = init_torch_distributed()
    nbytes, heap = int(args.size_mib * (1 << 20)), int(args.heap_gib * (1 << 30))
    rows = bench_iris("torch", args.counts, nbytes, heap) + bench_iris("vmem", args.counts, nbytes, heap)
    if torch.cuda.is_available():
        rows += bench_symm_mem(args.counts, nbytes)
    ref = {r["n"]: r["mean_us"] for r in rows if r["allocator"] == "torch symm_mem"}
    for r in rows:
        if r["n"] in ref and r["allocator"] != "torch symm_mem":
            r["times_cheaper_than_symm_mem"] = ref[r["n"]] / r["mean_us"]
    if rank == 0:
        print(f"{'allocator':>15} {'case':>20} {'N':>5} {'mean us':>9} {'median':>8} {'last10%':>8} {'exch':>5} {'x symm':>7}")
        for r in rows:
            print(f"{r['allocator']:>15} {r['case']:>20} {r['n']:>5} {r['mean_us']:9.1f} {r['median_us']:8.1f} "
                  f"{r['last10pct_mean_us']:8.1f} {r.get('exchanges', ''):>5} {r.get('times_cheaper_than_symm_mem', 0):7.0f}")
        print("wrote", write_result("alloc_cost", {"bytes_per_allocation": nbytes, "rows": rows}, args.out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
