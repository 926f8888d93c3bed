"""Gluon kernels of all_gather and all_to_all, for Config(use_gluon=True) (Iris's Gluon collectives).

Each rank pushes its tiles into the peers' outputs with iris.gluon.IrisDeviceCtx stores, a device
barrier before (no peer still reads its output) and after (every peer's tiles have landed), so a
call is complete in stream order and capturable in a CUDA graph. A tile is block_size_m x
block_size_n elements laid out flat over threads_per_warp (32 on NVIDIA) x num_warps threads.
Gluon has no interpreter: these run on GPUs only.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..gluon import IrisDeviceCtx
from ..errors import CollectiveError

_WARP = 32  # NVIDIA
_DEFAULT_WARPS = 4


@gluon.jit
def _tile(tile, tiles_n, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Row and column indices (int64) of one tile's elements, and which of them lie inside (M, N)."""
    flat = gl.arange(0, BLOCK_M * BLOCK_N, layout=layout)
    row = (tile // tiles_n) * BLOCK_M + flat // BLOCK_N
    col = (tile % tiles_n) * BLOCK_N + flat % BLOCK_N
    return row.to(gl.int64), col.to(gl.int64), (row < M) & (col < N)


@gluon.jit
def _push_kernel(IrisDeviceCtx: gl.constexpr, context, inp, out, M, N, s_im, s_in, s_om, s_on, peer_in, me_out,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WARP: gl.constexpr, WARPS: gl.constexpr,
                 PROGRAMS: gl.constexpr):
    """Every peer q gets tile by tile the (M, N) block of inp at element q * peer_in, stored into its out
    at element rank * me_out: all_gather (peer_in 0: the same block for every peer; me_out this rank's
    rows) and all_to_all (peer_in, me_out: one column block). Peers in order from this rank, so the
    ranks' stores spread over targets."""
    ctx = IrisDeviceCtx.initialize(context)
    layout: gl.constexpr = gl.BlockedLayout([BLOCK_M * BLOCK_N // (WARP * WARPS)], [WARP], [WARPS], [0])
    tiles_n = gl.cdiv(N, BLOCK_N)
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * tiles_n, PROGRAMS):
        row, col, mask = _tile(tile, tiles_n, M, N, BLOCK_M, BLOCK_N, layout)
        src = inp + row * s_im + col * s_in
        dst = out + ctx.cur_rank * me_out + row * s_om + col * s_on
        for i in range(ctx.num_ranks):
            peer = (ctx.cur_rank + i) % ctx.num_ranks
            ctx.store(dst, gl.load(src + peer * peer_in, mask=mask), peer, mask=mask)


def _launch_shape(ctx, config, M: int, N: int) -> tuple:
    """(block_m, block_n, warps, programs) from an Iris-style Config (None: its defaults), checked
    before any launch; at most one program per SM (comm_sms) and per tile."""
    block_m = getattr(config, "block_size_m", None) or 32
    block_n = getattr(config, "block_size_n", None) or 64
    warps = getattr(config, "num_warps", None) or _DEFAULT_WARPS
    warp = getattr(config, "threads_per_warp", None) or _WARP
    if warp != _WARP:
        raise CollectiveError(f"Gluon collectives: Config.threads_per_warp={warp}, but NVIDIA warps have "
                              f"{_WARP} threads; leave it None or set 32")
    threads = _WARP * warps
    if (block_m * block_n) % threads or block_m * block_n & (block_m * block_n - 1):
        raise CollectiveError(f"Gluon collectives: a tile of block_size_m * block_size_n = {block_m} * {block_n} "
                              f"elements must be a power of two and a multiple of threads_per_warp * num_warps "
                              f"= {threads}; e.g. block_size_m=8, block_size_n=256")
    sms = getattr(config, "comm_sms", None) or torch.cuda.get_device_properties(ctx.device).multi_processor_count
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    return block_m, block_n, warps, max(1, min(int(sms), tiles))


def _check(call: str, ctx, out, inp, want: tuple) -> None:
    if inp.dim() != 2:
        raise CollectiveError(f"{call}(use_gluon=True): inp must be 2-D, got shape {tuple(inp.shape)}")
    if tuple(out.shape) != want or out.dtype != inp.dtype:
        raise CollectiveError(f"{call}(use_gluon=True): out must be {want} {inp.dtype} for inp "
                              f"{tuple(inp.shape)}; got {tuple(out.shape)} {out.dtype}")
    if not ctx.is_symmetric(out):
        raise CollectiveError(f"{call}(use_gluon=True): out must be on the heap (peers store into it); "
                              "allocate it with ctx.empty/ctx.zeros")
    if inp.device != ctx.device or out.device != ctx.device:
        raise CollectiveError(f"{call}(use_gluon=True): inp and out must be on {ctx.device}")


def _run(ctx, out, inp, M: int, N: int, peer_in: int, me_out: int, config) -> None:
    block_m, block_n, warps, programs = _launch_shape(ctx, config, M, N)
    ctx.device_barrier()
    _push_kernel[(programs,)](IrisDeviceCtx, ctx.get_device_context(), inp, out, M, N, inp.stride(0), inp.stride(1),
                              out.stride(0), out.stride(1), peer_in, me_out, block_m, block_n, _WARP, warps, programs,
                              num_warps=warps)
    ctx.device_barrier()


def all_gather(ctx, out, inp, config=None) -> None:
    """out (world*M, N) = every rank's inp (M, N), rank r's at rows [r*M, (r+1)*M). Collective: all
    ranks, same order, same sizes."""
    M, N = (inp.shape[0], inp.shape[1]) if inp.dim() == 2 else (0, 0)
    _check("all_gather", ctx, out, inp, (ctx.get_num_ranks() * M, N))
    _run(ctx, out, inp, M, N, 0, M * out.stride(0), config)


def all_to_all(ctx, out, inp, config=None) -> None:
    """inp and out (M, N*world): columns [r*N, (r+1)*N) of inp go to rank r, and out's columns
    [r*N, (r+1)*N) come from rank r. Collective: all ranks, same order, same sizes."""
    world = ctx.get_num_ranks()
    _check("all_to_all", ctx, out, inp, tuple(inp.shape))
    if inp.shape[1] % world:
        raise CollectiveError(f"all_to_all(use_gluon=True): inp's {inp.shape[1]} columns are not N*world for "
                              f"{world} ranks; pad them to a multiple of {world}")
    n = inp.shape[1] // world
    _run(ctx, out, inp, inp.shape[0], n, n * inp.stride(1), n * out.stride(1), config)
