"""The pieces every collective kernel is built from: flag exchanges and waits, the hand-overs of the
rings, the pairwise meetings of the group and pair kernels, a peer's offset, a program's epoch and
range, the reductions, and the grouped tile order (also iris.ops' GEMM tile order).

The synchronisation rules they keep are the package's (iris/ccl/kernels/__init__.py).
"""
import triton
import triton.language as tl

from ...device.near import _relax
from ...device.translate import _translate


@triton.jit
def _exchange(row, epoch, rank, heap_bases, WORLD: tl.constexpr, PEERS: tl.constexpr, SPIN: tl.constexpr):
    """Writes epoch into slot `rank` of `row` on every peer (release, sys), then waits until every peer's
    slot of this rank's `row` holds at least epoch (acquire, sys). row: WORLD int64 flags on the heap;
    PEERS: a power of two >= WORLD. The barriers order the whole program's accesses around the flags.
    SPIN: as _await's; giving up marks slot `rank` of this rank's own row (no peer writes there)."""
    _signal(row, epoch, rank, heap_bases, WORLD, PEERS)
    _wait_peers(row, epoch, rank, WORLD, PEERS, SPIN)


@triton.jit
def _signal(row, epoch, rank, heap_bases, WORLD: tl.constexpr, PEERS: tl.constexpr):
    """_exchange's first half: _signal_to every peer."""
    peers = tl.arange(0, PEERS)
    _signal_to(row, epoch, rank, heap_bases, (peers < WORLD) & (peers != rank), PEERS)


@triton.jit
def _signal_to(row, epoch, rank, heap_bases, to, PEERS: tl.constexpr):
    """Orders the program's earlier accesses before it, then writes epoch into slot `rank` of `row` on the
    peers where `to` holds (a PEERS-wide mask over ranks; release, sys)."""
    tl.debug_barrier()
    peers = tl.arange(0, PEERS)
    slots = _translate(row + rank, rank, tl.where(to, peers, rank), heap_bases)
    tl.atomic_xchg(slots, tl.zeros([PEERS], tl.int64) + epoch, mask=to, sem="release", scope="sys")


@triton.jit
def _wait_peers(row, epoch, rank, WORLD: tl.constexpr, PEERS: tl.constexpr, SPIN: tl.constexpr):
    """_exchange's second half: waits until every peer's slot of this rank's `row` holds at least epoch
    (acquire, sys), then orders the program's later accesses after it. Giving up (SPIN) marks slot
    `rank` of this rank's own row."""
    peers = tl.arange(0, PEERS)
    _await(row + peers, (peers < WORLD) & (peers != rank), epoch, row + rank, SPIN)
    tl.debug_barrier()


@triton.jit
def _await(slots, live, target, mark, SPIN: tl.constexpr, EXACT: tl.constexpr = False):
    """Polls the live slots (int64 pointers, acquire, sys) until each reaches target (a scalar or one per
    slot; EXACT: until each holds it, for 0/1 hand-over flags). SPIN: the most polls (0: wait for ever;
    IRIS_SPIN_LIMIT or Config.spin_limit); giving up writes -(1 + slot + 65536 * target) into *mark
    for the first slot still short (decoded by iris/ccl/waits.py), so the host can name who was late."""
    pending = 1
    polls = 0
    idx = tl.arange(0, slots.shape[0])
    want = tl.zeros(slots.shape, tl.int64) + target
    while pending > 0:  # a scalar loop-carried value (Triton 3.6 mis-compiles a block one here)
        seen = tl.atomic_add(slots, 0, mask=live, sem="acquire", scope="sys")
        if EXACT:
            short = live & (seen != want)
        else:
            short = live & (seen < want)
        pending = tl.sum(short.to(tl.int32), axis=0)
        if pending > 0:
            _relax()
        if SPIN != 0:
            polls += 1
            if polls >= SPIN:
                if pending > 0:
                    late = tl.min(tl.where(short, idx, slots.shape[0]), axis=0)
                    epoch = tl.max(tl.where(short, want, 0), axis=0)
                    tl.store(mark, -1 - late - 65536 * epoch)
                pending = 0


@triton.jit
def _signal_wait(row, epoch, rank, heap_bases, to, frm, PEERS: tl.constexpr, SPIN: tl.constexpr):
    """Writes epoch into slot `rank` of `row` on the peers where `to` holds (release, sys), then waits
    until this rank's row holds at least epoch in the slots where `frm` holds (acquire, sys). to, frm:
    PEERS-wide masks over ranks. Giving up (SPIN) marks slot `rank` of this rank's own row."""
    _signal_to(row, epoch, rank, heap_bases, to, PEERS)
    _await(row + tl.arange(0, PEERS), frm, epoch, row + rank, SPIN)
    tl.debug_barrier()


@triton.jit
def _open(flag, value, mark, SPIN: tl.constexpr):
    """Waits until the int64 *flag holds value (acquire, sys; SPIN as _await's, marking *mark), then
    orders the program's later accesses after it."""
    one = tl.zeros([1], tl.int32)
    _await(flag + one, one == 0, value, mark, SPIN, True)
    tl.debug_barrier()


@triton.jit
def _hand_over(flag, value):
    """Orders the program's earlier accesses before it, then sets *flag to value (release, sys)."""
    tl.debug_barrier()
    tl.atomic_xchg(flag, value, sem="release", scope="sys")


