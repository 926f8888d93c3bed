"""Kernel parameters of the collectives (Iris's Config fields with Iris's meaning, plus iris's own), and
the reductions they offer. A Config is mutable, as Iris's is: a collective validates it when it uses
it, and finds its plan by the values it holds at that moment (Config.key())."""
from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum

from .. import settings
from ..errors import ConfigError

ALL_REDUCE = ("auto", "atomic", "ring", "two_shot", "one_shot", "spinlock", "one_shot_push", "two_shot_push")
ALL_GATHER = ("pull", "persistent", "partitioned", "ring", "tdm")
ALL_TO_ALL = ("default", "tdm")
REDUCE_SCATTER = ("two_shot", "ring_chunked")
REDUCE = ("one_shot", "two_shot")  # Iris's names; iris's rooted reduce is one kernel (the root reads in place)
GLUON_ONLY = "tdm"


class ReduceOp(str, Enum):
    """Reductions: SUM for every supported dtype; MAX and MIN cost the same here, so they are offered too."""
    SUM = "sum"
    MAX = "max"
    MIN = "min"


def _device_sms() -> int:
    """The current GPU's SM count, or 4 where there is none (the Triton interpreter runs programs one
    after another: more of them buy nothing)."""
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 4


@dataclass
class Config:
    """Collective kernel parameters; docs/collectives.md has the table (field, Iris's meaning, what iris
    does on NVIDIA, default).

    Iris's fields: block_size_m, block_size_n (a tile's rows and columns: the tile of the atomic,
    spinlock and ring all_reduce, block_size_m * block_size_n elements of the flattened tensor, as
    Iris's all_reduce views it); swizzle_size; comm_sms (most programs one launch uses; None: one per
    SM); num_xcds (1 on NVIDIA: there is one die); chunk_size; use_gluon (all_gather and all_to_all
    through iris.ccl.gluon); all_gather_variant, all_to_all_variant, all_reduce_variant,
    reduce_scatter_variant, reduce_variant (see the tuples above; reduce_variant's two names run
    iris's one rooted kernel); all_reduce_distribution (two_shot: 0 strides
    blocks across ranks, 1 gives each rank one contiguous range); all_reduce_num_rings;
    all_reduce_ring_slice_n; num_stages; num_warps (None: by variant); threads_per_warp (32 on NVIDIA);
    waves_per_eu (an AMD occupancy hint, no effect on NVIDIA).

    iris's own: block_size (elements a program moves per step in the flat kernels, a power of two;
    0: by dtype, benchmarks/collectives.py chose 16 KiB worth; two_shot_push 4 to 32 KiB by size);
    one_shot_max_bytes (the largest all_reduce that "auto" does in one shot; 0: 4 MiB on 2 ranks,
    256 KiB on more, from benchmarks/results/collectives_variants-gpu-2ranks.json); pull_segments
    (all_gather pull, all_to_all, reduce_scatter two_shot and all_reduce two_shot_push: 1 one flag
    exchange; k >= 2 each rank stores into the peers in at most k segments per program, building out
    from one segment while it stores the next; 0: 1 below iris.ccl.builders.PIPELINE_BYTES of inp,
    16 / 32 / 64 / 256 MiB, else builders.SEGMENTS, 4; other collectives ignore it); spin_limit (the
    most polls of a flag before a program gives up; None: IRIS_SPIN_LIMIT, a few minutes; 0 waits for
    ever; a program that gives up leaves wrong data and marks its flag, and the host raises WaitTimeout
    at the next ctx.barrier(), ctx.ccl.free() or close, naming the collective, the rank, the peer, the
    flag and the epoch; the workspace is then unusable).
    """
    block_size_m: int = 32
    block_size_n: int = 64
    swizzle_size: int = 4
    comm_sms: int | None = None
    num_xcds: int | None = None
    chunk_size: int | None = None
    use_gluon: bool = False
    all_gather_variant: str = "pull"
    all_to_all_variant: str = "default"
    all_reduce_variant: str = "auto"
    all_reduce_distribution: int = 1
    all_reduce_num_rings: int = 1
    all_reduce_ring_slice_n: int | None = None
    reduce_scatter_variant: str = "two_shot"
    reduce_variant: str = "one_shot"
    num_stages: int = 1
    num_warps: int | None = None
    threads_per_warp: int | None = None
    waves_per_eu: int = 0
    block_size: int = 0
    one_shot_max_bytes: int = 0
    pull_segments: int = 0
    spin_limit: int | None = None

    def __post_init__(self):
        if self.comm_sms is None:
            self.comm_sms = _device_sms()
        if self.num_xcds is None:
            self.num_xcds = 1
        if self.chunk_size is None and isinstance(self.comm_sms, int) and isinstance(self.num_xcds, int):
            self.chunk_size = max(1, min(self.swizzle_size * self.swizzle_size, self.comm_sms // max(1, self.num_xcds)))
        if self.all_reduce_ring_slice_n is None:
            self.all_reduce_ring_slice_n = self.block_size_n
        if self.threads_per_warp is None:
            self.threads_per_warp = 32
        if self.spin_limit is None:
            self.spin_limit = settings.SPIN_LIMIT.get()
        self.validate()
        # checked at construction only, as Iris does: iris's ring cuts each tile into world slices itself
        # (Iris's launch resets the slice to block_size_n // world), so a later block_size_n may not divide
        v = self.all_reduce_ring_slice_n
        if v & (v - 1) or self.block_size_n % v:
            raise ConfigError(f"Config.all_reduce_ring_slice_n ({v}) must be a power of two dividing block_size_n "
                              f"({self.block_size_n})")

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name != "_key":
            object.__setattr__(self, "_key", None)

    def key(self) -> tuple:
        """The values now held, validated: plans are found by it, so a field changed after construction
        takes effect at the next call (and is checked there)."""
        k = self.__dict__.get("_key")
        if k is None:
            self.validate()
            k = tuple(getattr(self, f.name) for f in fields(self))
            object.__setattr__(self, "_key", k)
        return k

    def validate(self, world: int | None = None) -> None:
        """Raises ConfigError naming the field and what it may hold. world: also the checks that depend
        on the number of ranks (the ring's tile split, partitioned all_gather)."""
        for name in ("block_size_m", "block_size_n", "swizzle_size", "comm_sms", "num_xcds", "chunk_size",
                     "all_reduce_num_rings", "all_reduce_ring_slice_n", "num_stages", "threads_per_warp"):
            _int(name, getattr(self, name), 1)
        for name in ("waves_per_eu", "block_size", "one_shot_max_bytes", "pull_segments", "spin_limit"):
            _int(name, getattr(self, name), 0)
        if self.num_warps is not None:
            _int("num_warps", self.num_warps, 1)
        for name in ("block_size_m", "block_size_n", "block_size", "num_warps"):
            v = getattr(self, name)
            if v and v & (v - 1):
                raise ConfigError(f"Config.{name} must be a power of two (Triton's block shapes are), got {v}")
        if self.block_size and self.block_size < 16:
            raise ConfigError(f"Config.block_size must be at least 16 elements (or 0: by dtype), got {self.block_size}")
        if self.threads_per_warp not in (32, 64):
            raise ConfigError(f"Config.threads_per_warp must be 32 (NVIDIA) or 64, got {self.threads_per_warp}")
        if not isinstance(self.use_gluon, bool):
            raise ConfigError(f"Config.use_gluon must be True or False, got {self.use_gluon!r}")
        if self.all_reduce_distribution not in (0, 1) or isinstance(self.all_reduce_distribution, bool):
            raise ConfigError("Config.all_reduce_distribution must be 0 (blocks strided across ranks) or 1 (one "
                              f"contiguous range per rank), got {self.all_reduce_distribution!r}")
        for name, allowed in (("all_reduce_variant", ALL_REDUCE), ("all_gather_variant", ALL_GATHER),
                              ("all_to_all_variant", ALL_TO_ALL), ("reduce_scatter_variant", REDUCE_SCATTER),
                              ("reduce_variant", REDUCE)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"Config.{name} must be one of {', '.join(map(repr, allowed))}, "
                                  f"got {getattr(self, name)!r}")
        for name in ("all_gather_variant", "all_to_all_variant"):
            if getattr(self, name) == GLUON_ONLY and not self.use_gluon:
                raise ConfigError(f"Config.{name}={GLUON_ONLY!r} is a Gluon kernel: set use_gluon=True, or pick "
                                  f"another variant")
        if world is None:
            return
        if self.all_reduce_num_rings > self.comm_sms:
            raise ConfigError(f"Config.all_reduce_num_rings ({self.all_reduce_num_rings}) must be at most comm_sms "
                              f"({self.comm_sms}): each ring needs a program")
        if self.all_gather_variant == "partitioned" and self.comm_sms % world:
            raise ConfigError(f"Config.comm_sms ({self.comm_sms}) must be a multiple of the {world} ranks for "
                              "all_gather_variant='partitioned' (its programs are split evenly by destination rank)")


def checked(config):
    """config (a Config, or None for the defaults) validated as it stands now; anything else is refused."""
    if config is not None:
        if not isinstance(config, Config):
            raise ConfigError(f"config must be an iris.ccl.Config (or None: the defaults), got {type(config).__name__}")
        config.key()
    return config


def _int(name, v, least) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ConfigError(f"Config.{name} must be an int >= {least}, got {v!r}")
