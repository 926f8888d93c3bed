"""torch.distributed over the "iris" backend against ctx.ccl called directly (the backend's own cost),
a do-nothing backend (torch's dispatch floor), NCCL and gloo, per collective and size (4 KiB to
256 MiB), eager and replayed from a CUDA graph. Writes JSON after every row.

    python -m iris.run -n 2 benchmarks/torch_backend.py --time-limit 420       # GPUs
    python -m iris.run -n 2 benchmarks/torch_backend.py --quick                # host: 4 KiB and 16 KiB
    python -m iris.run -n 2 benchmarks/torch_backend.py --dispatch-floor       # host: the backend's own host work

The eager overhead, as the goal names it (<= 5 us per call): host time per `dist.X` call over "iris"
on heap tensors minus host time per call of the same ctx.ccl call on the same tensors, both in the same
run, alternating within each sample, garbage collection off, median over samples of (calls
back-to-back) / calls, the slowest rank's (`overhead_eager_us`). The control, `floor_host_us`: the
same `dist.X` on a do-nothing ProcessGroup subclass registered like "iris" (torch's own Python in dist.X,
which every backend pays, NCCL's too). In a graph (<= 2 us): `overhead_graph_us`, device
time per call of the captured dist.X minus the captured ctx.ccl call; and what the graphs hold:
`<row>_graph_nodes`, each graph's nodes by kind, kernels by name (for `graph_calls` calls; read with
cuda-bindings, else `<row>_graph_nodes_error` says why), and `graph_nodes_equal`, whether dist.X's
graph on heap tensors holds the same nodes as ctx.ccl's: a replay then launches the same work, which
the device times cannot show where ranks time-slice one GPU.

Device rows per (op, bytes): "iris_heap" dist.X on heap tensors (zero copy), "iris_plain" on ordinary
tensors (through the staging area), "ccl" ctx.ccl's call on the heap tensors, "nccl" and "gloo" (CPU
tensors) dist.X on groups of those backends; eager times by CUDA events around calls back-to-back
(the host clock without a GPU), graph times per call of a replay of the calls captured in one graph.
NCCL runs only where every rank has its own GPU (it refuses two ranks on one GPU, "duplicate GPU");
the JSON says why a row is missing. Where ranks share one GPU, device times measure the ranks
time-slicing it, not the collective; host times stay per process. Sizes: all_reduce, broadcast,
all_to_all, reduce: the tensor; all_gather: one rank's input; reduce_scatter: one rank's output.

Rows go size by size (every op at 4 KiB, then at 16 KiB, ...), so a run cut short keeps every op's
small sizes; --time-limit stops before a row that would end past it (its estimate: the op's previous
row times the size step; from its second row, as the first includes compiling), and the JSON says
"complete": false and why; --min-bytes resumes such a run at the size it did not reach.

--dispatch-floor: host us per call at 4 KiB with ctx.ccl's call replaced by a no-op: dist.X on the
do-nothing backend and on "iris", that no-op called directly, and each group's method called directly
with the arguments dist.X hands it. This splits the overhead without any kernel: `torch_wrapper_us`
(dist.X on the do-nothing backend minus its method called directly: torch's Python before any backend
code, which every backend, NCCL's too, pays) and `iris_own_us` (iris's method called directly minus
the no-op: the backend's own work).
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
from common import captured, graph_nodes, sync, write_result  # noqa: E402

import iris  # noqa: E402,F401  (registers the backend)
from iris.torch_backend import Options, context  # noqa: E402

warnings.simplefilter("ignore", FutureWarning)
KiB, MiB = 1 << 10, 1 << 20
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")
STEP = 4  # the size ratio between rows
GOAL = "eager overhead (dist.X host time minus ctx.ccl's) <= 5 us per call; in a CUDA graph <= 2 us"
# torch 2.13 renames all_gather_into_tensor and reduce_scatter_tensor (the old names warn per call)
_ALL_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def _shapes(op, nbytes, w):
    """(input elements, output elements) of fp32 for op at nbytes."""
    n = max(w, nbytes // 4 // w * w)
    return {"all_gather": (n, n * w), "reduce_scatter": (n * w, n)}.get(op, (n, n))


def _dist_call(op, out, inp, group):
    if op == "all_reduce":
        return lambda: dist.all_reduce(inp, group=group)
    if op == "all_gather":
        return lambda: _ALL_GATHER(out, inp, group=group)
    if op == "reduce_scatter":
        return lambda: _REDUCE_SCATTER(out, inp, group=group)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(out, inp, group=group)
    if op == "reduce":
        return lambda: dist.reduce(inp, 0, group=group)
    return lambda: dist.broadcast(inp, 0, group=group)


def _method_call(op, out, inp, group):
    """group's method called as dist.X calls it for a Python ProcessGroup (the options, as dist.X fills
    them, made once): dist.X's cost without torch's own Python."""
    if op in ("all_reduce", "reduce_scatter", "reduce"):
        opts = {"all_reduce": dist.AllreduceOptions, "reduce_scatter": dist.ReduceScatterOptions,
                "reduce": dist.ReduceOptions}[op]()
        opts.reduceOp = dist.ReduceOp.SUM
    else:
        opts = {"all_gather": dist.distributed_c10d.AllgatherOptions, "all_to_all": dist.AllToAllOptions,
                "broadcast": dist.BroadcastOptions}[op]()
    if op in ("reduce", "broadcast"):
        opts.rootRank, opts.rootTensor = 0, 0
    opts.asyncOp = False
    if op == "all_reduce":
        return lambda: group.allreduce([inp], opts)
    # each group binds torch's older method names (_allgather_base, ...) to these same functions
    if op == "all_gather":
        return lambda: group.all_gather_single(out, inp, opts)
    if op == "reduce_scatter":
        return lambda: group.reduce_scatter_single(out, inp, opts)
    if op == "all_to_all":
        return lambda: group.all_to_all_single(out, inp, [], [], opts)
    if op == "reduce":
        return lambda: group.reduce([inp], opts)
    return lambda: group.broadcast([inp], opts)


def _ccl_call(ccl, op, out, inp):
    """ctx.ccl's call that dist.X over "iris" makes for these heap tensors (fp32, one dimension)."""
    if op == "all_reduce":
        return lambda: ccl.all_reduce(inp, inp)
    if op == "all_gather":
        return lambda: ccl.all_gather(out, inp)
    if op == "reduce_scatter":
        return lambda: ccl.reduce_scatter(out, inp)
    if op == "all_to_all":
        o2, i2 = out.view(1, -1).view(torch.int32), inp.view(1, -1).view(torch.int32)
        return lambda: ccl.all_to_all(o2, i2)
    if op == "reduce":
        return lambda: ccl.reduce(inp, inp, dst=0)
    return lambda: ccl.broadcast(inp, inp, src=0)


