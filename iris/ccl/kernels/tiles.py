"""reduce_scatter in Iris's layout: out shaped as inp, each rank's tiles (in grouped order, dealt by
Config.all_reduce_distribution) reduced over every rank."""
import triton
import triton.language as tl

from .common import _epoch, _reduce_ranks, _signal_wait, _tile_of, _tile_offsets


@triton.jit
def tile_reduce_scatter_kernel(inp, out, stage, flags, counters, heap_bases, M, N, tiles, parity_stride, rank,
                               WORLD: tl.constexpr, PEERS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                               GROUP_M: tl.constexpr, DIST: tl.constexpr, OP: tl.constexpr,
                               IS_FLOAT: tl.constexpr, SPIN: tl.constexpr):
    """reduce_scatter with out shaped as inp (M, N): rank r's tiles (BM x BN, Iris's swizzled order, dealt
    by DIST as Config.all_reduce_distribution) of out get the reduction over every rank of those tiles
    of inp; out's other elements are left as they were. Program p stages, for every rank x, the tiles
    p, p + P, ... of x's share (so what any rank's program p reads was staged by the peers' program
    p), exchanges once, then reduces its tiles of this rank's share from every rank's stage in rank
    order (floats in fp32). The stage is double-buffered by epoch parity (parity_stride apart), as in
    pull_kernel, so one exchange per call is enough."""
    VEC: tl.constexpr = 16 // (stage.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    e = _epoch(counters, pid)
    buf = stage + (e % 2) * parity_stride
    mine = tl.load(heap_bases + rank)
    share = tl.cdiv(tiles, WORLD)  # the most tiles a rank owns, either way
    for x in tl.static_range(WORLD):
        for k in range(pid, share, programs):
            t = _tile_of(k, tiles, x, WORLD, DIST)
            if t >= 0:
                o, mask = _tile_offsets(t, M, N, BM, BN, GROUP_M)
                tl.store(buf + o, tl.load(inp + o, mask=mask), mask=mask)
    peers = tl.arange(0, PEERS)
    live = (peers < WORLD) & (peers != rank)
    _signal_wait(flags + pid * WORLD, e, rank, heap_bases, live, live, PEERS, SPIN)
    for k in range(pid, share, programs):
        t = _tile_of(k, tiles, rank, WORLD, DIST)
        if t >= 0:
            o, mask = _tile_offsets(t, M, N, BM, BN, GROUP_M)
            acc = _reduce_ranks(buf, o, mask, heap_bases, mine, WORLD, VEC, OP, IS_FLOAT)
            tl.store(out + o, acc.to(out.dtype.element_ty), mask=mask)
