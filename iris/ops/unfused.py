"""The "ccl" variant: the whole GEMM (torch.matmul, cuBLAS), then ctx.ccl's collective, one after the
other on the caller's stream. Nothing overlaps; it wins where the communication is small against the
GEMM's launch and tail (few rows), or outweighs it so that the overlapped forms' SM or copy-engine
share costs more than it hides (matmul_all_reduce beyond 2 ranks): benchmarks/gemm_comm.py times it
beside the other variants and matmul + ctx.ccl itself.

Heap buffers hold what the collective reads (the partial products, the gathered A), so ctx.ccl
reads them in place instead of staging them first.
"""
from __future__ import annotations

import torch

from .streamed import replayed


def preamble(ctx, kind: str, output, A, B) -> dict:
    """The heap buffer of one op ("ag", "mag", "rs", "ar") at these shapes, and its collective's
    workspace, so that the first call can be captured. Collective: all ranks, same order, same sizes."""
    rows, cols = (ctx.world * A.shape[0], A.shape[1]) if kind == "ag" else (A.shape[0], B.shape[1])
    buf = ctx.empty(rows, cols, dtype=A.dtype)
    ws = {"buf": buf, "kind": kind}
    _collective(ctx, kind, output, A, buf, preamble=True)
    return ws


def _collective(ctx, kind, output, A, buf, preamble=False):
    """ctx.ccl's collective of the op (or its preamble)."""
    ccl = ctx.ccl
    if kind == "ag":
        (ccl.all_gather_preamble if preamble else ccl.all_gather)(buf, A)
    elif kind == "mag":
        (ccl.all_gather_preamble if preamble else ccl.all_gather)(output, buf)
    elif kind == "rs":
        (ccl.reduce_scatter_preamble if preamble else ccl.reduce_scatter)(output, buf)
    else:
        (ccl.all_reduce_preamble if preamble else ccl.all_reduce)(output, buf)


def run(ctx, output, A, B, ws, bias=None) -> torch.Tensor:
    """The GEMM, then the collective, on the current stream (streamed.run's signature); eager calls with
    the same tensors replay a graph of both (streamed.replayed). matmul_all_gather's bias goes into this
    rank's rows before they are gathered."""
    if output.numel():
        replayed(ws, (A, B, output, bias), lambda: _sequence(ctx, ws["kind"], output, A, B, ws["buf"], bias))
    return output


def _sequence(ctx, kind, output, A, B, buf, bias) -> None:
    if kind == "ag":
        _collective(ctx, kind, output, A, buf)
        torch.matmul(buf, B, out=output)
        return
    if bias is not None:
        torch.addmm(bias[:, None].to(buf.dtype), A, B, out=buf)
    else:
        torch.matmul(A, B, out=buf)
    _collective(ctx, kind, output, A, buf)
