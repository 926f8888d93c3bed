"""iris.ccl.reduce_scatter: the module Iris's programs import reduce_scatter from. The collective is
ctx.ccl.reduce_scatter (iris/ccl/collectives.py); this module gives it Iris's module-level form, the
context third, and the ring workspace Iris's tests build by hand to pass back as workspace=.
"""
from __future__ import annotations

import torch


class ReduceScatterWorkspace:
    """Flags a caller allocates for reduce_scatter's ring_chunked variant (Iris's type). iris's plans
    are found by shape, so the only use of one passed as workspace= is its check: flags fewer than the
    tiles of the call's config raise ValueError ("Flags array too small") before anything runs."""

    def __init__(self):
        self.flags = None
        self.ring_buffer = None  # Iris's staging buffer; iris's plan keeps its own
        self.variant = None
        self.prepared = False


def _prepare_ring_workspace(ctx, M, N, dtype, total_tiles, workspace) -> ReduceScatterWorkspace:
    """One heap flag per tile of an M x N reduce-scatter (Iris's helper, which its tests call to build
    a workspace for a tile count). Collective: all ranks, same order, same sizes."""
    if isinstance(total_tiles, bool) or not isinstance(total_tiles, int) or total_tiles < 1:
        raise ValueError(f"_prepare_ring_workspace: total_tiles must be a positive int, got {total_tiles!r}")
    workspace.flags = ctx.zeros(total_tiles, dtype=torch.int32)
    workspace.variant, workspace.prepared = "ring_chunked", True
    return workspace


def reduce_scatter(output_tensor, input_tensor, shmem, op=None, group=None, async_op=False, config=None,
                   workspace=None) -> None:
    """shmem.ccl.reduce_scatter(output_tensor, input_tensor, ...), as Iris's module function is called.
    Collective: all ranks (of the group), same order, same sizes."""
    shmem.ccl.reduce_scatter(output_tensor, input_tensor, op=op, group=group, async_op=async_op, config=config,
                             workspace=workspace)


__all__ = ["ReduceScatterWorkspace", "reduce_scatter"]
