"""iris.ops: GEMMs fused with communication, as ctx.ops.NAME(output, A, B, config=None).

Every op is collective: all ranks call it in the same order with the same shapes, dtypes and
config. The first call for a (shapes, dtype, config) allocates that op's workspace on the heap
(collectively) and keeps it; NAME_preamble does that ahead of time and returns it, to pass as
workspace= (for CUDA-graph capture, allocate before capturing). Calls only launch one kernel on
the current stream: no host synchronization, capturable in a CUDA graph.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import all_gather_matmul as _agm
from . import matmul_all_gather as _mag
from . import matmul_reduce as _mr
from .config import FusedConfig
from .gemm import matmul

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

    # all_gather_matmul -------------------------------------------------------------------------
    def all_gather_matmul_preamble(self, output, A, B, config: Optional[FusedConfig] = None) -> dict:
        """Workspace for all_gather_matmul at these shapes. Collective: all ranks, same order, same sizes."""
        return self._ws("all_gather_matmul", output, A, B, config,
                        lambda: _agm.preamble(self._ctx, output, A, B, config))

    def all_gather_matmul(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                          config: Optional[FusedConfig] = None, workspace: Optional[dict] = None) -> torch.Tensor:
        """output (world*m x N) = all_gather(A, rows) @ B; A: this rank's m x K rows, B: K x N (the same on
        every rank). Collective: all ranks, same order, same sizes."""
        _agm.check(A, B, output, self._ctx.world)
        ws = workspace or self.all_gather_matmul_preamble(output, A, B, config)
        return _agm.run(self._ctx, output, A, B, config, ws)

    # matmul_all_reduce -------------------------------------------------------------------------
    def matmul_all_reduce_preamble(self, output, A, B, config: Optional[FusedConfig] = None) -> dict:
        """Workspace for matmul_all_reduce at these shapes. Collective: all ranks, same order, same sizes."""
        return self._ws("matmul_all_reduce", output, A, B, config,
                        lambda: _mr.preamble(self._ctx, output, A, B, config, scatter=False))

    def matmul_all_reduce(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                          config: Optional[FusedConfig] = None, workspace: Optional[dict] = None) -> torch.Tensor:
        """output (M x N) = sum over ranks of A_r (M x k) @ B_r (k x N), on every rank: a row-parallel layer.
        Collective: all ranks, same order, same sizes."""
        _mr.check("matmul_all_reduce", A, B, output, self._ctx.world, False)
        ws = workspace or self.matmul_all_reduce_preamble(output, A, B, config)
        return _mr.run(self._ctx, output, A, B, config, ws, scatter=False)

    # matmul_reduce_scatter ---------------------------------------------------------------------
    def matmul_reduce_scatter_preamble(self, output, A, B, config: Optional[FusedConfig] = None) -> dict:
        """Workspace for matmul_reduce_scatter at these shapes. Collective: all ranks, same order, same sizes."""
        return self._ws("matmul_reduce_scatter", output, A, B, config,
                        lambda: _mr.preamble(self._ctx, output, A, B, config, scatter=True))

    def matmul_reduce_scatter(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                              config: Optional[FusedConfig] = None, workspace: Optional[dict] = None) -> torch.Tensor:
        """output (M/world x N) = rows [rank*M/world, (rank+1)*M/world) of sum over ranks of A_r @ B_r.
        Collective: all ranks, same order, same sizes."""
        _mr.check("matmul_reduce_scatter", A, B, output, self._ctx.world, True)
        ws = workspace or self.matmul_reduce_scatter_preamble(output, A, B, config)
        return _mr.run(self._ctx, output, A, B, config, ws, scatter=True)

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
