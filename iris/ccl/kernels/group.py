"""The kernels of the collectives over a subset of the ranks (group=) that read the peers' inp in place:
group_kernel (one_shot all_reduce, pull all_gather, two_shot reduce_scatter, all_to_all, broadcast)
and group_tile_kernel (two_shot reduce_scatter in Iris's layout); and _pairing, the start that every
group kernel shares. Ranks outside a group never make its calls, and heap allocation is collective
over the whole job, so these kernels allocate nothing: they read the peers' inp (a heap tensor) in
place and synchronise through pairwise counters in iris's reserve (ctx.reserve.group_counters,
zeroed once at context creation).

counters[p][s] on rank r counts the signals program p of rank s sent to program p of r; seen[p][s]
(this rank's device memory, not the heap) how many of them r has waited for, updated by the kernel
itself so CUDA graph replays advance it too. Each call signals twice: "ready" (the kernel started,
so inp is final by stream order) and "done" (finished reading the peers' inp, so a rank may
overwrite its inp once the call returns). Every rank splits the work the same way and program p
reads, and is read, over the same elements, so pairing by program is enough; programs of one launch
never wait for each other (the interpreter runs them one after another). A pair's counters are
shared by every group that holds both ranks: correct as long as both call their common groups'
collectives in the same order (NCCL's rule).
"""
import triton
import triton.language as tl

from .common import _a2a_index, _meet, _members, _peer_offset, _reduce_ranks, _tile_of, _tile_offsets


@triton.jit
def _pairing(members, counters, seen, me, world, GROUP: tl.constexpr, PEERS: tl.constexpr):
    """What program p of a group kernel meets its peers with: (its row of the pairwise counters, its row
    of this rank's seen counts, this rank's heap base, the positions 0..PEERS-1 as a block). members:
    GROUP global ranks, then their heap bases; counters and seen: (programs, world) int64."""
    pid = tl.program_id(0)
    return counters + pid * world, seen + pid * world, tl.load(members + GROUP + me), tl.arange(0, PEERS)


@triton.jit
def _place(o, q, n, cols, MODE: tl.constexpr, GROUP: tl.constexpr):
    """Where element o of the chunk that comes from group position q goes in out."""
    if MODE == "ag":
        return q * n + o
    elif MODE == "a2a":
        return _a2a_index(o, q, cols, GROUP)
    return o


@triton.jit
def group_kernel(inp, out, scratch, members, counters, seen, n, per, cols, me, rank, src, world,
                 GROUP: tl.constexpr, PEERS: tl.constexpr, MODE: tl.constexpr, OP: tl.constexpr,
                 IS_FLOAT: tl.constexpr, STAGED: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    """MODE (as pull_kernel's) over the GROUP ranks of members (their global ranks, then their heap
    bases; PEERS: a power of two >= GROUP), reading the peers' inp in place. me: this rank's position
    in the group, rank its global rank, src broadcast's root position; n: elements per chunk, per:
    elements of a chunk per program (a multiple of BLOCK); cols: columns per member for a2a; counters
    and seen: (programs, world) int64. STAGED (out overlaps inp): results go to scratch, shaped as out,
    and into out only after the "done" signal, when no peer reads this rank's inp any more. SPIN:
    Config.spin_limit; giving up marks seen[p][rank] with -1 (a slot no peer uses)."""
    VEC: tl.constexpr = 16 // (inp.dtype.element_ty.primitive_bitwidth // 8)
    PLACES: tl.constexpr = GROUP if (MODE == "ag" or MODE == "a2a") else 1
    pid = tl.program_id(0)
    row, srow, mine, j = _pairing(members, counters, seen, me, world, GROUP, PEERS)
    mark = srow + rank
    live = (j < GROUP) & (j != me)
    peer, delta, count = _members(members, srow, j, live, mine, rank, GROUP)
    if STAGED:
        dst = scratch
    else:
        dst = out
    if MODE == "rs":
        at = inp + me * n
    else:
        at = inp
    lo = pid * per
    hi = tl.minimum(lo + per, n)
    ar = tl.arange(0, BLOCK)
    _meet(row, peer, delta, live, count + 1, mark, rank, SPIN)
    if MODE == "ar" or MODE == "rs":
        for s in range(lo, hi, BLOCK):
            o = s + ar
            mask = o < n
            acc = _reduce_ranks(at, o, mask, members + GROUP, mine, GROUP, VEC, OP, IS_FLOAT)
            tl.store(dst + o, acc.to(out.dtype.element_ty), mask=mask)
    else:
        for q in tl.static_range(GROUP):
            if MODE != "bc" or q == src:
                frm = inp + _peer_offset(members + GROUP, q, mine, VEC)
                for s in range(lo, hi, BLOCK):
                    o = s + ar
                    mask = o < n
                    if MODE == "a2a":
                        x = tl.load(frm + _a2a_index(o, me, cols, GROUP), mask=mask)
                    else:
                        x = tl.load(frm + o, mask=mask)
                    tl.store(dst + _place(o, q, n, cols, MODE, GROUP), x, mask=mask)
    _meet(row, peer, delta, live, count + 2, mark, rank, SPIN)
    tl.store(srow + peer, count + 2, mask=live)
    if STAGED:
        for q in tl.static_range(PLACES):
            for s in range(lo, hi, BLOCK):
                o = s + ar
                mask = o < n
                i = _place(o, q, n, cols, MODE, GROUP)
                tl.store(out + i, tl.load(scratch + i, mask=mask), mask=mask)


@triton.jit
def group_tile_kernel(inp, out, members, counters, seen, M, N, tiles, me, rank, world,
                      GROUP: tl.constexpr, PEERS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      GROUP_M: tl.constexpr, DIST: tl.constexpr, OP: tl.constexpr, IS_FLOAT: tl.constexpr,
                      SPIN: tl.constexpr):
    """reduce_scatter in Iris's layout over the GROUP ranks of members: out shaped as inp (M, N); the
    tiles of position me's share (as tile_reduce_scatter_kernel's: BM x BN in grouped order, dealt by
    DIST among the GROUP positions) get those tiles of every member's inp, read in place and combined
    by OP in member order (floats in fp32); out's other elements are left as they were. Program p takes
    tiles p, p + P, ... of the share. Only a tile's owner reads or writes it, so out may be inp. Meets
    twice, as group_kernel ("ready", "done"); giving up (SPIN) marks seen[p][rank] with -1."""
    VEC: tl.constexpr = 16 // (inp.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    row, srow, mine, j = _pairing(members, counters, seen, me, world, GROUP, PEERS)
    live = (j < GROUP) & (j != me)
    peer, delta, count = _members(members, srow, j, live, mine, rank, GROUP)
    _meet(row, peer, delta, live, count + 1, srow + rank, rank, SPIN)
    for k in range(pid, tl.cdiv(tiles, GROUP), tl.num_programs(0)):
        t = _tile_of(k, tiles, me, GROUP, DIST)
        if t >= 0:
            o, mask = _tile_offsets(t, M, N, BM, BN, GROUP_M)
            acc = _reduce_ranks(inp, o, mask, members + GROUP, mine, GROUP, VEC, OP, IS_FLOAT)
            tl.store(out + o, acc.to(out.dtype.element_ty), mask=mask)
    _meet(row, peer, delta, live, count + 2, srow + rank, rank, SPIN)
    tl.store(srow + peer, count + 2, mask=live)
