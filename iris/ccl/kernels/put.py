"""The collectives' kernel for jobs with indirect peers: every collective as puts into the peers' receive
slots, a signal per put, and a purely local combine.

Each remote access is iris.put of a contiguous tile from this rank's heap (its staging slot) into a
slot of the peer's receive area, then iris.atomic_xchg on the peer's counter with release (after
nvshmem_quiet where the peer is indirect); the receiver waits on its own counters, combines locally
and acknowledges. Built from iris's device functions only, the kernel reaches direct and indirect
peers alike. The collective (`kind`), the reduction and each member's role (whom this rank sends to
and receives from, worked out on the host) are run-time arguments, so one compiled kernel per dtype
serves every collective: NVSHMEM-linked kernels compile slowly.

Program p of a rank meets only program p of its peers (every rank splits a call the same way), never
another program of its own launch. Per pair and program it keeps, on the device: puts sent, puts
received (this rank's memory, `state`), and on the heap (iris's reserve, `counters`) the received
puts' count, written by the sender, and the acknowledged puts' count, written by the receiver. Put m
of a pair goes to the slot of parity m % 2 and waits until the receiver acknowledged put m - 2, so a
sender never overwrites what a peer has not read; the ack is awaited two puts later, so a loop of
calls rarely waits for it. Counts only grow and are read against the device's own state, so CUDA
graph replays advance them, and every group, rooted call or transfer between two ranks shares them
(calls between two ranks come in the same order on both: NCCL's rule).
"""
import triton
import triton.language as tl

from ...device.atomics import atomic_xchg
from ...device.rma import put
from .common import _a2a_index, _await, _tile_mn

# what a call does; the symmetric ones (every member sends to every other) come first
AR: tl.constexpr = tl.constexpr(0)        # all_reduce in one shot: every rank's whole input to every peer
AR2: tl.constexpr = tl.constexpr(1)       # all_reduce, first shot: chunk q to q, reduced there...
AG: tl.constexpr = tl.constexpr(2)        # all_gather
RS: tl.constexpr = tl.constexpr(3)        # reduce_scatter (torch's layout)
A2A: tl.constexpr = tl.constexpr(4)       # all_to_all
RST: tl.constexpr = tl.constexpr(5)       # reduce_scatter in Iris's tile layout
AG2: tl.constexpr = tl.constexpr(6)       # ...second shot: the reduced chunk to every peer (inside AR2)
BARRIER: tl.constexpr = tl.constexpr(7)   # signals only
BC: tl.constexpr = tl.constexpr(8)        # broadcast from root
SCATTER: tl.constexpr = tl.constexpr(9)   # chunk q of root's inp to member q
REDUCE: tl.constexpr = tl.constexpr(10)   # every member's inp reduced on root
GATHER: tl.constexpr = tl.constexpr(11)   # every member's inp to root
P2P: tl.constexpr = tl.constexpr(12)      # send, recv, sendrecv (the roles say to and from whom)
# reductions, a run-time argument too
MAX: tl.constexpr = tl.constexpr(1)
MIN: tl.constexpr = tl.constexpr(2)
# a member's role, in the bits of its entry in `peers` (the host knows them: iris/ccl/puts.py)
SENDS: tl.constexpr = tl.constexpr(1)     # this rank puts to it
RECEIVES: tl.constexpr = tl.constexpr(2)  # it puts to this rank
OWN: tl.constexpr = tl.constexpr(4)       # (this rank's own entry) its inp is part of what it writes


@triton.jit
def _tile(o, q, M, N, tiles, bm, bn, gm, dist, g):
    """Element o of member q's share in Iris's tile layout: its tiles (bm x bn, tile rows in groups of
    gm, dealt round robin (dist 0) or as one run (dist 1)) one after another; (index, exists)."""
    T = bm * bn
    k = o // T
    e = o - k * T
    share = tl.cdiv(tiles, g)
    t = tl.where(dist == 0, q + k * g, q * share + k)
    ok = (k < share) & (t < tiles)
    t = tl.where(ok, t, 0)
    pm, pn = _tile_mn(t, tl.cdiv(M, bm), tl.cdiv(N, bn), gm)
    row = pm * bm + e // bn
    col = pn * bn + e % bn
    return row * N + col, ok & (row < M) & (col < N)


