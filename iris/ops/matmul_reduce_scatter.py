"""iris.ops.matmul_reduce_scatter: the module Iris's programs import matmul_reduce_scatter (and its
preamble) from. The op itself is ctx.ops.matmul_reduce_scatter (iris/ops/__init__.py)."""
from __future__ import annotations


def matmul_reduce_scatter(shmem, C, A, B, async_op=False, config=None, workspace=None) -> dict:
    """This rank's rows or (C M x N) tiles of sum over ranks of A_r @ B_r. Collective: all ranks, same
    order, same sizes."""
    return shmem.ops.matmul_reduce_scatter(C, A, B, async_op=async_op, config=config, workspace=workspace)


def matmul_reduce_scatter_preamble(shmem, C, A, B, config=None, workspace=None) -> dict:
    """Workspace for matmul_reduce_scatter. Collective: all ranks, same order, same sizes."""
    return shmem.ops.matmul_reduce_scatter_preamble(C, A, B, config=config, workspace=workspace)


__all__ = ["matmul_reduce_scatter", "matmul_reduce_scatter_preamble"]
