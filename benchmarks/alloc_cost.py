"""Cost of one collective allocation: iris's torch and vmem heaps against torch symmetric memory,
and (--sweep) how ctx.empty + ctx.free grows with the heap's state, against torch.empty + del.

    python -m iris.run -n 2 benchmarks/alloc_cost.py [--size-mib 1] [--counts 1 10 100 1000]
    python -m iris.run -n 2 benchmarks/alloc_cost.py --sweep
    python -m iris.run -n 2 benchmarks/alloc_cost.py --reuse [--sizes 4096 1048576 67108864]

Default: for each count N of 1 MiB allocations, the time per allocation inside already-mapped
memory, with heap growth (vmem: a fresh heap, chunks created and exchanged as they are needed),
and for torch's symm_mem.empty + rendezvous, all in the same run.

--sweep: a fresh heap per state, built with L live blocks and H free holes (holes smaller than
the request, so none can take it), then the median of ctx.empty(16 KiB) + ctx.free; and a vmem
heap of 100 GiB with S backed segments (one per allocation of one chunk). torch.empty + del of
the same size is timed alternately with it, as the reference, in batches of 25 calls; each median
(of the batches' per-call times) is the lowest of three rounds. A freed block returns to the pool
at the next collective point, so a ctx.collect() follows each batch, timed apart (its median is
reported, and the pair's cost with it spread over the batch). Writes benchmarks/results/.

--reuse: the loops of a memory-constrained program, per allocator and size, on a fresh heap each:
"local" (ctx.empty + ctx.free), "tp_step" (empty, fill, ctx.ccl.all_reduce, free) and "scope"
(`with ctx.scope(): ctx.empty(...)`). After a warm-up, for each: the distinct offsets handed out
and the bytes mapped (the heap's high-water), growths and host collectives per iteration (the
group's own count), and the medians of the allocation's cost and of
torch.empty + del of the same size, timed in alternating batches in the same run (tp_step: the
empty + free of each step, timed alone). No ctx.collect() anywhere: a freed block must come back
by itself. First, control rows (see controls()): the torch work the pair cannot skip and, with
peers, the progress counters alone. Writes alloc_cost_reuse-<host|gpu>-<N>ranks.json.
"""
import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import batched as _batched, init_torch_distributed, write_result  # noqa: E402

import iris  # noqa: E402
from iris.allocators import ALLOCATORS  # noqa: E402


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


