"""matmul_all_reduce and matmul_reduce_scatter through the device tile API (FusedConfig(variant="tiles")):
one persistent GEMM kernel whose programs hand each output tile, as soon as it is computed, to
all_reduce_<all_reduce_variant> or reduce_scatter of iris/device/tile_collectives.py, the functions
behind the DeviceContext methods a user's own kernel calls (here with a Ranks, as ops sit below the
tracing that DeviceContext carries).

The tile collectives leave the flags and the output's starting state to the caller, so each call
is: zero this rank's locks (or, for atomic and spinlock, the output), a device barrier (every rank
has done so, and has finished the call before: nobody still reads this rank's published tiles or
waits on its locks), the kernel, a device barrier (every rank's writes into this rank's output are
done). All of it is in stream order on the device: no host synchronisation, capturable in a CUDA
graph. Reduce-scatter owns tiles in contiguous runs of tile ids, which are this rank's rows of the
output (M/world x N) when M/world is a multiple of block_size_m.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device import signal
from ..device import tile_collectives as tiles
from ..device.tiles import Tile, TileView, make_tensor_view
from .config import FusedConfig
from .gemm import _dot_tile, _tile_mn, check_operands, launch, tile_args, tiles_for

ZEROED = ("atomic", "spinlock")  # the variants that add into a zeroed output
VARIANTS = ("atomic", "spinlock", "one_shot", "two_shot", "ring")


@triton.jit
def _matmul_tile_reduce_kernel(a, b, c, part, locks, heap_bases, M, N, K, sam, sak, sbk, sbn, scm, scn, row0,
                               RANK: tl.constexpr, WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                               BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, TMA: tl.constexpr,
                               A_T: tl.constexpr, B_T: tl.constexpr, STAGES: tl.constexpr, OP: tl.constexpr):
    ctx = tiles.Ranks(RANK, WORLD, heap_bases)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    # c's rows start at global row row0 (reduce-scatter into this rank's rows); the view spans all M
    dst = make_tensor_view(c - row0 * scm, M, N, scm, scn)
    published = make_tensor_view(part, M, N, N, 1)
    for t in range(tl.program_id(0), num_m * num_n, NUM_SMS):
        pid_m, pid_n = _tile_mn(t, num_m, num_n, GROUP_M)
        acc = _dot_tile(a, b, pid_m * BM, pid_n * BN, M, N, K, sam, sak, sbk, sbn, BM, BN, BK, TMA, A_T, B_T, STAGES)
        tile = Tile(pid_m, pid_n, BM, BN, acc.to(part.dtype.element_ty))
        if OP == "one_shot" or OP == "two_shot" or OP == "reduce_scatter" or OP == "ring":
            p, mask = published.tile_ptr(tile)
            tl.store(p, tile.data, mask=mask)
        if OP == "one_shot" or OP == "two_shot" or OP == "reduce_scatter":
            tl.debug_barrier()  # every thread's stores before the flag
            signal(locks + pid_m * num_n + pid_n, 1, RANK, RANK, heap_bases)  # release, sys scope
        if OP == "atomic":
            tiles.all_reduce_atomic(ctx, tile, dst)
        elif OP == "spinlock":
            tiles.all_reduce_spinlock(ctx, tile, dst, locks)
        elif OP == "one_shot":
            tiles.all_reduce_one_shot(ctx, tile, published, dst, locks)
        elif OP == "two_shot":
            tiles.all_reduce_two_shot(ctx, tile, published, dst, locks)
        elif OP == "reduce_scatter":
            tiles.reduce_scatter(ctx, tile, published, dst, locks)


@triton.jit
def _ring_kernel(part, c, heap_bases, M, N, scm, scn, RANK: tl.constexpr, WORLD: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, NUM_SMS: tl.constexpr):
    """all_reduce_ring needs every rank's partials complete before it starts: a second launch."""
    ctx = tiles.Ranks(RANK, WORLD, heap_bases)
    num_n = tl.cdiv(N, BN)
    dst = make_tensor_view(c, M, N, scm, scn)
    published = make_tensor_view(part, M, N, N, 1)
    for t in range(tl.program_id(0), tl.cdiv(M, BM) * num_n, NUM_SMS):
        tiles.all_reduce_ring(ctx, TileView(t // num_n, t % num_n, BM, BN), published, dst)


def check(name: str, ctx, A, B, output, config: FusedConfig, scatter: bool) -> None:
    """Raises before anything is allocated: shapes, and the tiles reduce-scatter's ownership needs."""
    check_operands(name, A, B, output)
    (m, k), (k2, n), w = A.shape, B.shape, ctx.world
    if k2 != k:
        raise ValueError(f"{name}: A is {m}x{k} but B is {k2}x{n}; B needs {k} rows (each rank's K shard)")
    if not scatter:
        if tuple(output.shape) != (m, n):
            raise ValueError(f"{name}: output must be {m}x{n}, got {tuple(output.shape)}")
        if config.all_reduce_variant not in VARIANTS:
            raise ValueError(f"{name}: variant='tiles' takes all_reduce_variant in {list(VARIANTS)}, got "
                             f"{config.all_reduce_variant!r}")
        return
    if tuple(output.shape) not in ((m, n), (m // w, n)) or m % w:
        raise ValueError(f"{name}: output must be {m // w}x{n} (this rank's rows) or {m}x{n} (the tile layout), "
                         f"and A's {m} rows a multiple of {w}; got output {tuple(output.shape)}")
    bm = tiles_for(m, n, A.device, config, A.element_size()).bm
    if output.shape[0] != m and (m // w) % bm:
        raise ValueError(f"{name}: with variant='tiles' a rank owns whole tiles, so its {m // w} rows must be a "
                         f"multiple of block_size_m ({bm}); pick a block_size_m dividing {m // w}, or pass an "
                         f"{m}x{n} output (the tile layout)")


def preamble(ctx, output, A, B, config: FusedConfig, scatter: bool) -> dict:
    """The published partials, one lock per tile, and an output on the heap where peers write into
    it. Collective: all ranks, same order, same sizes."""
    m, n = A.shape[0], B.shape[1]
    t = tiles_for(m, n, A.device, config, A.element_size())
    op = "reduce_scatter" if scatter else config.all_reduce_variant
    tiles = triton.cdiv(max(m, 1), t.bm) * triton.cdiv(max(n, 1), t.bn)
    ws = {"tiles": t, "tile_op": op, "locks": ctx.zeros(max(tiles, 1), dtype=torch.int32),
          "part": ctx.empty(m * n if op != "atomic" and op != "spinlock" else 1, dtype=A.dtype)}
    if op in ("atomic", "spinlock", "two_shot"):  # peers write into the output: it must be on the heap
        ws["heap_out"] = ctx.empty(m, n, dtype=A.dtype)
    ctx.barrier()
    return ws


def run(ctx, output, A, B, ws) -> torch.Tensor:
    """One call, in stream order (see the module docstring); no host synchronisation."""
    if output.numel() == 0:
        return output
    op, out = ws["tile_op"], ws.get("heap_out")
    out = output if out is None or ctx.is_symmetric(output) else out
    if op in ZEROED:
        out.zero_()
    else:
        ws["locks"].zero_()
    ctx.device_barrier()
    launch(ws, _matmul_tile_reduce_kernel, (A, B, out), lambda: _args(ctx, output, out, A, B, ws))
    if op == "ring":
        ctx.device_barrier()
        t = ws["tiles"]
        _ring_kernel[(t.sms,)](ws["part"], out, ctx.get_heap_bases(), A.shape[0], B.shape[1], out.stride(0),
                               out.stride(1), RANK=ctx.rank, WORLD=ctx.world, BM=t.bm, BN=t.bn, NUM_SMS=t.sms)
    ctx.device_barrier()
    if out is not output:
        output.copy_(out)
    return output


def _args(ctx, output, out, A, B, ws):
    (m, k), n, t = A.shape, B.shape[1], ws["tiles"]
    a, b, kw = tile_args(A, B, t)
    grid = min(t.sms, triton.cdiv(m, t.bm) * triton.cdiv(n, t.bn))
    row0 = ctx.rank * (m // ctx.world) if out.shape[0] != m else 0
    return ((grid,), (a, b, out, ws["part"], ws["locks"], ctx.get_heap_bases(), m, n, k, A.stride(0), A.stride(1),
                      B.stride(0), B.stride(1), out.stride(0), out.stride(1), row0),
            dict(kw, RANK=ctx.rank, WORLD=ctx.world, NUM_SMS=grid, OP=ws["tile_op"]))
