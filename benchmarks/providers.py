"""Providers side by side, in one run on one GPU (2 ranks share it, as iris.spawn starts them).

Allocation: ctx.empty + ctx.free per allocator (torch, vmem, nvshmem) against torch.empty + del;
nvshmem4py's buffer + free and nvshmem_malloc + free (collective); torch's symm_mem.empty +
rendezvous (its CUDA backend refuses two ranks on one GPU, so it is measured on a group of one
rank each, and the refusal of the two-rank group is recorded).
Bandwidth: iris.put and iris.get (rank 0 writes rank 1's copy / reads it) from 4 KiB to 256 MiB
over each allocator's memory, against the copy engine (torch copy_ on the same GPU), each timed as
a CUDA graph of back-to-back calls (device time, not Python launch cost). With both
ranks on one GPU a "remote" copy is a copy within one GPU's memory: the figures compare
allocators, not links.

python benchmarks/providers.py [--out PATH] [--quick] [--allocators torch,vmem,nvshmem]
    [--alloc-sizes 67108864,4096,...]   (allocation only, in that order, with the cost of the view alone)
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import traceback

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import iris  # noqa: E402
from benchmarks.common import RESULTS, write_result  # noqa: E402

ALLOCATORS = ("torch", "vmem", "nvshmem")
SIZES = [4 << 10 << (2 * i) for i in range(9)]  # 4 KiB .. 256 MiB, x4
ALLOC_SIZES = [4 << 10, 1 << 20, 64 << 20]


@triton.jit
def _copy(src, dst, n, me, peer, hb, BLOCK: tl.constexpr, PUT: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    if PUT:
        iris.put(src + o, dst + o, me, peer, hb, mask=m)
    else:
        iris.get(src + o, dst + o, me, peer, hb, mask=m)


def per_call_us(fn, reps: int, batches: int = 5) -> float:
    """Median over batches of the mean host time of one call."""
    out = []
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t) / reps * 1e6)
    return statistics.median(out)


def device_seconds(fn, reps: int) -> float:
    """Device time of one call: reps calls captured in one CUDA graph, the best of 3 replays. A
    replay launches them with no host work between, so small copies are not timed as Python launches."""
    fn()
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / reps)
    return best


def alloc_costs(ctx, reps: int, sizes=ALLOC_SIZES) -> dict:
    """Per size (a repeated size gets a '#k' suffix): ctx.empty + ctx.free, torch.empty + del, and
    the view alone (a tensor made over the block's address, no allocation)."""
    from iris.heap.views import tensor_at
    dev = ctx.get_device()
    out = {}
    for n in sizes:
        key = str(n)
        while key in out:
            key += "#"
        held = ctx.empty(n, dtype=torch.uint8)
        address = held.data_ptr()
        def heap():
            ctx.free(ctx.empty(n, dtype=torch.uint8))

        def plain():
            t = torch.empty(n, dtype=torch.uint8, device=dev)
            del t
        ctx.barrier()
        iris_us = per_call_us(heap, reps)
        ctx.barrier()
        torch_us = per_call_us(plain, reps)
        view_us = per_call_us(lambda: tensor_at(address, (n,), torch.uint8, dev), reps)
        ctx.free(held)
        out[key] = {"ctx_empty_free_us": round(iris_us, 3), "torch_empty_del_us": round(torch_us, 3),
                    "ratio": round(iris_us / torch_us, 2), "view_only_us": round(view_us, 3)}
    return out


def bandwidth(ctx, sizes, reps_for) -> dict:
    me, hb = ctx.get_rank(), ctx.get_heap_bases()
    big = max(sizes) // 4
    src, dst = ctx.empty(big, dtype=torch.float32), ctx.empty(big, dtype=torch.float32)
    src.copy_(torch.arange(big, dtype=torch.float32, device=src.device) + 1000 * me)
    out = {}
    for nbytes in sizes:
        n, row = nbytes // 4, {}
        for kind in ("put", "get"):
            dst.fill_(-1.0)
            ctx.barrier()
            if me == 0:  # put: 0's src into 1's dst; get: 1's src into 0's dst
                block = 4096 if n >= 4096 else triton.next_power_of_2(n)
                grid = (triton.cdiv(n, block),)
                launch = lambda: _copy[grid](src, dst, n, 0, 1, hb, BLOCK=block, PUT=kind == "put", num_warps=8)  # noqa: E731
                row[kind + "_gbps"] = round(nbytes / device_seconds(launch, reps_for(nbytes)) / 1e9, 1)
            ctx.barrier()
            receiver = 1 if kind == "put" else 0
            if me == receiver:  # every element of the last copy, and nothing past it
                want = torch.arange(n, dtype=torch.float32, device=dst.device) + 1000 * (1 - receiver)
                ok = torch.equal(dst[:n], want) and (n == big or bool((dst[n:n + 1024] == -1).all()))
                row[kind + "_checked"] = ok
            ctx.barrier()
        if me == 0:
            a, b = torch.empty_like(src[:n]), torch.empty_like(src[:n])
            row["copy_engine_gbps"] = round(nbytes / device_seconds(lambda: b.copy_(a), reps_for(nbytes)) / 1e9, 1)
        out[str(nbytes)] = row
    ctx.free(dst)
    ctx.free(src)
    return out


def nvshmem_costs(reps: int) -> dict:
    import nvshmem.core as nc
    from iris.experimental import nvshmem_runtime as rt
    out = {}
    for n in ALLOC_SIZES:
        rt.barrier_all()
        us_core = per_call_us(lambda: nc.free(nc.buffer(n)), reps, 3)
        rt.barrier_all()
        us_raw = per_call_us(lambda: rt.free(rt.malloc(n)), reps, 3)
        out[str(n)] = {"nvshmem4py_buffer_free_us": round(us_core, 1), "nvshmem_malloc_free_us": round(us_raw, 1)}
    return out


def torch_symm_costs(port: int, reps: int) -> dict:
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    rank, world = int(os.environ["IRIS_RANK"]), int(os.environ["IRIS_WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out = {"backend": None}
    try:
        try:
            out["backend"] = str(symm_mem.get_backend(torch.device("cuda", 0)))
        except Exception as e:  # older torch: no get_backend
            out["backend"] = f"unknown ({type(e).__name__})"
        try:
            t = symm_mem.empty(1024, device="cuda")
            symm_mem.rendezvous(t, group=dist.group.WORLD)
            out["two_ranks_one_gpu"] = "works"
        except RuntimeError as e:
            out["two_ranks_one_gpu"] = f"refused: {str(e).splitlines()[0]}"
        alone = [dist.new_group([r]) for r in range(world)][rank]
        for n in ALLOC_SIZES:
            def once():
                t = symm_mem.empty(n, dtype=torch.uint8, device="cuda")
                symm_mem.rendezvous(t, group=alone)
            out[str(n)] = {"symm_mem_empty_rendezvous_us_1rank_group": round(per_call_us(once, reps, 3), 1)}
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()
    return out


def rank_main(quick: bool, port: int, alloc_sizes=None, allocators=ALLOCATORS) -> dict:
    reps = 200 if quick else 2000
    sizes = SIZES[:4] if quick else SIZES
    reps_for = (lambda nbytes: 5) if quick else (lambda nbytes: max(10, min(200, (4 << 30) // nbytes)))
    res = {"allocators": {}}
    for name in allocators:
        ctx = iris.iris(heap_size=2 * max(sizes) + (128 << 20), allocator=name)  # whole 2 MiB chunks
        try:
            if alloc_sizes:  # allocation only, sizes in the order given
                res["allocators"][name] = {"alloc": alloc_costs(ctx, reps, alloc_sizes)}
                continue
            res["allocators"][name] = {"alloc": alloc_costs(ctx, reps), "bandwidth": bandwidth(ctx, sizes, reps_for)}
        except Exception:
            res["allocators"][name] = {"error": traceback.format_exc()[-1500:]}
        finally:
            gc.collect()
            ctx.close()
    if alloc_sizes:
        return res
    try:
        res["nvshmem4py"] = nvshmem_costs(10 if quick else 50)
    except Exception:
        res["nvshmem4py"] = {"error": traceback.format_exc()[-1500:]}
    res["torch_symm_mem"] = torch_symm_costs(port, 5 if quick else 20)
    return res


def summary(r: dict) -> dict:
    """The goals: nvshmem's ctx.empty + ctx.free against torch.empty + del; put over nvshmem against vmem."""
    a = r["allocators"]
    out = {"alloc_ratio_to_torch_empty": {k: {s: v["ratio"] for s, v in a[k]["alloc"].items()}
                                          for k in a if "alloc" in a[k]}}
    if "bandwidth" in a.get("nvshmem", {}) and "bandwidth" in a.get("vmem", {}):
        out["put_nvshmem_over_vmem"] = {s: round(a["nvshmem"]["bandwidth"][s]["put_gbps"] /
                                                 a["vmem"]["bandwidth"][s]["put_gbps"], 3)
                                        for s in a["vmem"]["bandwidth"]}
        out["get_nvshmem_over_vmem"] = {s: round(a["nvshmem"]["bandwidth"][s]["get_gbps"] /
                                                 a["vmem"]["bandwidth"][s]["get_gbps"], 3)
                                        for s in a["vmem"]["bandwidth"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="few sizes and repetitions: a smoke run")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS), help="comma-separated, of " + ", ".join(ALLOCATORS))
    ap.add_argument("--alloc-sizes", default=None,
                    help="comma-separated byte counts: time only ctx.empty + ctx.free, in this order")
    ap.add_argument("--world", type=int, default=2, help="ranks, with --alloc-sizes (1: no other rank shares the "
                    "host and GPU while allocation is timed)")
    args = ap.parse_args()
    if args.world != 2 and not args.alloc_sizes:
        ap.error("--world other than 2 needs --alloc-sizes (bandwidth runs rank 0 against rank 1)")
    alloc_sizes = [int(x) for x in args.alloc_sizes.split(",")] if args.alloc_sizes else None
    allocators = tuple(args.allocators.split(","))
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    per_rank = iris.spawn(rank_main, args.world, args=(args.quick, port, alloc_sizes, allocators), timeout=590)
    r = per_rank[0]
    if alloc_sizes:
        path = write_result("providers", {"world_size": args.world, "ranks_per_gpu": args.world, "alloc_only": per_rank},
                            args.out or os.path.join(RESULTS, f"providers-alloc-gpu-{args.world}ranks.json"))
        print(path)
        for name in allocators:
            print(name, [(k, v["ratio"], v["view_only_us"]) for r_ in per_rank for k, v in r_["allocators"][name]["alloc"].items()])
        return
    for name in ALLOCATORS:  # the other rank's allocation figures, and its check of what it received
        r["allocators"][name]["rank1"] = per_rank[1]["allocators"][name]
    payload = {"world_size": 2, "ranks_per_gpu": 2, "results": r, "summary": summary(r), "nvshmem4py_rank1": per_rank[1].get("nvshmem4py"),
               "torch_symm_mem_rank1": per_rank[1].get("torch_symm_mem")}
    path = write_result("providers", payload, args.out or os.path.join(RESULTS, "providers-gpu-2ranks.json"))
    print(path)
    import json
    print(json.dumps(payload["summary"], indent=1))


if __name__ == "__main__":
    main()
