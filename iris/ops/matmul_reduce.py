"""matmul_all_reduce and matmul_reduce_scatter: out = sum over ranks of A_r @ B_r (row-parallel layer),
every rank getting all rows (all-reduce) or its 1/world share of them (reduce-scatter).

One persistent kernel. Each program computes a tile, rounds it to the output dtype, and pushes it
into the slot of every rank that needs it (all: every rank; scatter: the rank owning those rows)
on the heap, and sets that tile's flag there only after computing its next tile: the release then
finds the stores drained instead of waiting for them (benchmarks/gemm_comm.py; docs/performance.md
has the figures). It reduces the tile it computed before (whose flags every rank has just set): waits for
the flags, sums the world partials in rank order in fp32 (every rank gets the same bits) and
writes the output. Slots alternate between two buffers by call parity: a rank writes buffer p
again only two calls later, when it has seen every peer's pushes of the call in between, so every
peer has finished reading buffer p.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device import signal, store, wait
from .config import FusedConfig
from .epoch import _epoch, _finish
from .gemm import _dot_tile, _tile_mn, _tile_ptrs, check_operands, interpreted, launch, tile_args, tiles_for


@triton.jit
def _wait_and_sum(c, slots, flags, ep, heap_bases, rank, world, t, T, slot0, M_out, N, scm, scn, pid_m, pid_n,
                  BM: tl.constexpr, BN: tl.constexpr):
    """Waits for every peer's partial of tile t (flag index src * T + t), sums the world partials of
    slot buffer slot0 in rank order, writes the output tile."""
    for i in range(1, world):
        wait(flags + ((rank + i) % world) * T + t, ep, rank, rank, heap_bases, cmp="ge")
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for src in range(0, world):
        p, mask = _tile_ptrs(slots + slot0 + (src * M_out).to(tl.int64) * N, pid_m * BM, pid_n * BN, M_out, N, N, 1, BM,
                             BN)
        acc += tl.load(p, mask=mask, other=0.0).to(tl.float32)
    p, mask = _tile_ptrs(c, pid_m * BM, pid_n * BN, M_out, N, scm, scn, BM, BN)
    tl.store(p, acc.to(c.dtype.element_ty), mask=mask)


@triton.jit
def _signal_tile(flag, ep, rank, world, owner, heap_bases, SCATTER: tl.constexpr):
    """Sets a tile's flag on its owner (SCATTER) or on every peer."""
    if SCATTER:
        signal(flag, ep, rank, owner, heap_bases)
    else:
        for i in range(1, world):
            signal(flag, ep, rank, (rank + i) % world, heap_bases)


