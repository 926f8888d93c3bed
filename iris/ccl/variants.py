"""Kernels of the all_reduce variants that accumulate into one buffer on every rank (atomic: remote
atomic adds; spinlock: a lock per block around a remote read-modify-write), the ring all_reduce,
the push all_gather (persistent: each program stores its range into every rank; partitioned: the
programs are split by destination rank), the reduce_scatter of Iris's layout (out shaped as inp,
each rank's tiles reduced), and the ring all_gather and ring reduce_scatter (ring_chunked; both
layouts).

The same flag discipline as kernels.py: per-program epochs on the device, flags that only grow (the
rings' 0/1 hand-overs return to 0 by themselves), and a program waits only for the program of the same
index on other ranks, so the interpreter, which runs a launch's programs one after another, works
too. Interpreter atomics are not atomic across processes, so under it (TURNS) the ranks take turns
to accumulate; on a GPU they race for real.
"""
import triton
import triton.language as tl

from ..device.translate import _translate
from .kernels import _await, _combine, _epoch, _peer_offset


@triton.jit
def _signal_wait(row, epoch, rank, heap_bases, to, frm, PEERS: tl.constexpr, SPIN: tl.constexpr):
    """Writes epoch into slot `rank` of `row` on the peers where `to` holds (release, sys), then waits
    until this rank's row holds at least epoch in the slots where `frm` holds (acquire, sys). to, frm:
    PEERS-wide masks over ranks. Giving up (SPIN) marks slot `rank` of this rank's own row."""
    tl.debug_barrier()
    peers = tl.arange(0, PEERS)
    slots = _translate(row + rank, rank, tl.where(to, peers, rank), heap_bases)
    tl.atomic_xchg(slots, tl.zeros([PEERS], tl.int64) + epoch, mask=to, sem="release", scope="sys")
    _await(row + peers, frm, epoch, row + rank, SPIN)
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
def accumulate_kernel(inp, out, acc, locks, flags, counters, heap_bases, n, per, rank,
                      WORLD: tl.constexpr, PEERS: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr,
                      LOCK: tl.constexpr, TURNS: tl.constexpr):
    """all_reduce (sum) by accumulation: every rank adds its input into acc (fp32 for floats, on the heap)
    on every rank, then copies its own acc into out. LOCK: each block of acc is updated under a lock
    on its owner (spinlock: atomic_cas to take it, plain load and store, atomic_xchg to give it back);
    else with atomic_add. n elements; per: elements per program (a multiple of BLOCK). Exchanges: the
    first after acc is zeroed (no rank adds into a peer still zeroing or copying out the last call),
    the second after the adds (every contribution is in before acc is read). TURNS: rank r adds after
    ranks 0..r-1 signalled that they have (the interpreter)."""
    VEC: tl.constexpr = 16 // (acc.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    e = _epoch(counters, pid)
    mine = tl.load(heap_bases + rank)
    lo = pid * per
    hi = tl.minimum(lo + per, n)
    ar = tl.arange(0, BLOCK)
    peers = tl.arange(0, PEERS)
    live = (peers < WORLD) & (peers != rank)
    rows = tl.num_programs(0) * WORLD
    for s in range(lo, hi, BLOCK):
        tl.store(acc + s + ar, tl.zeros([BLOCK], acc.dtype.element_ty), mask=s + ar < hi)
    _signal_wait(flags + pid * WORLD, e, rank, heap_bases, live, live, PEERS, SPIN)
    if TURNS:
        _signal_wait(flags + 2 * rows + pid * WORLD, e, rank, heap_bases, live & (peers < 0), live & (peers < rank),
                     PEERS, SPIN)
    for s in range(lo, hi, BLOCK):
        o = s + ar
        mask = o < hi
        x = tl.load(inp + o, mask=mask).to(acc.dtype.element_ty)
        for i in tl.static_range(WORLD):
            q = (rank + i) % WORLD  # each rank starts at itself: the peers' first adds go to different owners
            there = acc + _peer_offset(heap_bases, q, mine, VEC) + o
            if LOCK:
                lock = locks + s // BLOCK + _peer_offset(heap_bases, q, mine, 2)
                free = tl.zeros([], tl.int64)  # atomic_cas wants the lock's own type
                while tl.atomic_cas(lock, free, free + 1, sem="acquire", scope="sys") != 0:
                    pass
                tl.debug_barrier()
                cur = tl.load(there, mask=mask, volatile=True)
                tl.store(there, cur + x, mask=mask)
                tl.debug_barrier()
                tl.atomic_xchg(lock, free, sem="release", scope="sys")
            else:
                tl.atomic_add(there, x, mask=mask, sem="relaxed", scope="sys")
    if TURNS:
        _signal_wait(flags + 2 * rows + pid * WORLD, e, rank, heap_bases, live & (peers > rank), live & (peers < 0),
                     PEERS, SPIN)
    _signal_wait(flags + rows + pid * WORLD, e, rank, heap_bases, live, live, PEERS, SPIN)
    for s in range(lo, hi, BLOCK):
        o = s + ar
        mask = o < hi
        tl.store(out + o, tl.load(acc + o, mask=mask, volatile=True).to(out.dtype.element_ty), mask=mask)


