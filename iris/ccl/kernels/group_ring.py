"""Ring kernels over a subset of the ranks (group=), position -> position + 1 of the group's members:
the ring all_reduce, the ring all_gather and the ring reduce_scatter (ring_chunked; both layouts).

No slot can be allocated for a group call (group.py), so program p hands its pieces over through a
channel in iris's reserve (ctx.reserve.ring_slots and ring_flags: a slot of RING_SLOT bytes and a
0/1 flag per program on every rank), one piece at a time: a piece is stored into the successor's
slot once its flag is 0, and the flag set to 1; the successor reads it and sets it back to 0. A
rank's slot is written only by its predecessor of the call it is in: each call starts by meeting
its predecessor and successor through the pairwise counters, and a rank enters a call only after
reading every piece of its previous one. inp and out are read and written by their own rank only,
so they may be any tensors, and out may be inp.
"""
import triton
import triton.language as tl

from .common import _combine, _meet, _members, _peer_offset, _tile_of, _tile_offsets, _tile_mn
from .group import _pairing
from .ring import _receive, _ring_all_reduce, _send


@triton.jit
def _neighbours(slots, flags, members, counters, seen, ELEMS, me, rank, world, GROUP: tl.constexpr,
                PEERS: tl.constexpr, SPIN: tl.constexpr):
    """Meets the predecessor and the successor (once each, whatever GROUP), then returns program p's
    channel: (its slot, the successor's slot, its flag, the successor's flag, where giving up marks).
    slots: the reserve's slots as the piece dtype, ELEMS of them per program."""
    pid = tl.program_id(0)
    VEC: tl.constexpr = 16 // (slots.dtype.element_ty.primitive_bitwidth // 8)
    row, srow, mine, j = _pairing(members, counters, seen, me, world, GROUP, PEERS)
    nxt = (me + 1) % GROUP
    live = (j < GROUP) & (j != me) & ((j == nxt) | (j == (me - 1 + GROUP) % GROUP))
    peer, delta, count = _members(members, srow, j, live, mine, rank, GROUP)
    _meet(row, peer, delta, live, count + 1, srow + rank, rank, SPIN)
    tl.store(srow + peer, count + 1, mask=live)
    here = slots + pid * ELEMS
    flag = flags + pid
    return (here, here + _peer_offset(members + GROUP, nxt, mine, VEC), flag,
            flag + _peer_offset(members + GROUP, nxt, mine, 2), srow + rank)


@triton.jit
def group_ring_kernel(inp, out, slots, flags, members, counters, seen, n, tiles, me, rank, world,
                      GROUP: tl.constexpr, PEERS: tl.constexpr, OP: tl.constexpr, SLICE: tl.constexpr,
                      RINGS: tl.constexpr, ELEMS: tl.constexpr, SPIN: tl.constexpr):
    """all_reduce around the group's ring: ring_kernel's algorithm (_ring_all_reduce) over positions,
    each slice reduced in ring order from its own position, partials in the slots' dtype (fp32 for
    floats), so every member gets the same bits. SLICE elements fit in a slot of ELEMS."""
    here, there, flag, next_flag, mark = _neighbours(slots, flags, members, counters, seen, ELEMS, me, rank, world,
                                                     GROUP, PEERS, SPIN)
    ar = tl.arange(0, SLICE)
    _ring_all_reduce(inp, out, here + ar, there + ar, flag, next_flag, mark, n, tiles, me, GROUP, OP, SLICE, RINGS,
                     SPIN)


@triton.jit
def group_ring_gather_kernel(inp, out, slots, flags, members, counters, seen, n, me, rank, world,
                             GROUP: tl.constexpr, PEERS: tl.constexpr, PIECE: tl.constexpr, ELEMS: tl.constexpr,
                             SPIN: tl.constexpr):
    """all_gather around the group's ring: out (GROUP * n) gets position q's inp (n) at q * n. Program p
    moves pieces p, p + P, ... (PIECE elements) of a chunk: a piece of this rank's inp goes to the
    successor, and GROUP - 1 hops pass on what arrived, each stored into out at its chunk."""
    here, there, flag, next_flag, mark = _neighbours(slots, flags, members, counters, seen, ELEMS, me, rank, world,
                                                     GROUP, PEERS, SPIN)
    ar = tl.arange(0, PIECE)
    for s in range(tl.program_id(0) * PIECE, n, tl.num_programs(0) * PIECE):
        o = s + ar
        mask = o < n
        part = tl.load(inp + o, mask=mask)
        tl.store(out + me * n + o, part, mask=mask)
        for h in tl.static_range(GROUP - 1):
            _send(part, there + ar, next_flag, mark, SPIN)
            part = _receive(here + ar, flag, mark, SPIN)
            tl.store(out + ((me - h - 1 + GROUP) % GROUP) * n + o, part, mask=mask)


