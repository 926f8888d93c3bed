"""all_gather_matmul: output (M x N) = all_gather(A_local, rows) @ B, the gather hidden behind the GEMM.

One persistent kernel. Its first comm_sms programs push this rank's A rows, one block of
block_size_m rows at a time, into every peer's gather buffer on the heap and set a per-block flag
there. Meanwhile the other programs, and the pushers once done, take tiles from a ticket counter:
first the tiles of this rank's own rows (read from A_local directly, nothing to wait for), then
those of the next rank's rows and so on, each waiting only for the flag of the block it reads.
Before pushing, a pusher waits until the peer has finished reading the previous call's blocks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device import signal, store, wait
from .config import FusedConfig
from .epoch import _epoch, _finish
from .gemm import (_dot_tile, _tile_mn, _tile_ptrs, check_operands, interpreted, launch, operand, tile_args,
                   tiles_for)


@triton.jit
def _fence_async(x):
    # the flag was acquired by ordinary loads; TMA reads through the async proxy
    tl.inline_asm_elementwise("fence.proxy.async; mov.u32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def _ticket(counter, base):
    # int32: TMA offsets must be
    return (tl.atomic_add(counter, 1, sem="relaxed", scope="gpu") - base).to(tl.int32)


@triton.jit
def _push_rows(a_ptr, g, flags, ctl, ep, heap_bases, rank, world, M_loc, K, sam, sak, pid, BM: tl.constexpr,
               PK: tl.constexpr, PUSHERS: tl.constexpr):
    for i in range(1, world):
        wait(ctl + 2 + (rank + i) % world, ep - 1, rank, rank, heap_bases, cmp="ge")
    chunks = tl.cdiv(M_loc, BM)
    for chunk in range(pid, chunks, PUSHERS):
        rows = chunk * BM + tl.arange(0, BM)
        for k0 in range(0, K, PK):
            cols = k0 + tl.arange(0, PK)
            mask = (rows[:, None] < M_loc) & (cols[None, :] < K)
            v = tl.load(a_ptr + rows[:, None].to(tl.int64) * sam + cols[None, :] * sak, mask=mask)
            dst = g + (rank * M_loc + rows)[:, None].to(tl.int64) * K + cols[None, :]
            for i in range(1, world):
                store(dst, v, rank, (rank + i) % world, heap_bases, mask=mask)
        tl.debug_barrier()
        for i in range(1, world):
            signal(flags + rank * chunks + chunk, ep, rank, (rank + i) % world, heap_bases)


@triton.jit
def _all_gather_matmul_kernel(a, a_ptr, g, g_ptr, b, c, flags, ctl, heap_bases, rank, world, M_loc, N, K, sam, sak,
                              sbk, sbn, scm, scn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                              GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, PUSHERS: tl.constexpr,
                              PK: tl.constexpr, TMA: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
                              STAGES: tl.constexpr):
    pid = tl.program_id(0)
    ep = _epoch(ctl)
    if pid < PUSHERS:
        _push_rows(a_ptr, g_ptr, flags, ctl, ep, heap_bases, rank, world, M_loc, K, sam, sak, pid, BM, PK, PUSHERS)
    chunks = tl.cdiv(M_loc, BM)
    num_n = tl.cdiv(N, BN)
    per_shard = chunks * num_n
    total = world * per_shard
    base = (ep - 1) * (total + NUM_SMS)  # every call takes exactly total + NUM_SMS tickets
    # tickets in order: this rank's rows first, then the next rank's, ... Two loops, not one with a
    # branch: their TMA pipelines then share shared memory (in one loop both would be allocated).
    t = _ticket(ctl + 2 + world, base)
    while t < per_shard:
        nxt = _ticket(ctl + 2 + world, base)  # in flight during this tile
        pid_m, pid_n = _tile_mn(t, chunks, num_n, GROUP_M)
        acc = _dot_tile(a, b, pid_m * BM, pid_n * BN, M_loc, N, K, sam, sak, sbk, sbn, BM, BN, BK, TMA, A_T, B_T,
                        STAGES)
        p, mask = _tile_ptrs(c + (rank * M_loc).to(tl.int64) * scm, pid_m * BM, pid_n * BN, M_loc, N, scm, scn, BM,
                             BN)
        tl.store(p, acc.to(c.dtype.element_ty), mask=mask)
        t = nxt
    while t < total:
        nxt = _ticket(ctl + 2 + world, base)
        src = (rank + t // per_shard) % world
        pid_m, pid_n = _tile_mn(t % per_shard, chunks, num_n, GROUP_M)
        wait(flags + src * chunks + pid_m, ep, rank, rank, heap_bases, cmp="ge")
        if TMA:
            _fence_async(pid)
        acc = _dot_tile(g, b, src * M_loc + pid_m * BM, pid_n * BN, (src + 1) * M_loc, N, K, K, 1, sbk, sbn, BM, BN,
                        BK, TMA, False, B_T, STAGES)
        p, mask = _tile_ptrs(c + (src * M_loc).to(tl.int64) * scm, pid_m * BM, pid_n * BN, M_loc, N, scm, scn, BM, BN)
        tl.store(p, acc.to(c.dtype.element_ty), mask=mask)
        t = nxt
    _finish(ctl, ep, rank, world, heap_bases, NUM_SMS, True)


def check(A: torch.Tensor, B: torch.Tensor, output: torch.Tensor, world: int) -> None:
    check_operands("all_gather_matmul", A, B, output)
    (m, k), (k2, n) = A.shape, B.shape
    if k2 != k:
        raise ValueError(f"all_gather_matmul: A_local is {m}x{k} but B is {k2}x{n}; B needs {k} rows")
    if tuple(output.shape) != (world * m, n):
        raise ValueError(f"all_gather_matmul: output must be (world * A_local rows) x N = {world * m}x{n}, "
                         f"got {tuple(output.shape)}")


def preamble(ctx, output: torch.Tensor, A: torch.Tensor, B: torch.Tensor, config: FusedConfig | None = None) -> dict:
    """The workspace for these shapes: gather buffer, per-block flags, ctl.
    Collective: all ranks, same order, same sizes."""
    check(A, B, output, ctx.world)
    t = tiles_for(output.shape[0], output.shape[1], A.device, config, A.element_size())
    m, k = A.shape
    chunks = triton.cdiv(max(m, 1), t.bm)
    ws = {"gather": ctx.empty(ctx.world * m, k, dtype=A.dtype), "flags": ctx.zeros(ctx.world * chunks,
          dtype=torch.int64), "ctl": ctx.zeros(3 + ctx.world, dtype=torch.int64), "tiles": t}
    ctx.barrier()  # every rank's flags are zero before any peer signals into them
    return ws


def run(ctx, output, A, B, config, ws) -> torch.Tensor:
    """Launch on the current stream; no host synchronization."""
    if output.numel() == 0:
        return output
    launch(ws, _all_gather_matmul_kernel, (A, B, output), lambda: _args(ctx, output, A, B, config, ws))
    return output


def _args(ctx, output, A, B, config, ws):
    t = ws["tiles"]
    (m, k), n = A.shape, B.shape[1]
    g = ws["gather"]
    a, b, kw = tile_args(A, B, t, g)
    gd = operand(g, (t.bm, t.bk), kw["TMA"])[0]
    pushers = (config.comm_sms if config and config.comm_sms else 1 if interpreted() else 8)
    grid = max(t.sms, pushers + 1)
    return ((grid,), (a, A, gd, g, b, output, ws["flags"], ws["ctl"], ctx.get_heap_bases(), ctx.rank, ctx.world, m, n,
                      k, A.stride(0), A.stride(1), B.stride(0), B.stride(1), output.stride(0), output.stride(1)),
            dict(kw, NUM_SMS=grid, PUSHERS=pushers, PK=min(128, max(t.bk, 16))))
