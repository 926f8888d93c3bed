"""The pull kernels: all_reduce one-shot, all_gather, all_to_all and broadcast by staging this rank's
input, one flag exchange, and reading the peers' staged copies; large all_gathers and all_to_alls
with the staging in segments, each read by the peers while the next is staged; and the large
broadcast over more than two ranks, a scatter then an all_gather (two exchanges)."""
import triton
import triton.language as tl

from .common import _a2a_index, _exchange, _peer_offset, _reduce_ranks, _signal, _start, _wait_peers


@triton.jit
def pull_kernel(inp, out, stage, flags, counters, heap_bases, n, cs, per, parity_stride, cols, rank, src,
                WORLD: tl.constexpr, PEERS: tl.constexpr, MODE: tl.constexpr, OP: tl.constexpr,
                IS_FLOAT: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    """Stage this rank's input in the heap, exchange one flag per peer, then build out from the peers'
    staged copies. MODE: "ar" all_reduce, "ag" all_gather, "bc" broadcast from src, "a2a" all_to_all.
    n: elements per chunk; stage holds two copies (by epoch parity, parity_stride apart) of CHUNKS
    chunks cs apart (1 chunk, or WORLD for a2a); per: elements of each chunk per program (a multiple
    of BLOCK); cols: columns per rank for a2a. Double buffering by parity makes one exchange enough:
    a rank rewrites a stage copy only after every peer has entered the next call, so after it
    finished reading that copy. This rank's own part goes from inp to out while staging; the peers'
    parts are read in turn from rank + 1 on."""
    CHUNKS: tl.constexpr = WORLD if MODE == "a2a" else 1
    VEC: tl.constexpr = 16 // (stage.dtype.element_ty.primitive_bitwidth // 8)
    pid, e, mine, lo, hi = _start(counters, heap_bases, rank, per, n)
    buf = stage + (e % 2) * parity_stride
    ar = tl.arange(0, BLOCK)
    if MODE != "bc" or rank == src:
        for c in tl.static_range(CHUNKS):
            for s in range(lo, hi, BLOCK):
                o = s + ar
                mask = o < n
                if MODE == "a2a":
                    at = _a2a_index(o, c, cols, WORLD)
                    x = tl.load(inp + at, mask=mask)
                    if c == rank:  # the own column block goes straight to out
                        tl.store(out + at, x, mask=mask)
                    else:
                        tl.store(buf + c * cs + o, x, mask=mask)
                else:
                    x = tl.load(inp + o, mask=mask)
                    tl.store(buf + o, x, mask=mask)
                    if MODE == "ag":
                        tl.store(out + rank * n + o, x, mask=mask)
                    elif MODE == "bc":
                        tl.store(out + o, x, mask=mask)
    _exchange(flags + pid * WORLD, e, rank, heap_bases, WORLD, PEERS, SPIN)
    if MODE == "ar":
        for s in range(lo, hi, BLOCK):
            o = s + ar
            mask = o < n
            acc = _reduce_ranks(buf, o, mask, heap_bases, mine, WORLD, VEC, OP, IS_FLOAT)
            tl.store(out + o, acc.to(out.dtype.element_ty), mask=mask)
    elif MODE == "bc":
        if rank != src:
            peer = buf + _peer_offset(heap_bases, src, mine, VEC)
            for s in range(lo, hi, BLOCK):
                o = s + ar
                mask = o < n
                tl.store(out + o, tl.load(peer + o, mask=mask), mask=mask)
    else:
        for i in tl.static_range(1, WORLD):
            # each rank starts at the next peer, so no rank serves every reader at once
            q = (rank + i) % WORLD
            peer = buf + _peer_offset(heap_bases, q, mine, VEC)
            for s in range(lo, hi, BLOCK):
                o = s + ar
                mask = o < n
                if MODE == "ag":
                    tl.store(out + q * n + o, tl.load(peer + o, mask=mask), mask=mask)
                else:
                    x = tl.load(peer + rank * cs + o, mask=mask)
                    tl.store(out + _a2a_index(o, q, cols, WORLD), x, mask=mask)


@triton.jit
def pipelined_kernel(inp, out, stage, flags, counters, heap_bases, n, cs, per, seg, parity_stride, cols, rank,
                     WORLD: tl.constexpr, PEERS: tl.constexpr, MODE: tl.constexpr, BLOCK: tl.constexpr,
                     SPIN: tl.constexpr):
    """pull_kernel's all_gather ("ag") and all_to_all ("a2a") with the staging overlapped with the
    peers' reads. Program p's range of a chunk, [p * per, p * per + per), is cut into cdiv(per, seg)
    segments of seg elements (a multiple of BLOCK; the last may be short, a last program's empty).
    The program stages segment 0 and signals it; then for each segment j it waits for every peer's
    signal of j and, in one loop, reads segment j from every peer while it stages segment j + 1 (the
    local copy's loads in flight beside the reads over the links), then signals j + 1. Segment j's
    flags are row j * programs + p (WORLD slots; iris/ccl/waits.py names it "wait j + 1 of the
    call"). Other parameters as pull_kernel's.

    The stage's two copies alternate by epoch parity, and only program p of each peer reads program
    p's range. A rank's program p writes copy e % 2 in call e only after it waited, in call e - 1, for
    every peer's signals of that call; each peer's program p raised them after all its reads of call
    e - 2, the last reads of that copy's range."""
    tl.static_assert(WORLD > 1)
    VEC: tl.constexpr = 16 // (stage.dtype.element_ty.primitive_bitwidth // 8)
    pid, e, mine, lo, hi = _start(counters, heap_bases, rank, per, n)
    programs = tl.num_programs(0)
    segs = tl.cdiv(per, seg)
    buf = stage + (e % 2) * parity_stride
    ar = tl.arange(0, BLOCK)
    for s in range(lo, tl.minimum(lo + seg, hi), BLOCK):
        o = s + ar
        _stage(inp, out, buf, n, cs, cols, rank, o, o < hi, WORLD, MODE)
    _signal(flags + pid * WORLD, e, rank, heap_bases, WORLD, PEERS)
    for j in range(segs):
        row = flags + (j * programs + pid) * WORLD
        _wait_peers(row, e, rank, WORLD, PEERS, SPIN)
        a = lo + j * seg
        # segment j + 1 is empty unless segment j is whole: segment j's blocks cover both
        for s in range(a, tl.minimum(a + seg, hi), BLOCK):
            r = s + ar
            o = r + seg
            _step(inp, out, buf, heap_bases, mine, n, cs, cols, rank, o, o < hi, r, r < hi, WORLD, MODE, VEC)
        if j + 1 < segs:
            _signal(row + programs * WORLD, e, rank, heap_bases, WORLD, PEERS)


@triton.jit
def _stage(inp, out, buf, n, cs, cols, rank, o, mask, WORLD: tl.constexpr, MODE: tl.constexpr):
    """Elements o (where mask holds) of this rank's chunks from inp into the stage buf, its own part
    straight into out, as pull_kernel stages them ("ag": one chunk; "a2a": a column block per rank)."""
    if MODE == "a2a":
        for i in tl.static_range(WORLD):
            c = (rank + i) % WORLD
            at = _a2a_index(o, c, cols, WORLD)
            x = tl.load(inp + at, mask=mask)
            if i == 0:
                tl.store(out + at, x, mask=mask)
            else:
                tl.store(buf + c * cs + o, x, mask=mask)
    else:
        x = tl.load(inp + o, mask=mask)
        tl.store(buf + o, x, mask=mask)
        tl.store(out + rank * n + o, x, mask=mask)


@triton.jit
def _step(inp, out, buf, heap_bases, mine, n, cs, cols, rank, o, staged, r, read, WORLD: tl.constexpr,
          MODE: tl.constexpr, VEC: tl.constexpr):
    """One step of pipelined_kernel: _stage of elements o where staged holds, and elements r of every
    peer's staged chunk for this rank into out where read holds, from rank + 1 on. Each load is issued
    before the stores of the loads before it, so that a step's local and remote loads are in flight
    together (the compiler keeps loads and stores that may alias in program order)."""
    if MODE == "a2a":
        own = _a2a_index(o, rank, cols, WORLD)  # the own column block goes straight to out
        x0 = tl.load(inp + own, mask=staged)
        for i in tl.static_range(1, WORLD):
            c = (rank + i) % WORLD
            at = _a2a_index(o, c, cols, WORLD)
            x = tl.load(inp + at, mask=staged)
            y = tl.load(buf + _peer_offset(heap_bases, c, mine, VEC) + rank * cs + r, mask=read)
            if i == 1:
                tl.store(out + own, x0, mask=staged)
            tl.store(buf + c * cs + o, x, mask=staged)
            tl.store(out + _a2a_index(r, c, cols, WORLD), y, mask=read)
    else:
        x = tl.load(inp + o, mask=staged)
        for i in tl.static_range(1, WORLD):
            q = (rank + i) % WORLD
            y = tl.load(buf + _peer_offset(heap_bases, q, mine, VEC) + r, mask=read)
            if i == 1:
                tl.store(buf + o, x, mask=staged)
                tl.store(out + rank * n + o, x, mask=staged)
            tl.store(out + q * n + r, y, mask=read)


@triton.jit
def _keep(frm, buf, out, at, lo, hi, n, BLOCK: tl.constexpr):
    """Elements [at + lo, at + hi) of frm, below n, into both buf and out (the same offsets)."""
    ar = tl.arange(0, BLOCK)
    for s in range(lo, hi, BLOCK):
        o = at + s + ar
        mask = (s + ar < hi) & (o < n)
        x = tl.load(frm + o, mask=mask)
        tl.store(buf + o, x, mask=mask)
        tl.store(out + o, x, mask=mask)


@triton.jit
def broadcast_kernel(inp, out, stage, flags, counters, heap_bases, n, piece, per, parity_stride, rank, src,
                     WORLD: tl.constexpr, PEERS: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    """broadcast from src as a scatter, then an all_gather, so that src's links carry the tensor about
    once instead of once per peer: src stages inp (n elements) and copies it to out; after one exchange
    every other rank r copies piece r (piece elements at r * piece) from src's stage into its own stage
    and out; after a second exchange it reads each other piece q from rank q's stage (src's holds
    every piece), in turn from rank + 1. per: elements of a piece per program (a multiple of BLOCK).
    The stage alternates between two copies (parity_stride apart) by epoch parity: src rewrites a copy
    two calls later, after every peer has entered the call between, so finished reading it."""
    VEC: tl.constexpr = 16 // (stage.dtype.element_ty.primitive_bitwidth // 8)
    pid, e, mine, lo, hi = _start(counters, heap_bases, rank, per, piece)
    buf = stage + (e % 2) * parity_stride
    ar = tl.arange(0, BLOCK)
    if rank == src:
        for q in range(WORLD):
            _keep(inp, buf, out, q * piece, lo, hi, n, BLOCK)
    _exchange(flags + pid * WORLD, e, rank, heap_bases, WORLD, PEERS, SPIN)
    if rank != src:
        _keep(buf + _peer_offset(heap_bases, src, mine, VEC), buf, out, rank * piece, lo, hi, n, BLOCK)
    _exchange(flags + (tl.num_programs(0) + pid) * WORLD, e, rank, heap_bases, WORLD, PEERS, SPIN)
    if rank != src:
        for i in tl.static_range(1, WORLD):
            q = (rank + i) % WORLD
            frm = buf + _peer_offset(heap_bases, q, mine, VEC)
            for s in range(lo, hi, BLOCK):
                o = q * piece + s + ar
                mask = (s + ar < hi) & (o < n)
                tl.store(out + o, tl.load(frm + o, mask=mask), mask=mask)
