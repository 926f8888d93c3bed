"""Put and get to a peer reached directly (loads and stores through nvshmem_ptr's mapping) against the
same peer reached indirectly (NVSHMEM's device API), from the same kernel in one run, with NVSHMEM's
host-side stream put (putmem_on_stream) as the reference; then, in a job with indirect peers, ctx.ccl's
all_reduce (4 KiB to 64 MiB) and one all_gather through its put kernel, reaching the peers directly and
indirectly, beside the load/store kernel a job without indirect peers runs; writes every number and the
ratios as JSON.

    IRIS_INDIRECT_PEERS=all python -m iris.run -n 2 benchmarks/indirect.py
    python -m iris.run -n 2 benchmarks/indirect.py --out benchmarks/results/indirect-none-gpu-2ranks.json

With IRIS_INDIRECT_PEERS=all the heap's table has 0 for the peer (indirect) and the benchmark builds
the direct table from nvshmem_ptr; without it the job has no indirect peer, and the JSON records what
the kernel costs then (compile time, whether NVSHMEM is in its code, put times). Rank 0 puts to and
gets from rank 1 (4 KiB to 256 MiB); times are medians of CUDA-event-timed launches. The collectives
run on every rank, each result checked element by element before it is timed; with all ranks on one
GPU their kernels take turns on it, so compare the columns with each other, not with NVLink figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import sync, timed, write_result  # noqa: E402

import iris  # noqa: E402
from iris.ccl import Config, ReduceOp  # noqa: E402
from iris.experimental import nvshmem_runtime  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
BLOCK = 4096


@triton.jit
def copy_kernel(src, dst, n, me, peer, heap_bases, BLOCK: tl.constexpr, PUT: tl.constexpr):
    """Grid-stride loop over whole tiles: PUT writes my src into peer's dst; else reads peer's src into my dst."""
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        o = start + tl.arange(0, BLOCK)
        if PUT:
            iris.put(src + o, dst + o, me, peer, heap_bases)
        else:
            iris.get(src + o, dst + o, me, peer, heap_bases)


def _plans(ctx, kind, out, x, direct, cfg):
    """ctx.ccl's plans of one call shape: its put kernel reaching every peer through the heap's table
    (indirect where the entry is 0) and through the direct table, and the load/store kernel that a job
    without indirect peers runs, on the direct table. Built from ccl's plan builders, outside its cache."""
    ccl, sum_ = ctx.ccl, ReduceOp.SUM

    def build():
        if kind == "ar":
            return ccl._plan_all_reduce(out, x, sum_, cfg)
        return ccl._plan_puts("ag", out, x, None, sum_, cfg, whole=True) if ccl.puts else ccl._plan_pull(
            "ag", out, x, sum_, cfg)

    plans = {"put_indirect": build(), "put_direct": build()}
    ccl.puts = False
    try:
        plans["loadstore_direct"] = build()
    finally:
        ccl.puts = True
    for how in ("put_direct", "loadstore_direct"):
        plan = plans[how]
        plan.args[plan.at["heap_bases"]] = direct
    return plans