@triton.jit
def _meet(row, peer, delta, live, target, mark, rank, SPIN: tl.constexpr):
    """Adds 1 to this rank's counter in `row` on every live peer (release, sys), then waits until each
    peer's counter in this rank's `row` reaches target (acquire, sys). row: this program's counters,
    one int64 per global rank; peer: the peers' global ranks; delta: their heap bases minus this
    rank's, in int64 elements. The barriers order the whole program's accesses around the counters."""
    tl.debug_barrier()
    tl.atomic_add(row + rank + delta, tl.full(delta.shape, 1, tl.int64), mask=live, sem="release", scope="sys")
    _await(row + peer, live, target, mark, SPIN)
    tl.debug_barrier()


@triton.jit
def _peer_offset(heap_bases, q, mine, VEC: tl.constexpr):
    """Elements from a pointer in this rank's heap (base mine) to the same offset in rank q's heap
    (heap_bases: int64 bases; VEC: elements per 16 bytes, so the offset keeps 16-byte alignment)."""
    return tl.multiple_of((tl.load(heap_bases + q) - mine) // (16 // VEC), VEC)


@triton.jit
def _members(members, seen_row, j, live, mine, rank, GROUP: tl.constexpr):
    """The peers a pair or group kernel meets, from members (GROUP global ranks, then their heap bases)
    at the positions j where live holds: (their global ranks (rank elsewhere), their heap bases minus
    mine in int64 elements (0 elsewhere), the signals this rank has seen from each (seen_row: its
    counts per global rank))."""
    peer = tl.load(members + j, mask=live, other=rank)
    delta = (tl.load(members + GROUP + j, mask=live, other=mine) - mine) // 8
    return peer, delta, tl.load(seen_row + peer, mask=live, other=0)


@triton.jit
def _epoch(counters, pid):
    """This program's next epoch: counters[pid] + 1, stored back. Kept on the device so that CUDA graph
    replays advance it too. Every warp reads the count before one thread stores it: a warp that read
    it after the store would run the next call's epoch, its parity of the stage and its flags."""
    e = tl.load(counters + pid) + 1
    tl.debug_barrier()  # every warp has read the count before one thread overwrites it
    tl.store(counters + pid, e)
    return e


@triton.jit
def _start(counters, heap_bases, rank, per, n):
    """The preamble of a kernel whose program p moves elements [p * per, p * per + per) of n under an
    epoch: (pid, its epoch (_epoch), this rank's heap base, lo, hi)."""
    pid = tl.program_id(0)
    lo = pid * per
    return pid, _epoch(counters, pid), tl.load(heap_bases + rank), lo, tl.minimum(lo + per, n)


@triton.jit
def _a2a_index(o, c, cols, WORLD):
    """Where element o of column chunk c sits in a row-major (M, cols * WORLD) tensor (WORLD a constexpr
    or a run-time value)."""
    m = o // cols
    return m * (cols * WORLD) + c * cols + (o - m * cols)


@triton.jit
def _combine(acc, x, OP: tl.constexpr):
    """acc and x combined by OP ("sum", "max", "min")."""
    if OP == "max":
        return tl.maximum(acc, x)
    elif OP == "min":
        return tl.minimum(acc, x)
    return acc + x


@triton.jit
def _reduce_ranks(base, o, mask, heap_bases, mine, WORLD: tl.constexpr, VEC: tl.constexpr, OP: tl.constexpr,
                  IS_FLOAT: tl.constexpr):
    """base[o] of every rank combined by OP ("sum", "max", "min"), in rank order so that every rank gets
    the same bits; floats in fp32. base: valid in this rank's view (heap base mine); heap_bases: the
    WORLD ranks' bases, in the order to combine (a group's members for group_kernel); VEC: elements per
    16 bytes."""
    acc = tl.load(base + _peer_offset(heap_bases, 0, mine, VEC) + o, mask=mask)
    if IS_FLOAT:
        acc = acc.to(tl.float32)
    for q in tl.static_range(1, WORLD):
        x = tl.load(base + _peer_offset(heap_bases, q, mine, VEC) + o, mask=mask)
        if IS_FLOAT:
            x = x.to(tl.float32)
        acc = _combine(acc, x, OP)
    return acc


@triton.jit
def _tile_of(k, tiles, x, WORLD: tl.constexpr, DIST: tl.constexpr):
    """Tile id of the k-th tile that rank x owns (DIST 0: tiles x, x + WORLD, ...; 1: a contiguous run of
    cdiv(tiles, WORLD)), or -1 past the end of its share."""
    if DIST == 0:
        t = x + k * WORLD
    else:
        t = x * tl.cdiv(tiles, WORLD) + k
        t = tl.where(k < tl.cdiv(tiles, WORLD), t, tiles)
    return tl.where(t < tiles, t, -1)


@triton.jit
def _tile_mn(tile, num_m, num_n, GROUP_M):
    """(row block, column block) of the tile-th tile of a num_m x num_n grid in grouped order: GROUP_M
    row blocks at a time, column by column (Iris's swizzle; the GEMM's tiles share B's columns while
    they are in L2). GROUP_M may be a constexpr or a run-time value."""
    width = GROUP_M * num_n
    first_m = (tile // width) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % width) % rows, (tile % width) // rows


@triton.jit
def _tile_offsets(t, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Element offsets and mask of tile t of a row-major (M, N) tensor, tiles in grouped order (_tile_mn)."""
    pm, pn = _tile_mn(t, tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    return rm[:, None] * N + rn[None, :], (rm[:, None] < M) & (rn[None, :] < N)
