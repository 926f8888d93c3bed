"""What device tracing costs. Two measures, one run:

- compiled code: a kernel using DeviceContext methods (tracing off) and the same kernel written with
  the module functions are compiled for one GPU architecture, disassembled with nvdisasm, and their
  SASS compared instruction by instruction (the tracing constexpr must leave nothing behind);
- time (GPU only, one rank): the two kernels, the context kernel compiled with tracing=True but
  tracing not enabled (the event counter still counts), and with tracing enabled (every operation
  recorded), each over a buffer of --n int32, median of --rounds rounds of --reps launches.

    python benchmarks/tracing_cost.py [--arch 90] [--n 16777216] [--sass-only] [--out FILE]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels, also on a machine without a GPU (--sass-only)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_result  # noqa: E402

import iris  # noqa: E402

OPS = ("load", "store", "put", "get", "copy", "atomic_add", "atomic_cas")


@triton.jit
def with_context(context, buf, out, flags, n, rank: tl.constexpr, world: tl.constexpr, BLOCK: tl.constexpr,
                 TRACING: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world, tracing=TRACING)
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    peer = (rank + 1) % world
    x = ctx.load(buf + o, peer, mask=m)
    ctx.store(buf + o, x + 1, peer, mask=m)
    ctx.put(buf + o, out + o, peer, mask=m)
    ctx.get(buf + o, out + o, peer, mask=m)
    ctx.copy(buf + o, out + o, rank, peer, mask=m)
    old = ctx.atomic_add(flags + o, 1, peer, mask=m, sem="release", scope="gpu")
    tl.store(out + o, old + ctx.atomic_cas(flags, 0, 0, peer), mask=m)


@triton.jit
def with_functions(context, buf, out, flags, n, rank: tl.constexpr, world: tl.constexpr, BLOCK: tl.constexpr,
                   TRACING: tl.constexpr):
    hb = context + 2
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    peer = (rank + 1) % world
    x = iris.load(buf + o, rank, peer, hb, mask=m)
    iris.store(buf + o, x + 1, rank, peer, hb, mask=m)
    iris.put(buf + o, out + o, rank, peer, hb, mask=m)
    iris.get(buf + o, out + o, rank, peer, hb, mask=m)
    iris.copy(buf + o, out + o, rank, peer, rank, hb, mask=m)
    old = iris.atomic_add(flags + o, 1, rank, peer, hb, mask=m, sem="release", scope="gpu")
    tl.store(out + o, old + iris.atomic_cas(flags, 0, 0, rank, peer, hb), mask=m)


def _nvdisasm() -> str:
    here = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    return here if os.path.exists(here) else "nvdisasm"


def sass(fn, arch: int, tracing: bool) -> list:
    """fn's SASS instructions (addresses and encodings dropped) for sm_{arch}, rank 0 of 2, BLOCK 1024."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig = {"context": "*i64", "buf": "*i32", "out": "*i32", "flags": "*i32", "n": "i32", "rank": "constexpr",
           "world": "constexpr", "BLOCK": "constexpr", "TRACING": "constexpr"}
    src = ASTSource(fn=fn, signature=sig, constexprs={"rank": 0, "world": 2, "BLOCK": 1024, "TRACING": tracing})
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([_nvdisasm(), "-c", f.name], capture_output=True, text=True, check=True).stdout
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s*([^;]*;)", text)]


def compare_sass(arch: int) -> dict:
    ctx_code, fn_code = sass(with_context, arch, False), sass(with_functions, arch, False)
    traced = sass(with_context, arch, True)
    return {"arch": f"sm_{arch}", "triton": triton.__version__, "identical": ctx_code == fn_code,
            "instructions_context": len(ctx_code), "instructions_functions": len(fn_code),
            "instructions_context_traced": len(traced),
            "first_difference": next((i for i, (a, b) in enumerate(zip(ctx_code, fn_code)) if a != b), None)}


def timing(n: int, reps: int, rounds: int) -> dict:
    ctx = iris.iris(heap_size=4 * n * 4 + (64 << 20))
    dev = ctx.get_device()
    buf = ctx.arange(n, dtype=torch.int32)
    out = ctx.zeros(n, dtype=torch.int32)
    flags = ctx.zeros(n, dtype=torch.int32)
    block = 1024
    grid = (triton.cdiv(n, block),)
    context = ctx.get_device_context()
    events_per_launch = grid[0] * len(OPS)

    def launch(fn, tracing):
        return lambda: fn[grid](context, buf, out, flags, n, 0, 1, block, tracing)

    cases = {"functions": launch(with_functions, False), "context": launch(with_context, False),
             "context_tracing_compiled_not_enabled": launch(with_context, True)}
    per_round = {name: [] for name in [*cases, "context_tracing_enabled"]}
    for case in cases.values():
        case()
    torch.cuda.synchronize(dev)

    def run(case):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            case()
        end.record()
        torch.cuda.synchronize(dev)
        return start.elapsed_time(end) / reps

    for _ in range(rounds):  # interleaved, so every case sees the same clocks and load
        for name, case in cases.items():
            per_round[name].append(run(case))
    ctx.tracing.enable(max_events=events_per_launch * reps)  # from here on the traced kernel records
    for _ in range(rounds):
        ctx.tracing.reset()
        per_round["context_tracing_enabled"].append(run(cases["context_tracing_compiled_not_enabled"]))
    recorded = ctx.tracing.recorded()
    ms = {name: statistics.median(v) for name, v in per_round.items()}
    result = {"n_int32": n, "block": block, "programs": grid[0], "ops_per_program": list(OPS), "reps": reps,
              "rounds": rounds, "median_ms_per_launch": ms, "rounds_ms": per_round,
              "events_recorded_last_round": recorded, "events_expected_per_round": events_per_launch * reps,
              "ratio_to_functions": {name: ms[name] / ms["functions"] for name in ms}}
    ctx.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=None, help="sm_XX to compile for (default: this GPU, else 90)")
    parser.add_argument("--n", type=int, default=1 << 24)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sass-only", action="store_true", help="compare compiled code only (no GPU needed)")
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    arch = opts.arch
    if arch is None:
        major, minor = torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)
        arch = major * 10 + minor
    payload = {"sass": compare_sass(arch)}
    print(json.dumps(payload["sass"]), flush=True)
    if not opts.sass_only and torch.cuda.is_available():
        payload["timing"] = timing(opts.n, opts.reps, opts.rounds)
        print(json.dumps(payload["timing"]["median_ms_per_launch"]), flush=True)
    path = write_result("tracing_cost", payload, opts.out)
    print(f"wrote {path}")
    return 0 if payload["sass"]["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
