"""Iris's tile ownership: out (M x N) = sum over ranks of A_r @ B_r, where tile t of the output
(block_size_m x block_size_n tiles, numbered row by row) belongs to rank min(t // (T // world),
world - 1), T the number of tiles: each rank owns T // world consecutive tiles, the last rank also
the remainder. matmul_reduce_scatter (Iris's layout) writes each rank's own tiles and zeroes the
others (Iris zeroes the output first); the two-shot
matmul_all_reduce then sends every reduced tile to every other rank, so all get all of out.

One persistent kernel. A program computes the partials of tiles that other ranks own and stores
each into its owner's slot for this rank on the heap (a block_size_m x block_size_n block), then
sets the tile's flag there. For the tiles this rank owns it computes its own partial, waits for the
peers' flags, sums in fp32 and writes out; two-shot also stores the sum into every peer's gather
block and sets a flag there, and at the end copies the other ranks' tiles from its gather blocks.
Before the first store into a peer's slots, a program waits until that peer has finished the
previous call (ctl[2 + peer], set by its last program): the slots are then free again.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device import signal, store, wait
from .epoch import _epoch, _finish
from .gemm import _dot_tile, _tile_ptrs, interpreted, launch, tile_args, tiles_for


@triton.jit
def _owner(t, tpr, world):
    return tl.where(tpr == 0, world - 1, tl.minimum(t // tl.maximum(tpr, 1), world - 1))


@triton.jit
def _block(BM: tl.constexpr, BN: tl.constexpr):
    """Offsets of a BM x BN block stored densely (a slot or a gather block)."""
    return tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]


@triton.jit
def _owned_tiles_kernel(a, b, c, slots, flags, gather, gflags, ctl, heap_bases, rank, world, M, N, K, sam, sak, sbk,
                        sbn, scm, scn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NUM_SMS: tl.constexpr,
                        ALL: tl.constexpr, TMA: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
                        STAGES: tl.constexpr):
    pid = tl.program_id(0)
    ep = _epoch(ctl)
    num_n = tl.cdiv(N, BN)
    T = tl.cdiv(M, BM) * num_n
    tpr = T // world
    per = T - (world - 1) * tpr  # the most tiles one rank owns (the last rank's count)
    lo = rank * tpr
    hi = tl.where(rank == world - 1, T, lo + tpr)
    blk = _block(BM, BN)
    # other ranks' tiles: partials into their owners' slots
    for i in range(pid, T - (hi - lo), NUM_SMS):
        t = tl.where(i < lo, i, i + hi - lo)
        owner = _owner(t, tpr, world)
        pid_m = t // num_n
        pid_n = t % num_n
        acc = _dot_tile(a, b, pid_m * BM, pid_n * BN, M, N, K, sam, sak, sbk, sbn, BM, BN, BK, TMA, A_T, B_T, STAGES)
        wait(ctl + 2 + owner, ep - 1, rank, rank, heap_bases, cmp="ge")  # the owner is done with its slots
        local = t - owner * tpr
        store(slots + tl.cast(rank * per + local, tl.int64) * (BM * BN) + blk, acc.to(c.dtype.element_ty), rank, owner,
              heap_bases)
        tl.debug_barrier()
        signal(flags + rank * per + local, ep, rank, owner, heap_bases)
        if not ALL:  # as Iris, whose preamble zeroes C: the tiles other ranks own read 0
            p, mask = _tile_ptrs(c, pid_m * BM, pid_n * BN, M, N, scm, scn, BM, BN)
            tl.store(p, tl.zeros((BM, BN), dtype=c.dtype.element_ty), mask=mask)
    # this rank's tiles: own partial plus the peers', in fp32
    for t in range(lo + pid, hi, NUM_SMS):
        pid_m = t // num_n
        pid_n = t % num_n
        acc = _dot_tile(a, b, pid_m * BM, pid_n * BN, M, N, K, sam, sak, sbk, sbn, BM, BN, BK, TMA, A_T, B_T, STAGES)
        local = t - lo
        for j in range(1, world):
            src = (rank + j) % world
            wait(flags + src * per + local, ep, rank, rank, heap_bases, cmp="ge")
            acc += tl.load(slots + tl.cast(src * per + local, tl.int64) * (BM * BN) + blk).to(tl.float32)
        out = acc.to(c.dtype.element_ty)
        p, mask = _tile_ptrs(c, pid_m * BM, pid_n * BN, M, N, scm, scn, BM, BN)
        tl.store(p, out, mask=mask)
        if ALL:
            for j in range(1, world):
                peer = (rank + j) % world
                store(gather + tl.cast(t, tl.int64) * (BM * BN) + blk, out, rank, peer, heap_bases)
            tl.debug_barrier()
            for j in range(1, world):
                signal(gflags + t, ep, rank, (rank + j) % world, heap_bases)
    if ALL:  # the other ranks' reduced tiles
        for i in range(pid, T - (hi - lo), NUM_SMS):
            t = tl.where(i < lo, i, i + hi - lo)
            wait(gflags + t, ep, rank, rank, heap_bases, cmp="ge")
            pid_m = t // num_n
            pid_n = t % num_n
            p, mask = _tile_ptrs(c, pid_m * BM, pid_n * BN, M, N, scm, scn, BM, BN)
            tl.store(p, tl.load(gather + tl.cast(t, tl.int64) * (BM * BN) + blk), mask=mask)
    _finish(ctl, ep, rank, world, heap_bases, NUM_SMS, True)


def owned_range(M: int, N: int, bm: int, bn: int, rank: int, world: int) -> tuple:
    """(first tile, tiles) that rank owns: Iris's layout."""
    T = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    tpr = T // world
    return rank * tpr, (T - rank * tpr if rank == world - 1 else tpr)


