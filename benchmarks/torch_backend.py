"""torch.distributed over the "iris" backend against ctx.ccl called directly (the backend's own cost),
NCCL and gloo, per collective, eager and replayed from a CUDA graph, 4 KiB to 256 MiB. Writes JSON.

    python -m iris.run -n 2 benchmarks/torch_backend.py                 # GPUs
    python -m iris.run -n 2 benchmarks/torch_backend.py --quick         # host: 4 KiB and 16 KiB, few calls

Rows per (op, bytes): "iris_heap" dist.X on heap tensors (zero copy), "iris_plain" dist.X on ordinary
tensors (through the staging area), "ccl" ctx.ccl's call on the same heap tensors, "nccl" and
"gloo" dist.X on groups of those backends. A time is the median over samples of (calls back-to-back,
timed by CUDA events on a GPU, by the host clock here) / calls, the slowest rank's; "graph" replays
the calls captured in one CUDA graph (iris and NCCL only). overhead_us = iris_heap - ccl per call;
backend_host_us: host time per dist.X call on heap tensors outside ctx.ccl's call (torch's dispatch
and the backend), timed around ctx.ccl's method, meaningful on the host too.
NCCL runs only where every rank has its own GPU (it refuses two ranks on one GPU); the JSON says why
a row is missing. Sizes: all_reduce, broadcast, all_to_all: the tensor; all_gather: one rank's input;
reduce_scatter: one rank's output.

--dispatch-floor: host time per dist.X call (all_reduce, all_gather, reduce_scatter, 4 KiB heap
tensors) on a do-nothing ProcessGroup subclass registered as a backend like "iris" (torch's own
dispatch floor for a Python backend, which no Python backend can go under) and on "iris" with
ctx.ccl's call replaced by a no-op (the backend's per-call host work on top of that floor).
The heap is sized from --max-bytes, and the JSON is rewritten after every row, so a run that stops
still leaves the rows it measured.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_result  # noqa: E402

import iris  # noqa: E402,F401  (registers the backend)
from iris.torch_backend import Options, context  # noqa: E402

warnings.simplefilter("ignore", FutureWarning)
KiB, MiB = 1 << 10, 1 << 20
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def _shapes(op, nbytes, w):
    """(input elements, output elements) of fp32 for op at nbytes."""
    n = max(w, nbytes // 4 // w * w)
    return {"all_gather": (n, n * w), "reduce_scatter": (n * w, n)}.get(op, (n, n))


def _dist_call(op, out, inp, group):
    if op == "all_reduce":
        return lambda: dist.all_reduce(inp, group=group)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(out, inp, group=group)
    return lambda: dist.broadcast(inp, 0, group=group)


def _ccl_call(ctx, op, out, inp):
    ccl, w = ctx.ccl, ctx.get_num_ranks()
    if op == "all_reduce":
        return lambda: ccl.all_reduce(inp, inp)
    if op == "all_gather":
        return lambda: ccl.all_gather(out, inp)
    if op == "reduce_scatter":
        return lambda: ccl.reduce_scatter(out, inp)
    if op == "all_to_all":
        return lambda: ccl.all_to_all(out.view(1, -1), inp.view(1, -1))
    return lambda: ccl.broadcast(inp, inp, src=0)


_CCL_NAMES = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
              "all_to_all": "all_to_all", "broadcast": "broadcast"}


def backend_host_us(ctx, op, fn, calls) -> float:
    """Host microseconds per dist.X call spent outside ctx.ccl's own call (torch's dispatch and the
    backend): the whole call's time less the time inside ctx.ccl's method, timed around it."""
    name = _CCL_NAMES[op]
    method, inside = getattr(ctx.ccl, name), [0.0]

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - t0

    fn()
    setattr(ctx.ccl, name, timed)  # an instance attribute over the method, for these calls only
    gc.collect()
    gc.disable()  # a collection of the kernels' garbage would land on whichever side it falls
    try:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        total = time.perf_counter() - t0
    finally:
        gc.enable()
        delattr(ctx.ccl, name)
    return (total - inside[0]) / calls * 1e6


class _Nothing(dist.ProcessGroup):
    """A backend whose collectives do nothing: what remains of a dist.X call is torch's dispatch."""

    def __init__(self, rank, size):
        super().__init__(rank, size)
        self._done = _Done()

    def allreduce(self, tensors, opts=None):
        return self._done

    def _allgather_base(self, output, input, opts=None):
        return self._done

    def _reduce_scatter_base(self, output, input, opts=None):
        return self._done

    all_gather_single, reduce_scatter_single = _allgather_base, _reduce_scatter_base

    def getBackendName(self):
        return "nothing"


