"""The pull kernels: all_reduce one-shot, all_gather, all_to_all and broadcast by staging this rank's
input, one flag exchange, and reading the peers' staged copies; and the large broadcast over more than
two ranks, a scatter then an all_gather (two exchanges)."""
import triton
import triton.language as tl

from .common import _a2a_index, _exchange, _peer_offset, _reduce_ranks, _start


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
