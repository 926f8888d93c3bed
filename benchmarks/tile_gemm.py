"""The GEMM that reduces its own tiles through the device tile API against matmul, then a collective.

    python -m iris.run -n 2 benchmarks/tile_gemm.py                      # M = 512..8192, JSON to results/
    python -m iris.run -n 2 benchmarks/tile_gemm.py --ms 512 --nk 2048   # a quick check
    python -m iris.run -n 2 benchmarks/tile_gemm.py --dry-run            # tiny sizes on the host

Row-parallel layer, bf16: every rank holds A_r (M x K/world) and B_r (K/world x N), N = K = 8192
by default; the result is the sum over ranks, on every rank (all-reduce) or this rank's M/world rows
(reduce-scatter). ctx.ops.matmul_all_reduce / matmul_reduce_scatter with FusedConfig(variant="tiles")
(each all_reduce_variant the tile API has) against torch.matmul followed by ctx.ccl.all_reduce
(reduce_scatter), and by NCCL's all_reduce (reduce_scatter_tensor) where NCCL runs (one GPU per
rank; it refuses ranks that share a device, and those rows then say so). Each eager (CUDA events
around each call) and replayed from a CUDA graph; medians in microseconds. Every iris result is
checked against the torch reference before it is timed. Where ranks share one GPU their kernels
take turns on it, so the numbers measure time slicing, not communication: the JSON says so.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import captured, init_torch_distributed, write_result  # noqa: E402
from gemm_comm import check, fmt, us  # noqa: E402

import iris  # noqa: E402
from iris.ops import FusedConfig  # noqa: E402

AR_VARIANTS = ("one_shot", "two_shot", "atomic", "spinlock")


def both(dev, fn, reps):
    """Eager and CUDA-graph medians (µs) of fn; a failure is recorded, not raised."""
    dist.barrier()
    try:
        row = {"eager_us": us(dev, fn, reps)}
    except Exception as e:  # noqa: BLE001 - recorded: the other rows still run
        return f"failed: {type(e).__name__}: {str(e)[:300]}"
    dist.barrier()
    if dev.type == "cuda":
        try:
            row["graph_us"] = us(dev, captured(fn).replay, reps)
        except Exception as e:  # noqa: BLE001
            row["graph_us"] = f"capture failed: {type(e).__name__}: {str(e)[:200]}"
    dist.barrier()
    return row


def one_m(ctx, dev, M, N, K, reps, nccl):
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    bf, k, m = torch.bfloat16, K // w, M // w
    A = torch.randn(M, k, device=dev, dtype=bf)
    B = torch.randn(k, N, device=dev, dtype=bf) / K ** 0.5
    full = torch.empty(M, N, device=dev, dtype=bf)
    C = torch.empty(M, N, device=dev, dtype=bf)
    Cs = torch.empty(m, N, device=dev, dtype=bf)
    ref, ref_s = ctx.empty(M, N, dtype=bf), torch.empty(m, N, device=dev, dtype=bf)

    def ccl_ar():
        torch.matmul(A, B, out=ref)
        ctx.ccl.all_reduce(ref, ref)

    def ccl_rs():
        torch.matmul(A, B, out=full)
        ctx.ccl.reduce_scatter(ref_s, full)

    ccl_ar()
    ccl_rs()
    row = {"M": M, "N": N, "K": K}
    for variant in AR_VARIANTS:
        cfg = FusedConfig(block_size_m=None, block_size_n=None, block_size_k=None, group_size_m=8, variant="tiles",
                          all_reduce_variant=variant)
        try:
            C.fill_(float("nan"))
            ctx.ops.matmul_all_reduce(C, A, B, config=cfg)
            row[f"tiles_{variant}"] = {"max_abs_err": check(f"tiles {variant} M={M}", C, ref),
                                       **both(dev, lambda: ctx.ops.matmul_all_reduce(C, A, B, config=cfg), reps)}
        except Exception as e:  # noqa: BLE001 - recorded: the other variants still run
            row[f"tiles_{variant}"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
    cfg = FusedConfig(block_size_m=None, block_size_n=None, block_size_k=None, group_size_m=8, variant="tiles")
    try:
        Cs.fill_(float("nan"))
        ctx.ops.matmul_reduce_scatter(Cs, A, B, config=cfg)
        row["tiles_reduce_scatter"] = {"max_abs_err": check(f"tiles reduce_scatter M={M}", Cs, ref_s),
                                       **both(dev, lambda: ctx.ops.matmul_reduce_scatter(Cs, A, B, config=cfg), reps)}
    except Exception as e:  # noqa: BLE001
        row["tiles_reduce_scatter"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
    row["matmul_alone"] = both(dev, lambda: torch.matmul(A, B, out=full), reps)
    row["matmul_then_ccl_all_reduce"] = both(dev, ccl_ar, reps)
    row["matmul_then_ccl_reduce_scatter"] = both(dev, ccl_rs, reps)
    if nccl is None:
        full2 = torch.empty(M, N, device=dev, dtype=bf)

        def nccl_ar():
            torch.matmul(A, B, out=full2)
            dist.all_reduce(full2)

        def nccl_rs():
            torch.matmul(A, B, out=full)
            dist.reduce_scatter_tensor(ref_s, full)
        row["matmul_then_nccl_all_reduce"] = both(dev, nccl_ar, reps)
        row["matmul_then_nccl_reduce_scatter"] = both(dev, nccl_rs, reps)
    else:
        row["matmul_then_nccl_all_reduce"] = row["matmul_then_nccl_reduce_scatter"] = f"skipped: {nccl}"
    if r == 0:
        print(f"M={M} N={N} K={K} (eager/graph us): " + ", ".join(f"{key} {fmt(v)}" for key, v in row.items()
                                                                   if key not in ("M", "N", "K")), flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ms", default="512,1024,2048,4096,8192", help="comma-separated M (rows)")
    p.add_argument("--nk", type=int, default=8192, help="N = K")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes (the host, no GPU)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    gpu = torch.cuda.is_available()
    world = int(os.environ.get("IRIS_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    shared = gpu and torch.cuda.device_count() < world
    # NCCL refuses two ranks on one device: there the process group is gloo (barriers only)
    nccl = None if gpu and not shared else ("ranks share a GPU: NCCL refuses two ranks on one device" if gpu else
                                            "no GPU")
    rank, world = init_torch_distributed("gloo" if nccl else "nccl")
    dev = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    small = args.dry_run or not gpu
    ms = [16 * world, 32 * world] if small else [int(x) for x in args.ms.split(",")]
    nk = 32 if small else args.nk
    reps = 2 if small else args.reps
    # each variant's workspace (published tiles, an output on the heap) stays for its shape
    elems = sum(ms) * nk * 2 * (len(AR_VARIANTS) + 1) + 4 * max(ms) * nk
    ctx = iris.iris(heap_size=(1 << 24) if small else 2 * elems + (1 << 30))
    payload = {"dtype": "bfloat16", "N": nk, "K": nk, "sizes_M": ms, "nccl": nccl or "ran",
               "time_slicing": (f"{world} ranks share {torch.cuda.device_count()} GPU(s): their kernels take turns "
                                "on a GPU, so these numbers measure time slicing, not communication"
                                if shared else None),
               "rows": [one_m(ctx, dev, M, nk, nk, reps, nccl) for M in ms]}
    ctx.barrier()
    if rank == 0:
        print("wrote", write_result("tile_gemm", payload, args.out), flush=True)
    ctx.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
