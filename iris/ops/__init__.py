"""iris.ops: GEMMs fused with communication, as ctx.ops.NAME(output, A, B, config=None).

Every op is collective: all ranks call it in the same order with the same shapes, dtypes and
config. The first call for a (shapes, dtype, config) allocates that op's workspace on the heap
(collectively) and keeps it; NAME_preamble does that ahead of time and returns it, to pass as
workspace= (for CUDA-graph capture, allocate before capturing). Calls are ordered on the current
stream, never synchronize the host and can be captured in a CUDA graph.

Two variants (FusedConfig.variant): "fused", one persistent Triton kernel; "streamed", cuBLAS by
chunks of rows with copy-engine transfers on side streams (streamed.py). None picks what measured
faster on 2x H200 (docs/collectives.md): streamed for matmul_all_reduce from 1024 rows and for a
large matmul_reduce_scatter, fused otherwise, and always on the host.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import all_gather_matmul as _agm
from . import matmul_all_gather as _mag
from . import matmul_reduce as _mr
from . import streamed as _st
from .config import FusedConfig
from .gemm import interpreted, matmul

# where "streamed" measured faster on 2x H200 (benchmarks/results/gemm_comm-fused-gpu-2ranks.json,
# N=8192, K=8192 over 2 ranks): matmul_all_reduce from 1024 output rows (at 512: fused 90 us, streamed
# 95), matmul_reduce_scatter at 8192 rows (753 against 853 us; smaller sizes not measured, hence the
# bound at a quarter of that). all_gather_matmul: fused (1468 against 1718 us at 8192 rows).
STREAMED_MIN_ROWS = 1024
STREAMED_MIN_MACS = 1 << 36

__all__ = ["FusedConfig", "OpsNamespace", "matmul"]


class OpsNamespace:
    """ctx.ops: the fused ops bound to one Iris context, with their workspaces."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._workspaces = {}

    def forget(self) -> None:
        """Drop every workspace (the context is closing): a later call builds one, which raises ContextClosed."""
        self._workspaces.clear()

    def _ws(self, name, output, A, B, config, make):
        key = (name, tuple(A.shape), tuple(B.shape), tuple(output.shape), A.dtype, A.device,
               config)
        ws = self._workspaces.get(key)
        if ws is None:
            ws = self._workspaces[key] = make()
        return ws

    def _variant(self, kind, output, A, B, config) -> str:
        if config is not None and config.variant is not None:
            return config.variant if self._ctx.world > 1 else "fused"
        if A.device.type != "cuda" or interpreted() or self._ctx.world == 1:
            return "fused"
        if kind == "ar":
            return "streamed" if output.shape[0] >= STREAMED_MIN_ROWS else "fused"
        if kind == "rs":
            return "streamed" if A.shape[0] * output.shape[1] * A.shape[1] >= STREAMED_MIN_MACS else "fused"
        return "fused"

    def _preamble(self, kind, output, A, B, config):
        ctx = self._ctx
        if self._variant(kind, output, A, B, config) == "streamed":
            chunks = config.chunks if config is not None and config.chunks else {"ag": 1, "ar": 2, "rs": 4}[kind]
            comm_sms = config.comm_sms if config is not None else None
            return self._ws(kind + "/streamed", output, A, B, config,
                            lambda: _st.preamble(ctx, kind, output, A, B, chunks, comm_sms))
        make = {"ag": lambda: _agm.preamble(ctx, output, A, B, config),
                "ar": lambda: _mr.preamble(ctx, output, A, B, config, scatter=False),
                "rs": lambda: _mr.preamble(ctx, output, A, B, config, scatter=True)}[kind]
        return self._ws(kind, output, A, B, config, make)

    def _run(self, kind, output, A, B, config, ws):
        if "kind" in ws:  # a streamed workspace
            return _st.run(self._ctx, output, A, B, ws)
        if kind == "ag":
            return _agm.run(self._ctx, output, A, B, config, ws)
        return _mr.run(self._ctx, output, A, B, config, ws, scatter=kind == "rs")

    # all_gather_matmul -------------------------------------------------------------------------
    def all_gather_matmul_preamble(self, output, A, B, config: Optional[FusedConfig] = None) -> dict:
        """Workspace for all_gather_matmul at these shapes. Collective: all ranks, same order, same sizes."""
        _agm.check(A, B, output, self._ctx.world)
        return self._preamble("ag", output, A, B, config)

    def all_gather_matmul(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                          config: Optional[FusedConfig] = None, workspace: Optional[dict] = None) -> torch.Tensor:
        """output (world*m x N) = all_gather(A, rows) @ B; A: this rank's m x K rows, B: K x N (the same on
        every rank). Collective: all ranks, same order, same sizes."""
        _agm.check(A, B, output, self._ctx.world)
        return self._run("ag", output, A, B, config, workspace or self._preamble("ag", output, A, B, config))

    # matmul_all_reduce -------------------------------------------------------------------------
    def matmul_all_reduce_preamble(self, output, A, B, config: Optional[FusedConfig] = None) -> dict:
        """Workspace for matmul_all_reduce at these shapes. Collective: all ranks, same order, same sizes."""
        _mr.check("matmul_all_reduce", A, B, output, self._ctx.world, False)
        return self._preamble("ar", output, A, B, config)

    def matmul_all_reduce(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                          config: Optional[FusedConfig] = None, workspace: Optional[dict] = None) -> torch.Tensor:
        """output (M x N) = sum over ranks of A_r (M x k) @ B_r (k x N), on every rank: a row-parallel layer.
        Collective: all ranks, same order, same sizes."""
        _mr.check("matmul_all_reduce", A, B, output, self._ctx.world, False)
        return self._run("ar", output, A, B, config, workspace or self._preamble("ar", output, A, B, config))

    # matmul_reduce_scatter ---------------------------------------------------------------------
    def matmul_reduce_scatter_preamble(self, output, A, B, config: Optional[FusedConfig] = None) -> dict:
        """Workspace for matmul_reduce_scatter at these shapes. Collective: all ranks, same order, same sizes."""
        _mr.check("matmul_reduce_scatter", A, B, output, self._ctx.world, True)
        return self._preamble("rs", output, A, B, config)

    def matmul_reduce_scatter(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                              config: Optional[FusedConfig] = None, workspace: Optional[dict] = None) -> torch.Tensor:
        """output (M/world x N) = rows [rank*M/world, (rank+1)*M/world) of sum over ranks of A_r @ B_r.
        Collective: all ranks, same order, same sizes."""
        _mr.check("matmul_reduce_scatter", A, B, output, self._ctx.world, True)
        return self._run("rs", output, A, B, config, workspace or self._preamble("rs", output, A, B, config))

    # matmul_all_gather -------------------------------------------------------------------------
    def matmul_all_gather_preamble(self, output, A, B, config: Optional[FusedConfig] = None) -> dict:
        """Workspace for matmul_all_gather at these shapes. Collective: all ranks, same order, same sizes."""
        return self._ws("matmul_all_gather", output, A, B, config,
                        lambda: _mag.preamble(self._ctx, output, A, B, config))

    def matmul_all_gather(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                          config: Optional[FusedConfig] = None, workspace: Optional[dict] = None) -> torch.Tensor:
        """output (world*m x N, a heap tensor) = all_gather(A (m x K) @ B (K x N), rows) on every rank.
        Collective: all ranks, same order, same sizes."""
        _mag.check(self._ctx, A, B, output)
        ws = workspace or self.matmul_all_gather_preamble(output, A, B, config)
        return _mag.run(self._ctx, output, A, B, config, ws)
