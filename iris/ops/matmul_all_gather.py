"""matmul_all_gather: output (M x N) on every rank = all_gather(A_local @ B + bias, rows), bias (optional)
this rank's, one value per row of A_local, as Iris adds it: each rank's rows carry its own bias.

One persistent kernel: each tile of this rank's A_local @ B (+ bias, in fp32) is written into its
rows of the output on this rank and, straight from registers, on every peer (the output is a heap
tensor), then the tile's flag is set there. Before its first remote write a program waits until the peer
has started this call (so the peer is done with the previous output); at the end each program
waits for the peers' tiles that mirror its own, so the output is complete when the kernel ends.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device import signal, store, wait
from .config import FusedConfig
from .epoch import _epoch, _finish
from .gemm import _dot_tile, _tile_mn, _tile_ptrs, check_operands, launch, tile_args, tiles_for


@triton.jit
def _matmul_all_gather_kernel(a, b, c, bias, flags, ctl, heap_bases, rank, world, M_loc, N, K, sam, sak, sbk, sbn,
                              scm, scn, s_bias, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                              GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, TMA: tl.constexpr, A_T: tl.constexpr,
                              B_T: tl.constexpr, STAGES: tl.constexpr, BIAS: tl.constexpr):
    pid = tl.program_id(0)
    ep = _epoch(ctl)
    if pid == 0:  # "this rank has started call ep": peers may now overwrite its output
        for i in range(1, world):
            signal(ctl + 2 + rank, ep, rank, (rank + i) % world, heap_bases)
    for i in range(1, world):
        wait(ctl + 2 + (rank + i) % world, ep, rank, rank, heap_bases, cmp="ge")
    num_m = tl.cdiv(M_loc, BM)
    num_n = tl.cdiv(N, BN)
    T = num_m * num_n
    mine = c + (rank * M_loc).to(tl.int64) * scm
    for t in range(pid, T, NUM_SMS):
        pid_m, pid_n = _tile_mn(t, num_m, num_n, GROUP_M)
        acc = _dot_tile(a, b, pid_m * BM, pid_n * BN, M_loc, N, K, sam, sak, sbk, sbn, BM, BN, BK, TMA, A_T, B_T,
                        STAGES)
        if BIAS:
            rows = pid_m * BM + tl.arange(0, BM)
            acc += tl.load(bias + rows * s_bias, mask=rows < M_loc, other=0.0).to(tl.float32)[:, None]
        part = acc.to(c.dtype.element_ty)
        p, mask = _tile_ptrs(mine, pid_m * BM, pid_n * BN, M_loc, N, scm, scn, BM, BN)
        tl.store(p, part, mask=mask)
        for i in range(1, world):
            store(p, part, rank, (rank + i) % world, heap_bases, mask=mask)
        tl.debug_barrier()
        for i in range(1, world):
            signal(flags + rank * T + t, ep, rank, (rank + i) % world, heap_bases)
    for t in range(pid, T, NUM_SMS):
        for i in range(1, world):
            wait(flags + ((rank + i) % world) * T + t, ep, rank, rank, heap_bases, cmp="ge")
    _finish(ctl, ep, rank, world, heap_bases, NUM_SMS, False)


def check(ctx, A: torch.Tensor, B: torch.Tensor, output: torch.Tensor) -> None:
    """The operands' dtypes, devices and shapes (ctx.ops checks them once per call signature), and a heap output."""
    check_operands("matmul_all_gather", A, B, output)
    (m, k), (k2, n) = A.shape, B.shape
    if k2 != k:
        raise ValueError(f"matmul_all_gather: A_local is {m}x{k} but B is {k2}x{n}; B needs {k} rows")
    if tuple(output.shape) != (ctx.world * m, n):
        raise ValueError(f"matmul_all_gather: output must be (world * A_local rows) x N = {ctx.world * m}x{n}, "
                         f"got {tuple(output.shape)}")
    check_call(ctx, A, output)


def check_call(ctx, A: torch.Tensor, output: torch.Tensor, bias=None) -> None:
    """What every call checks, the shapes known good: the bias, and the output on the heap (no signature
    of shapes and dtypes tells either)."""
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.shape[0] != A.shape[0]
                             or bias.device != A.device or not bias.dtype.is_floating_point):
        raise ValueError(f"matmul_all_gather: bias must be a 1-D float tensor of A_local's {A.shape[0]} rows on "
                         f"{A.device} (each rank adds its own to its rows, as Iris does), got "
                         f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}"
                         f"{' ' + str(bias.dtype) if isinstance(bias, torch.Tensor) else ''}")
    if not ctx.is_symmetric(output):
        raise ValueError("matmul_all_gather: output must be a heap tensor (peers write into it); allocate it with "
                         "ctx.empty(M, N, dtype=...)")


def preamble(ctx, output, A, B, config: FusedConfig | None = None) -> dict:
    """Per-tile flags and ctl. Collective: all ranks, same order, same sizes."""
    check(ctx, A, B, output)
    t = tiles_for(A.shape[0], B.shape[1], A.device, config, A.element_size())
    tiles = triton.cdiv(max(A.shape[0], 1), t.bm) * triton.cdiv(max(B.shape[1], 1), t.bn)
    ws = {"flags": ctx.zeros(ctx.world * tiles, dtype=torch.int64), "ctl": ctx.zeros(3 + ctx.world, dtype=torch.int64),
          "tiles": t}
    ctx.barrier()  # every rank's flags are zero before any peer signals into them
    return ws


def run(ctx, output, A, B, config, ws, bias=None) -> torch.Tensor:
    """Launch on the current stream; no host synchronization."""
    if output.numel() == 0:
        return output
    tensors = (A, B, output) if bias is None else (A, B, output, bias)
    launch(ws, _matmul_all_gather_kernel, tensors, lambda: _args(ctx, output, A, B, ws, bias))
    return output


def _args(ctx, output, A, B, ws, bias):
    (m, k), n = A.shape, B.shape[1]
    a, b, kw = tile_args(A, B, ws["tiles"])
    sms = ws["tiles"].sms
    return ((sms,), (a, b, output, output if bias is None else bias, ws["flags"], ws["ctl"], ctx.get_heap_bases(),
                     ctx.rank, ctx.world, m, n, k, A.stride(0), A.stride(1), B.stride(0), B.stride(1), output.stride(0),
                     output.stride(1), 0 if bias is None else bias.stride(0)),
            dict(kw, NUM_SMS=sms, BIAS=bias is not None))
