"""FusedConfig: the tile sizes and launch shape of the fused GEMM + communication kernels."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class FusedConfig:
    """Tuning knobs (Iris's names). None means: chosen from the shape and the device.

    block_size_m/n/k: the GEMM tile; group_size_m: tiles of that many rows share B columns in L2
    (grouped order); num_sms: programs of the persistent grid (default: every SM, or a few under
    the interpreter); comm_sms: programs that only move data: all_gather_matmul's pushers; in
    the streamed matmul_all_reduce, reduce each chunk with ctx.ccl.all_reduce on that many programs
    (instead of the copy engine and an add);
    num_stages/num_warps: Triton's software pipeline depth and warps per program.
    variant: "fused" (the persistent kernel), "streamed" (torch.matmul by chunks of rows on the caller's
    stream, copy-engine transfers on side streams: iris/ops/streamed.py) or None (by shape and device,
    as measured: docs/collectives.md); chunks: row chunks of the streamed variant (per owner for
    matmul_reduce_scatter).
    """
    block_size_m: Optional[int] = None
    block_size_n: Optional[int] = None
    block_size_k: Optional[int] = None
    group_size_m: int = 8
    num_sms: Optional[int] = None
    comm_sms: Optional[int] = None
    num_stages: Optional[int] = None
    num_warps: Optional[int] = None
    variant: Optional[str] = None
    chunks: Optional[int] = None

    def __post_init__(self):
        for name in ("block_size_m", "block_size_n", "block_size_k"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1)):
                raise ValueError(f"FusedConfig.{name} must be a power of two >= 16, got {v!r}")
        if self.variant not in (None, "fused", "streamed"):
            raise ValueError(f"FusedConfig.variant must be None, 'fused' or 'streamed', got {self.variant!r}")
        for name in ("group_size_m", "num_sms", "comm_sms", "num_stages", "num_warps", "chunks"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"FusedConfig.{name} must be a positive int, got {v!r}")
