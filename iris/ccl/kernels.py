"""Triton kernels of the collectives: one pull kernel (stage, one flag exchange, read the peers) for
all_reduce one-shot, all_gather, reduce_scatter, all_to_all and broadcast; a two-shot all_reduce;
a push all_reduce (one- or two-shot by remote stores only). Subset groups: group_kernel.py.

Synchronisation never leaves the device. Each program p of a launch owns a row of flags on every
rank and an epoch counter in this rank's memory; it increments its counter (so CUDA graph replays
advance it too), writes the new epoch into row p, slot `rank`, of every peer's flags with release at
sys scope, and spins with acquire until its own row holds that epoch from every peer. Flags only
grow, so nothing is ever reset. Program p of one rank waits only for program p of the others (every
rank splits the work the same way), never for a program of its own launch, so the interpreter, which
runs programs one after another, works too.
"""
import triton
import triton.language as tl

from ..device.translate import _translate


@triton.jit
def _exchange(row, epoch, rank, heap_bases, WORLD: tl.constexpr, PEERS: tl.constexpr, SPIN: tl.constexpr):
    """Writes epoch into slot `rank` of `row` on every peer (release, sys), then waits until every peer's
    slot of this rank's `row` holds at least epoch (acquire, sys). row: WORLD int64 flags on the heap;
    PEERS: a power of two >= WORLD. The barriers order the whole program's accesses around the flags.
    SPIN: as _await's; giving up marks slot `rank` of this rank's own row (no peer writes there)."""
    tl.debug_barrier()
    peers = tl.arange(0, PEERS)
    live = (peers < WORLD) & (peers != rank)
    slots = _translate(row + rank, rank, tl.where(live, peers, rank), heap_bases)
    tl.atomic_xchg(slots, tl.zeros([PEERS], tl.int64) + epoch, mask=live, sem="release", scope="sys")
    _await(row + peers, live, epoch, row + rank, SPIN)
    tl.debug_barrier()


@triton.jit
def _await(slots, live, target, mark, SPIN: tl.constexpr, EXACT: tl.constexpr = False):
    """Polls the live slots (int64 pointers, acquire, sys) until each reaches target (a scalar or one per
    slot; EXACT: until each holds it, for 0/1 hand-over flags). SPIN: 0 waits for ever; else the most
    polls before giving up, which writes -1 into *mark so the host can tell (Config.spin_limit)."""
    pending = 1
    polls = 0
    while pending > 0:  # a scalar loop-carried value (Triton 3.6 mis-compiles a block one here)
        seen = tl.atomic_add(slots, 0, mask=live, sem="acquire", scope="sys")
        if EXACT:
            pending = tl.sum((live & (seen != target)).to(tl.int32), axis=0)
        else:
            pending = tl.sum((live & (seen < target)).to(tl.int32), axis=0)
        if SPIN != 0:
            polls += 1
            if polls >= SPIN:
                if pending > 0:
                    tl.store(mark, -1)
                pending = 0


