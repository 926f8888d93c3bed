"""iris.ops: GEMMs fused with communication, as ctx.ops.NAME(output, A, B, ...) or, as Iris spells
them, iris.ops.NAME(ctx, output, A, B, ...).

Every op is collective: all ranks call it in the same order with the same shapes, dtypes and
config. The first call for a (shapes, dtype, config) allocates that op's workspace on the heap
(collectively) and keeps it; NAME_preamble does that ahead of time and returns it, to pass as
workspace= (for CUDA-graph capture, allocate before capturing). Calls are ordered on the current
stream and the output is complete on every rank when the op's work ends in that order, so they
never synchronize the host (async_op is accepted for Iris's programs: no barrier is needed) and can
be captured in a CUDA graph. Every op returns its workspace, as Iris's do.

Layouts follow the shapes. all_gather_matmul: A row-sharded (m x K, B K x N, output world*m x N),
or Iris's column-sharded A (M x K_local, B world*K_local x N, output M x N). matmul_reduce_scatter:
output M/world x N takes this rank's rows; output M x N is Iris's layout, this rank's tiles
(owned_tiles.py). matmul_all_reduce: FusedConfig.all_reduce_variant "one_shot" or "two_shot" by
iris's fused kernels; "atomic", "spinlock" and "ring" (Iris's other names) through the device tile API
(matmul_tile_reduce.py), as FusedConfig(variant="tiles") runs every variant.

Three implementations (FusedConfig.variant): "fused", one persistent Triton kernel; "streamed", cuBLAS
by chunks of rows with copy-engine transfers on side streams (streamed.py); "ccl", the GEMM then
ctx.ccl's collective (unfused.py). With config=None iris
picks by shape where benchmarks/gemm_comm.py chose (docs/performance.md): streamed for
matmul_all_gather from STREAMED_MIN_ROWS * world / 2 rows and for a row-layout
matmul_reduce_scatter from STREAMED_MIN_MACS * world / 2; below them matmul_all_gather is "ccl",
matmul_reduce_scatter "ccl" on 2 ranks and beyond 2 fused ("ccl" below RS_CCL_MAX_MACS).
all_gather_matmul is "ccl" below AG_CCL_MAX_MACS, streamed below AG_STREAMED_MAX_MACS (twice that
beyond 2 ranks), fused from there. matmul_all_reduce is streamed
from AR_STREAMED_MIN_ROWS * world / 2 rows, "ccl" below. The host always runs fused.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from . import all_gather_matmul as _agm
from . import gather_k as _gk
from . import matmul_all_gather as _mag
from . import matmul_reduce as _mr
from . import matmul_tile_reduce as _mtr
from . import owned_tiles as _ot
from . import streamed as _st
from . import unfused as _un
from ..errors import CollectiveError, IndirectPeerError, WaitTimeout
from .config import FusedConfig
# Iris's module path iris.ops.matmul_reduce_scatter; bound after the submodule loads, so the name is the function
from .matmul_reduce_scatter import matmul_reduce_scatter, matmul_reduce_scatter_preamble
from .gemm import check_operands, interpreted, matmul, tiles_for
from .workspace import FusedWorkspace

# where "streamed" and "ccl" are chosen, and the chunks: benchmarks/gemm_comm.py (results/gemm_comm-fused-gpu-*.json)
STREAMED_MIN_ROWS = 2048  # matmul_all_gather: streamed from these output rows times world / 2, "ccl" below
AR_STREAMED_MIN_ROWS = 2048  # matmul_all_reduce: streamed from these rows times world / 2, "ccl" below
STREAMED_MIN_MACS = 1 << 35  # matmul_reduce_scatter (row layout): multiply-adds from which streamed is
AG_STREAMED_MAX_MACS = 1 << 38  # all_gather_matmul: streamed below these multiply-adds, the fused kernel from them
AG_CCL_MAX_MACS = 1 << 36  # all_gather_matmul: "ccl" below these multiply-adds
RS_CCL_MAX_MACS = 1 << 34  # matmul_reduce_scatter beyond 2 ranks: "ccl" below these, fused from them
CHUNK_ROWS = 512  # streamed: chunks per owner's rows of about this many, 2 to 4 (one chunk cannot overlap)
RS_CHUNK_ROWS = 2048  # matmul_reduce_scatter's on 2 ranks (2 chunks led 4 up to 4096 rows an owner)
CHUNKS_BEYOND_2 = 2  # matmul_all_reduce's and matmul_reduce_scatter's beyond 2 ranks (4 ranks: 2 led 3 and 4 from
# 1024 rows an owner); matmul_all_gather's follow CHUNK_ROWS at any world (4 ranks, 2048 rows a rank: 4 chunks 503 us,
# 2 chunks 547 in a graph)


def streamed_chunks(kind: str, owner_rows: int, world: int = 2) -> int:
    """The default chunks of a streamed op whose ranks each own owner_rows rows of the output."""
    if kind == "ag":
        return 1
    if world > 2 and kind != "mag":
        return CHUNKS_BEYOND_2
    return min(4, max(2, owner_rows // (RS_CHUNK_ROWS if kind == "rs" else CHUNK_ROWS)))
IRIS_TILE = dict(block_size_m=256, block_size_n=64)  # Iris's default tile: it defines who owns which tiles
# matmul_all_reduce's variants that only the tile-API kernel runs (Iris's atomic and spinlock add each tile
# into every rank's zeroed output; ring reduces the published partials around the ring)
TILE_API_VARIANTS = ("atomic", "spinlock", "ring")
# the workspaces that hold a lock per tile of the config they were built with, as Iris's do
LOCKED = ("ar", "rs", "ar_tiles", "rs_tiles", "ar_tile_api", "rs_tile_api")
OP_NAMES = {"ag": "all_gather_matmul", "ar": "matmul_all_reduce", "rs": "matmul_reduce_scatter",
            "mag": "matmul_all_gather"}

__all__ = ["FusedConfig", "FusedWorkspace", "OpsNamespace", "all_gather_matmul", "all_gather_matmul_preamble", "matmul",
           "matmul_all_gather", "matmul_all_gather_preamble", "matmul_all_reduce", "matmul_all_reduce_preamble",
           "matmul_reduce_scatter", "matmul_reduce_scatter_preamble"]


def default_variant(kind: str, world: int, rows: int, cols: int, a_rows: int, inner: int) -> str:
    """The variant config=None runs on GPUs for an op (kind "ag", "mag", "rs", "ar") with an output of
    rows x cols and A of a_rows x inner on each of world ranks (module docstring; docs/performance.md)."""
    if kind == "ar":  # the matmul then ctx.ccl.all_reduce led below 2048 rows at 2 ranks, below 4096 at 4
        return "streamed" if rows >= AR_STREAMED_MIN_ROWS * world / 2 else "ccl"
    if kind == "mag":
        return "streamed" if rows >= STREAMED_MIN_ROWS * world / 2 else "ccl"
    if kind == "rs":
        macs = a_rows * cols * inner
        return ("streamed" if macs >= STREAMED_MIN_MACS * world / 2 else
                "ccl" if world == 2 or macs < RS_CCL_MAX_MACS else "fused")
    macs = rows * cols * inner
    return ("ccl" if macs < AG_CCL_MAX_MACS else
            "streamed" if macs < AG_STREAMED_MAX_MACS * (1 if world == 2 else 2) else "fused")


def _check_bias(name, bias, output):
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 1
                             or bias.shape[0] != output.shape[0] or bias.device != output.device):
        raise ValueError(f"{name}: bias must be a 1-D tensor of the output's {output.shape[0]} rows on "
                         f"{output.device} (added to every column, as Iris does), got "
                         f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")


def _tagged(ws: dict, op: str) -> FusedWorkspace:
    """The workspace as a FusedWorkspace, marked with the kernel it was built for."""
    ws = FusedWorkspace(ws)
    ws["op"] = op
    return ws


def _shaped(shape, like: torch.Tensor) -> torch.Tensor:
    """A tensor of this shape that takes no memory: for checks and workspace keys before the output exists."""
    return torch.empty(1, dtype=like.dtype, device=like.device).expand(*shape)


class OpsNamespace:
    """ctx.ops: the fused ops bound to one Iris context, with their workspaces.

    A call's checks depend on its signature (_signature) and the context alone, so each signature is
    checked at its first call, before anything is allocated, and later calls find its workspace by one
    lookup. What no signature tells (the bias, a heap output, a workspace passed back) is checked at
    every call."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._workspaces = {}
        self._calls = {}  # signature -> the workspace of its calls, every check of it made
        self._watch = None  # the streamed calls in flight on the GPU (streamed.Watch), from the first

    def forget(self) -> None:
        """Drop every workspace and signature (the context is closing): a later call checks anew, which
        raises ContextClosed."""
        self._workspaces.clear()
        self._calls.clear()
        if self._watch is not None:
            self._watch.close()

    def raise_failed(self) -> None:
        """Raise, once, the WaitTimeout of a streamed call that the watch released (a peer stopped sending
        its chunks), after dropping that call's workspace."""
        if self._watch is not None and self._watch.failed is not None:
            self._calls = {k: v for k, v in self._calls.items() if not v.get("dead")}
            self._watch.raise_failed()

    @staticmethod
    def _signature(kind, output, A, B, config) -> tuple:
        """What _kind's checks and the workspace depend on besides the context: the operands' shapes,
        dtypes and devices, and the config's values (a FusedConfig is mutable). No check reads strides."""
        if not (isinstance(A, torch.Tensor) and isinstance(B, torch.Tensor) and isinstance(output, torch.Tensor)):
            check_operands(OP_NAMES[kind], A, B, output)  # raises, naming the operand
        return (kind, A.shape, B.shape, output.shape, A.dtype, B.dtype, output.dtype, A.device, B.device,
                output.device, None if config is None else config.key())

    def _known(self, signature):
        """The workspace of a signature checked before, or None."""
        try:
            return self._calls.get(signature)
        except TypeError:  # a config field set to something unhashable: new, and validate() names it
            return None

    def _ws(self, name, output, A, B, config, make):
        key = (name, tuple(A.shape), tuple(B.shape), tuple(output.shape), A.dtype, A.device,
               None if config is None else config.key())
        ws = self._workspaces.get(key)
        if ws is None:
            ws = self._workspaces[key] = make()
            # name's first word is the op's kind ("rs_tiles", "ar/streamed", "ag_k"): what a call checks it against
            ws["built_for"] = (name.split("/")[0].split("_")[0],) + key[1:6]
        return ws

    @staticmethod
    def _passed(name, workspace) -> None:
        if not isinstance(workspace, dict):
            raise TypeError(f"{name}: workspace must be what {name}_preamble or {name} returned, got "
                            f"{type(workspace).__name__}")

    @staticmethod
    def _built_for(kind, workspace, output, A, B) -> bool:
        return tuple(workspace.get("built_for", ())) == (kind, tuple(A.shape), tuple(B.shape), tuple(output.shape),
                                                         A.dtype, A.device)

    def _given(self, name, kind, output, A, B, config, workspace):
        """A workspace passed back to an op whose signature is checked: checked against these tensors and
        config before anything is allocated or launched; an empty FusedWorkspace is filled."""
        self._passed(name, workspace)
        if not workspace:
            workspace.update(self._preamble(kind, output, A, B, config))
            return workspace
        if not self._built_for(kind, workspace, output, A, B):
            built = tuple(workspace.get("built_for", ())) + (None,) * 6
            raise CollectiveError(f"{name}: the workspace was built for {OP_NAMES.get(built[0], 'no op')} with A "
                                  f"{built[1]}, B {built[2]}, output {built[3]} {built[4]} on {built[5]}, not for "
                                  f"{name} with A {tuple(A.shape)}, B {tuple(B.shape)}, output "
                                  f"{tuple(output.shape)} {A.dtype} on {A.device}; build one with {name}_preamble")
        self._locks_cover(name, workspace, output, A, config)
        return workspace

    def _prepared(self, name, kind, output, A, B, config, workspace):
        """What NAME_preamble returns: the workspace for this call, reused where one was built for it and
        built where not, as Iris's preambles rebuild one passed for other shapes or tiles; an empty
        FusedWorkspace passed is filled with it."""
        if workspace is not None:
            self._passed(name, workspace)
        ws = self._preamble(kind, output, A, B, config)
        if workspace is not None and not workspace:
            workspace.update(ws)
            return workspace
        return ws

    @staticmethod
    def _locks_cover(name, workspace, output, A, config) -> None:
        """Iris's check of a matmul_all_reduce or matmul_reduce_scatter workspace passed back with a config
        of smaller tiles than it was built for: its locks, one per tile, would not cover the config's
        tiles. Pure arithmetic on the shapes, so every rank raises alike, before anything is allocated."""
        built, op = workspace.get("tiles"), workspace.get("op")
        if config is None or built is None or op not in LOCKED or workspace.get("tile_op") in ("atomic", "ring"):
            return  # nothing holds a lock per tile (Iris's atomic takes no locks either)
        if op in ("ar_tiles", "rs_tiles"):  # as _preamble fills them
            config = dataclasses.replace(config, **{k: v for k, v in IRIS_TILE.items() if getattr(config, k) is None})
        m, n = (A.shape[0], output.shape[1]) if op.endswith("tile_api") else output.shape  # what the preamble tiled
        want = tiles_for(m, n, A.device, config, A.element_size())
        have, need = -(-m // built.bm) * -(-n // built.bn), -(-m // want.bm) * -(-n // want.bn)
        if have < need:
            raise CollectiveError(f"{name}: Lock array too small: have {have} but need {need} for block_size_m="
                                  f"{want.bm}, block_size_n={want.bn}: the workspace passed back was built for "
                                  f"{built.bm}x{built.bn} tiles. Pre-allocate workspace with the smallest block "
                                  f"sizes you intend to use ({name}_preamble with this config), or leave "
                                  f"workspace= out")

    def _variant(self, kind, output, A, B, config) -> str:
        if config is not None:
            return (config.variant or "fused") if self._ctx.world > 1 else "fused"
        if A.device.type != "cuda" or interpreted() or self._ctx.world == 1:
            return "fused"
        return default_variant(kind, self._ctx.world, output.shape[0], output.shape[1], A.shape[0], A.shape[1])

    def _kind(self, kind, output, A, B, config) -> str:
        """The op's layout and algorithm from the shapes and config, checked (before any allocation)."""
        w = self._ctx.world
        if self._ctx.reserve.indirect:
            raise IndirectPeerError("iris.ops: its fused GEMMs load and store into peers' memory directly, "
                                    "and some rank of this job has an indirect peer (another node, or "
                                    "IRIS_INDIRECT_PEERS); run the GEMM with torch and the communication with "
                                    "ctx.ccl, which reaches indirect peers")
        if config is not None:
            config.validate(w)
        if config is not None and config.variant == "tiles" and kind in ("ar", "rs"):
            name = "matmul_all_reduce" if kind == "ar" else "matmul_reduce_scatter"
            _mtr.check(name, self._ctx, A, B, output, config, kind == "rs")
            return kind + "_tile_api"
        if kind == "ag":
            if w > 1 and B.dim() == 2 and A.dim() == 2 and B.shape[0] == w * A.shape[1]:
                _gk.check(A, B, output, w)
                return "ag_k"
            _agm.check(A, B, output, w)
        elif kind == "ar":
            _mr.check("matmul_all_reduce", A, B, output, w, False)
            if config is not None and config.variant not in ("streamed", "ccl"):
                if config.all_reduce_variant in TILE_API_VARIANTS:
                    _mtr.check("matmul_all_reduce", self._ctx, A, B, output, config, False)
                    return "ar_tile_api"
                if config.all_reduce_variant == "two_shot" and w > 1:
                    return "ar_tiles"
        elif kind == "rs" and w > 1 and output.dim() == 2 and A.dim() == 2 and tuple(output.shape) == tuple(
                A.shape[:1]) + tuple(B.shape[1:]):
            _mr.check("matmul_reduce_scatter", A, B, output, 1, False)
            if config is not None and config.variant in ("streamed", "ccl"):
                raise ValueError(f"matmul_reduce_scatter: the {config.variant} variant takes the row layout (output "
                                 f"{A.shape[0] // w}x{B.shape[1]}); Iris's tile layout (output M x N) runs fused")
            return "rs_tiles"
        elif kind == "rs":
            _mr.check("matmul_reduce_scatter", A, B, output, w, True)
        elif kind == "mag":
            _mag.check(self._ctx, A, B, output)
        return kind

    def _preamble(self, kind, output, A, B, config):
        signature = self._signature(kind, output, A, B, config)
        ws = self._known(signature)
        if ws is None:
            ws = self._calls[signature] = self._build(self._kind(kind, output, A, B, config), output, A, B, config)
        return ws

    def _build(self, kind, output, A, B, config):
        """The workspace of a call checked by _kind, which named its kind."""
        ctx = self._ctx
        if kind in ("ar_tile_api", "rs_tile_api"):
            return self._ws(kind, output, A, B, config, lambda: _tagged(_mtr.preamble(ctx, output, A, B, config,
                                                                                 kind == "rs_tile_api"), kind))
        if kind in ("ar_tiles", "rs_tiles"):
            cfg = config or FusedConfig()
            cfg = dataclasses.replace(cfg, **{k: v for k, v in IRIS_TILE.items() if getattr(cfg, k) is None})
            return self._ws(kind, output, A, B, cfg, lambda: _tagged(_ot.preamble(ctx, output, A, B, cfg,
                                                                                kind == "ar_tiles"), kind))
        if kind == "ag_k":
            return self._ws(kind, output, A, B, None, lambda: _tagged(_gk.preamble(ctx, output, A, B), kind))
        variant = self._variant(kind, output, A, B, config)
        if variant == "ccl":  # the whole GEMM, then ctx.ccl's collective with its default config
            return self._ws(kind + "/ccl", output, A, B, None, lambda: _tagged(_un.preamble(ctx, kind, output, A, B),
                                                                               "ccl"))
        if variant == "streamed":
            owner = {"mag": A.shape[0], "rs": output.shape[0], "ar": output.shape[0] // ctx.world}.get(kind, 0)
            chunks = (config.chunks if config is not None and config.chunks else
                      streamed_chunks(kind, owner, ctx.world))
            comm_sms = config.comm_sms if config is not None else None
            if self._watch is None and A.device.type == "cuda":
                self._watch = _st.Watch(ctx)
            return self._ws(kind + "/streamed", output, A, B, config,
                            lambda: _tagged(_st.preamble(ctx, kind, output, A, B, chunks, comm_sms, self._watch),
                                            "streamed"))
        make = {"ag": lambda: _agm.preamble(ctx, output, A, B, config),
                "mag": lambda: _mag.preamble(ctx, output, A, B, config),
                "ar": lambda: _mr.preamble(ctx, output, A, B, config, scatter=False),
                "rs": lambda: _mr.preamble(ctx, output, A, B, config, scatter=True)}[kind]
        return self._ws(kind, output, A, B, config, lambda: _tagged(make(), kind))

    def _call(self, kind, name, output, A, B, bias, config, workspace):
        signature = self._signature(kind, output, A, B, config)
        ws = self._known(signature)
        # a new signature: its shapes and config checked before the bias (whose check reads them) and anything else
        layout = self._kind(kind, output, A, B, config) if ws is None else None
        if kind == "mag":  # this rank's bias goes into its rows before they are sent (Iris's layout)
            _mag.check_call(self._ctx, A, output, bias)
        else:
            _check_bias(name, bias, output)
        if workspace is not None:
            ws = self._given(name, kind, output, A, B, config, workspace)
        elif ws is None:
            ws = self._calls[signature] = self._build(layout, output, A, B, config)
        ctx, op = self._ctx, ws["op"]
        ctx.ccl.order.enter()  # one device order with every collective of the context (iris/ccl/order.py)
        if op in ("streamed", "ccl"):  # matmul_all_gather's bias goes into its rows before they are sent
            if self._watch is not None and (self._watch.failed is not None or ws.get("dead")):
                self.raise_failed()
                raise WaitTimeout(f"{OP_NAMES.get(kind, kind)}: this workspace belongs to a streamed call that was "
                                  "released after a peer stopped sending its chunks; its flags are not reset. Build "
                                  "a new one (the op's _preamble, or leave workspace= out), once every rank is back")
            (_st if op == "streamed" else _un).run(ctx, output, A, B, ws, bias if kind == "mag" else None)
            if kind == "mag":
                return ws
        elif op in ("ar_tile_api", "rs_tile_api"):
            _mtr.run(ctx, output, A, B, ws)
        elif op in ("ar_tiles", "rs_tiles"):
            _ot.run(ctx, output, A, B, ws)
        elif op == "ag_k":
            _gk.run(ctx, output, A, B, config, ws)
        elif op == "ag":
            _agm.run(ctx, output, A, B, config, ws)
        elif op == "mag":
            _mag.run(ctx, output, A, B, config, ws, bias)
            return ws
        else:
            _mr.run(ctx, output, A, B, config, ws, scatter=op == "rs")
        if bias is not None:
            output.add_(bias[:, None])
        return ws

    # the ops, with Iris's signatures -----------------------------------------------------------
    def all_gather_matmul_preamble(self, *tensors, config: Optional[FusedConfig] = None) -> dict:
        """Workspace for all_gather_matmul: (output, A, B) or, as Iris, (A_sharded, B).
        Collective: all ranks, same order, same sizes."""
        if len(tensors) == 2:
            A, B = tensors
            w = self._ctx.world
            rows = A.shape[0] if w > 1 and B.shape[0] == w * A.shape[1] else w * A.shape[0]
            tensors = (_shaped((rows, B.shape[1]), A), A, B)
        return self._preamble("ag", *tensors, config)

    def all_gather_matmul(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor, bias=None,
                          async_op: bool = False, config: Optional[FusedConfig] = None, workspace=None) -> dict:
        """output = all_gather(A) @ B (+ bias per row). A row-sharded (m x K per rank, output world*m x N)
        or column-sharded as Iris (M x K_local per rank, B world*K_local x N, output M x N); B the same on
        every rank. Collective: all ranks, same order, same sizes."""
        return self._call("ag", "all_gather_matmul", output, A, B, bias, config, workspace)

    def matmul_all_reduce_preamble(self, output, A, B, config: Optional[FusedConfig] = None, workspace=None) -> dict:
        """Workspace for matmul_all_reduce at these shapes and config: workspace= is returned where it was
        built for them, else replaced, as Iris's preamble rebuilds (the op itself raises on a workspace
        of larger tiles than its config's). Collective: all ranks, same order, same sizes."""
        return self._prepared("matmul_all_reduce", "ar", output, A, B, config, workspace)

    def matmul_all_reduce(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor, bias=None,
                          async_op: bool = False, config: Optional[FusedConfig] = None, workspace=None) -> dict:
        """output (M x N) = sum over ranks of A_r (M x k) @ B_r (k x N) (+ bias per row), on every rank: a
        row-parallel layer. Collective: all ranks, same order, same sizes."""
        return self._call("ar", "matmul_all_reduce", output, A, B, bias, config, workspace)

    def matmul_reduce_scatter_preamble(self, output, A, B, config: Optional[FusedConfig] = None,
                                       workspace=None) -> dict:
        """Workspace for matmul_reduce_scatter at these shapes and config: workspace= built for these shapes
        with larger tiles than config's raises, as Iris's preamble does, before anything is allocated; one
        built for this call is returned, any other replaced. Collective: all ranks, same order, same sizes."""
        if isinstance(workspace, dict) and workspace:
            self._kind("rs", output, A, B, config)
            if self._built_for("rs", workspace, output, A, B):
                self._locks_cover("matmul_reduce_scatter", workspace, output, A, config)
        return self._prepared("matmul_reduce_scatter", "rs", output, A, B, config, workspace)

    def matmul_reduce_scatter(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor, bias=None,
                              async_op: bool = False, config: Optional[FusedConfig] = None, workspace=None) -> dict:
        """This rank's share of sum over ranks of A_r @ B_r: output M/world x N takes rows [rank*M/world,
        (rank+1)*M/world); output M x N (Iris's layout) gets this rank's tiles (see owned_tiles), the
        others left as they were. Collective: all ranks, same order, same sizes."""
        return self._call("rs", "matmul_reduce_scatter", output, A, B, bias, config, workspace)

    def matmul_all_gather_preamble(self, output, A, B, config: Optional[FusedConfig] = None) -> dict:
        """Workspace for matmul_all_gather at these shapes. Collective: all ranks, same order, same sizes."""
        return self._preamble("mag", output, A, B, config)

    def matmul_all_gather(self, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor, bias=None,
                          async_op: bool = False, config: Optional[FusedConfig] = None, workspace=None) -> dict:
        """output (world*m x N, a heap tensor) = all_gather(A (m x K) @ B (K x N) + bias, rows) on every
        rank; bias (optional): this rank's, m values, one per row of A, as Iris adds it (each rank's
        rows carry its own). Collective: all ranks, same order, same sizes."""
        return self._call("mag", "matmul_all_gather", output, A, B, bias, config, workspace)


# Iris's module-level spelling: the context first ------------------------------------------------
def matmul_all_reduce(shmem, C, A, B, async_op=False, config=None, workspace=None) -> dict:
    """C = sum over ranks of A_r @ B_r on every rank (see OpsNamespace). Collective: all ranks, same order, same sizes."""
    return shmem.ops.matmul_all_reduce(C, A, B, async_op=async_op, config=config, workspace=workspace)


def matmul_all_reduce_preamble(shmem, C, A, B, config=None, workspace=None) -> dict:
    """Workspace for matmul_all_reduce. Collective: all ranks, same order, same sizes."""
    return shmem.ops.matmul_all_reduce_preamble(C, A, B, config=config, workspace=workspace)


def all_gather_matmul(shmem, output_tensor, A_sharded, B, bias=None, async_op=False, config=None,
                      workspace=None) -> dict:
    """output = all_gather(A_sharded) @ B (+ bias per row). Collective: all ranks, same order, same sizes."""
    return shmem.ops.all_gather_matmul(output_tensor, A_sharded, B, bias=bias, async_op=async_op, config=config,
                                       workspace=workspace)


def all_gather_matmul_preamble(shmem, A_sharded, B, config=None) -> dict:
    """Workspace for all_gather_matmul. Collective: all ranks, same order, same sizes."""
    return shmem.ops.all_gather_matmul_preamble(A_sharded, B, config=config)


def matmul_all_gather(shmem, output_tensor, A, B, bias=None, async_op=False, config=None, workspace=None) -> dict:
    """output = all_gather(A @ B + bias, rows) on every rank (bias: this rank's, per row of A). Collective:
    all ranks, same order, same sizes."""
    return shmem.ops.matmul_all_gather(output_tensor, A, B, bias=bias, async_op=async_op, config=config,
                                       workspace=workspace)


def matmul_all_gather_preamble(shmem, output_tensor, A, B, config=None) -> dict:
    """Workspace for matmul_all_gather. Collective: all ranks, same order, same sizes."""
    return shmem.ops.matmul_all_gather_preamble(output_tensor, A, B, config=config)