class _Done(dist.Work):
    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def _nothing_group(dist_options, options):
    return _Nothing(dist_options.group_rank, dist_options.group_size)


def _per_call(fns, samples, calls) -> list:
    """Per fn, the median over samples of host microseconds per call; the fns alternate within each
    sample so that load on the machine falls on all of them alike. Garbage collection off."""
    for fn in fns:
        fn()
    gc.collect()
    gc.disable()
    times = [[] for _ in fns]
    try:
        for _ in range(samples):
            for fn, out in zip(fns, times):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                out.append((time.perf_counter() - t0) / calls)
    finally:
        gc.enable()
    return [statistics.median(t) * 1e6 for t in times]


def dispatch_floor(ctx, gloo, args) -> int:
    """Host microseconds per dist.X call on a do-nothing backend (torch's dispatch floor for a Python
    backend) and on "iris" with ctx.ccl's method replaced by a no-op (torch's dispatch plus the
    backend's own per-call work: backend_host without the kernels' time), heap tensors; gloo's
    all_reduce of the same bytes on CPU tensors for scale."""
    if "nothing" not in dist.Backend.backend_list:
        dist.Backend.register_backend("nothing", _nothing_group, extended_api=True, devices=["cpu", "cuda"])
    nothing = dist.new_group(backend="nothing")
    rank, w = dist.get_rank(), dist.get_world_size()
    samples, calls = (5, 500) if args.quick else (15, 2000)
    rows = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        nbytes = 4 * KiB
        n_in, n_out = _shapes(op, nbytes, w)
        h_in, h_out = ctx.empty(n_in), ctx.empty(n_out)
        h_in.fill_(1.0)
        fns = [_dist_call(op, h_out, h_in, nothing), _dist_call(op, h_out, h_in, None)]
        name = _CCL_NAMES[op]
        setattr(ctx.ccl, name, lambda *a, **k: None)  # an instance attribute over the method, for these calls
        try:
            floor, iris_stub = _per_call(fns, samples, calls)
        finally:
            delattr(ctx.ccl, name)
        row = {"op": op, "bytes": nbytes, "nothing_us": slowest(floor, gloo), "iris_no_kernel_us": slowest(iris_stub, gloo)}
        row["iris_over_floor_us"] = row["iris_no_kernel_us"] - row["nothing_us"]
        if op == "all_reduce":
            c = torch.ones(n_in)
            (g,) = _per_call([lambda: dist.all_reduce(c, group=gloo)], samples, max(1, calls // 20))
            row["gloo_cpu_us"] = slowest(g, gloo)
        rows.append(row)
        if rank == 0:
            print(f"floor {op:15s} {nbytes:>6d} B  " + "  ".join(f"{k[:-3]}={v:.2f}" for k, v in row.items()
                                                              if k.endswith("_us")), flush=True)
        del fns, h_in, h_out
    if rank == 0:
        path = write_result("torch_backend-floor", {"rows": rows, "dtype": "float32", "samples": samples,
                                                    "calls": calls, "note": "host us per call, gc off, slowest "
                                                    "rank's median; ctx.ccl's call replaced by a no-op"}, args.out)
        print(f"wrote {path}", flush=True)
    return 0


class Timer:
    def __init__(self, dev, samples, calls):
        self.dev, self.samples, self.calls = dev, samples, calls
        self.gpu = dev.type == "cuda"

    def _sync(self):
        if self.gpu:
            torch.cuda.synchronize(self.dev)

    def eager(self, fn) -> float:
        fn()
        self._sync()
        times = []
        for _ in range(self.samples):
            if self.gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(self.calls):
                    fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3 / self.calls)
            else:
                t0 = time.perf_counter()
                for _ in range(self.calls):
                    fn()
                times.append((time.perf_counter() - t0) / self.calls)
        return statistics.median(times)

    def graph(self, fn):
        if not self.gpu:
            return None
        fn()
        self._sync()
        g, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.cuda.graph(g):
            for _ in range(self.calls):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g.replay()
        self._sync()
        times = []
        for _ in range(self.samples):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3 / self.calls)
        return statistics.median(times)


