"""The two-shot all_reduce: each rank reduces its share pulled from every peer, then stores it into every
peer."""
import triton
import triton.language as tl

from .common import _exchange, _peer_offset, _reduce_ranks, _start


@triton.jit
def _share(c, s, chunk, WORLD: tl.constexpr, BLOCK: tl.constexpr, STRIDED: tl.constexpr):
    """Where element s of rank c's share starts in the whole tensor: blocks dealt round robin (STRIDED,
    s a multiple of BLOCK) or one range of chunk elements per rank."""
    if STRIDED:
        return ((s // BLOCK) * WORLD + c) * BLOCK
    return c * chunk + s


@triton.jit
def two_shot_kernel(inp, out, stage, gather, flags, counters, heap_bases, n, chunk, per, rank,
                    WORLD: tl.constexpr, PEERS: tl.constexpr, OP: tl.constexpr, IS_FLOAT: tl.constexpr,
                    IN_HEAP: tl.constexpr, OUT_HEAP: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr,
                    STRIDED: tl.constexpr):
    """all_reduce in two shots: rank r reduces chunk r by pulling it from every peer, then pushes the
    result into every peer. n elements in WORLD chunks of `chunk` (a multiple of 16); per: elements of
    each chunk per program (a multiple of BLOCK). IN_HEAP: peers read inp itself (the same heap tensor
    on every rank), else a staged copy; OUT_HEAP: the result goes straight into the peers' out, else
    into their `gather` buffer, copied to out after the second exchange. Two exchanges per call (ready,
    done) make single buffers safe: a rank writes into a peer only after that peer entered this call,
    and leaves only after every peer finished reading it. STRIDED (Config.all_reduce_distribution=0):
    rank r's share is blocks r, r + WORLD, r + 2*WORLD... of BLOCK elements (chunk then a multiple of
    BLOCK), else elements [r*chunk, (r+1)*chunk)."""
    VEC: tl.constexpr = 16 // (stage.dtype.element_ty.primitive_bitwidth // 8)
    pid, e, mine, lo, hi = _start(counters, heap_bases, rank, per, chunk)
    ar = tl.arange(0, BLOCK)
    if IN_HEAP:
        src = inp
    else:
        src = stage
        for c in tl.static_range(WORLD):
            for s in range(lo, hi, BLOCK):
                o = _share(c, s, chunk, WORLD, BLOCK, STRIDED) + ar
                mask = (s + ar < hi) & (o < n)
                tl.store(stage + o, tl.load(inp + o, mask=mask), mask=mask)
    if OUT_HEAP:
        dst = out
    else:
        dst = gather
    _exchange(flags + pid * WORLD, e, rank, heap_bases, WORLD, PEERS, SPIN)
    for s in range(lo, hi, BLOCK):
        o = _share(rank, s, chunk, WORLD, BLOCK, STRIDED) + ar
        mask = (s + ar < hi) & (o < n)  # a last block past hi is the next rank's chunk: not ours to write
        r = _reduce_ranks(src, o, mask, heap_bases, mine, WORLD, VEC, OP, IS_FLOAT).to(out.dtype.element_ty)
        tl.store(out + o, r, mask=mask)
        for q in tl.static_range(WORLD):
            if q != rank:
                tl.store(dst + _peer_offset(heap_bases, q, mine, VEC) + o, r, mask=mask)
    _exchange(flags + (tl.num_programs(0) + pid) * WORLD, e, rank, heap_bases, WORLD, PEERS, SPIN)
    if not OUT_HEAP:
        for c in tl.static_range(WORLD):
            if c != rank:
                for s in range(lo, hi, BLOCK):
                    o = _share(c, s, chunk, WORLD, BLOCK, STRIDED) + ar
                    mask = (s + ar < hi) & (o < n)
                    tl.store(out + o, tl.load(gather + o, mask=mask), mask=mask)
