"""The accumulating all_reduce variants over a subset of the ranks (group=): atomic (remote atomic adds)
and spinlock (a lock around a remote read-modify-write), adding into the members' out. No heap
accumulator can be allocated for a group call (group.py), so out is the accumulator: a heap tensor,
the same allocation on every member, summed in its own dtype (Iris's kernels add into out too).

The spinlock's lock is a ticket lock per program on every rank, in iris's reserve
(ctx.reserve.group_locks, zeroed once): [0] counts tickets taken, [1] tickets served; both only grow,
so nothing ever resets them. Program p of every member handles the same range, so p's lock on a
rank serialises every update of that range there.
"""
import triton
import triton.language as tl

from .common import _hand_over, _meet, _members, _open, _peer_offset
from .group import _pairing


@triton.jit
def _add(cur, x):
    """cur + x in cur's dtype, floats added in fp32 (as a GPU adds fp16 and bf16; the interpreter would add
    bf16's bits as integers)."""
    if cur.dtype.is_floating():
        return (cur.to(tl.float32) + x.to(tl.float32)).to(cur.dtype)
    return cur + x


@triton.jit
def group_accumulate_kernel(inp, out, snap, members, counters, seen, locks, n, per, me, rank, world,
                            GROUP: tl.constexpr, PEERS: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr,
                            LOCK: tl.constexpr, TURNS: tl.constexpr, SNAP: tl.constexpr):
    """all_reduce (sum) by accumulation over the GROUP positions of members: program p zeroes elements
    [p*per, (p+1)*per) of this rank's out, meets ("ready": every member's range is zeroed), adds its
    inp range into every member's out (LOCK: under the ticket lock of program p on that member, plain
    load and store; else atomic_add), and meets again ("done": every add into this rank's out is in).
    Adds arrive in any order, so floats may differ in the last bits between runs and members. SNAP
    (out is inp): the range of inp is copied into snap (this rank's memory) before out is zeroed, and
    read from there. TURNS: position me adds after positions below it have (the interpreter, whose
    atomics are not atomic across processes): one more meeting per pair, before the higher one's
    adds and after the lower one's."""
    VEC: tl.constexpr = 16 // (out.dtype.element_ty.primitive_bitwidth // 8)
    DONE: tl.constexpr = 3 if TURNS else 2
    pid = tl.program_id(0)
    row, srow, mine, j = _pairing(members, counters, seen, me, world, GROUP, PEERS)
    mark = srow + rank
    live = (j < GROUP) & (j != me)
    peer, delta, count = _members(members, srow, j, live, mine, rank, GROUP)
    lo = pid * per
    hi = tl.minimum(lo + per, n)
    ar = tl.arange(0, BLOCK)
    if SNAP:
        src = snap
    else:
        src = inp
    for s in range(lo, hi, BLOCK):
        o = s + ar
        mask = o < hi
        if SNAP:
            tl.store(snap + o, tl.load(inp + o, mask=mask), mask=mask)
        tl.store(out + o, tl.zeros([BLOCK], out.dtype.element_ty), mask=mask)
    _meet(row, peer, delta, live, count + 1, mark, rank, SPIN)
    if TURNS:
        _meet(row, peer, delta, live & (j < me), count + 2, mark, rank, SPIN)
    for s in range(lo, hi, BLOCK):
        o = s + ar
        mask = o < hi
        x = tl.load(src + o, mask=mask)
        for i in tl.static_range(GROUP):
            q = (me + i) % GROUP  # each member starts at itself: the first adds go to different owners
            there = out + _peer_offset(members + GROUP, q, mine, VEC) + o
            if LOCK:
                lock = locks + 2 * pid + _peer_offset(members + GROUP, q, mine, 2)
                ticket = tl.atomic_add(lock, 1, sem="relaxed", scope="sys")
                _open(lock + 1, ticket, mark, SPIN)
                tl.store(there, _add(tl.load(there, mask=mask, volatile=True), x), mask=mask)
                _hand_over(lock + 1, ticket + 1)
            elif TURNS and out.dtype.element_ty == tl.bfloat16:  # the interpreter has no bf16 atomics; turns
                tl.store(there, _add(tl.load(there, mask=mask), x), mask=mask)  # keep each add alone there
            else:
                tl.atomic_add(there, x, mask=mask, sem="relaxed", scope="sys")
    if TURNS:
        _meet(row, peer, delta, live & (j > me), count + 2, mark, rank, SPIN)
    _meet(row, peer, delta, live, count + DONE, mark, rank, SPIN)
    tl.store(srow + peer, count + DONE, mask=live)
