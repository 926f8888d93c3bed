"""The fused GEMM + communication ops against the bulk-synchronous and PyTorch references, same run.

    python -m iris.run -n 2 benchmarks/gemm_comm.py                 # everything, JSON to benchmarks/results/
    python -m iris.run -n 2 benchmarks/gemm_comm.py --part gemm     # world-1 GEMM configs vs torch.matmul
    python -m iris.run -n 2 benchmarks/gemm_comm.py --dry-run       # tiny sizes on the host, no GPU

gemm: iris.ops.matmul (persistent, TMA) against torch.matmul (cuBLAS) at 8192^3 and 4096x8192x8192
bf16 (--gemm-shapes), several tile configs (8 row blocks a group) and config=None's, eager and in a
CUDA graph, TFLOP/s (rank 0's GPU). fused (bf16, K = N = --nk, every M of --ms, the
output's rows): all_gather_matmul and matmul_all_gather (A sharded by rows) against torch.matmul
alone (the floor: no communication), NCCL collective + torch.matmul, ctx.ccl's collective +
torch.matmul, and torch.ops.symm_mem.fused_all_gather_matmul; matmul_reduce_scatter and
matmul_all_reduce (row-parallel, K sharded) against matmul + reduce_scatter_tensor / all_reduce,
matmul + ctx.ccl's, and symm_mem.fused_matmul_reduce_scatter; matmul_all_reduce also at the rows of --small-ms.
Each iris op in both variants (FusedConfig.variant "fused": the persistent kernel; "streamed": cuBLAS
by chunks with copy-engine transfers, at several chunk counts) and as dispatched by default ("iris").
Each eager (CUDA events around each call) and replayed from a CUDA graph; medians in microseconds.
Every iris result is checked against its reference before it is timed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import captured, init_torch_distributed, timed, write_result  # noqa: E402

import iris  # noqa: E402
from iris.ops import FusedConfig, matmul, tiles_for  # noqa: E402

GEMM_CONFIGS = [(128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (128, 128, 64, 4, 8), (128, 128, 64, 3, 4),
                (256, 128, 64, 3, 8)]


def us(dev, fn, reps):
    return statistics.median(timed(dev, fn, reps, warmup=3)) * 1e6


def graph_of(dev, fn):
    """A CUDA graph of one call of fn; None on the host, the failure where capture fails."""
    if dev.type != "cuda":
        return None
    try:
        return captured(fn)
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        return f"capture failed: {type(e).__name__}: {str(e)[:200]}"


def time_all(row, fns, dev, reps, rounds=4):
    """row[label] gets the median eager and graph-replayed us of fns[label] (merged into what row holds
    there), measured in `rounds` rounds that each time every entry in turn: the GPU's clocks drift over
    a sweep (GEMMs at full power slow down), and interleaving lays that drift on every entry alike
    instead of on the last ones timed."""
    graphs = {label: graph_of(dev, fn) for label, fn in fns.items()}
    eager, graph = {label: [] for label in fns}, {label: [] for label in fns}
    per = max(1, reps // rounds)
    for _ in range(rounds):
        for label, fn in fns.items():
            dist.barrier()
            eager[label] += timed(dev, fn, per, warmup=1)
            if isinstance(graphs[label], torch.cuda.CUDAGraph):
                dist.barrier()
                graph[label] += timed(dev, graphs[label].replay, per, warmup=1)
    for label in fns:
        g = statistics.median(graph[label]) * 1e6 if graph[label] else graphs[label]
        row[label] = {**row.get(label, {}), "eager_us": statistics.median(eager[label]) * 1e6, "graph_us": g}
    del graphs


def part_gemm(dev, shapes, reps):
    rows = []
    for M, N, K in shapes:
        A = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        B = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
        flop = 2 * M * N * K
        ref = A @ B
        t_torch = us(dev, lambda: torch.matmul(A, B), reps)
        row = {"M": M, "N": N, "K": K, "torch_us": t_torch, "torch_tflops": flop / t_torch / 1e6, "configs": []}
        if dev.type == "cuda":  # eager times hold the host's launch where it is longer than the GEMM
            row["torch_graph_us"] = us(dev, captured(lambda: torch.matmul(A, B)).replay, reps)
        auto = tiles_for(M, N, dev, None)  # config=None's choice (the row "default")
        for tiles in (GEMM_CONFIGS if dev.type == "cuda" else [(16, 16, 16, 1, 4)]) + [None]:
            bm, bn, bk, st, wp = tiles or (auto.bm, auto.bn, auto.bk, auto.stages, auto.warps)
            cfg = FusedConfig(block_size_m=bm, block_size_n=bn, block_size_k=bk, num_stages=st, num_warps=wp,
                              group_size_m=8) if tiles else None
            name = [bm, bn, bk, st, wp] if tiles else "default"
            try:
                out = matmul(A, B, config=cfg)
                err = (out.float() - ref.float()).abs().max().item()
                t = us(dev, lambda: matmul(A, B, out=out, config=cfg), reps)
                row["configs"].append({"config": name, "us": t, "tflops": flop / t / 1e6,
                                       "vs_torch": t_torch / t, "max_abs_err_vs_torch": err})
                if dev.type == "cuda":
                    g = us(dev, captured(lambda: matmul(A, B, out=out, config=cfg)).replay, reps)
                    row["configs"][-1].update(graph_us=g, graph_vs_torch=row["torch_graph_us"] / g)
            except Exception as e:  # noqa: BLE001 - a config that does not fit is recorded
                row["configs"].append({"config": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        t_torch2 = us(dev, lambda: torch.matmul(A, B), reps)  # again: clocks drift over the sweep
        row["torch_us_after"] = t_torch2
        rows.append(row)
        if dist.get_rank() == 0:
            best = min((c for c in row["configs"] if "us" in c), key=lambda c: c.get("graph_us", c["us"]),
                       default=None)
            print(f"gemm {M}x{N}x{K}: torch {row['torch_tflops']:.0f} TFLOP/s; best iris {best}", flush=True)
    return rows


def fmt(v):
    """eager/graph us of a timing, or the failure."""
    if isinstance(v, dict):
        g = v.get("graph_us")
        return f"{v['eager_us']:.0f}/" + (f"{g:.0f}" if isinstance(g, float) else str(g))
    return str(v)


def check(name, got, want):
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    if not err <= 0.02 * scale + 0.1:
        raise RuntimeError(f"{name}: max error {err} against the reference (scale {scale})")
    return err


def _variants():
    """label -> FusedConfig, per op. streamed_<chunks>: that many chunks per owner's rows (all_reduce,
    reduce_scatter, matmul_all_gather; one chunk still overlaps the peers' blocks or rows with the
    copies); ccl: the GEMM, then ctx.ccl's collective; streamed_<chunks>_ccl<sms>: matmul_all_reduce's
    chunks reduced by ctx.ccl.all_reduce on that many programs, beside the GEMM's next chunk, instead of
    the copy engines; fused_bn64: narrower tiles (more waves, so more of the pushes overlap the next
    wave's GEMM); two_shot: the two-shot kernel (Iris's
    tile ownership) with the same tiles. Tiles chosen by shape, as with config=None."""
    def F(**kw):
        return FusedConfig(**{**dict(block_size_m=None, block_size_n=None, block_size_k=None, group_size_m=8,
                                     all_reduce_variant="one_shot"), **kw})
    ccl = {"ccl": F(variant="ccl")}
    chunked = {f"streamed_{c}": F(variant="streamed", chunks=c) for c in (1, 2, 3, 4)}
    return {"ag": {"fused": F(variant="fused"), "streamed": F(variant="streamed"), **ccl},
            "mag": {"fused": F(variant="fused"), **chunked, **ccl},
            "rs": {"fused": F(variant="fused"), **chunked, **ccl},
            "ar": {"fused": F(variant="fused"), "two_shot": F(variant="fused", all_reduce_variant="two_shot"), **ccl,
                   "fused_bn64": F(variant="fused", block_size_n=64, num_warps=4),
                   **chunked,
                   **{f"streamed_{c}_ccl{sms}": F(variant="streamed", chunks=c, comm_sms=sms)
                      for c, sms in ((2, 32), (4, 32), (2, 64))}}}


def variants(row, fns, kind, call, name, got, want):
    """fns["iris_<label>"] for every variant that computes the reference (else row records its failure),
    then fns["iris"] (default dispatch)."""
    for label, cfg in _variants()[kind].items():
        label = "iris_" + label
        try:
            got.fill_(float("nan"))
            call(cfg)
            row[label] = {"max_abs_err": check(f"{name} {label}", got, want)}
            fns[label] = lambda c=cfg: call(c)
        except Exception as e:  # noqa: BLE001 - recorded: the other variants still run
            row[label] = f"failed: {type(e).__name__}: {str(e)[:300]}"
    fns["iris"] = lambda: call(None)


def measure(dev, reps, name, kind, mkn, call, got, want, refs, ccl, symm=None):
    """One op's row: call(config) as dispatched (config=None) and in every variant, each checked against
    want; refs (label -> its unfused references, NCCL's and the GEMM alone); ccl (label, the GEMM and
    ctx.ccl's collective one after the other: the floor "never slower than" refers to), checked too;
    symm (torch's symmetric-memory op and its result's tensor, where torch offers it); then all of
    them timed by time_all."""
    call(None)
    row, fns = {"M": mkn[0], "K": mkn[1], "N": mkn[2], "max_abs_err": check(name, got, want)}, {}
    variants(row, fns, kind, call, name, got, want)
    fns.update(refs)
    got.fill_(float("nan"))
    ccl[1]()
    row[ccl[0]] = {"max_abs_err": check(ccl[0], got, want)}
    fns[ccl[0]] = ccl[1]
    if symm is not None:
        try:
            fn, result = symm()
            check(f"symm_mem {name}", result(fn()), want)
            fns["torch_symm_mem_fused"] = fn
        except Exception as e:  # noqa: BLE001 - recorded: torch's op is missing on the host, or refuses
            row["torch_symm_mem_fused"] = f"unavailable: {type(e).__name__}: {str(e)[:200]}"
    time_all(row, fns, dev, reps)
    return row


def part_fused(ctx, dev, M, K, N, reps):
    """Every op at M rows (the whole output's), K = N: one row per op, each checked, then timed."""
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    bf = torch.bfloat16
    m = M // w
    out = {}
    A_loc = torch.randn(m, K, device=dev, dtype=bf)
    B = torch.randn(K, N, device=dev, dtype=bf) / K ** 0.5
    A_full = torch.empty(M, K, device=dev, dtype=bf)
    C = torch.empty(M, N, device=dev, dtype=bf)
    C_ref = torch.empty(M, N, device=dev, dtype=bf)

    # all_gather_matmul
    def ref_ag():
        dist.all_gather_into_tensor(A_full, A_loc)
        torch.matmul(A_full, B, out=C_ref)
    ref_ag()
    group = dist.group.WORLD.group_name

    def symm_ag():  # torch's symmetric memory for the job's group, then its fused op (rs's below too)
        import torch.distributed._symmetric_memory as symm_mem
        symm_mem.enable_symm_mem_for_group(group)
        return (lambda: torch.ops.symm_mem.fused_all_gather_matmul(A_loc, [B], 0, group, return_A=False)), \
            lambda res: res[1][0]
    out["all_gather_matmul"] = measure(
        dev, reps, "all_gather_matmul", "ag", (M, K, N),
        lambda cfg: ctx.ops.all_gather_matmul(C, A_loc, B, config=cfg), C, C_ref,
        {"matmul_alone": lambda: torch.matmul(A_full, B, out=C_ref), "nccl_all_gather_then_matmul": ref_ag},
        ("ccl_all_gather_then_matmul", lambda: (ctx.ccl.all_gather(A_full, A_loc), torch.matmul(A_full, B, out=C))),
        symm_ag)

    # matmul_all_gather (output on the heap)
    Ch = ctx.empty(M, N, dtype=bf)
    part = torch.empty(m, N, device=dev, dtype=bf)

    def ref_mag():
        torch.matmul(A_loc, B, out=part)
        dist.all_gather_into_tensor(C_ref, part)
    ref_mag()
    out["matmul_all_gather"] = measure(
        dev, reps, "matmul_all_gather", "mag", (M, K, N),
        lambda cfg: ctx.ops.matmul_all_gather(Ch, A_loc, B, config=cfg), Ch, C_ref,
        {"matmul_alone": lambda: torch.matmul(A_loc, B, out=part), "matmul_then_nccl_all_gather": ref_mag},
        ("matmul_then_ccl_all_gather", lambda: (torch.matmul(A_loc, B, out=part), ctx.ccl.all_gather(Ch, part))))
    del Ch

    # matmul_reduce_scatter and matmul_all_reduce, row-parallel: A (M x K/w), B (K/w x N) per rank
    k = K // w
    A_rp = torch.randn(M, k, device=dev, dtype=bf)
    B_rp = torch.randn(k, N, device=dev, dtype=bf) / K ** 0.5
    Cs = torch.empty(m, N, device=dev, dtype=bf)
    Cs_ref = torch.empty(m, N, device=dev, dtype=bf)

    def ref_rs():
        torch.matmul(A_rp, B_rp, out=C_ref)
        dist.reduce_scatter_tensor(Cs_ref, C_ref)
    ref_rs()
    full = torch.empty(M, N, device=dev, dtype=bf)
    out["matmul_reduce_scatter"] = measure(
        dev, reps, "matmul_reduce_scatter", "rs", (M, K, N),
        lambda cfg: ctx.ops.matmul_reduce_scatter(Cs, A_rp, B_rp, config=cfg), Cs, Cs_ref,
        {"matmul_alone": lambda: torch.matmul(A_rp, B_rp, out=C_ref), "matmul_then_nccl_reduce_scatter": ref_rs},
        ("matmul_then_ccl_reduce_scatter",
         lambda: (torch.matmul(A_rp, B_rp, out=full), ctx.ccl.reduce_scatter(Cs, full))),
        lambda: ((lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(A_rp, B_rp, "sum", 0, group)),
                 lambda res: res))
    del Cs, Cs_ref, full
    out["matmul_all_reduce"] = part_all_reduce(ctx, dev, M, A_rp, B_rp, C, C_ref, reps)
    if r == 0:
        for name, row in out.items():
            print(f"{name} M={M}: " + ", ".join(f"{kk} {fmt(v)}" for kk, v in row.items()
                                                 if kk not in ("M", "K", "N", "max_abs_err")), flush=True)
    return out


def part_all_reduce(ctx, dev, M, A, B, Co, Co_ref, reps):
    """matmul_all_reduce: A (M x k), B (k x N) per rank; the sum of the products on every rank."""
    def ref_ar():
        torch.matmul(A, B, out=Co_ref)
        dist.all_reduce(Co_ref)
    ref_ar()
    full = torch.empty_like(Co)
    return measure(dev, reps, f"matmul_all_reduce M={M}", "ar", (M, A.shape[1] * ctx.get_num_ranks(), B.shape[1]),
                   lambda cfg: ctx.ops.matmul_all_reduce(Co, A, B, config=cfg), Co, Co_ref,
                   {"matmul_alone": lambda: torch.matmul(A, B, out=Co_ref), "matmul_then_nccl_all_reduce": ref_ar},
                   ("matmul_then_ccl_all_reduce", lambda: (torch.matmul(A, B, out=full), ctx.ccl.all_reduce(Co, full))))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["gemm", "fused", "all"], default="all")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes (the host, no GPU)")
    p.add_argument("--ms", default="512,1024,2048,4096,8192", help="comma-separated M (rows of the output) of every op")
    p.add_argument("--small-ms", default="128,256", help="comma-separated M of matmul_all_reduce alone (below --ms)")
    p.add_argument("--nk", type=int, default=8192, help="N = K")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--gemm-shapes", default="8192x8192x8192,4096x8192x8192",
                   help="--part gemm: comma-separated MxNxK (a rank's GEMM: the fused ops' K is K/world for "
                        "matmul_all_reduce and matmul_reduce_scatter)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rank, world = init_torch_distributed()
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    small = args.dry_run or dev.type != "cuda"
    reps = 2 if small else args.reps
    payload = {"dtype": "bfloat16"}
    if args.part in ("gemm", "all"):
        shapes = [(64, 48, 32)] if small else [tuple(int(v) for v in x.split("x"))
                                                for x in args.gemm_shapes.split(",")]
        payload["gemm"] = part_gemm(dev, shapes, reps)
    if args.part in ("fused", "all"):
        ctx = iris.iris(heap_size=(1 << 24) if small else (16 << 30))  # every shape's workspaces stay
        ms = [32 * world] if small else [int(x) for x in args.ms.split(",")]
        small_ms = [16] if small else [int(x) for x in args.small_ms.split(",") if x]
        nk = 48 if small else args.nk
        rows = [part_fused(ctx, dev, M, nk, nk, reps) for M in ms]
        payload["fused"] = {name: [row[name] for row in rows] for name in rows[0]}
        k, small_rows = nk // world, []
        for M in small_ms:  # matmul_all_reduce alone below the other ops' sizes (decode-like rows)
            A = torch.randn(M, k, device=dev, dtype=torch.bfloat16)
            B = torch.randn(k, nk, device=dev, dtype=torch.bfloat16) / nk ** 0.5
            C, C_ref = (torch.empty(M, nk, device=dev, dtype=torch.bfloat16) for _ in range(2))
            small_rows.append(part_all_reduce(ctx, dev, M, A, B, C, C_ref, reps))
        payload["fused"]["matmul_all_reduce"][:0] = small_rows
        payload["fused"]["streamed_capture_failures"] = sorted(
            {ws["no_graph"][:300] for ws in ctx.ops._workspaces.values() if "no_graph" in ws})
        ctx.barrier()
    if rank == 0:
        print("wrote", write_result(f"gemm_comm-{args.part}", payload, args.out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