@triton.jit
def _source(what, o, q, n, total, cols, g, M, N, tiles, bm, bn, gm, dist):
    """Where element o of the chunk meant for member q sits in inp, and whether it exists (total: inp's
    elements)."""
    idx = o
    if (what == AR2) | (what == RS) | (what == SCATTER):
        idx = q * n + o
    elif what == A2A:
        idx = _a2a_index(o, q, cols, g)
    ok = (o < n) & (idx < total)
    if what == RST:
        idx, ok = _tile(o, q, M, N, tiles, bm, bn, gm, dist, g)
        ok = ok & (o < n)
    return idx, ok


@triton.jit
def _at_least(count, target, mark, SPIN: tl.constexpr):
    """Polls the int64 *count (this rank's memory) until it reaches target; SPIN and mark as _await's."""
    _await(count + tl.arange(0, 1), tl.full([1], 1, tl.int1), target, mark, SPIN)


@triton.jit
def _stage(inp, stage, what, q, r0, r1, n, total, cols, g, M, N, tiles, bm, bn, gm, dist, BLOCK: tl.constexpr):
    """Elements [r0, r1) of the chunk meant for member q into this rank's staging slot (puts leave from
    the heap: NVSHMEM's remote transports read registered memory only)."""
    for s in range(r0, r1, BLOCK):
        o = s + tl.arange(0, BLOCK)
        idx, ok = _source(what, o, q, n, total, cols, g, M, N, tiles, bm, bn, gm, dist)
        tl.store(stage + (o - r0), tl.load(inp + idx, mask=ok & (o < r1)), mask=o < r1)