class _Nothing(dist.ProcessGroup):
    """A backend whose collectives do nothing, returning what the cheapest backend can (None where
    torch's caller waits at once): what remains of a dist.X call is torch's dispatch."""

    def __init__(self, rank, size):
        super().__init__(rank, size)
        self._done = _Done()

    def _none(self, opts):
        return self._done if opts is None or opts.asyncOp else None

    def allreduce(self, tensors, opts=None):
        return self._none(opts)

    def _allgather_base(self, output, input, opts=None):
        return self._none(opts)

    def _reduce_scatter_base(self, output, input, opts=None):
        return self._none(opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self._none(opts)

    def broadcast(self, tensors, opts=None):
        return self._none(opts)

    def reduce(self, tensors, opts=None):
        return self._none(opts)

    all_gather_single, reduce_scatter_single, all_to_all_single = _allgather_base, _reduce_scatter_base, alltoall_base

    def getBackendName(self):
        return "nothing"


class _Done(dist.Work):
    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def _nothing_group(dist_options, options):
    return _Nothing(dist_options.group_rank, dist_options.group_size)


def host_us(fns, samples, calls, dev) -> list:
    """Per fn, the median over samples of host microseconds per call of `calls` calls back-to-back.
    The fns alternate within each sample, so load on the machine falls on all alike; the device is
    drained (untimed) before each window, so a window measures launches, not a full queue; garbage
    collection off."""
    for fn in fns:
        fn()
    sync(dev)
    gc.collect()
    gc.disable()
    times = [[] for _ in fns]
    try:
        for _ in range(samples):
            for fn, out in zip(fns, times):
                sync(dev)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                out.append((time.perf_counter() - t0) / calls)
        sync(dev)
    finally:
        gc.enable()
    return [statistics.median(t) * 1e6 for t in times]


class Timer:
    """Device seconds per call: CUDA events around `calls` calls back-to-back (the host clock without a
    GPU), and per call of a replayed graph of `calls` captured calls; medians over samples."""

    def __init__(self, dev, samples, calls):
        self.dev, self.samples, self.calls = dev, samples, calls
        self.gpu = dev.type == "cuda"

    def eager(self, fn, calls=None) -> float:
        calls = calls or self.calls
        fn()
        sync(self.dev)
        times = []
        for _ in range(self.samples):
            if self.gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3 / calls)
            else:
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times.append((time.perf_counter() - t0) / calls)
        return statistics.median(times)

    def graph(self, fn, calls=None):
        """(None, None) without a GPU; else (seconds per captured call, the graph's nodes by kind: see
        common.graph_nodes); what the capture raised, as a string, where it cannot be captured."""
        if not self.gpu:
            return None, None
        calls = calls or self.calls
        try:
            g = captured(fn, calls, keep=True)
        except Exception as e:  # a row records why instead of ending the run
            sync(self.dev)
            return f"{type(e).__name__}: {e}", None
        nodes = graph_nodes(g)
        g.replay()
        sync(self.dev)
        times = []
        for _ in range(self.samples):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3 / calls)
        del g
        return statistics.median(times), nodes