@triton.jit
def _peer_offset(heap_bases, q, mine, VEC: tl.constexpr):
    """Elements from a pointer in this rank's heap (base mine) to the same offset in rank q's heap
    (heap_bases: int64 bases; VEC: elements per 16 bytes, so the offset keeps 16-byte alignment)."""
    return tl.multiple_of((tl.load(heap_bases + q) - mine) // (16 // VEC), VEC)


@triton.jit
def _epoch(counters, pid):
    """This program's next epoch: counters[pid] + 1, stored back. Kept on the device so that CUDA graph
    replays advance it too."""
    e = tl.load(counters + pid) + 1
    tl.store(counters + pid, e)
    return e


@triton.jit
def _a2a_index(o, c, cols, WORLD: tl.constexpr):
    """Where element o of column chunk c sits in a row-major (M, cols * WORLD) tensor."""
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
def pull_kernel(inp, out, stage, flags, counters, heap_bases, n, cs, per, parity_stride, cols, rank, src,
                WORLD: tl.constexpr, PEERS: tl.constexpr, MODE: tl.constexpr, OP: tl.constexpr,
                IS_FLOAT: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    """Stage this rank's input in the heap, exchange one flag per peer, then build out from the peers'
    staged copies. MODE: "ar" all_reduce, "ag" all_gather, "bc" broadcast from src, "rs"
    reduce_scatter, "a2a" all_to_all. n: elements per chunk; stage holds two copies (by epoch parity,
    parity_stride apart) of CHUNKS chunks cs apart (1 chunk, or WORLD for rs and a2a); per: elements
    of each chunk per program (a multiple of BLOCK); cols: columns per rank for a2a.
    Double buffering by parity makes one exchange enough: a rank rewrites a stage copy only after
    every peer has entered the next call, so after it finished reading that copy."""
    CHUNKS: tl.constexpr = WORLD if (MODE == "rs" or MODE == "a2a") else 1
    VEC: tl.constexpr = 16 // (stage.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    e = _epoch(counters, pid)
    buf = stage + (e % 2) * parity_stride
    mine = tl.load(heap_bases + rank)
    lo = pid * per
    hi = tl.minimum(lo + per, n)
    ar = tl.arange(0, BLOCK)
    if MODE != "bc" or rank == src:
        for c in tl.static_range(CHUNKS):
            for s in range(lo, hi, BLOCK):
                o = s + ar
                mask = o < n
                if MODE == "a2a":
                    x = tl.load(inp + _a2a_index(o, c, cols, WORLD), mask=mask)
                else:
                    x = tl.load(inp + c * n + o, mask=mask)
                tl.store(buf + c * cs + o, x, mask=mask)
    _exchange(flags + pid * WORLD, e, rank, heap_bases, WORLD, PEERS, SPIN)
    if MODE == "ar" or MODE == "rs":
        at = buf if MODE == "ar" else buf + rank * cs
        for s in range(lo, hi, BLOCK):
            o = s + ar
            mask = o < n
            acc = _reduce_ranks(at, o, mask, heap_bases, mine, WORLD, VEC, OP, IS_FLOAT)
            tl.store(out + o, acc.to(out.dtype.element_ty), mask=mask)
    else:
        for q in tl.static_range(WORLD):
            if MODE != "bc" or q == src:
                peer = buf + _peer_offset(heap_bases, q, mine, VEC)
                for s in range(lo, hi, BLOCK):
                    o = s + ar
                    mask = o < n
                    if MODE == "ag":
                        tl.store(out + q * n + o, tl.load(peer + o, mask=mask), mask=mask)
                    elif MODE == "a2a":
                        x = tl.load(peer + rank * cs + o, mask=mask)
                        tl.store(out + _a2a_index(o, q, cols, WORLD), x, mask=mask)
                    else:
                        tl.store(out + o, tl.load(peer + o, mask=mask), mask=mask)


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
    pid = tl.program_id(0)
    e = _epoch(counters, pid)
    mine = tl.load(heap_bases + rank)
    lo = pid * per
    hi = tl.minimum(lo + per, chunk)
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


@triton.jit
def push_kernel(inp, out, stage, gather, flags, counters, heap_bases, n, chunk, per, parity_stride, rank,
                WORLD: tl.constexpr, PEERS: tl.constexpr, OP: tl.constexpr, IS_FLOAT: tl.constexpr,
                IN_HEAP: tl.constexpr, OUT_HEAP: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr,
                TWO_SHOT: tl.constexpr):
    """all_reduce with remote stores only (on NVLink, posted writes reach more bandwidth than loads that
    wait for their data). Every rank writes into slot `rank` of peer q's stage what q reduces: chunk q of
    its input (TWO_SHOT) or all of it (one shot); one exchange; then each rank reduces its part locally,
    its own input and the WORLD-1 slots in rank order (identical bits everywhere). Two-shot then stores
    the reduced chunk into every peer's out (OUT_HEAP: out is the same heap tensor on every rank) or
    gather buffer, exchanges again and copies gather into out. inp is read once, on the heap or not
    (IN_HEAP is unused: plans pass both residences).
    n elements; chunk: elements per slot, a multiple of 16 (n/WORLD rounded up for two-shot, n rounded
    up for one-shot); per: elements of a slot per program, a multiple of BLOCK. One-shot alternates
    between two stages (parity_stride apart) by epoch parity, so one exchange is enough: a rank writes
    a stage again only after every peer entered the next call, so finished reading it. Two-shot's second
    exchange does that for its single stage and gather buffer."""
    VEC: tl.constexpr = 16 // (stage.dtype.element_ty.primitive_bitwidth // 8)
    pid = tl.program_id(0)
    e = _epoch(counters, pid)
    buf = stage + (e % 2) * parity_stride
    mine = tl.load(heap_bases + rank)
    lo = pid * per
    hi = tl.minimum(lo + per, chunk)
    ar = tl.arange(0, BLOCK)
    for s in range(lo, hi, BLOCK):
        i = s + ar
        for q in tl.static_range(WORLD):
            if q != rank:
                if TWO_SHOT:
                    g = q * chunk + i
                else:
                    g = i
                mask = (i < hi) & (g < n)
                x = tl.load(inp + g, mask=mask)
                peer = buf + _peer_offset(heap_bases, q, mine, VEC)
                tl.store(peer + rank * chunk + i, x, mask=mask)
    _exchange(flags + pid * WORLD, e, rank, heap_bases, WORLD, PEERS, SPIN)
    for s in range(lo, hi, BLOCK):
        i = s + ar
        if TWO_SHOT:
            g = rank * chunk + i
        else:
            g = i
        mask = (i < hi) & (g < n)
        for q in tl.static_range(WORLD):
            if q == rank:
                v = tl.load(inp + g, mask=mask)
            else:
                v = tl.load(buf + q * chunk + i, mask=mask)
            y = v.to(tl.float32) if IS_FLOAT else v
            if q == 0:
                acc = y
            else:
                acc = _combine(acc, y, OP)
        r = acc.to(out.dtype.element_ty)
        tl.store(out + g, r, mask=mask)
        if TWO_SHOT:
            for q in tl.static_range(WORLD):
                if q != rank:
                    delta = _peer_offset(heap_bases, q, mine, VEC)
                    if OUT_HEAP:
                        tl.store(out + delta + g, r, mask=mask)
                    else:
                        tl.store(gather + delta + g, r, mask=mask)
    if TWO_SHOT:
        _exchange(flags + (tl.num_programs(0) + pid) * WORLD, e, rank, heap_bases, WORLD, PEERS, SPIN)
        if not OUT_HEAP:
            for c in tl.static_range(WORLD):
                if c != rank:
                    for s in range(lo, hi, BLOCK):
                        i = s + ar
                        g = c * chunk + i
                        mask = (i < hi) & (g < n)
                        tl.store(out + g, tl.load(gather + g, mask=mask), mask=mask)
