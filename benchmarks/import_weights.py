"""Weights made symmetric: zero-copy as_symmetric against a copy into the heap and against torch
symmetric memory (allocate + copy), in one run: time and extra device bytes for about 8 GB.

    python -m iris.run -n 2 benchmarks/import_weights.py [--gib 8] [--tensor-mib 128]

Where the time goes, per rank: the driver calls (count, ms; their sum is the goal's yardstick:
total within 1.15x of it; per rank, and for the job: the last rank's finish over the slowest rank's
driver sum, since a rank whose driver calls run faster waits for its peer's pages), the group's exchanges (the page steps run on a background thread, so
their time overlaps driver calls and is not on the critical path), and for the batched call the
phases of the import (retain, plan exchange, export, map own, import peers, wait for peers, set
access peers, close fds) plus what lies outside it.

PyTorch allocates the weights with expandable_segments:True (VMM-backed), as a job that wants
zero copy would. On the host the weights are shared-memory tensors and sizes are scaled down.
"""
import os

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before torch touches CUDA

import argparse  # noqa: E402
import contextlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import init_torch_distributed, write_result  # noqa: E402

import iris  # noqa: E402


def _free_bytes(ctx):
    if ctx.get_device().type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.mem_get_info()[0]
    return ctx.driver.mem_info()[0]


def _measure(ctx, fn, calls=None):
    """fn's result, seconds (to the last rank done) and extra device bytes; with calls, also the
    driver calls and exchanges that fn makes (not the barriers around it)."""
    ctx.barrier()
    free0 = _free_bytes(ctx)
    t0 = time.perf_counter()
    with _driver_calls(ctx, calls) if calls is not None else contextlib.nullcontext():
        out = fn()
    ctx.barrier()
    seconds = time.perf_counter() - t0
    return out, seconds, free0 - _free_bytes(ctx)


DRIVER = ("retain", "export", "import_", "map", "set_access", "release")


