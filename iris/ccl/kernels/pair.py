"""Kernels that meet only the ranks they exchange data with: the rooted collectives (reduce, scatter,
gather), point-to-point transfers and the barrier over a subset of the ranks; and the mailbox
transfer of send/recv(p2p_state=), which meets no one (see mailbox_kernel).

They synchronise as group.py's kernel does, through the pairwise counters in iris's reserve
(counters[p][s] on rank r: signals program p of rank s sent to program p of r) and this rank's seen
counts (how many of them it has waited for, advanced by the kernel itself, so CUDA graph replays
advance them too). A call meets each of its peers twice: "ready" (the kernel started, so the data it
will read or the buffer it will receive into is final in stream order) and "done" (every access to
a peer's memory is over, so each rank may reuse its tensors once the call returns). A rooted call's
peers are the root and the other members (they meet the root only); a transfer's peers are its
destination and its source. Counts stay paired as long as every pair of ranks makes its common
calls in the same order (NCCL's rule), whatever other ranks do in between.
"""
import triton
import triton.language as tl

from ...device.atomics import atomic_add
from ...device.rma import put
from .common import _await, _meet, _members, _peer_offset, _reduce_ranks

# ranks as plain arguments: one compiled kernel serves every rank and root (Triton would compile an int
# argument equal to 1 in as a constant, a second kernel for rank 1)