def slowest_row(row, group) -> dict:
    """Every numeric field the slowest rank's (the largest over ranks, field by field); one exchange."""
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row, group=group)
    out = {}
    for k, v in row.items():
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        out[k] = max(vals) if vals and k not in ("bytes",) else v
    return out


def _nothing(ranks=None):
    if "nothing" not in dist.Backend.backend_list:
        dist.Backend.register_backend("nothing", _nothing_group, extended_api=True, devices=["cpu", "cuda"])
    return dist.new_group(ranks, backend="nothing")


def dispatch_floor(ctx, gloo, args) -> int:
    """Host microseconds per call with ctx.ccl's method replaced by a no-op: dist.X on a do-nothing
    backend (torch's dispatch floor for a Python backend), dist.X over "iris" (the floor plus the
    backend's own per-call work), the no-op called as dist.X's would be, and both groups' methods
    called directly as dist.X calls them (without torch's Python); 4 KiB heap tensors. The ranks take
    turns."""
    nothing, iris_group = _nothing(), dist.distributed_c10d._get_default_group()
    rank, w, dev = dist.get_rank(), dist.get_world_size(), ctx.get_device()
    samples, calls = (5, 500) if args.quick else (31, 1000)
    rows = []
    for op in args.ops.split(","):
        nbytes = 4 * KiB
        n_in, n_out = _shapes(op, nbytes, w)
        h_in, h_out = ctx.empty(n_in), ctx.empty(n_out)
        h_in.fill_(1.0)
        setattr(ctx.ccl, op, lambda *a, **k: None)  # an instance attribute over the method, for these calls
        try:
            fns = [_dist_call(op, h_out, h_in, nothing), _dist_call(op, h_out, h_in, None),
                   _ccl_call(ctx.ccl, op, h_out, h_in), _method_call(op, h_out, h_in, nothing),
                   _method_call(op, h_out, h_in, iris_group)]
            # with no kernel the calls do not communicate: the ranks take turns, so that they do not
            # compete for the host's cores with each other
            for turn in range(w):
                dist.barrier(group=gloo)
                if rank == turn:
                    floor, iris_stub, ccl_stub, nothing_direct, iris_direct = host_us(fns, samples, calls, dev)
        finally:
            delattr(ctx.ccl, op)
        row = slowest_row({"op": op, "bytes": nbytes, "nothing_us": floor, "iris_no_kernel_us": iris_stub,
                           "ccl_no_kernel_us": ccl_stub, "overhead_eager_us": iris_stub - ccl_stub,
                           "iris_over_floor_us": iris_stub - floor, "nothing_direct_us": nothing_direct,
                           "torch_wrapper_us": floor - nothing_direct, "iris_direct_us": iris_direct,
                           "iris_own_us": iris_direct - ccl_stub}, gloo)
        rows.append(row)
        if rank == 0:
            print(f"floor {op:15s} {nbytes:>6d} B  " + "  ".join(f"{k[:-3]}={v:.2f}" for k, v in row.items()
                                                              if k.endswith("_us")), flush=True)
        del fns, h_in, h_out
    if rank == 0:
        path = write_result("torch_backend-floor", {
            "rows": rows, "dtype": "float32", "samples": samples, "calls": calls, "goal": GOAL,
            "note": "host us per call, gc off, the slowest rank's median of each field; ctx.ccl's call replaced "
                    "by a no-op in all five, the ranks taking turns: nothing = dist.X on a do-nothing backend "
                    "(torch's dispatch floor), iris_no_kernel = dist.X over iris, ccl_no_kernel = the no-op called "
                    "directly, nothing_direct and iris_direct = each group's method called directly with the "
                    "arguments dist.X hands it (options made once); overhead_eager = iris_no_kernel - "
                    "ccl_no_kernel (the goal's measure without kernels); torch_wrapper = nothing - nothing_direct "
                    "(torch's Python in dist.X before any backend code, which every backend pays); iris_own = "
                    "iris_direct - ccl_no_kernel (the backend's own work, without torch's wrapper)"},
            args.out)
        print(f"wrote {path}", flush=True)
    return 0