@triton.jit
def _send(x, there, flag, mark, SPIN: tl.constexpr):
    """One ring hop out: waits until the successor emptied its slot (flag 0), stores x into it, sets
    its flag to 1 (release)."""
    _open(flag, 0, mark, SPIN)
    tl.store(there, x)
    _hand_over(flag, 1)


@triton.jit
def _receive(here, flag, mark, SPIN: tl.constexpr):
    """One ring hop in: waits until the predecessor filled this rank's slot (flag 1), reads it, empties it."""
    _open(flag, 1, mark, SPIN)
    x = tl.load(here, volatile=True)
    _hand_over(flag, 0)
    return x


@triton.jit
def ring_kernel(inp, out, buf, flags, heap_bases, n, tiles, rank,
                WORLD: tl.constexpr, OP: tl.constexpr, IS_FLOAT: tl.constexpr, SLICE: tl.constexpr,
                RINGS: tl.constexpr, SPIN: tl.constexpr):
    """all_reduce around the ring rank -> rank + 1: a reduce-scatter, then an all-gather, over each tile of
    WORLD slices of SLICE elements. Hop k of the first half sends the partial of slice rank - k and
    combines the received partial of slice rank - k - 1 with this rank's input; after WORLD - 1 hops
    this rank holds slice rank + 1 reduced over every rank (in ring order from the slice's own rank, so
    every rank gets the same bits), writes it to out and passes reduced slices on for WORLD - 1 more
    hops. Each program is a ring of its own with one slot (SLICE elements of buf, fp32 for floats) and
    one 0/1 flag per rank; program p serves ring p % RINGS (Config.all_reduce_num_rings), which takes
    tiles p % RINGS, p % RINGS + RINGS, ..., dealt over its programs. tiles: the tile count. A tile is
    read and written in place, so out may be inp."""
    VEC: tl.constexpr = 16 // (buf.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    mine = tl.load(heap_bases + rank)
    nxt = (rank + 1) % WORLD
    here = buf + pid * SLICE + tl.arange(0, SLICE)
    there = here + _peer_offset(heap_bases, nxt, mine, VEC)
    flag = flags + pid
    next_flag = flag + _peer_offset(heap_bases, nxt, mine, 2)
    ring = pid % RINGS
    per_ring = tl.num_programs(0) // RINGS
    ar = tl.arange(0, SLICE)
    for t in range(ring + RINGS * (pid // RINGS), tiles, RINGS * per_ring):
        base = t * (SLICE * WORLD) + ar
        o = base + rank * SLICE
        part = tl.load(inp + o, mask=o < n).to(buf.dtype.element_ty)
        for k in tl.static_range(WORLD - 1):
            _send(part, there, next_flag, flag, SPIN)
            x = _receive(here, flag, flag, SPIN)
            o = base + ((rank - k - 1 + WORLD) % WORLD) * SLICE
            part = _combine(x, tl.load(inp + o, mask=o < n).to(buf.dtype.element_ty), OP)
        o = base + ((rank + 1) % WORLD) * SLICE
        red = part.to(out.dtype.element_ty)
        tl.store(out + o, red, mask=o < n)
        part = red.to(buf.dtype.element_ty)
        for k in tl.static_range(WORLD - 1):
            _send(part, there, next_flag, flag, SPIN)
            part = _receive(here, flag, flag, SPIN)
            o = base + ((rank - k + WORLD) % WORLD) * SLICE
            tl.store(out + o, part.to(out.dtype.element_ty), mask=o < n)


@triton.jit
def gather_push_kernel(inp, out, stage, flags, counters, heap_bases, n, per, rank,
                       WORLD: tl.constexpr, PEERS: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr,
                       OUT_HEAP: tl.constexpr, PARTITIONED: tl.constexpr):
    """all_gather by remote stores: out (WORLD * n) gets rank q's inp (n) at q * n. Persistent: program
    p stores elements [p * per, (p+1) * per) of inp into every rank. PARTITIONED: the programs form
    WORLD equal groups; program p of group g stores its range (p mod the group size) into rank
    rank + g only, and learns of the range rank - g wrote into it. OUT_HEAP: stores go straight into
    the peers' out (the same heap tensor on every rank), else into their stage (laid out as out),
    copied into out at the end. Two signals: "entered" (a rank writes into a peer only after the
    peer's previous use of out or stage is over) and "written"."""
    VEC: tl.constexpr = 16 // (inp.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    e = _epoch(counters, pid)
    mine = tl.load(heap_bases + rank)
    peers = tl.arange(0, PEERS)
    live = (peers < WORLD) & (peers != rank)
    if PARTITIONED:
        parts = tl.num_programs(0) // WORLD
        g = pid // parts
        lo = (pid % parts) * per
        dest = (rank + g) % WORLD
        frm = (rank - g + WORLD) % WORLD
        writers = live & (peers == frm)
        targets = live & (peers == dest)
    else:
        lo = pid * per
        dest = rank
        frm = rank
        writers = live
        targets = live
    hi = tl.minimum(lo + per, n)
    ar = tl.arange(0, BLOCK)
    if OUT_HEAP:
        dst = out
    else:
        dst = stage
    rows = tl.num_programs(0) * WORLD
    _signal_wait(flags + pid * WORLD, e, rank, heap_bases, writers, targets, PEERS, SPIN)
    for s in range(lo, hi, BLOCK):
        o = s + ar
        mask = o < hi
        x = tl.load(inp + o, mask=mask)
        if PARTITIONED:
            if dest == rank:
                tl.store(out + rank * n + o, x, mask=mask)
            else:
                tl.store(dst + _peer_offset(heap_bases, dest, mine, VEC) + rank * n + o, x, mask=mask)
        else:
            for i in tl.static_range(WORLD):
                q = (rank + i) % WORLD
                if q == rank:
                    tl.store(out + rank * n + o, x, mask=mask)
                else:
                    tl.store(dst + _peer_offset(heap_bases, q, mine, VEC) + rank * n + o, x, mask=mask)
    _signal_wait(flags + rows + pid * WORLD, e, rank, heap_bases, targets, writers, PEERS, SPIN)
    if not OUT_HEAP:
        for q in tl.static_range(WORLD):
            if PARTITIONED:
                wrote = (q == frm) & (q != rank)
            else:
                wrote = q != rank
            if wrote:
                for s in range(lo, hi, BLOCK):
                    o = q * n + s + ar
                    mask = s + ar < hi
                    tl.store(out + o, tl.load(stage + o, mask=mask), mask=mask)


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
def _tile_offsets(t, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Element offsets and mask of tile t of a row-major (M, N) tensor, tiles ordered in groups of GROUP_M
    tile rows (Iris's swizzle)."""
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    in_group = GROUP_M * grid_n
    first_m = (t // in_group) * GROUP_M
    rows = tl.minimum(grid_m - first_m, GROUP_M)
    pm = first_m + (t % in_group) % rows
    pn = (t % in_group) // rows
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    return rm[:, None] * N + rn[None, :], (rm[:, None] < M) & (rn[None, :] < N)


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
            acc = tl.load(buf + _peer_offset(heap_bases, 0, mine, VEC) + o, mask=mask)
            if IS_FLOAT:
                acc = acc.to(tl.float32)
            for q in tl.static_range(1, WORLD):
                y = tl.load(buf + _peer_offset(heap_bases, q, mine, VEC) + o, mask=mask)
                if IS_FLOAT:
                    y = y.to(tl.float32)
                acc = _combine(acc, y, OP)
            tl.store(out + o, acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def ring_gather_kernel(inp, out, slot, flags, heap_bases, n, rank, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                       SPIN: tl.constexpr):
    """all_gather around the ring rank -> rank + 1: out (WORLD * n) gets rank q's inp (n) at q * n, in
    WORLD - 1 hops. Program p moves blocks p, p + P, ... (BLOCK elements) of a chunk. Hop h stores
    chunk rank - h (this rank's inp first, then what it received at hop h - 1, read back from out)
    into the successor's slot (n elements on the heap) and sets the successor's 0/1 flag; then it
    waits for its own flag, copies chunk rank - h - 1 from its slot into out and empties the slot.
    One hand-over per hop and program whatever the size; the flags return to 0, so repeated calls
    and graph replays need no epoch. out may be any tensor."""
    VEC: tl.constexpr = 16 // (slot.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    mine = tl.load(heap_bases + rank)
    nxt = (rank + 1) % WORLD
    there = slot + _peer_offset(heap_bases, nxt, mine, VEC)
    flag = flags + pid
    next_flag = flag + _peer_offset(heap_bases, nxt, mine, 2)
    ar = tl.arange(0, BLOCK)
    for s in range(pid * BLOCK, n, step):
        o = s + ar
        tl.store(out + rank * n + o, tl.load(inp + o, mask=o < n), mask=o < n)
    for h in tl.static_range(WORLD - 1):
        c = (rank - h + WORLD) % WORLD
        _open(next_flag, 0, flag, SPIN)
        for s in range(pid * BLOCK, n, step):
            o = s + ar
            tl.store(there + o, tl.load(out + c * n + o, mask=o < n), mask=o < n)
        _hand_over(next_flag, 1)
        c = (c - 1 + WORLD) % WORLD
        _open(flag, 1, flag, SPIN)
        for s in range(pid * BLOCK, n, step):
            o = s + ar
            tl.store(out + c * n + o, tl.load(slot + o, mask=o < n, volatile=True), mask=o < n)
        _hand_over(flag, 0)


@triton.jit
def _unit(k, x, n, M, N, tiles, WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr,
          DIST: tl.constexpr, TILED: tl.constexpr):
    """Unit k of chunk x of a reduce_scatter: (offsets in out, where the chunk starts in inp, mask).
    TILED: the k-th tile of rank x's share of an (M, N) tensor (as tile_reduce_scatter_kernel's;
    inp and out alike); else block k (BN elements, M = 1, N = n) of the n elements at x * n of inp."""
    if TILED:
        t = _tile_of(k, tiles, x, WORLD, DIST)
        o, mask = _tile_offsets(tl.maximum(t, 0), M, N, BM, BN, GROUP_M)
        return o, 0, mask & (o < tl.where(t >= 0, M * N, 0))  # past its share (t -1): nothing
    o, mask = _tile_offsets(k, M, N, BM, BN, GROUP_M)
    return o, x * n, mask


@triton.jit
def ring_reduce_scatter_kernel(inp, out, slot, part, flags, heap_bases, n, M, N, tiles, units, rank,
                               WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr,
                               DIST: tl.constexpr, TILED: tl.constexpr, OP: tl.constexpr, SPIN: tl.constexpr):
    """reduce_scatter around the ring rank -> rank + 1 (the first half of the ring all_reduce): chunk x
    (rank x's part, `units` units of BM x BN, see _unit) starts at rank x + 1 as its input and
    travels WORLD - 1 hops, each rank combining (OP) the partial it receives with its own input of
    that chunk, and ends reduced at rank x, which writes it to out. Hop h sends chunk rank - h - 1
    (inp at hop 0, then the partial kept in `part`, local memory) into the successor's slot and
    sets its 0/1 flag; then it waits for its own flag and combines chunk rank - h - 2. Partials and
    slots are fp32 for floats; every element of a chunk is combined in the same ring order, so the
    result does not depend on timing. Program p moves units p, p + P, ...; one hand-over per hop
    and program. TILED: Iris's layout (out shaped as inp, this rank's tiles written, the rest left
    as it was); else torch's (out: n elements, rows [rank * n, (rank + 1) * n) of inp reduced)."""
    VEC: tl.constexpr = 16 // (slot.dtype.element_ty.primitive_bitwidth // 8)
    UNIT: tl.constexpr = BM * BN
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    mine = tl.load(heap_bases + rank)
    nxt = (rank + 1) % WORLD
    there = slot + _peer_offset(heap_bases, nxt, mine, VEC)
    flag = flags + pid
    next_flag = flag + _peer_offset(heap_bases, nxt, mine, 2)
    blk = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    if WORLD == 1:
        for k in range(pid, units, programs):
            o, base, mask = _unit(k, rank, n, M, N, tiles, WORLD, BM, BN, GROUP_M, DIST, TILED)
            tl.store(out + o, tl.load(inp + base + o, mask=mask), mask=mask)
    for h in tl.static_range(WORLD - 1):
        x = (rank - h - 1 + WORLD) % WORLD
        _open(next_flag, 0, flag, SPIN)
        for k in range(pid, units, programs):
            if h == 0:
                o, base, mask = _unit(k, x, n, M, N, tiles, WORLD, BM, BN, GROUP_M, DIST, TILED)
                v = tl.load(inp + base + o, mask=mask).to(slot.dtype.element_ty)
            else:
                v = tl.load(part + k * UNIT + blk)
            tl.store(there + k * UNIT + blk, v)
        _hand_over(next_flag, 1)
        x = (x - 1 + WORLD) % WORLD
        _open(flag, 1, flag, SPIN)
        for k in range(pid, units, programs):
            o, base, mask = _unit(k, x, n, M, N, tiles, WORLD, BM, BN, GROUP_M, DIST, TILED)
            acc = _combine(tl.load(slot + k * UNIT + blk, volatile=True),
                           tl.load(inp + base + o, mask=mask).to(slot.dtype.element_ty), OP)
            if h == WORLD - 2:
                tl.store(out + o, acc.to(out.dtype.element_ty), mask=mask)
            else:
                tl.store(part + k * UNIT + blk, acc)
        _hand_over(flag, 0)