def ccl_rows(ctx, direct, sizes, ag_bytes, reps) -> list:
    """all_reduce at each size and one all_gather (ag_bytes per rank), fp32, every rank: each plan's
    result checked element by element, then timed (µs, median of this rank's calls)."""
    me, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    cfg = Config()
    rows = []
    for kind, nbytes in [("ar", b) for b in sizes] + [("ag", ag_bytes)]:
        n = nbytes // 4
        x = ctx.empty(n, dtype=torch.float32)
        x.copy_((torch.arange(n, device=dev) % 1000 + me).float())
        out = torch.empty(n * (w if kind == "ag" else 1), dtype=torch.float32, device=dev)
        if kind == "ar":
            want = (torch.arange(n, device=dev) % 1000).float() * w + w * (w - 1) // 2
        else:
            want = torch.cat([(torch.arange(n, device=dev) % 1000 + q).float() for q in range(w)])
        row = {"collective": "all_reduce" if kind == "ar" else "all_gather", "bytes": nbytes}
        for how, plan in _plans(ctx, kind, out, x, direct, cfg).items():
            out.fill_(float("nan"))
            plan(out, x)
            sync(dev)
            row[f"{how}_exact"] = bool(torch.equal(out, want))
            secs = timed(dev, lambda: plan(out, x), reps=reps)
            row[f"{how}_us"] = statistics.median(secs) * 1e6
            row[f"{how}_kernel"] = plan.fn.__name__
            for t in plan.workspace:  # the plans are outside ccl's cache: give their heap buffers back now
                if ctx.is_symmetric(t):
                    ctx.free(t)
        row["put_indirect_over_put_direct"] = row["put_indirect_us"] / row["put_direct_us"]
        row["put_indirect_over_loadstore"] = row["put_indirect_us"] / row["loadstore_direct_us"]
        rows.append(row)
        if me == 0:
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        ctx.free(x)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-mib", type=int, default=256)
    p.add_argument("--ccl-max-mib", type=int, default=64, help="largest all_reduce; 0 leaves the collectives out")
    p.add_argument("--reps", type=int, default=20, help="timed calls of each collective")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    sizes = [4 * KiB << (2 * i) for i in range(12) if 4 * KiB << (2 * i) <= args.max_mib * MiB]
    # put/get buffers, then a collective's input and its plans' buffers (at most 4x its size each)
    ctx = iris.iris(heap_size=(2 * args.max_mib + 8 * args.ccl_max_mib + 64) * MiB, allocator="nvshmem")
    me, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    peer = 1 - me
    n_max = args.max_mib * MiB // 4
    src = ctx.empty(n_max, dtype=torch.float32)
    dst = ctx.empty(n_max, dtype=torch.float32)
    src.copy_(torch.arange(n_max, device=dev, dtype=torch.float32) + 1000 * me)
    hb = ctx.get_heap_bases()
    base = ctx.heap.alloc.base
    direct = torch.tensor([nvshmem_runtime.peer_ptr(base, r) for r in range(w)], dtype=torch.int64, device=dev)
    tables = {"direct": direct} if hb[peer].item() != 0 else {"direct": hb}
    if hb[peer].item() == 0:
        tables["indirect"] = hb
    grid = (torch.cuda.get_device_properties(dev).multi_processor_count,)
    rows, checks, compile_s, nvshmem_in_code = [], {}, None, None
    ctx.barrier()
    if me == 0:
        stream = torch.cuda.current_stream(dev).cuda_stream
        for nbytes in sizes:
            n = nbytes // 4
            row = {"bytes": nbytes}
            for how, table in tables.items():
                for op, put in (("put", True), ("get", False)):
                    a, b = src, dst  # put: my src into the peer's dst; get: the peer's src into my dst
                    t0 = time.perf_counter()
                    k = copy_kernel[grid](a, b, n, me, peer, table, BLOCK=BLOCK, PUT=put)
                    if compile_s is None:
                        torch.cuda.synchronize()
                        compile_s = time.perf_counter() - t0
                        nvshmem_in_code = "nvshmem" in k.asm["ptx"]
                    secs = timed(dev, lambda: copy_kernel[grid](a, b, n, me, peer, table, BLOCK=BLOCK, PUT=put),
                                 reps=20 if nbytes >= 64 * MiB else 50)
                    row[f"{how}_{op}_us"] = statistics.median(secs) * 1e6
            secs = timed(dev, lambda: (nvshmem_runtime.load()[1].putmem_on_stream(
                dst.data_ptr(), src.data_ptr(), nbytes, peer, stream)), reps=20 if nbytes >= 64 * MiB else 50)
            row["nvshmem_stream_put_us"] = statistics.median(secs) * 1e6
            if "indirect" in tables:
                row["indirect_put_over_direct"] = row["indirect_put_us"] / row["direct_put_us"]
                row["indirect_get_over_direct"] = row["indirect_get_us"] / row["direct_get_us"]
                row["indirect_put_over_nvshmem_stream_put"] = row["indirect_put_us"] / row["nvshmem_stream_put_us"]
            row["GBps"] = {k[:-3]: nbytes / v / 1e3 for k, v in row.items() if k.endswith("_us")}
            rows.append(row)
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items() if k != "GBps"},
                  flush=True)
        # every element of a get of the peer's whole src, through each table
        for how, table in tables.items():
            dst.fill_(-1.0)
            copy_kernel[grid](src, dst, n_max, me, peer, table, BLOCK=BLOCK, PUT=False)
            torch.cuda.synchronize()
            checks[f"{how}_get_exact"] = bool(torch.equal(dst, torch.arange(n_max, device=dev,
                                                                             dtype=torch.float32) + 1000 * peer))
    ctx.barrier()
    collectives = []
    if args.ccl_max_mib and ctx.ccl.puts:  # the job has an indirect peer: ctx.ccl runs its put kernel
        ccl_sizes = [4 * KiB << (2 * i) for i in range(12) if 4 * KiB << (2 * i) <= args.ccl_max_mib * MiB]
        collectives = ccl_rows(ctx, direct, ccl_sizes, MiB, args.reps)
    if me == 0:
        path = write_result("indirect", {
            "indirect_peers": os.environ.get("IRIS_INDIRECT_PEERS", ""),
            "kernel": f"copy_kernel: grid = SM count, tiles of {BLOCK} fp32, iris.put/iris.get per tile",
            "first_launch_s_with_compile": compile_s, "nvshmem_in_kernel_code": nvshmem_in_code,
            "checks": checks, "rows": rows, "collectives": collectives,
            "note": "direct: the peer's heap_bases entry is its nvshmem_ptr mapping; indirect: 0, so the same "
                    "kernel goes through nvshmemx_putmem_block/getmem_block (NVSHMEM's peer-to-peer path: both "
                    "ranks share one GPU). collectives: ctx.ccl's put kernel (iris/ccl/put_kernel.py) on the heap's "
                    "table (put_indirect) and on the nvshmem_ptr table (put_direct), and the load/store kernel of a "
                    "job without indirect peers on the nvshmem_ptr table (loadstore_direct); every rank calls, all "
                    "on one GPU"}, args.out)
        print("wrote", path, flush=True)
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
