"""Put and get to a peer reached directly (loads and stores through nvshmem_ptr's mapping) against the
same peer reached indirectly (NVSHMEM's device API), from the same kernel in one run, with NVSHMEM's
host-side stream put (putmem_on_stream) as the reference; writes every number and the ratios as JSON.

    IRIS_INDIRECT_PEERS=all python -m iris.run -n 2 benchmarks/indirect.py
    python -m iris.run -n 2 benchmarks/indirect.py --out benchmarks/results/indirect-none-gpu-2ranks.json

With IRIS_INDIRECT_PEERS=all the heap's table has 0 for the peer (indirect) and the benchmark builds
the direct table from nvshmem_ptr; without it the job has no indirect peer, and the JSON records what
the kernel costs then (compile time, whether NVSHMEM is in its code, put times). Rank 0 puts to and
gets from rank 1 (4 KiB to 256 MiB); times are medians of CUDA-event-timed launches.
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
from common import timed, write_result  # noqa: E402

import iris  # noqa: E402
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-mib", type=int, default=256)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    sizes = [4 * KiB << (2 * i) for i in range(12) if 4 * KiB << (2 * i) <= args.max_mib * MiB]
    ctx = iris.iris(heap_size=2 * args.max_mib * MiB + 64 * MiB, allocator="nvshmem")
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
    if me == 0:
        path = write_result("indirect", {
            "indirect_peers": os.environ.get("IRIS_INDIRECT_PEERS", ""),
            "kernel": f"copy_kernel: grid = SM count, tiles of {BLOCK} fp32, iris.put/iris.get per tile",
            "first_launch_s_with_compile": compile_s, "nvshmem_in_kernel_code": nvshmem_in_code,
            "checks": checks, "rows": rows,
            "note": "direct: the peer's heap_bases entry is its nvshmem_ptr mapping; indirect: 0, so the same "
                    "kernel goes through nvshmemx_putmem_block/getmem_block (NVSHMEM's peer-to-peer path: both "
                    "ranks share one GPU)"}, args.out)
        print("wrote", path, flush=True)
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
