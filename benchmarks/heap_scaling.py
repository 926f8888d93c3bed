"""Heap creation and growth time as ranks are added: every rank maps every peer.

    python -m iris.run -n N benchmarks/heap_scaling.py [--heap-gib 64] [--grow-mib 2 64 1024]

Creation: iris.iris() until every rank has its peers' views (torch: IPC open of each peer's
block; vmem: a reservation per peer). Growth: one vmem allocation that needs new chunks, so
every rank creates, exports, exchanges, imports and maps them for its N-1 peers.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_result  # noqa: E402

import iris  # noqa: E402


def _ms(fn, repeat):
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(out), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heap-gib", type=float, default=64)
    ap.add_argument("--grow-mib", type=float, nargs="+", default=[2, 64, 1024])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    heap = int(args.heap_gib * (1 << 30))
    rows = []
    iris.iris(heap_size=1 << 24, allocator="vmem").close()  # warm the runtime and the rendezvous
    for allocator in ("torch", "vmem"):
        size = heap if allocator == "vmem" else min(heap, 1 << 30)
        med, all_ = _ms(lambda: iris.iris(heap_size=size, allocator=allocator).close(), args.repeat)
        rows.append({"what": f"create + close ({allocator}, {size >> 20} MiB heap)", "median_ms": med, "all_ms": all_})
    for mib in args.grow_mib:
        nbytes = int(mib * (1 << 20))
        times = []
        for _ in range(args.repeat):
            with iris.iris(heap_size=heap, allocator="vmem") as ctx:
                ctx.barrier()
                t0 = time.perf_counter()
                t = ctx.empty(nbytes, dtype=torch.uint8)
                ctx.barrier()
                times.append(1e3 * (time.perf_counter() - t0))
                segments = len(ctx.heap.alloc.segments)
                del t
        rows.append({"what": f"growth by {mib:g} MiB (vmem, {segments} segment(s), + barrier)",
                     "median_ms": statistics.median(times), "all_ms": times})
    with iris.iris(heap_size=1 << 24, allocator="vmem") as ctx:
        world = ctx.get_num_ranks()
        gathered = ctx.heap.group.allgather(rows)
        if ctx.get_rank() == 0:
            print(f"{world} ranks")
            for i, row in enumerate(rows):
                worst = max(g[i]["median_ms"] for g in gathered)
                print(f"{row['what']:>60}: {row['median_ms']:8.2f} ms (slowest rank {worst:.2f})")
            name = f"heap_scaling-{world}ranks"
            print("wrote", write_result("heap_scaling", {"ranks": world, "rows": gathered},
                                        args.out or os.path.join(os.path.dirname(__file__), "results",
                                                                 f"{name}-{'gpu' if torch.cuda.is_available() else 'host'}.json")))


if __name__ == "__main__":
    main()