def slowest(x, group):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, x, group=group)
    vals = [v for v in out if v is not None]
    return max(vals) if vals else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON file (rank 0); default benchmarks/results/torch_backend-<gpu|host>-<n>ranks.json")
    p.add_argument("--quick", action="store_true", help="4 KiB and 16 KiB, 2 samples of 3 calls (the host)")
    p.add_argument("--max-bytes", type=int, default=256 * MiB)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dispatch-floor", action="store_true",
                   help="host: dist.all_reduce on a do-nothing backend, gloo and iris; iris's host time per call")
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    sizes = [4 * KiB, 16 * KiB] if args.quick else [s for s in (4 * KiB << 2 * k for k in range(9)) if s <= args.max_bytes]
    top, w_env = max(sizes), int(os.environ.get("WORLD_SIZE", "1"))
    staging = (2 * w_env + 2) * top
    # one size's heap tensors live at a time (freed before the next), but ctx.ccl keeps each shape's plan
    # and its workspace for the context's life: room for the sizes' workspaces (a geometric series below
    # 2x the largest), the staging area and the mailbox
    heap = 8 * (w_env + 1) * top + staging + 256 * MiB
    dist.init_process_group("iris", pg_options=Options(heap_size=heap, staging_bytes=staging))
    ctx = context()
    rank, w, dev = dist.get_rank(), dist.get_world_size(), ctx.get_device()
    gloo = dist.new_group(backend="gloo")
    if args.dispatch_floor:
        code = dispatch_floor(ctx, gloo, args)
        dist.barrier(group=gloo)
        dist.destroy_process_group()
        return code
    skipped = {}
    nccl = None
    if not gpu:
        skipped["nccl"] = "no GPU"
    elif torch.cuda.device_count() < w:
        skipped["nccl"] = (f"{w} ranks on {torch.cuda.device_count()} GPU(s): NCCL refuses two ranks on one GPU "
                           "(duplicate GPU detected)")
    else:
        nccl = dist.new_group(backend="nccl")
    timer = Timer(dev, 2 if args.quick else 10, 3 if args.quick else 20)
    cpu_timer = Timer(torch.device("cpu"), 2 if args.quick else 5, 3 if args.quick else 5)
    rows, goal = [], "overhead <= 2 us per call in a graph, <= 5 us eager"
    for op in args.ops.split(","):
        for nbytes in sizes:
            n_in, n_out = _shapes(op, nbytes, w)
            h_in, h_out = ctx.empty(n_in), ctx.empty(n_out)
            h_in.copy_(torch.arange(n_in, dtype=torch.float32) % 7 + rank)
            p_in, p_out = torch.ones(n_in, device=dev), torch.empty(n_out, device=dev)
            row = {"op": op, "bytes": nbytes}
            calls = {"iris_heap": _dist_call(op, h_out, h_in, None), "iris_plain": _dist_call(op, p_out, p_in, None),
                     "ccl": _ccl_call(ctx, op, h_out, h_in)}
            if nccl is not None:
                calls["nccl"] = _dist_call(op, torch.empty(n_out, device=dev), torch.ones(n_in, device=dev), nccl)
            for name, fn in calls.items():
                row[f"{name}_eager_us"] = slowest(timer.eager(fn) * 1e6, gloo)
                g = timer.graph(fn)
                row[f"{name}_graph_us"] = slowest(g * 1e6, gloo) if g is not None else None
            row["backend_host_us"] = slowest(backend_host_us(ctx, op, calls["iris_heap"], timer.calls * 5), gloo)
            c_in, c_out = torch.ones(n_in), torch.empty(n_out)
            row["gloo_eager_us"] = slowest(cpu_timer.eager(_dist_call(op, c_out, c_in, gloo)) * 1e6, gloo)
            for mode in ("eager", "graph"):
                a, b = row.get(f"iris_heap_{mode}_us"), row.get(f"ccl_{mode}_us")
                row[f"overhead_{mode}_us"] = None if a is None or b is None else a - b
            rows.append(row)
            if rank == 0:
                print(f"{op:15s} {nbytes:>10d} B  " + "  ".join(
                    f"{k[:-3]}={v:.1f}" for k, v in row.items() if k.endswith("_us") and v is not None), flush=True)
                path = write_result("torch_backend", {"rows": rows, "skipped": skipped, "dtype": "float32",
                                                      "heap_bytes": heap, "complete": False, "goal": goal}, args.out)
            # the lambdas hold the tensors: drop them all before the next size allocates its own
            del h_in, h_out, p_in, p_out, calls, c_in, c_out
            gc.collect()
            ctx.collect()
    if rank == 0:
        path = write_result("torch_backend", {"rows": rows, "skipped": skipped, "dtype": "float32",
                                              "heap_bytes": heap, "complete": True, "goal": goal}, args.out)
        print(f"wrote {path}", flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