@contextlib.contextmanager
def _driver_calls(ctx, into: dict):
    """Count the driver's calls and the group's exchanges, with their milliseconds, while the block
    runs: where the time goes."""
    targets = [(ctx.driver, name) for name in DRIVER] + [(ctx.heap.group, "exchange")]
    for obj, name in targets:
        def timed(*a, _f=getattr(obj, name), _n=name, **k):
            t0 = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                c = into.setdefault(_n, {"calls": 0, "ms": 0.0})
                c["calls"] += 1
                c["ms"] += 1e3 * (time.perf_counter() - t0)
        setattr(obj, name, timed)
    try:
        yield into
    finally:
        for obj, name in targets:
            delattr(obj, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=None, help="total weights per rank (default 8 on GPUs, 0.25 on the host)")
    ap.add_argument("--tensor-mib", type=float, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rank, world = init_torch_distributed()
    ctx = iris.iris(heap_size=1 << 40, allocator="vmem")
    gpu = ctx.get_device().type == "cuda"
    total = int((args.gib if args.gib else (8 if gpu else 0.25)) * (1 << 30))
    per = int(args.tensor_mib * (1 << 20)) // 2 * 2
    n = max(1, total // per)
    g = torch.Generator(device=ctx.get_device()).manual_seed(rank)
    weights = [torch.empty(per // 2, dtype=torch.bfloat16, device=ctx.get_device()) for _ in range(n)]
    for w in weights:
        w.uniform_(-1, 1, generator=g)
        if not gpu:
            w.share_memory_()
    nbytes = n * per
    rows = []

    for method, run in (("iris as_symmetric zero copy, one call per tensor",
                         lambda: [ctx.as_symmetric(w, copy=False) for w in weights]),
                        ("iris as_symmetric zero copy, one batched call",
                         lambda: ctx.as_symmetric(weights, copy=False))):
        calls = {}
        views, sec, extra = _measure(ctx, run, calls)
        driver_ms = sum(v["ms"] for k, v in calls.items() if k in DRIVER)
        # every element, the views alias the originals, and the peer sees this rank's weights
        ok = all(ctx.is_zero_copy(v) and torch.equal(v, w) and v.data_ptr() != w.data_ptr()
                 for v, w in zip(views, weights))
        views[0].fill_(rank + 0.5)
        ok = ok and bool((weights[0] == rank + 0.5).all())
        ctx.barrier()
        peer = (rank + 1) % world
        ok = ok and bool((ctx.peer_view(views[0], peer) == peer + 0.5).all())
        ctx.barrier()
        phases = dict(ctx.heap.stats.get("as_symmetric_ms", {}))  # the last call's: the whole batch when batched
        rows.append({"method": method, "ms": 1e3 * sec, "extra_bytes": extra, "checked": ok, "driver_calls": calls,
                     "driver_ms": driver_ms, "ms_over_driver": 1e3 * sec / driver_ms, "phases_ms": phases,
                     "outside_adopt_ms": 1e3 * sec - sum(phases.values())})
        t0 = time.perf_counter()
        for v in views:
            ctx.free(v)
        rows[-1]["free_ms"] = 1e3 * (time.perf_counter() - t0)
        del views

    copies, sec, extra = _measure(ctx, lambda: [ctx.as_symmetric(w, copy=True) for w in weights])
    ok = all(torch.equal(c, w) and not ctx.is_zero_copy(c) for c, w in zip(copies, weights))
    rows.append({"method": "iris copy into heap", "ms": 1e3 * sec, "extra_bytes": extra, "checked": ok})
    for c in copies:
        ctx.free(c)
    del copies
    ctx.trim()

    if gpu:
        import torch.distributed._symmetric_memory as symm_mem

        def symm():
            out = []
            for w in weights:
                s = symm_mem.empty(w.shape, dtype=w.dtype, device=w.device)
                symm_mem.rendezvous(s, dist.group.WORLD)
                s.copy_(w)
                out.append(s)
            return out
        try:  # a reference that cannot run here is named in the JSON, not fatal to iris's rows
            sym, sec, extra = _measure(ctx, symm)
            ok = all(torch.equal(s, w) for s, w in zip(sym, weights))
            rows.append({"method": "torch symm_mem empty+rendezvous+copy", "ms": 1e3 * sec, "extra_bytes": extra,
                         "checked": ok})
            del sym
        except Exception as e:  # noqa: BLE001
            rows.append({"method": "torch symm_mem skipped", "reason": f"{type(e).__name__}: {e}".splitlines()[0][:200]})
    gathered = ctx.heap.group.allgather(rows)
    if rank == 0:
        print(f"{n} tensors of {per / 2**20:.0f} MiB = {nbytes / 2**30:.2f} GiB per rank, {world} ranks")
        print(f"{'method':>50} {'ms':>9} {'extra MiB':>10} checked")
        for r, rr in enumerate(gathered):
            for row in rr:
                if "reason" in row:
                    print(f"{row['method']:>50}: {row['reason']}  (rank {r})")
                    continue
                print(f"{row['method']:>50} {row['ms']:9.1f} {row['extra_bytes'] / 2**20:10.1f} {row['checked']}  (rank {r})")
                if "driver_calls" in row:
                    print(" " * 51 + "calls: " + ", ".join(f"{k} {v['calls']}x {v['ms']:.1f} ms"
                                                          for k, v in row["driver_calls"].items()))
                    print(" " * 51 + f"driver sum {row['driver_ms']:.1f} ms; total / driver sum "
                          f"{row['ms_over_driver']:.2f}x (goal: 1.15x)")
                    if "batched" in row["method"]:
                        print(" " * 51 + "phases (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in row["phases_ms"].items())
                              + f"; outside adopt (checks, views, last barrier) {row['outside_adopt_ms']:.1f}")
        job = {}  # the job's view: the call ends when the last rank is done, and the slowest rank's driver calls bound it
        for k, row in enumerate(gathered[0]):
            if "driver_ms" in row:
                slowest = max(rr[k]["driver_ms"] for rr in gathered)
                job[row["method"]] = {"ms": row["ms"], "slowest_driver_ms": slowest, "ms_over_slowest_driver": row["ms"] / slowest}
                print(f"job, {row['method']}: {row['ms']:.1f} ms / slowest rank's driver sum {slowest:.1f} ms = "
                      f"{row['ms'] / slowest:.2f}x")
        print("wrote", write_result("import_weights", {"bytes_per_rank": nbytes, "tensors": n, "ranks": gathered,
                                                       "job": job}, args.out))
    ctx.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
