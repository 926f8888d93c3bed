"""Collectives over the symmetric heap (ctx.ccl): all_reduce, all_gather, reduce_scatter, all_to_all and
broadcast as Triton kernels synchronised on the device. See docs/collectives.md."""
from ..errors import CollectiveError, ConfigError, GluonUnavailable
from .collectives import CCL
from .config import Config, ReduceOp

__all__ = ["CCL", "CollectiveError", "Config", "ConfigError", "GluonUnavailable", "ReduceOp"]