@triton.jit
def _piece(k, x, n, M, N, tiles, GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SBM: tl.constexpr,
           SBN: tl.constexpr, GROUP_M: tl.constexpr, DIST: tl.constexpr, TILED: tl.constexpr):
    """Piece k of chunk x of a reduce_scatter: (offsets in out, where the chunk starts in inp, mask).
    TILED: SBM x SBN piece k % (pieces per tile) of the (k // pieces per tile)-th tile of position x's
    share of an (M, N) tensor (tiles BM x BN in grouped order, dealt by DIST); else the SBN elements
    from k * SBN of the n at x * n of inp (SBM = 1)."""
    if TILED:
        across: tl.constexpr = BN // SBN
        t = _tile_of(k // ((BM // SBM) * across), tiles, x, GROUP, DIST)
        i = k % ((BM // SBM) * across)
        pm, pn = _tile_mn(tl.maximum(t, 0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
        rm = pm * BM + (i // across) * SBM + tl.arange(0, SBM)
        rn = pn * BN + (i % across) * SBN + tl.arange(0, SBN)
        o = rm[:, None] * N + rn[None, :]
        inside = (rm[:, None] < M) & (rn[None, :] < N)
        return o, 0, inside & (o < tl.where(t >= 0, M * N, 0))  # past its share (t -1): nothing
    else:  # a branch of its own: Triton compiles what follows a static if in every case
        o, mask = _tile_offsets(k, 1, n, 1, SBN, 1)
        return o, x * n, mask


@triton.jit
def group_ring_reduce_scatter_kernel(inp, out, slots, flags, members, counters, seen, n, M, N, tiles, pieces, me,
                                     rank, world, GROUP: tl.constexpr, PEERS: tl.constexpr, BM: tl.constexpr,
                                     BN: tl.constexpr, SBM: tl.constexpr, SBN: tl.constexpr, GROUP_M: tl.constexpr,
                                     DIST: tl.constexpr, TILED: tl.constexpr, OP: tl.constexpr, ELEMS: tl.constexpr,
                                     SPIN: tl.constexpr):
    """reduce_scatter around the group's ring (ring_reduce_scatter_kernel's algorithm over positions,
    piece by piece): chunk x (position x's part, `pieces` pieces, see _piece) starts at position x + 1
    as its input and travels GROUP - 1 hops, each member combining (OP) the partial it receives with
    its own input of that piece, and ends at position x, which writes it to out. Partials are in the
    slots' dtype (fp32 for floats); every element of a chunk is combined in the same ring order, so
    the result does not depend on timing. TILED: Iris's layout (out shaped as inp, this rank's tiles
    written, the rest left as it was); else torch's (out: n elements)."""
    here, there, flag, next_flag, mark = _neighbours(slots, flags, members, counters, seen, ELEMS, me, rank, world,
                                                     GROUP, PEERS, SPIN)
    ACC: tl.constexpr = slots.dtype.element_ty
    blk = tl.arange(0, SBM)[:, None] * SBN + tl.arange(0, SBN)[None, :]
    for k in range(tl.program_id(0), pieces, tl.num_programs(0)):
        o, base, mask = _piece(k, (me - 1 + GROUP) % GROUP, n, M, N, tiles, GROUP, BM, BN, SBM, SBN, GROUP_M, DIST,
                               TILED)
        part = tl.load(inp + base + o, mask=mask).to(ACC)
        for h in tl.static_range(GROUP - 1):
            _send(part, there + blk, next_flag, mark, SPIN)
            o, base, mask = _piece(k, (me - h - 2 + 2 * GROUP) % GROUP, n, M, N, tiles, GROUP, BM, BN, SBM, SBN,
                                   GROUP_M, DIST, TILED)
            part = _combine(_receive(here + blk, flag, mark, SPIN), tl.load(inp + base + o, mask=mask).to(ACC), OP)
        tl.store(out + o, part.to(out.dtype.element_ty), mask=mask)
