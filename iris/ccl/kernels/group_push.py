"""Collectives over a subset of the ranks (group=) that store into the members' out: the two-shot
all_reduce (each position reduces its share, read from every member's inp in place, and stores it
into every member's out) and the push all_gather (persistent, partitioned). out is then a heap
tensor, the same allocation on every member: it is the only room a group call has in its peers,
since nothing can be allocated for it (group.py). They meet as group_kernel does: "ready" (every
member entered the call, so its inp is final and its out free to be written) and "done" (every
store into this rank's out and every read of its inp is over)."""
import triton
import triton.language as tl

from .common import _meet, _members, _peer_offset, _reduce_ranks
from .group import _pairing
from .shots import _share


@triton.jit
def group_two_shot_kernel(inp, out, members, counters, seen, n, chunk, per, me, rank, world,
                          GROUP: tl.constexpr, PEERS: tl.constexpr, OP: tl.constexpr, IS_FLOAT: tl.constexpr,
                          BLOCK: tl.constexpr, SPIN: tl.constexpr, STRIDED: tl.constexpr):
    """all_reduce in two shots over the GROUP positions of members: position me reduces its share of the
    n elements (STRIDED: blocks me, me + GROUP, ... of BLOCK; else elements [me*chunk, (me+1)*chunk),
    as two_shot_kernel's) from every member's inp in member order (floats in fp32, so every member
    gets the same bits) and stores it into every member's out. per: elements of the share per
    program (a multiple of BLOCK). Only a share's owner reads or writes it, so out may be inp."""
    VEC: tl.constexpr = 16 // (inp.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    row, srow, mine, j = _pairing(members, counters, seen, me, world, GROUP, PEERS)
    live = (j < GROUP) & (j != me)
    peer, delta, count = _members(members, srow, j, live, mine, rank, GROUP)
    lo = pid * per
    hi = tl.minimum(lo + per, chunk)
    ar = tl.arange(0, BLOCK)
    _meet(row, peer, delta, live, count + 1, srow + rank, rank, SPIN)
    for s in range(lo, hi, BLOCK):
        o = _share(me, s, chunk, GROUP, BLOCK, STRIDED) + ar
        mask = (s + ar < hi) & (o < n)
        r = _reduce_ranks(inp, o, mask, members + GROUP, mine, GROUP, VEC, OP, IS_FLOAT).to(out.dtype.element_ty)
        for i in tl.static_range(GROUP):  # from this rank on: the members' stores spread over targets
            tl.store(out + _peer_offset(members + GROUP, (me + i) % GROUP, mine, VEC) + o, r, mask=mask)
    _meet(row, peer, delta, live, count + 2, srow + rank, rank, SPIN)
    tl.store(srow + peer, count + 2, mask=live)


@triton.jit
def group_gather_push_kernel(inp, out, members, counters, seen, n, per, me, rank, world,
                             GROUP: tl.constexpr, PEERS: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr,
                             PARTITIONED: tl.constexpr):
    """all_gather by remote stores over the GROUP positions of members: out (GROUP * n) gets position q's
    inp (n) at q * n. Persistent: program p stores elements [p*per, (p+1)*per) of inp into every
    member's out and meets every member. PARTITIONED: the programs form GROUP equal groups; program p
    of group g stores its range into position me + g only and meets that position and me - g (which
    stores into this rank); the meeting is mutual, as me + g's program p has me as its me - g. inp is
    read here only: any tensor, also this rank's own chunk of out."""
    VEC: tl.constexpr = 16 // (inp.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    row, srow, mine, j = _pairing(members, counters, seen, me, world, GROUP, PEERS)
    if PARTITIONED:
        parts = tl.num_programs(0) // GROUP
        lo = (pid % parts) * per
        dest = (me + pid // parts) % GROUP
        live = (j < GROUP) & (j != me) & ((j == dest) | (j == (me - pid // parts + GROUP) % GROUP))
    else:
        lo = pid * per
        dest = me
        live = (j < GROUP) & (j != me)
    peer, delta, count = _members(members, srow, j, live, mine, rank, GROUP)
    hi = tl.minimum(lo + per, n)
    ar = tl.arange(0, BLOCK)
    _meet(row, peer, delta, live, count + 1, srow + rank, rank, SPIN)
    for s in range(lo, hi, BLOCK):
        o = s + ar
        mask = o < hi
        x = tl.load(inp + o, mask=mask)
        if PARTITIONED:
            tl.store(out + _peer_offset(members + GROUP, dest, mine, VEC) + me * n + o, x, mask=mask)
        else:
            for i in tl.static_range(GROUP):
                tl.store(out + _peer_offset(members + GROUP, (me + i) % GROUP, mine, VEC) + me * n + o, x, mask=mask)
    _meet(row, peer, delta, live, count + 2, srow + rank, rank, SPIN)
    tl.store(srow + peer, count + 2, mask=live)