def _stop(reason, gloo) -> str | None:
    """Rank 0's reason to stop, told to every rank (they must leave the loop together)."""
    box = [reason]
    dist.broadcast_object_list(box, src=0, group=gloo)
    return box[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON file (rank 0); default benchmarks/results/torch_backend-<gpu|host>-<n>ranks.json")
    p.add_argument("--quick", action="store_true", help="4 KiB and 16 KiB, 2 samples of 3 calls (the host)")
    p.add_argument("--max-bytes", type=int, default=256 * MiB, help="the largest size (default 256 MiB)")
    p.add_argument("--min-bytes", type=int, default=4 * KiB, help="the smallest size (default 4 KiB), to resume a run "
                   "that a time limit stopped")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds from start: no row starts that would end past it (the JSON says so)")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--no-graph", action="store_true", help="eager only")
    p.add_argument("--dispatch-floor", action="store_true",
                   help="host us per call with ctx.ccl's call a no-op: do-nothing backend, iris, the no-op")
    p.add_argument("--spread-from", type=int, default=None,
                   help="bytes from which reduce and broadcast over 3+ ranks on heap tensors spread the work over "
                        "the members (iris.ccl.rooted.SPREAD; above --max-bytes: the forms before it, a control)")
    p.add_argument("--store-reduce-from", type=int, default=None,
                   help="bytes from which a whole-job reduce runs by stores (iris.ccl.rooted.STORE_REDUCE; above "
                        "--max-bytes: the forms before it, a control)")
    args = p.parse_args(argv)
    from iris.ccl import rooted
    if args.spread_from is not None:
        rooted.SPREAD = dict.fromkeys(rooted.SPREAD, args.spread_from)
    if args.store_reduce_from is not None:
        rooted.STORE_REDUCE = args.store_reduce_from
    if not 4 * KiB <= args.min_bytes <= args.max_bytes:
        p.error(f"--min-bytes {args.min_bytes} must be at least {4 * KiB} and at most --max-bytes {args.max_bytes}")
    start = time.perf_counter()
    gpu = torch.cuda.is_available()
    sizes = [4 * KiB, 16 * KiB] if args.quick else [s for s in (4 * KiB * STEP ** k for k in range(9))
                                                     if args.min_bytes <= s <= args.max_bytes]
    top, w_env = max(sizes), int(os.environ.get("WORLD_SIZE", "1"))
    staging = (2 * w_env + 2) * top
    # one size's heap tensors live at a time (freed before the next), but ctx.ccl keeps a plan and its
    # workspace per shape and dtype for the context's life: room for every op's workspaces over the sizes
    # (a geometric series below 2x the largest), twice (the staging area's int32 views make plans of
    # their own), the staging area and the mailbox
    heap = 16 * (w_env + 1) * top + staging + 256 * MiB
    dist.init_process_group("iris", pg_options=Options(heap_size=heap, staging_bytes=staging))
    ctx = context()
    rank, w, dev = dist.get_rank(), dist.get_world_size(), ctx.get_device()
    gloo = dist.new_group(backend="gloo")
    if args.dispatch_floor:
        code = dispatch_floor(ctx, gloo, args)
        dist.barrier(group=gloo)
        dist.destroy_process_group()
        return code
    nothing = _nothing()
    skipped, notes = {}, []
    nccl = None
    if not gpu:
        skipped["nccl"] = "no GPU"
        skipped["graph"] = "no GPU"
        notes.append("host: ctx.ccl's kernels run in Triton's interpreter, so every time is the interpreter's and "
                     "the ranks' spinning on shared cores; --dispatch-floor measures the backend's host work here")
    elif torch.cuda.device_count() < w:
        skipped["nccl"] = (f"{w} ranks on {torch.cuda.device_count()} GPU(s): NCCL refuses two ranks on one GPU "
                           "(duplicate GPU detected)")
        notes.append(f"{w} ranks share {torch.cuda.device_count()} GPU(s): device times (eager and graph) measure "
                     "the ranks time-slicing the GPU, not the collective; host times (host_us, overhead_eager_us) "
                     "are each process's own")
    else:
        nccl = dist.new_group(backend="nccl")
    quick = args.quick or not gpu
    timer = Timer(dev, 2 if quick else 5, 3 if quick else 10)
    host_samples, host_calls = (3, 5) if quick else (7, 20)
    rows, last, done, stopped = [], {}, {}, None
    meta = {"skipped": skipped, "notes": notes, "dtype": "float32", "heap_bytes": heap, "goal": GOAL,
            "time_limit_s": args.time_limit, "host_samples": host_samples, "host_calls": host_calls,
            "device_samples": timer.samples, "device_calls": timer.calls}

    def save(complete):
        if rank == 0:
            return write_result("torch_backend", {"rows": rows, "complete": complete, "stopped": stopped, **meta},
                                args.out)

    for nbytes in sizes:
        for op in args.ops.split(","):
            reason = None
            if rank == 0 and args.time_limit is not None:
                elapsed = time.perf_counter() - start
                # an op's first row includes compiling its kernels: estimates start from its second
                guess = last[op] * STEP if done.get(op, 0) >= 2 else 0.0
                if elapsed + guess > args.time_limit:
                    reason = (f"time limit {args.time_limit:.0f} s: {elapsed:.0f} s elapsed and {op} at {nbytes} B "
                              f"was estimated at {guess:.0f} s")
            stopped = _stop(reason, gloo)
            if stopped:
                break
            t_row = time.perf_counter()
            rows.append(measure(op, nbytes, ctx, nothing, nccl, gloo, timer, host_samples, host_calls, args))
            last[op] = time.perf_counter() - t_row
            done[op] = done.get(op, 0) + 1
            rows[-1]["row_s"] = round(last[op], 2)
            if rank == 0:
                print(f"{op:15s} {nbytes:>10d} B  " + "  ".join(
                    f"{k[:-3]}={v:.1f}" for k, v in rows[-1].items() if k.endswith("_us") and isinstance(v, float)),
                    flush=True)
            save(False)
        if stopped:
            break
    path = save(stopped is None)
    if rank == 0:
        print(f"wrote {path}" + (f" (stopped: {stopped})" if stopped else ""), flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    return 0


def measure(op, nbytes, ctx, nothing, nccl, gloo, timer, host_samples, host_calls, args) -> dict:
    """One row: host times (iris, ccl, the floor; plain tensors for scale), device times eager and in a
    graph, gloo's; the slowest rank's of each."""
    rank, w, dev = dist.get_rank(), dist.get_world_size(), ctx.get_device()
    n_in, n_out = _shapes(op, nbytes, w)
    h_in, h_out = ctx.empty(n_in), ctx.empty(n_out)
    h_in.copy_(torch.arange(n_in, dtype=torch.float32) % 7 + rank)
    p_in, p_out = torch.ones(n_in, device=dev), torch.empty(n_out, device=dev)
    row = {"op": op, "bytes": nbytes}
    calls = {"iris_heap": _dist_call(op, h_out, h_in, None), "iris_plain": _dist_call(op, p_out, p_in, None),
             "ccl": _ccl_call(ctx.ccl, op, h_out, h_in)}
    host = host_us([calls["iris_heap"], calls["ccl"], _dist_call(op, h_out, h_in, nothing), calls["iris_plain"]],
                   host_samples, host_calls, dev)
    row.update(zip(("iris_heap_host_us", "ccl_host_us", "floor_host_us", "iris_plain_host_us"), host))
    if nccl is not None:
        calls["nccl"] = _dist_call(op, torch.empty(n_out, device=dev), torch.ones(n_in, device=dev), nccl)
    # fewer calls for large sizes: every call moves the whole size
    reps = max(2, min(timer.calls, (64 * MiB) // nbytes))
    for name, fn in calls.items():
        row[f"{name}_eager_us"] = timer.eager(fn, reps) * 1e6
        if not args.no_graph:
            g, nodes = timer.graph(fn, reps)
            if isinstance(g, str):
                row[f"{name}_graph_error"] = g
            elif g is not None:
                row[f"{name}_graph_us"] = g * 1e6
                row["graph_calls"] = reps
                row[f"{name}_graph_nodes" if isinstance(nodes, dict) else f"{name}_graph_nodes_error"] = nodes
    c_in, c_out = torch.ones(n_in), torch.empty(n_out)
    gloo_timer = Timer(torch.device("cpu"), max(1, min(5, (256 * MiB) // nbytes)), max(1, min(5, (64 * MiB) // nbytes)))
    row["gloo_eager_us"] = gloo_timer.eager(_dist_call(op, c_out, c_in, gloo)) * 1e6
    # each rank's own differences, then the slowest rank's of every field
    row["overhead_eager_us"] = row["iris_heap_host_us"] - row["ccl_host_us"]
    row["iris_over_floor_us"] = row["overhead_eager_us"] - row["floor_host_us"]
    a, b = row.get("iris_heap_graph_us"), row.get("ccl_graph_us")
    if a is not None and b is not None:
        row["overhead_graph_us"] = a - b
    # the same nodes (kinds, kernels by name) in both graphs: a replay of dist.X launches ctx.ccl's work
    # and nothing else, which the device times cannot show where ranks time-slice one GPU
    a, b = row.get("iris_heap_graph_nodes"), row.get("ccl_graph_nodes")
    if a is not None and b is not None:
        row["graph_nodes_equal"] = a == b
    row = slowest_row(row, gloo)
    # the lambdas hold the tensors: drop them all before the next size allocates its own
    del h_in, h_out, p_in, p_out, calls, c_in, c_out
    gc.collect()
    ctx.collect()
    return row


if __name__ == "__main__":
    sys.exit(main())