def _pair_times(ctx, nbytes, reps, rounds=3, batch=25):
    """Per-call medians (seconds) of ctx.empty + ctx.free of nbytes (the tensor dropped too) and of
    torch.empty + del of the same size, timed in batches of `batch` calls (so the timer's own cost,
    about 0.3 us a reading, is spread over the batch instead of added to each call), batches of the
    two alternating so both see the same machine load; the lowest of `rounds` medians each. After
    each batch of the pair, ctx.collect() returns its blocks to the pool: its median is the third."""
    dev, ours, ref, points = ctx.get_device(), [], [], []
    clock = time.perf_counter
    for _ in range(rounds):
        a, b, c = [], [], []
        for _ in range(max(1, reps // batch)):
            t0 = clock()
            for _ in range(batch):
                t = ctx.empty(nbytes, dtype=torch.uint8)
                ctx.free(t)
                del t
            t1 = clock()
            ctx.collect()
            t2 = clock()
            for _ in range(batch):
                t = torch.empty(nbytes, dtype=torch.uint8, device=dev)
                del t
            b.append((clock() - t2) / batch)
            a.append((t1 - t0) / batch)
            c.append(t2 - t1)
        ours.append(statistics.median(a))
        ref.append(statistics.median(b))
        points.append(statistics.median(c))
    return min(ours), min(ref), min(points)


def _row(ctx, allocator, nbytes, reps, batch=25, **state):
    ours, ref, point = _pair_times(ctx, nbytes, reps, batch=batch)
    return {"allocator": allocator, **state, "iris_median_us": 1e6 * ours, "torch_empty_del_median_us": 1e6 * ref,
            "ratio_to_torch": ours / ref, "collect_median_us": 1e6 * point, "batch": batch,
            "ratio_with_collect_per_batch": (ours + point / batch) / ref}


def _fragment(ctx, live, holes, hole_bytes, live_bytes):
    """live blocks kept and holes freed between them, so no two holes coalesce."""
    keep, gaps = [], []
    for i in range(max(live, holes + 1)):
        if i < holes:
            gaps.append(ctx.empty(hole_bytes, dtype=torch.uint8))
        keep.append(ctx.empty(live_bytes, dtype=torch.uint8))
    for g in gaps:
        ctx.free(g)
    return keep


def sweep(args):
    """Allocation cost against the heap's state; torch.empty + del of the same size as reference."""
    nbytes, reps = args.request_kib << 10, args.reps
    rows = []
    for allocator in args.allocators.split(","):
        for live, holes in args.states:
            heap = (3 * (max(live, holes + 1) * 4096 + holes * nbytes // 2) // 2 + (64 << 20)) & -(1 << 21)
            with iris.iris(heap_size=heap, allocator=allocator) as ctx:
                keep = _fragment(ctx, live, holes, nbytes // 2, 4096)
                warm = ctx.empty(nbytes, dtype=torch.uint8)  # back the block the timed requests use
                ctx.free(warm)
                del warm
                ctx.barrier()
                rows.append(_row(ctx, allocator, nbytes, reps, live_blocks=len(keep), holes=holes,
                                 segments=len(getattr(ctx.heap.alloc, "segments", ())) or 1))
                del keep
    chunk = args.chunk_kib << 10
    for segments in args.segments:
        alloc_cls = ALLOCATORS["vmem"]
        ALLOCATORS["vmem"] = functools.partial(alloc_cls, chunk_size=chunk)  # small chunks where the host limits
        try:
            with iris.iris(heap_size=100 << 30, allocator="vmem") as ctx:
                real_chunk = ctx.heap.alloc.chunk
                keep = [ctx.empty(real_chunk, dtype=torch.uint8) for _ in range(segments)]
                warm = ctx.empty(nbytes, dtype=torch.uint8)
                ctx.free(warm)
                del warm
                ctx.barrier()
                rows.append(_row(ctx, "vmem", nbytes, reps, live_blocks=len(keep), holes=0,
                                 segments=len(ctx.heap.alloc.segments), chunk_bytes=real_chunk))
                del keep
        finally:
            ALLOCATORS["vmem"] = alloc_cls
    return rows


def _print_sweep(rows):
    print(f"{'allocator':>9} {'live':>7} {'holes':>6} {'segments':>8} {'iris us':>8} {'torch us':>8} {'ratio':>6} "
          f"{'collect us':>10} {'ratio+collect':>13}")
    for r in rows:
        print(f"{r['allocator']:>9} {r['live_blocks']:>7} {r['holes']:>6} {r['segments']:>8} {r['iris_median_us']:8.2f} "
              f"{r['torch_empty_del_median_us']:8.2f} {r['ratio_to_torch']:6.2f} {r['collect_median_us']:10.2f} "
              f"{r['ratio_with_collect_per_batch']:13.2f}")


def reuse_loop(ctx, loop, nbytes, reps, tp_steps, batch=25):
    """One loop on one heap: the row described in the module docstring."""
    dev, offsets = ctx.get_device(), set()
    n = nbytes // 4

    # the timed loops note each tensor's address (one C call: offset_of's checks would be timed as the
    # allocation's cost) and turn them into heap offsets after timing
    addresses = set()

    def local():
        t = ctx.empty(n, dtype=torch.float32)
        addresses.add(t.data_ptr())
        ctx.free(t)

    def scoped():
        with ctx.scope():
            addresses.add(ctx.empty(n, dtype=torch.float32).data_ptr())

    def reference():
        t = torch.empty(n, dtype=torch.float32, device=dev)
        del t

    step = scoped if loop == "scope" else local
    for _ in range(3):  # warm-up: first blocks, kernels compiled, ccl's workspaces
        if loop == "tp_step":
            x = ctx.empty(n, dtype=torch.float32)
            x.fill_(1.0)
            ctx.ccl.all_reduce(x, x)
            ctx.free(x)
        else:
            step()
    ctx.barrier()
    offsets.clear()
    addresses.clear()
    collectives, stats = ctx.group.collectives, dict(ctx.heap.stats)
    ours, ref, iters = [], [], 0
    if loop == "tp_step":
        clock = time.perf_counter
        for i in range(tp_steps):
            t0 = clock()
            x = ctx.empty(n, dtype=torch.float32)
            t1 = clock()
            offsets.add(ctx.heap.offset_of(x))
            x.fill_(float(i))
            ctx.ccl.all_reduce(x, x)
            t2 = clock()
            ctx.free(x)
            t3 = clock()
            ours.append(t1 - t0 + t3 - t2)
            ref += _batched(reference, 1, 1)
        iters = tp_steps
    else:
        for _ in range(3):
            ours += _batched(step, reps, batch)
            ref += _batched(reference, reps, batch)
        iters = 3 * max(1, reps // batch) * batch
    offsets.update(a - ctx.heap.bases[ctx.get_rank()] for a in addresses)
    committed = getattr(ctx.heap.alloc, "committed", 0)
    return {"loop": loop, "bytes": nbytes, "iterations": iters, "distinct_offsets": len(offsets),
            "mapped_bytes": committed, "growths": ctx.heap.stats["growths"] - stats["growths"],
            "exchanges": ctx.heap.stats["exchanges"] - stats["exchanges"],
            "host_collectives_per_iteration": (ctx.group.collectives - collectives) / iters,
            "iris_median_us": 1e6 * statistics.median(ours), "torch_empty_del_median_us": 1e6 * statistics.median(ref),
            "ratio_to_torch": statistics.median(ours) / statistics.median(ref)}


def controls(ctx, reps, batch=25):
    """Rows that say what part of the pair's cost is not bookkeeping, timed like the loops, against
    torch.empty + del in alternating batches: "floor: tensor ops" is the torch work the usual pair
    does and cannot skip (ctx.free's t.detach() that the next ctx.empty hands out, and the swap that
    detaches t); "floor: view + owner" is what a tensor dropped before its free costs instead (the
    scope loop's: a new view over the block, carrying the Owner that queues it); "floor: counters" (peers only) is the progress
    counters' part alone, a free's counter write and a reuse's wait for the peers, with no
    allocation: on GPUs two driver calls, on the host the ranks' lockstep (a reuse waits until every
    peer has passed its matching free, which on the host means its program got there)."""
    from iris.heap.lifetime import FreedTensor
    dev = ctx.get_device()
    n = 4096 // 4
    base = torch.empty(n, dtype=torch.float32, device=dev)
    dead = torch.empty(0, dtype=torch.float32, device=dev)

    def tensor_ops():
        t = base.detach()
        kept = t.detach()
        t.data = dead
        t.__class__ = FreedTensor
        return kept

    def reference():
        t = torch.empty(n, dtype=torch.float32, device=dev)
        del t

    from iris.heap.lifetime import Block, Owner
    heap = ctx.heap
    gone = Block(0, 4096, -1)
    gone.freed = True  # its owners' end is counted like a freed block's: no garbage queued

    def view_owner():  # what a tensor dropped before its free costs: a view and its Owner, made and gone
        heap._view(heap._base, (n,), torch.float32, dev, Owner(heap, gone), 4096)

    cases = {"floor: tensor ops": tensor_ops, "floor: view + owner": view_owner}
    progress = ctx.heap.progress
    if progress is not None and progress.peers:
        def counters():
            if progress.epoch > progress.done:
                progress.wait(progress.epoch, 0, 0)
            progress.passed()
        cases["floor: counters"] = counters
    rows = []
    ctx.barrier()
    for name, fn in cases.items():
        ours, ref = [], []
        for _ in range(3):
            ours += _batched(fn, reps, batch)
            ref += _batched(reference, reps, batch)
        ctx.barrier()
        rows.append({"allocator": "-", "loop": name, "bytes": 4096, "iterations": 3 * max(1, reps // batch) * batch,
                     "iris_median_us": 1e6 * statistics.median(ours),
                     "torch_empty_del_median_us": 1e6 * statistics.median(ref),
                     "ratio_to_torch": statistics.median(ours) / statistics.median(ref)})
        if ctx.get_rank() == 0:
            r = rows[-1]
            print(f"{name:>20} iris={r['iris_median_us']:.2f}us torch={r['torch_empty_del_median_us']:.2f}us "
                  f"ratio={r['ratio_to_torch']:.2f}", flush=True)
    return rows


def reuse(args):
    rows = []
    with iris.iris(heap_size=256 << 20, allocator=args.allocators.split(",")[0]) as ctx:
        rows += controls(ctx, args.reps)
    for allocator in args.allocators.split(","):
        for nbytes in args.sizes:
            heap = max(256 << 20, 4 * nbytes)
            with iris.iris(heap_size=heap, allocator=allocator) as ctx:
                for loop in ("local", "tp_step", "scope"):
                    reps = args.reps if nbytes < (64 << 20) or torch.cuda.is_available() else max(25, args.reps // 4)
                    row = reuse_loop(ctx, loop, nbytes, reps, args.tp_steps)
                    rows.append({"allocator": allocator, "heap_size": heap, **row})
                    if ctx.get_rank() == 0:
                        r = rows[-1]
                        print(f"{allocator:>8} {loop:>8} {nbytes:>9} offsets={r['distinct_offsets']} "
                              f"mapped={r['mapped_bytes']} growths={r['growths']} "
                              f"collectives/it={r['host_collectives_per_iteration']:.3f} "
                              f"iris={r['iris_median_us']:.2f}us torch={r['torch_empty_del_median_us']:.2f}us "
                              f"ratio={r['ratio_to_torch']:.2f}", flush=True)
                        if args.out_partial:
                            with open(args.out_partial, "a") as f:
                                f.write(json.dumps(rows[-1]) + "\n")
    return rows


def _state(text):
    live, holes = text.split(":")
    return int(float(live)), int(float(holes))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="allocation cost against the heap's state")
    ap.add_argument("--states", type=_state, nargs="+",
                    default=[_state(s) for s in ("1e2:10", "1e2:1e2", "1e3:1e3", "1e4:1e4", "1e5:1e2", "1e5:5e4")],
                    help="live:holes pairs for --sweep")
    ap.add_argument("--allocators", default="torch,vmem", help="comma-separated allocators of the --states sweep")
    ap.add_argument("--segments", type=int, nargs="*", default=[100, 1000, 10000, 50000],
                    help="backed segments of a 100 GiB vmem heap for --sweep")
    ap.add_argument("--chunk-kib", type=int, default=2048,
                    help="vmem chunk for the segments sweep (the driver's granularity at least)")
    ap.add_argument("--request-kib", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 10, 100, 1000])
    ap.add_argument("--size-mib", type=float, default=1.0)
    ap.add_argument("--heap-gib", type=float, default=8.0)
    ap.add_argument("--reuse", action="store_true", help="the reuse loops (local, tp_step, scope) per allocator and size")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 1 << 20, 64 << 20], help="bytes, for --reuse")
    ap.add_argument("--tp-steps", type=int, default=50, help="iterations of the tp_step loop, for --reuse")
    ap.add_argument("--out-partial", default=None, help="--reuse: append each row to this file as it is made")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.reuse:
        rows = reuse(args)
        if int(os.environ.get("IRIS_RANK", 0)) == 0:
            payload = {"reps": args.reps, "tp_steps": args.tp_steps, "rows": rows,
                       "ranks_per_gpu": int(os.environ.get("IRIS_WORLD_SIZE", 1)) // max(1, torch.cuda.device_count())
                       if torch.cuda.is_available() else 0}
            print("wrote", write_result("alloc_cost_reuse", payload, args.out))
        return
    rank, world = init_torch_distributed()
    if args.sweep:
        rows = sweep(args)
        if rank == 0:
            _print_sweep(rows)
            payload = {"request_bytes": args.request_kib << 10, "reps": args.reps, "rows": rows}
            print("wrote", write_result("alloc_cost_sweep", payload, args.out))
        dist.barrier()
        dist.destroy_process_group()
        return
    nbytes, heap = int(args.size_mib * (1 << 20)), int(args.heap_gib * (1 << 30))
    rows = bench_iris("torch", args.counts, nbytes, heap) + bench_iris("vmem", args.counts, nbytes, heap)
    skipped = {}
    if torch.cuda.is_available():
        try:  # a reference that cannot run here is named in the JSON, not fatal to iris's rows
            rows += bench_symm_mem(args.counts, nbytes)
        except Exception as e:  # noqa: BLE001
            skipped["torch symm_mem"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    ref = {r["n"]: r["mean_us"] for r in rows if r["allocator"] == "torch symm_mem"}
    for r in rows:
        if r["n"] in ref and r["allocator"] != "torch symm_mem":
            r["times_cheaper_than_symm_mem"] = ref[r["n"]] / r["mean_us"]
    if rank == 0:
        print(f"{'allocator':>15} {'case':>20} {'N':>5} {'mean us':>9} {'median':>8} {'last10%':>8} {'exch':>5} {'x symm':>7}")
        for r in rows:
            print(f"{r['allocator']:>15} {r['case']:>20} {r['n']:>5} {r['mean_us']:9.1f} {r['median_us']:8.1f} "
                  f"{r['last10pct_mean_us']:8.1f} {r.get('exchanges', ''):>5} {r.get('times_cheaper_than_symm_mem', 0):7.0f}")
        print("wrote", write_result("alloc_cost", {"bytes_per_allocation": nbytes, "rows": rows,
                                                   "references_skipped": skipped}, args.out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
