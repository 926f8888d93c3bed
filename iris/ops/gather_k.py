"""all_gather_matmul in Iris's layout: A sharded by columns (each rank M x K_local), B (world*K_local
x N) the same on every rank, output M x N = [A_0 | A_1 | ...] @ B.

Every rank's transposed shard is gathered with ctx.ccl.all_gather into a K x M heap buffer, which
read transposed is the whole of A (column-major: the persistent GEMM and TMA read it as it is), and
one GEMM follows. The gather is not hidden behind the GEMM as in the row-sharded kernel.
"""
from __future__ import annotations

import torch

from .gemm import _matmul_kernel, check_operands, launch, matmul_args


def check(A: torch.Tensor, B: torch.Tensor, output: torch.Tensor, world: int) -> None:
    check_operands("all_gather_matmul", A, B, output)
    (m, kl), (k, n) = A.shape, B.shape
    if k != world * kl:
        raise ValueError(f"all_gather_matmul: A_sharded is {m}x{kl} on each of {world} ranks, so B needs "
                         f"{world * kl} rows, got {k}")
    if tuple(output.shape) != (m, n):
        raise ValueError(f"all_gather_matmul: output must be {m}x{n}, got {tuple(output.shape)}")


def preamble(ctx, output, A, B) -> dict:
    """The shard's transpose and the gathered K x M buffer, on the heap. Collective: all ranks, same
    order, same sizes."""
    m, kl = A.shape
    ws = {"shard_t": ctx.empty(kl, m, dtype=A.dtype), "gathered": ctx.empty(ctx.world * kl, m, dtype=A.dtype)}
    ctx.barrier()
    return ws


def run(ctx, output, A, B, config, ws) -> torch.Tensor:
    """On the current stream; no host synchronization."""
    ws["shard_t"].copy_(A.t())
    ctx.ccl.all_gather(ws["gathered"], ws["shard_t"])
    if output.numel():
        # the GEMM's launch is remembered while the same tensors come back: building it (descriptors, the
        # JIT's launch) takes longer than a GEMM of a few thousand rows
        g = ws["gathered"].t()
        launch(ws, _matmul_kernel, (g, B, output), lambda: matmul_args(g, B, output, config))
    return output
