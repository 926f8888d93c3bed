"""Kernel parameters of the collectives, and the reductions they offer."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

VARIANTS = ("auto", "one_shot", "two_shot", "one_shot_push", "two_shot_push")


class ReduceOp(str, Enum):
    """Reductions: SUM for every supported dtype; MAX and MIN cost the same here, so they are offered too."""
    SUM = "sum"
    MAX = "max"
    MIN = "min"


@dataclass(frozen=True)
class Config:
    """Kernel parameters; 0 means "pick for me" (sizes in elements).

    block_size: elements each program moves per step (a power of two; default 16 KiB worth, 32 KiB
    for two_shot_push); num_warps: warps per program (default 8, 16 for two_shot_push); comm_sms:
    most programs one launch uses (default the device's SM count, 4 on the host); all_reduce_variant: "auto", "one_shot" or "two_shot";
    one_shot_max_bytes: the largest all_reduce that "auto" does in one shot (default 4 MiB on 2 ranks,
    where one-shot measured faster than two-shot up to 4 MiB on 2x H200; 256 KiB on more ranks, not
    measured: one-shot reads world-1 full copies). "one_shot_push" and "two_shot_push" move data with
    remote stores only (each rank writes into its peers' stage, then reduces locally) and read inp
    once, on the heap or not. "auto" takes two_shot_push above one_shot_max_bytes: on 2x H200 it
    measured 54 / 748 us at 16 / 256 MiB on heap tensors against the pull two-shot's 57 / 796
    (plain tensors 58 / 790 against 69 / 975; benchmarks/results/collectives_variants-gpu-2ranks.json).
    spin_limit: the most polls of a flag before a program gives up waiting for a peer (0: wait for
    ever, the default). A program that gives up leaves wrong data and marks its flag row with -1; its
    workspace is then unusable (ctx.ccl.free()). For benchmarks and tests that must not hang.
    """
    block_size: int = 0
    num_warps: int = 0
    comm_sms: int = 0
    all_reduce_variant: str = "auto"
    one_shot_max_bytes: int = 0
    spin_limit: int = 0

    def __post_init__(self):
        for name in ("block_size", "num_warps", "comm_sms", "one_shot_max_bytes", "spin_limit"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"Config.{name} must be an int >= 0 (0: automatic), got {v!r}")
        for name in ("block_size", "num_warps"):
            v = getattr(self, name)
            if v & (v - 1):
                raise ValueError(f"Config.{name} must be a power of two (or 0: automatic), got {v}")
        if self.block_size and self.block_size < 16:
            raise ValueError(f"Config.block_size must be at least 16 elements, got {self.block_size}")
        if self.all_reduce_variant not in VARIANTS:
            raise ValueError(f"Config.all_reduce_variant must be one of {VARIANTS}, got {self.all_reduce_variant!r}")