@triton.jit
def _send(inp, region, stage, flags, sent, heap_bases, peers, what, r0, r1, n, total, cols, M, N, tiles, bm, bn, gm,
          dist, g, rank, world, slot, mark, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    """Puts elements [r0, r1) of what each destination gets into its slot of parity (its put count) % 2
    and signals it. A chunk per destination is staged before each put; the same data once."""
    per_dest = (what == AR2) | (what == RS) | (what == A2A) | (what == RST) | (what == SCATTER)
    staged = (what == AG2) | (what == BARRIER)  # AG2 sends what AR2 reduced into the stage; BARRIER nothing
    for j in range(g):
        if (tl.load(peers + g + j) & SENDS) != 0:
            q = tl.load(peers + j)
            m = tl.load(sent + q)
            _at_least(flags + world + q, m - 1, mark, SPIN)  # q acknowledged put m - 2: this slot is free
            if per_dest | (staged == 0):
                _stage(inp, stage, what, j, r0, r1, n, total, cols, g, M, N, tiles, bm, bn, gm, dist, BLOCK)
                staged = per_dest == 0
            tl.debug_barrier()  # the whole stage is written before any thread puts it
            dst = region + ((m % 2) * world + rank) * slot
            for s in range(0, r1 - r0, BLOCK):
                o = s + tl.arange(0, BLOCK)
                put(stage + o, dst + o, rank, q, heap_bases, mask=o < r1 - r0)
            tl.debug_barrier()  # every thread's part of the put is out before the signal (and a restage)
            atomic_xchg(flags + rank, m + 1, rank, q, heap_bases, sem="release", scope="sys")
            tl.store(sent + q, m + 1)


@triton.jit
def _receive(inp, out, region, stage, flags, got, heap_bases, peers, what, op, r0, r1, n, total, cols, M, N, tiles,
             bm, bn, gm, dist, g, me, rank, world, slot, mark, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    """Waits for this round's puts, combines them (and this rank's own part) into out, acknowledges.
    Member j's elements come from this rank's inp (j == me) or from the slot its pending put landed in."""
    IS_FLOAT: tl.constexpr = inp.dtype.element_ty.is_floating()
    for j in range(g):
        if (tl.load(peers + g + j) & RECEIVES) != 0:
            q = tl.load(peers + j)
            _at_least(flags + q, tl.load(got + q) + 1, mark, SPIN)
    tl.debug_barrier()
    reduces = (what == AR) | (what == AR2) | (what == RS) | (what == RST) | (what == REDUCE)
    own = ((tl.load(peers + g + me) & OWN) != 0) & (what != AG2)  # AR2 wrote its own part already
    if reduces & own:  # every member's part, in member order: the same bits on every rank
        for s in range(r0, r1, BLOCK):
            o = s + tl.arange(0, BLOCK)
            idx, ok = _source(what, o, me, n, total, cols, g, M, N, tiles, bm, bn, gm, dist)
            ok = ok & (o < r1)
            acc = tl.zeros([BLOCK], tl.float32 if IS_FLOAT else inp.dtype.element_ty)
            for j in range(g):
                if j == me:
                    x = tl.load(inp + idx, mask=ok)
                else:
                    q = tl.load(peers + j)
                    x = tl.load(region + ((tl.load(got + q) % 2) * world + q) * slot + (o - r0), mask=ok,
                                cache_modifier=".cg")
                if IS_FLOAT:
                    x = x.to(tl.float32)
                if j == 0:
                    acc = x
                else:
                    acc = tl.where(op == MAX, tl.maximum(acc, x), tl.where(op == MIN, tl.minimum(acc, x), acc + x))
            r = acc.to(out.dtype.element_ty)
            tl.store(out + tl.where(what == RS, o, idx), r, mask=ok)
            if what == AR2:  # the second shot sends it from the stage
                tl.store(stage + (o - r0), r, mask=o < r1)
    elif reduces == 0:
        for j in range(g):
            if ((tl.load(peers + g + j) & RECEIVES) != 0) | ((j == me) & own):
                q = tl.load(peers + j)
                for s in range(r0, r1, BLOCK):
                    o = s + tl.arange(0, BLOCK)
                    at = o
                    if (what == AG) | (what == GATHER) | (what == AG2):
                        at = j * n + o
                    elif what == A2A:
                        at = _a2a_index(o, j, cols, g)
                    ok = (o < r1) & (o < n)
                    if what == AG2:
                        ok = ok & (at < total)
                    if j == me:
                        idx, exists = _source(what, o, me, n, total, cols, g, M, N, tiles, bm, bn, gm, dist)
                        x = tl.load(inp + idx, mask=ok & exists)
                    else:
                        x = tl.load(region + ((tl.load(got + q) % 2) * world + q) * slot + (o - r0), mask=ok,
                                    cache_modifier=".cg")
                    tl.store(out + at, x, mask=ok)
    tl.debug_barrier()  # every read of the slots is done before the acks free them
    for j in range(g):
        if (tl.load(peers + g + j) & RECEIVES) != 0:
            q = tl.load(peers + j)
            m = tl.load(got + q)
            atomic_xchg(flags + world + rank, m + 1, rank, q, heap_bases, sem="release", scope="sys")
            tl.store(got + q, m + 1)


@triton.jit(do_not_specialize=["kind", "op", "n", "total", "per", "slot", "cols", "M", "N", "tiles", "bm", "bn", "gm",
                               "dist", "g", "me", "rank", "world"])
def put_kernel(inp, out, area, counters, state, heap_bases, peers, kind, op, n, total, per, slot, cols, M, N, tiles,
               bm, bn, gm, dist, g, me, rank, world, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    """One collective (kind: AR ... P2P; op: 0 sum, MAX, MIN) over g members at position me (this rank:
    rank). peers: int64, the members' global ranks, then their roles (SENDS, RECEIVES, OWN bits).
    n: elements per chunk; total: inp's elements; per: elements of a chunk per program (a multiple of
    BLOCK); cols: columns per member (A2A); M, N, tiles, bm, bn, gm, dist: Iris's tile layout (RST).
    area: the receive area, per program 2 parities x world source ranks x `slot` elements; a program
    moves its range in rounds of `slot`. counters: (programs, 2, world) int64 on the heap, received
    puts per source then acknowledgements per destination; state: the same shape in this rank's memory,
    puts sent per destination then received per source. SPIN: Config.spin_limit (a program that gives
    up marks its own received count with -1)."""
    pid = tl.program_id(0)
    lo = pid * per
    hi = tl.minimum(lo + per, n)
    region = area + pid * (2 * world * slot)
    stage = region + rank * slot  # parity 0 of this rank's own source slot: no peer writes there
    flags = counters + pid * 2 * world
    sent = state + pid * 2 * world
    got = sent + world
    mark = got + rank
    phases = 1 + (kind == AR2).to(tl.int32)
    for k in range(tl.maximum(tl.cdiv(hi - lo, slot), 1)):  # a barrier (n = 0) still meets once
        r0 = lo + k * slot
        r1 = tl.minimum(r0 + slot, hi)
        for phase in range(phases):
            what = tl.where(phase == 0, kind, AG2)
            _send(inp, region, stage, flags, sent, heap_bases, peers, what, r0, r1, n, total, cols, M, N, tiles, bm,
                  bn, gm, dist, g, rank, world, slot, mark, BLOCK, SPIN)
            _receive(inp, out, region, stage, flags, got, heap_bases, peers, what, op, r0, r1, n, total, cols, M, N,
                     tiles, bm, bn, gm, dist, g, me, rank, world, slot, mark, BLOCK, SPIN)
