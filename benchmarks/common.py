"""What every benchmark shares: the job's process group, the device's name, and the JSON record."""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time

import torch
import torch.distributed as dist

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def nccl_unusable(world: int | None = None) -> str | None:
    """Why NCCL cannot serve this job's references here, or None: it refuses two ranks on one GPU
    ("Duplicate GPU detected"), which is how iris runs several ranks on a single GPU."""
    if not torch.cuda.is_available():
        return "no GPU"
    world = world or int(os.environ.get("IRIS_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    gpus = torch.cuda.device_count()
    return None if world <= gpus else f"NCCL needs a GPU per rank; {world} ranks share {gpus} GPU(s)"


def init_torch_distributed(backend: str | None = None) -> tuple[int, int]:
    """A torch process group over the ranks iris.run (or torchrun) started: backend, else NCCL on GPUs
    (gloo where ranks share a GPU, see nccl_unusable) and gloo on the host."""
    if not dist.is_initialized():
        rank = int(os.environ.get("IRIS_RANK", os.environ.get("RANK", 0)))
        world = int(os.environ.get("IRIS_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        if torch.cuda.is_available():
            torch.cuda.set_device(rank % torch.cuda.device_count())
        backend = backend or ("nccl" if not nccl_unusable(world) else "gloo")
        kwargs = {"device_id": torch.device("cuda", rank % torch.cuda.device_count())} if backend == "nccl" else {}
        dist.init_process_group(backend, rank=rank, world_size=world, **kwargs)
    return dist.get_rank(), dist.get_world_size()


def device_name() -> str:
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return f"{n}x {torch.cuda.get_device_name(0)}"
    return f"host CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def command_line() -> str:
    """The command line as typed: the launcher too, where iris.run or torchrun started the ranks."""
    launcher = (f"python -m iris.run -n {os.environ['IRIS_WORLD_SIZE']} " if "IRIS_RANK" in os.environ
                else f"torchrun --nproc-per-node {os.environ['WORLD_SIZE']} " if "LOCAL_RANK" in os.environ
                else "python ")
    return launcher + " ".join(sys.argv)


def write_result(name: str, payload: dict, out: str | None = None) -> str:
    """Write payload with the device, the date and the command to benchmarks/results/ (or out)."""
    record = {
        "benchmark": name,
        "device": device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
        "world_size": dist.get_world_size() if dist.is_initialized() else int(os.environ.get("IRIS_WORLD_SIZE", 1)),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        **payload,
    }
    slug = "gpu" if torch.cuda.is_available() else "host"
    path = out or os.path.join(RESULTS, f"{name}-{slug}-{record['world_size']}ranks.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    return path


RANK_CHECK_HELP = ("both: the benchmark as two jobs of this job's size, one with iris's rank check compiled in "
                   "(IRIS_RANK_CHECK=1) and one without (0), and one JSON with both runs and their ratios; otherwise "
                   "IRIS_RANK_CHECK decides (on by default)")
WAIT_BOUND_HELP = ("both: the benchmark as two jobs of this job's size, one with every device wait bounded "
                   "(IRIS_SPIN_LIMIT at its default) and one with the bound compiled out (0), and one JSON with both "
                   "runs and their ratios; otherwise IRIS_SPIN_LIMIT decides")
# --rank-check / --wait-bound both: (the environment variable, its value in the run "on", in the run "off")
BOTH = {"rank_check": ("IRIS_RANK_CHECK", "1", "0"), "wait_bound": ("IRIS_SPIN_LIMIT", None, "0")}


def both_ways(script: str, argv: list, out: str | None, name: str, what: str) -> int:
    """--rank-check both, --wait-bound both (what: a key of BOTH). Both are read when kernels compile or a
    context is made, so each value is a job of its own: rank 0 of this job (or a plain
    process, as 2 ranks) starts `python -m iris.run` twice, with the variable's value on and off and the
    same options, then writes one JSON with both records and, for every figure they share, on / off.
    The other ranks return at once."""
    import subprocess
    import tempfile

    from iris import settings
    from iris.cli.bench import free_port
    if int(os.environ.get("IRIS_RANK", os.environ.get("RANK", "0"))) != 0:
        return 0
    var, on, off = BOTH[what]
    flag = "--" + what.replace("_", "-")
    world = int(os.environ.get("IRIS_WORLD_SIZE", os.environ.get("WORLD_SIZE", "2")))
    launched = {s.name for s in (settings.RANK, settings.WORLD_SIZE, settings.LOCAL_RANK, settings.SOCKET_DIR,
                                 settings.JOB_SECRET)} | {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                          "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK"}
    env = {k: v for k, v in os.environ.items() if k not in launched and not k.startswith("TORCHELASTIC")}
    env.pop(var, None)
    rest, skip = [], False
    for a in argv:  # this run's flag and --out are the driver's
        if skip or a in (flag, "--out") or a.startswith((flag + "=", "--out=")):
            skip = a in (flag, "--out")
            continue
        rest.append(a)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        # beside out while the job runs: a job stopped halfway (a timeout) leaves the finished run's JSON
        halves = {label: (os.path.splitext(out)[0] if out else os.path.join(tmp, name)) + f"-{what}-{label}.json"
                  for label in ("on", "off")}
        for label, value in (("on", on), ("off", off)):
            cmd = [sys.executable, "-m", "iris.run", "-n", str(world), script, *rest, "--out", halves[label]]
            print(f"{what} {label}: {' '.join(cmd[1:])}", flush=True)
            run_env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            if value is not None:  # None: the default
                run_env[var] = value
            code = subprocess.call(cmd, env=run_env)
            if code:
                return code
            with open(halves[label]) as f:
                runs[label] = json.load(f)
        for path in halves.values():
            os.remove(path)
    ratios = _ratios(runs["on"], runs["off"])
    path = write_result(f"{name}_{what}", {"ranks": world, f"{what}_on": runs["on"], f"{what}_off": runs["off"],
                                           "on_over_off": ratios}, out)
    print(f"{what} on / off: {len(ratios)} figures, median {_median(ratios.values()):.3f}; wrote {path}")
    return 0


def _ratios(on, off, at: str = "") -> dict:
    """on / off for every timing or rate the two records share (keys ending _s, _us or _GBps), by path."""
    out = {}
    if isinstance(on, dict) and isinstance(off, dict):
        for k in on.keys() & off.keys():
            out.update(_ratios(on[k], off[k], f"{at}.{k}" if at else k))
    elif isinstance(on, list) and isinstance(off, list):
        for i, (a, b) in enumerate(zip(on, off)):
            out.update(_ratios(a, b, f"{at}[{i}]"))
    elif isinstance(on, (int, float)) and isinstance(off, (int, float)) and not isinstance(on, bool) and off \
            and at.endswith(("_s", "_us", "_GBps")):
        out[at] = on / off
    return out


def _median(values) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else float("nan")


def batched(fn, reps: int, batch: int = 25) -> list:
    """Per-call seconds of fn, one figure per batch of `batch` calls (so the timer's own cost is
    spread over the batch instead of added to each call)."""
    clock, out = time.perf_counter, []
    for _ in range(max(1, reps // batch)):
        t0 = clock()
        for _ in range(batch):
            fn()
        out.append((clock() - t0) / batch)
    return out


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(dev, fn, reps: int, warmup: int = 2) -> list:
    """Seconds of each of reps calls of fn, timed on the device."""
    for _ in range(warmup):
        fn()
    sync(dev)
    if dev.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(dev)
        return [start.elapsed_time(end) / 1e3 for start, end in events]
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def captured(fn, calls: int = 1, keep: bool = False) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` calls of fn, after one call on a side stream (compiles and allocates).
    keep: the graph also keeps its cudaGraph_t, for graph_nodes (where torch can: CUDAGraph.raw_cuda_graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    keep = keep and hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph")
    graph = torch.cuda.CUDAGraph(keep_graph=True) if keep else torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    if keep:
        graph.instantiate()  # a kept graph is otherwise instantiated by its first replay
    return graph


def graph_nodes(graph) -> dict | str:
    """The nodes of a graph made by captured(..., keep=True), counted by kind, kernels by their name
    ({"kernel:name": n, "memcpy": m, ...}): two graphs that launch the same work count alike. A string
    says why they cannot be read (no raw_cuda_graph in this torch, no cuda-bindings, the graph not
    kept)."""
    raw = getattr(graph, "raw_cuda_graph", None)
    if raw is None:
        return f"no CUDAGraph.raw_cuda_graph (torch {torch.__version__}) to read the graph's nodes"
    try:
        from cuda.bindings import driver
    except ImportError as e:
        return f"cuda-bindings cannot be imported to read the graph's nodes ({e})"

    def ok(result):
        err, *values = result
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(getattr(err, "name", str(err)))
        return values

    try:
        handle = driver.CUgraph(raw())
        _, count = ok(driver.cuGraphGetNodes(handle, 0))
        nodes, _ = ok(driver.cuGraphGetNodes(handle, count)) if count else ([], 0)
        kinds = {}
        for node in nodes:
            (kind,) = ok(driver.cuGraphNodeGetType(node))
            key = kind.name.removeprefix("CU_GRAPH_NODE_TYPE_").lower()
            if kind == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                try:
                    (params,) = ok(driver.cuGraphKernelNodeGetParams(node))
                    (name,) = ok(driver.cuFuncGetName(params.func))
                    key += ":" + (name.decode() if isinstance(name, bytes) else str(name))
                except Exception:  # the kind alone where the kernel's name cannot be read
                    pass
            kinds[key] = kinds.get(key, 0) + 1
        return dict(sorted(kinds.items()))
    except Exception as e:  # a row records why instead of ending the run
        return f"{type(e).__name__}: {e}"
