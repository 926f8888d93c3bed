"""Collectives over the symmetric heap (ctx.ccl): all_reduce, all_gather, reduce_scatter, all_to_all and
broadcast as Triton kernels synchronised on the device. See docs/collectives.md."""
from .collectives import CCL, CollectiveError, GluonUnavailable
from .config import Config, ConfigError, ReduceOp

__all__ = ["CCL", "CollectiveError", "Config", "ConfigError", "GluonUnavailable", "ReduceOp"]