@triton.jit(do_not_specialize=["me", "rank", "root"])
def rooted_kernel(inp, out, members, counters, seen, n, per, me, rank, root, world,
                  GROUP: tl.constexpr, PEERS: tl.constexpr, MODE: tl.constexpr, OP: tl.constexpr,
                  IS_FLOAT: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    """MODE over the GROUP ranks of members (their global ranks, then their heap bases; PEERS: a power of
    two >= GROUP), reading inp (a heap tensor, the same allocation on every member) in place:
    "reduce": the root's out = every member's inp combined by OP in member order (floats in fp32);
    "scatter": every member's out = chunk `me` (n elements) of the root's inp;
    "gather": the root's out, chunk q = member q's inp (n elements each).
    me: this rank's position in members, rank its global rank, root the root's position; per: elements
    of a chunk per program (a multiple of BLOCK); counters and seen: (programs, world) int64. SPIN:
    Config.spin_limit; giving up marks seen[p][rank] with -1 (a slot no peer uses)."""
    VEC: tl.constexpr = 16 // (inp.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    row = counters + pid * world
    mark = seen + pid * world + rank
    mine = tl.load(members + GROUP + me)
    j = tl.arange(0, PEERS)
    live = (j < GROUP) & (j != me) & ((j == root) | (j * 0 + me == root))  # a block: the interpreter masks with it
    peer, delta, count = _members(members, seen + pid * world, j, live, mine, rank, GROUP)
    lo = pid * per
    hi = tl.minimum(lo + per, n)
    ar = tl.arange(0, BLOCK)
    _meet(row, peer, delta, live, count + 1, mark, rank, SPIN)
    if MODE == "scatter":
        frm = inp + _peer_offset(members + GROUP, root, mine, VEC) + me * n
        for s in range(lo, hi, BLOCK):
            o = s + ar
            mask = o < n
            tl.store(out + o, tl.load(frm + o, mask=mask), mask=mask)
    elif me == root:
        if MODE == "reduce":
            for s in range(lo, hi, BLOCK):
                o = s + ar
                mask = o < n
                acc = _reduce_ranks(inp, o, mask, members + GROUP, mine, GROUP, VEC, OP, IS_FLOAT)
                tl.store(out + o, acc.to(out.dtype.element_ty), mask=mask)
        else:
            for q in tl.static_range(GROUP):
                frm = inp + _peer_offset(members + GROUP, q, mine, VEC)
                for s in range(lo, hi, BLOCK):
                    o = s + ar
                    mask = o < n
                    tl.store(out + q * n + o, tl.load(frm + o, mask=mask), mask=mask)
    _meet(row, peer, delta, live, count + 2, mark, rank, SPIN)
    tl.store(seen + pid * world + peer, count + 2, mask=live)


@triton.jit(do_not_specialize=["me", "rank", "root"])
def spread_kernel(inp, out, members, counters, seen, n, part, per, me, rank, root, world,
                  GROUP: tl.constexpr, PEERS: tl.constexpr, MODE: tl.constexpr, OP: tl.constexpr,
                  IS_FLOAT: tl.constexpr, COPY: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    """reduce or broadcast over GROUP >= 3 members with the work spread over the members but the root:
    the k-th of them (the root left out) owns elements [k * part, (k + 1) * part) of n, so that every
    rank's links carry about the tensor once each way, where rooted_kernel's root takes in GROUP - 1.
    "reduce": an owner combines its elements of every member's inp by OP in member order (floats in
    fp32, rooted_kernel's bits) and stores them into the root's out; "broadcast": an owner copies its
    elements of the root's inp into its own out and every other owner's, and the root copies inp into
    its own out where COPY (out is not inp). inp and out: heap tensors, each the same allocation on
    every member. Every member meets every other twice, "ready" and "done" (as rooted_kernel's); per:
    elements of a part per program (a multiple of BLOCK)."""
    VEC: tl.constexpr = 16 // (inp.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    row = counters + pid * world
    mark = seen + pid * world + rank
    bases = members + GROUP
    mine = tl.load(bases + me)
    j = tl.arange(0, PEERS)
    live = (j < GROUP) & (j != me)
    peer, delta, count = _members(members, seen + pid * world, j, live, mine, rank, GROUP)
    ar = tl.arange(0, BLOCK)
    _meet(row, peer, delta, live, count + 1, mark, rank, SPIN)
    at_root = _peer_offset(bases, root, mine, VEC)
    for k in range(0, GROUP - 1):
        owner = k + (k >= root).to(tl.int32)
        end = tl.minimum(k * part + part, n)
        lo = k * part + pid * per
        hi = tl.minimum(lo + per, end)
        if owner == me:
            for s in range(lo, hi, BLOCK):
                o = s + ar
                mask = o < hi
                if MODE == "reduce":
                    acc = _reduce_ranks(inp, o, mask, bases, mine, GROUP, VEC, OP, IS_FLOAT)
                    tl.store(out + at_root + o, acc.to(out.dtype.element_ty), mask=mask)
                else:
                    x = tl.load(inp + at_root + o, mask=mask)
                    for q in tl.static_range(GROUP):
                        far = out + _peer_offset(bases, q, mine, VEC)
                        tl.store(far + o, x, mask=mask & (o * 0 + q != root))  # a block mask
        elif COPY and me == root:
            for s in range(lo, hi, BLOCK):
                o = s + ar
                mask = o < hi
                tl.store(out + o, tl.load(inp + o, mask=mask), mask=mask)
    _meet(row, peer, delta, live, count + 2, mark, rank, SPIN)
    tl.store(seen + pid * world + peer, count + 2, mask=live)


@triton.jit(do_not_specialize=["rank", "to", "frm"])
def p2p_kernel(src, dst, counters, seen, heap_bases, n, per, rank, to, frm, world, BLOCK: tl.constexpr,
               SPIN: tl.constexpr):
    """Stores src (n elements, this rank's memory) into rank `to`'s copy of dst (a heap tensor, the same
    allocation on both ranks), while rank `frm` stores into this rank's dst; -1: no such peer, `to` ==
    rank: a local copy. Both peers are met twice: after "ready" from `to` its dst may be overwritten
    (every earlier use of it is done in its stream order); after "done" from `frm` this rank's dst
    holds the data. per: elements per program (a multiple of BLOCK); counters and seen as
    rooted_kernel's."""
    VEC: tl.constexpr = 16 // (dst.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    row = counters + pid * world
    mark = seen + pid * world + rank
    mine = tl.load(heap_bases + rank)
    j = tl.arange(0, 2)
    peer = tl.where(j == 0, to, frm)
    live = (peer >= 0) & (peer != rank) & ((j == 0) | (j * 0 + frm != to))
    peer = tl.where(live, peer, rank)
    delta = _peer_offset(heap_bases, peer, mine, 2)
    count = tl.load(seen + pid * world + peer, mask=live, other=0)
    _meet(row, peer, delta, live, count + 1, mark, rank, SPIN)
    if to >= 0:
        far = dst + _peer_offset(heap_bases, to, mine, VEC)
        lo = pid * per
        hi = tl.minimum(lo + per, n)
        for s in range(lo, hi, BLOCK):
            o = s + tl.arange(0, BLOCK)
            mask = o < n
            tl.store(far + o, tl.load(src + o, mask=mask), mask=mask)
    _meet(row, peer, delta, live, count + 2, mark, rank, SPIN)
    tl.store(seen + pid * world + peer, count + 2, mask=live)


@triton.jit(do_not_specialize=["me", "rank"])
def barrier_kernel(members, counters, seen, me, rank, world, GROUP: tl.constexpr, PEERS: tl.constexpr,
                   SPIN: tl.constexpr):
    """One meeting of the GROUP ranks of members (as rooted_kernel's), by program 0's counters: launch
    with grid (1,). Nothing after it in this rank's stream starts before every member reached it."""
    mark = seen + rank
    mine = tl.load(members + GROUP + me)
    j = tl.arange(0, PEERS)
    live = (j < GROUP) & (j != me)
    peer, delta, count = _members(members, seen, j, live, mine, rank, GROUP)
    _meet(counters, peer, delta, live, count + 1, mark, rank, SPIN)
    tl.store(seen + peer, count + 1, mask=live)


@triton.jit(do_not_specialize=["rank", "peer"])
def mailbox_kernel(src, dst, sent, acked, counts, heap_bases, n, per, rank, peer, world, SEND: tl.constexpr,
                   BLOCK: tl.constexpr, SPIN: tl.constexpr, FAR: tl.constexpr = False):
    """One message of the mailbox form of send/recv (iris.ccl.p2p.P2PState), program p moving elements
    [p * per, (p + 1) * per) of n. SEND: once program p of `peer` has acknowledged this rank's previous
    message, stores src (this rank's memory) into dst, this rank's slot of peer's mailbox (an address
    in this rank's view of the heap), then counts the message in peer's sent[p][rank]. Else: waits
    until this rank's sent[p][peer] counts the next message from peer, copies src (peer's slot of this
    rank's mailbox) into dst (any contiguous memory), then acknowledges it in peer's acked[p][rank].
    A send waits for the slot to be free, never for the receiver's call: sends listed before receives
    (batch_isend_irecv) cannot wait on each other. sent, acked: (programs, world) int64 on the heap;
    counts[p][peer]: messages this rank sent to (SEND) or received from peer, in this rank's device
    memory and advanced by the kernel, so CUDA graph replays advance it too. SPIN: Config.spin_limit,
    giving up marks counts[p][rank] (a slot no peer uses) with -1. FAR (a job with indirect peers): the
    peer's memory is reached through iris.put and iris.atomic_add, which take NVSHMEM's path to it."""
    VEC: tl.constexpr = 16 // (dst.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    mine = tl.load(heap_bases + rank)
    delta = _peer_offset(heap_bases, peer, mine, 2)
    count = counts + pid * world + peer
    e = tl.load(count) + 1
    one = tl.zeros([1], tl.int32)
    if SEND:
        _await(acked + pid * world + peer + one, one == 0, e - 1, counts + pid * world + rank, SPIN)
        if not FAR:
            dst += _peer_offset(heap_bases, peer, mine, VEC)
    else:
        _await(sent + pid * world + peer + one, one == 0, e, counts + pid * world + rank, SPIN)
    tl.debug_barrier()
    lo = pid * per
    hi = tl.minimum(lo + per, n)
    for s in range(lo, hi, BLOCK):
        o = s + tl.arange(0, BLOCK)
        if FAR and SEND:
            put(src + o, dst + o, rank, peer, heap_bases, mask=o < n)
        else:
            tl.store(dst + o, tl.load(src + o, mask=o < n, volatile=True), mask=o < n)  # a peer's stores, on recv
    tl.debug_barrier()
    count_at = (sent if SEND else acked) + pid * world + rank
    if FAR:
        atomic_add(count_at, 1, rank, peer, heap_bases, sem="release", scope="sys")
    else:
        tl.atomic_add(count_at + delta, 1, sem="release", scope="sys")
    tl.store(count, e)