def preamble(ctx, output, A, B, config, all_ranks: bool) -> dict:
    """Slots (world partials of the most tiles one rank owns), flags, gather blocks (two-shot), ctl.
    Collective: all ranks, same order, same sizes."""
    m, n = output.shape
    t = tiles_for(m, n, A.device, config, A.element_size())
    T = triton.cdiv(max(m, 1), t.bm) * triton.cdiv(max(n, 1), t.bn)
    per = T - (ctx.world - 1) * (T // ctx.world)
    ws = {"slots": ctx.empty(ctx.world * per * t.bm * t.bn, dtype=output.dtype),
          "flags": ctx.zeros(ctx.world * per, dtype=torch.int64),
          "gather": ctx.empty(T * t.bm * t.bn if all_ranks else 1, dtype=output.dtype),
          "gflags": ctx.zeros(T if all_ranks else 1, dtype=torch.int64),
          "ctl": ctx.zeros(3 + ctx.world, dtype=torch.int64), "tiles": t, "all": all_ranks}
    ctx.barrier()  # every rank's flags are zero before any peer signals into them
    return ws


def run(ctx, output, A, B, ws) -> torch.Tensor:
    """Launch on the current stream; no host synchronization."""
    if output.numel() == 0:
        return output
    launch(ws, _owned_tiles_kernel, (A, B, output), lambda: _args(ctx, output, A, B, ws))
    return output


def _args(ctx, output, A, B, ws):
    (m, k), n = A.shape, B.shape[1]
    a, b, kw = tile_args(A, B, ws["tiles"])
    grid = 1 if interpreted() else ws["tiles"].sms
    return ((grid,), (a, b, output, ws["slots"], ws["flags"], ws["gather"], ws["gflags"], ws["ctl"],
                      ctx.get_heap_bases(), ctx.rank, ctx.world, m, n, k, A.stride(0), A.stride(1), B.stride(0),
                      B.stride(1), output.stride(0), output.stride(1)), dict(kw, NUM_SMS=grid, ALL=ws["all"]))