@triton.jit
def _matmul_reduce_kernel(a, b, c, slots, flags, ctl, heap_bases, rank, world, M, N, K, sam, sak, sbk, sbn, scm, scn,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                          NUM_SMS: tl.constexpr, SCATTER: tl.constexpr, TMA: tl.constexpr, A_T: tl.constexpr,
                          B_T: tl.constexpr, STAGES: tl.constexpr):
    ep = _epoch(ctl)
    if SCATTER:
        M_out = M // world
    else:
        M_out = M
    num_m = tl.cdiv(M_out, BM)
    num_n = tl.cdiv(N, BN)
    T = num_m * num_n  # tiles per output (per owner when scattering)
    slot0 = ((ep % 2) * world * M_out).to(tl.int64) * N  # this call's buffer
    mine = slot0 + (rank * M_out).to(tl.int64) * N  # where this rank's partials go, on every rank
    have_prev = False
    prev = 0
    prev_m = 0
    prev_n = 0
    pend = -1  # the tile whose pushes are out but whose flags are not set yet
    pend_owner = 0
    for tt in range(tl.program_id(0), (world if SCATTER else 1) * T, NUM_SMS):
        if SCATTER:
            owner = (rank + 1 + tt // T) % world  # other ranks' rows first, this rank's own last
            row0 = owner * M_out
        else:
            owner = rank
            row0 = 0
        t = tt % T
        pid_m, pid_n = _tile_mn(t, num_m, num_n, GROUP_M)
        acc = _dot_tile(a, b, row0 + pid_m * BM, pid_n * BN, row0 + M_out, N, K, sam, sak, sbk, sbn, BM, BN, BK, TMA,
                        A_T, B_T, STAGES)
        part = acc.to(c.dtype.element_ty)
        if pend >= 0:  # its stores drained while this tile was computed: the release is cheap now
            tl.debug_barrier()
            _signal_tile(flags + rank * T + pend, ep, rank, world, pend_owner, heap_bases, SCATTER)
        p, mask = _tile_ptrs(slots + mine, pid_m * BM, pid_n * BN, M_out, N, N, 1, BM, BN)
        if owner != rank:  # scatter: the owner alone needs it
            store(p, part, rank, owner, heap_bases, mask=mask)
        else:
            tl.store(p, part, mask=mask)
            if not SCATTER:
                for i in range(1, world):
                    store(p, part, rank, (rank + i) % world, heap_bases, mask=mask)
        if SCATTER:
            pend = tl.where(owner != rank, t, -1)  # this rank's own tiles go nowhere
        else:
            pend = t
        pend_owner = owner
        if owner == rank:  # reduce the tile before, whose flags every rank has just set
            if have_prev:
                _wait_and_sum(c, slots, flags, ep, heap_bases, rank, world, prev, T, slot0, M_out, N, scm, scn,
                              prev_m, prev_n, BM, BN)
            have_prev = True
            prev = t
            prev_m = pid_m
            prev_n = pid_n
    if pend >= 0:
        tl.debug_barrier()
        _signal_tile(flags + rank * T + pend, ep, rank, world, pend_owner, heap_bases, SCATTER)
    if have_prev:
        _wait_and_sum(c, slots, flags, ep, heap_bases, rank, world, prev, T, slot0, M_out, N, scm, scn, prev_m,
                      prev_n, BM, BN)
    _finish(ctl, ep, rank, world, heap_bases, NUM_SMS, False)


def check(name: str, A: torch.Tensor, B: torch.Tensor, output: torch.Tensor, world: int, scatter: bool) -> None:
    check_operands(name, A, B, output)
    (m, k), (k2, n) = A.shape, B.shape
    if k2 != k:
        raise ValueError(f"{name}: A is {m}x{k} but B is {k2}x{n}; B needs {k} rows (each rank's K shard)")
    if scatter and m % world:
        raise ValueError(f"{name}: A's {m} rows do not split over {world} ranks; use a multiple of {world}")
    want = (m // world if scatter else m, n)
    if tuple(output.shape) != want:
        raise ValueError(f"{name}: output must be {want[0]}x{want[1]}, got {tuple(output.shape)}")


def preamble(ctx, output, A, B, config: FusedConfig | None, scatter: bool) -> dict:
    """Slots (2 buffers x world partials), per-tile flags, ctl. Collective: all ranks, same order, same sizes."""
    name = "matmul_reduce_scatter" if scatter else "matmul_all_reduce"
    check(name, A, B, output, ctx.world, scatter)
    m_out, n = output.shape
    t = tiles_for(m_out, n, A.device, config, A.element_size())
    tiles = triton.cdiv(max(m_out, 1), t.bm) * triton.cdiv(max(n, 1), t.bn)
    ws = {"slots": ctx.empty(2 * ctx.world * m_out * n, dtype=A.dtype),
          "flags": ctx.zeros(ctx.world * tiles, dtype=torch.int64), "ctl": ctx.zeros(3 + ctx.world, dtype=torch.int64),
          "tiles": t}
    ctx.barrier()  # every rank's flags are zero before any peer signals into them
    return ws


def run(ctx, output, A, B, config, ws, scatter: bool) -> torch.Tensor:
    """Launch on the current stream; no host synchronization."""
    if output.numel() == 0:
        return output
    launch(ws, _matmul_reduce_kernel, (A, B, output), lambda: _args(ctx, output, A, B, ws, scatter))
    return output


def _args(ctx, output, A, B, ws, scatter):
    (m, k), n = A.shape, B.shape[1]
    a, b, kw = tile_args(A, B, ws["tiles"], row_step=output.shape[0] if scatter else 0)  # each owner's rows
    grid = 1 if interpreted() and scatter else ws["tiles"].sms
    return ((grid,), (a, b, output, ws["slots"], ws["flags"], ws["ctl"], ctx.get_heap_bases(), ctx.rank, ctx.world,
                      m, n, k, A.stride(0), A.stride(1), B.stride(0), B.stride(1), output.stride(0), output.stride(1)),
            dict(kw, NUM_SMS=grid, SCATTER=scatter))
