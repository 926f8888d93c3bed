"""Ring kernels, rank -> rank + 1: the ring all_reduce, the ring all_gather and the ring reduce_scatter
(ring_chunked; both layouts). Hand-overs are 0/1 flags that return to 0, so no epoch is needed."""
import triton
import triton.language as tl

from .common import _combine, _hand_over, _open, _peer_offset, _tile_of, _tile_offsets


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
    """all_reduce around the ring rank -> rank + 1 (_ring_all_reduce). Each program is a ring of its own
    with one slot (SLICE elements of buf, fp32 for floats) and one 0/1 flag per rank."""
    VEC: tl.constexpr = 16 // (buf.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    mine = tl.load(heap_bases + rank)
    nxt = (rank + 1) % WORLD
    here = buf + pid * SLICE + tl.arange(0, SLICE)
    flag = flags + pid
    _ring_all_reduce(inp, out, here, here + _peer_offset(heap_bases, nxt, mine, VEC), flag,
                     flag + _peer_offset(heap_bases, nxt, mine, 2), flag, n, tiles, rank, WORLD, OP, SLICE, RINGS,
                     SPIN)


@triton.jit
def _ring_all_reduce(inp, out, here, there, flag, next_flag, mark, n, tiles, rank, WORLD: tl.constexpr,
                     OP: tl.constexpr, SLICE: tl.constexpr, RINGS: tl.constexpr, SPIN: tl.constexpr):
    """A reduce-scatter, then an all-gather, around the ring rank -> rank + 1 over each tile of WORLD
    slices of SLICE elements. Hop k of the first half sends the partial of slice rank - k and combines
    the received partial of slice rank - k - 1 with this rank's input; after WORLD - 1 hops this rank
    holds slice rank + 1 reduced over every rank (in ring order from the slice's own rank, so every
    rank gets the same bits), writes it to out and passes reduced slices on for WORLD - 1 more hops.
    here, there: this program's slot (SLICE pointers, in the accumulation dtype) and the successor's;
    flag, next_flag: their 0/1 flags; mark: where giving up (SPIN) writes -1. Program p serves ring
    p % RINGS (Config.all_reduce_num_rings), which takes tiles p % RINGS, p % RINGS + RINGS, ...,
    dealt over its programs. tiles: the tile count. A tile is read and written in place, so out may
    be inp."""
    ACC: tl.constexpr = here.dtype.element_ty
    pid = tl.program_id(0)
    ring = pid % RINGS
    per_ring = tl.num_programs(0) // RINGS
    ar = tl.arange(0, SLICE)
    for t in range(ring + RINGS * (pid // RINGS), tiles, RINGS * per_ring):
        base = t * (SLICE * WORLD) + ar
        o = base + rank * SLICE
        part = tl.load(inp + o, mask=o < n).to(ACC)
        for k in tl.static_range(WORLD - 1):
            _send(part, there, next_flag, mark, SPIN)
            x = _receive(here, flag, mark, SPIN)
            o = base + ((rank - k - 1 + WORLD) % WORLD) * SLICE
            part = _combine(x, tl.load(inp + o, mask=o < n).to(ACC), OP)
        o = base + ((rank + 1) % WORLD) * SLICE
        red = part.to(out.dtype.element_ty)
        tl.store(out + o, red, mask=o < n)
        part = red.to(ACC)
        for k in tl.static_range(WORLD - 1):
            _send(part, there, next_flag, mark, SPIN)
            part = _receive(here, flag, mark, SPIN)
            o = base + ((rank - k + WORLD) % WORLD) * SLICE
            tl.store(out + o, part.to(out.dtype.element_ty), mask=o < n)


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
