"""FusedConfig: the tile sizes, launch shape and algorithm of the fused GEMM + communication ops."""
from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Optional

ALL_REDUCE_VARIANTS = ("atomic", "ring", "one_shot", "two_shot", "spinlock")  # the names Iris accepts
CACHE_MODIFIERS = (None, "", ".ca", ".cg", ".cs", ".cv", ".wb", ".wt")


@dataclass
class FusedConfig:
    """Iris's fields with Iris's defaults, plus iris's own. Mutable, as Iris's: checked by validate(),
    which an op calls the first time it sees these values (key()).

    block_size_m/n/k: the GEMM tile (None: chosen from the shape and the device); group_size_m: tiles
    of that many rows share B columns in L2; num_sms: programs of the persistent grid (default every
    SM, or one under the interpreter); all_reduce_variant: matmul_all_reduce's algorithm, "two_shot"
    (each rank reduces the tiles it owns and sends them to every rank) or "one_shot" (every rank
    receives every partial and reduces all); "atomic", "spinlock" (each tile added into every rank's
    zeroed output) and "ring" run through the device tile API (iris/ops/matmul_tile_reduce.py).
    Accepted for Iris's programs, without effect on NVIDIA (docs/porting-from-iris.md): num_xcds,
    chunk_size (AMD chiplets), cache_modifier_a/b (operands are read through TMA or plain loads),
    all_reduce_num_rings (the ring variant), reduce_num_sms (no separate reduction kernel here).
    allow_tf32: float32 operands multiply in TF32, as Iris's default; False is not offered.

    iris's own: comm_sms: programs that only move data (all_gather_matmul's pushers; in the streamed
    matmul_all_reduce, reduce each chunk with ctx.ccl.all_reduce on that many programs);
    num_stages/num_warps: Triton's pipeline depth and warps per program; variant: "fused" (one
    persistent kernel), "streamed" (torch.matmul by chunks of rows, copy-engine transfers on side
    streams: iris/ops/streamed.py), "ccl" (torch.matmul, then ctx.ccl's collective: iris/ops/unfused.py)
    or None: with config=None iris picks by shape and device
    (docs/collectives.md); with a config, "fused"; "tiles": matmul_all_reduce and matmul_reduce_scatter
    through the device tile API, any all_reduce_variant but ring's block rule (iris/ops/matmul_tile_reduce.py);
    chunks: the streamed variant's chunks of each rank's rows (None: 2 to 4 by size).
    """
    block_size_m: Optional[int] = 256
    block_size_n: Optional[int] = 64
    block_size_k: Optional[int] = 64
    group_size_m: int = 1
    num_sms: Optional[int] = None
    num_xcds: int = 1
    chunk_size: int = 1
    cache_modifier_a: Optional[str] = ".ca"
    cache_modifier_b: Optional[str] = ".ca"
    allow_tf32: bool = True
    all_reduce_variant: str = "two_shot"
    all_reduce_num_rings: int = 1
    reduce_num_sms: int = 64
    comm_sms: Optional[int] = None
    num_stages: Optional[int] = None
    num_warps: Optional[int] = None
    variant: Optional[str] = None
    chunks: Optional[int] = None

    def __post_init__(self):
        self.validate()

    def key(self) -> tuple:
        """The fields' values now (scalars all, not copied): what validate() and a workspace built for this
        config depend on, so every op call with a config keys on it."""
        return _KEY(self)

    def validate(self, world_size: Optional[int] = None) -> None:
        """Raise ValueError naming the first bad field (Iris's check, and the limits of iris's kernels)."""
        for name in ("block_size_m", "block_size_n", "block_size_k"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1)):
                raise ValueError(f"FusedConfig.{name} must be a power of two >= 16 (or None: chosen by shape), "
                                 f"got {v!r}")
        for name in ("group_size_m", "num_xcds", "chunk_size", "all_reduce_num_rings", "reduce_num_sms", "num_sms",
                     "comm_sms", "num_stages", "num_warps", "chunks"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"FusedConfig.{name} must be a positive int, got {v!r}")
        if self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise ValueError(f"FusedConfig.all_reduce_variant must be one of {list(ALL_REDUCE_VARIANTS)}, "
                             f"got {self.all_reduce_variant!r}")
        if self.all_reduce_variant == "ring" and world_size is not None and self.block_size_n is not None \
                and self.block_size_n % world_size:
            raise ValueError(f"FusedConfig: the ring variant needs block_size_n ({self.block_size_n}) divisible by "
                             f"the world size ({world_size})")
        if self.variant not in (None, "fused", "streamed", "tiles", "ccl"):
            raise ValueError(f"FusedConfig.variant must be None, 'tiles', 'fused', 'streamed' or 'ccl', got "
                             f"{self.variant!r}")
        for name in ("cache_modifier_a", "cache_modifier_b"):
            if getattr(self, name) not in CACHE_MODIFIERS:
                raise ValueError(f"FusedConfig.{name} must be one of {list(CACHE_MODIFIERS)}, got "
                                 f"{getattr(self, name)!r}")
        if self.allow_tf32 is not True:
            raise ValueError("FusedConfig.allow_tf32=False is not offered: iris's kernels multiply float32 in TF32; "
                             "use torch.matmul with torch.backends.cuda.matmul.allow_tf32 = False and ctx.ccl")


_KEY = attrgetter(*(f.name for f in fields(FusedConfig)))
