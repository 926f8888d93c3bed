"""Collectives by remote stores only: the push all_reduce (one or two shots); reduce_scatter (the first
shot alone), the large all_gather and all_to_all and the largest two-shot all_reduce, each rank's
local pass pipelined with its stores into the peers; and the push all_gather's persistent and
partitioned variants (each program stores its range into every rank, or the programs are split by
destination rank)."""
import triton
import triton.language as tl

from .common import (_a2a_index, _combine, _epoch, _exchange, _peer_offset, _signal, _signal_to, _signal_wait,
                     _start, _wait_peers)


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
    pid, e, mine, lo, hi = _start(counters, heap_bases, rank, per, chunk)
    buf = stage + (e % 2) * parity_stride
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
        r = _reduce_slots(inp + g, buf + i, chunk, mask, rank, WORLD, OP, IS_FLOAT).to(out.dtype.element_ty)
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


@triton.jit
def _reduce_slots(own, slots, stride, mask, rank, WORLD: tl.constexpr, OP: tl.constexpr, IS_FLOAT: tl.constexpr):
    """own (this rank's values) and slot q of slots (stride apart, q != rank) combined by OP in rank order,
    floats in fp32, so every rank that reduces the same values gets the same bits."""
    for q in tl.static_range(WORLD):
        if q == rank:
            v = tl.load(own, mask=mask)
        else:
            v = tl.load(slots + q * stride, mask=mask)
        y = v.to(tl.float32) if IS_FLOAT else v
        if q == 0:
            acc = y
        else:
            acc = _combine(acc, y, OP)
    return acc


@triton.jit
def scatter_push_kernel(inp, out, stage, flags, counters, heap_bases, n, total, cs, per, seg, parity_stride, cols,
                        rank, root, WORLD: tl.constexpr, PEERS: tl.constexpr, MODE: tl.constexpr, OP: tl.constexpr,
                        IS_FLOAT: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr, IN_HEAP: tl.constexpr,
                        OUT_HEAP: tl.constexpr):
    """reduce_scatter ("rs"), all_gather ("ag"), all_to_all ("a2a"), all_reduce ("ar") and reduce ("rd")
    by remote stores: rank r stores what peer q gets of its input (chunk q of n elements at q * n, all of
    inp, or column block q) into slot r of q's stage (slots cs apart), and builds out from its own part
    and the WORLD-1 slots of its stage: reduced in rank order (_reduce_slots) or copied into place.
    Program p's range of a chunk, [p * per, p * per + per), is cut into cdiv(per, seg) segments (seg a
    multiple of BLOCK; seg = per: one exchange): the program stores segment 0 and signals it, then for
    each segment j waits for every peer's signal of j and, in one loop, builds segment j of out while it
    stores segment j + 1 into the peers, then signals j + 1, so the local pass runs beside the stores
    over the links (on NVLink, posted writes reach more bandwidth than loads that wait for their data).
    Segment j's flags are row j * programs + p. Peers are taken in turn from rank + 1, so no rank
    receives from every other at once. cols: columns per rank ("a2a"). The stage alternates between two
    copies (parity_stride apart) by epoch parity: program p writes a peer's copy e % 2 in call e only
    after it waited, in call e - 1, for all that peer's program p's signals, raised after its reads of
    call e - 2 ended.
    "ar" is "rs" over chunks of n elements (the last one short: elements from total on are masked) that
    also stores each reduced segment into every rank: into its out where out is the same heap tensor
    everywhere (OUT_HEAP), else into the gather half of its stage (the copy's second WORLD * cs), then
    signals it (rows from segs * programs on); a rank copies the peers' reduced segment j - 1 from its
    gather half into out once it has stored segment j, and the last one at the end.
    "rd" (three or more ranks) is "ar" with the chunks owned by the ranks but the root (chunk k by the
    k-th of them, root: a rank) and each reduced segment stored into the root alone, so that every
    rank's links carry about the tensor once each way. Other modes pass root = WORLD, so that rank q
    owns chunk q."""
    VEC: tl.constexpr = 16 // (stage.dtype.element_ty.primitive_bitwidth // 8)
    pid, e, mine, lo, hi = _start(counters, heap_bases, rank, per, n)
    programs = tl.num_programs(0)
    segs = tl.cdiv(per, seg)
    buf = stage + (e % 2) * parity_stride
    ar = tl.arange(0, BLOCK)
    owns, part = _owner(rank, root, ar)
    takes = (rank == root) | (root == WORLD)  # receives reduced segments ("ar": every rank, "rd": the root)
    for s in range(lo, tl.minimum(lo + seg, hi), BLOCK):
        o = s + ar
        _scatter(inp, out, buf, heap_bases, mine, n, total, cs, cols, rank, root, o, o < hi, WORLD, MODE, VEC)
    _signal(flags + pid * WORLD, e, rank, heap_bases, WORLD, PEERS)
    gathered = flags + segs * programs * WORLD  # row j * programs + p: segment j reduced and in place
    for j in range(segs):
        row = flags + (j * programs + pid) * WORLD
        _wait_peers(row, e, rank, WORLD, PEERS, SPIN)
        a = lo + j * seg
        # segment j + 1 is empty unless segment j is whole: segment j's blocks cover both
        for s in range(a, tl.minimum(a + seg, hi), BLOCK):
            i = s + ar
            mask = i < hi
            o = i + seg
            if MODE == "rs" or MODE == "ar" or MODE == "rd":
                mask = mask & owns & (part * n + i < total)
                acc = _reduce_slots(inp + part * n + i, buf + i, cs, mask, rank, WORLD, OP, IS_FLOAT)
            else:
                _unstage(out, buf, n, cs, cols, rank, i, mask, WORLD, MODE)
            _scatter(inp, out, buf, heap_bases, mine, n, total, cs, cols, rank, root, o, o < hi, WORLD, MODE, VEC)
            if MODE == "rs":
                tl.store(out + i, acc.to(out.dtype.element_ty), mask=mask)
            elif MODE == "ar" or MODE == "rd":
                _gather_to_peers(out, buf, heap_bases, mine, n, cs, rank, root, part, i, acc.to(out.dtype.element_ty),
                                 mask, WORLD, MODE, OUT_HEAP, VEC)
        if j + 1 < segs:
            _signal(row + programs * WORLD, e, rank, heap_bases, WORLD, PEERS)
        if MODE == "ar":
            _signal(gathered + (j * programs + pid) * WORLD, e, rank, heap_bases, WORLD, PEERS)
        elif MODE == "rd":  # to the root alone: a signal that no rank waits for could land after the call
            if rank != root:  # ended, in memory reused by then
                _signal_to(gathered + (j * programs + pid) * WORLD, e, rank, heap_bases, tl.arange(0, PEERS) == root,
                           PEERS)
        if (MODE == "ar" or MODE == "rd") and not OUT_HEAP:
            if takes & (j > 0):  # the peers' segment before, which landed while this one was stored
                _copy_gathered(out, buf, gathered, e, n, total, cs, rank, root, lo + (j - 1) * seg, hi, seg,
                               (j - 1) * programs + pid, WORLD, PEERS, BLOCK, SPIN)
    if MODE == "ar" or MODE == "rd":  # the peers' last segment (their signal of it follows their stores)
        if takes:
            if OUT_HEAP:
                _wait_peers(gathered + ((segs - 1) * programs + pid) * WORLD, e, rank, WORLD, PEERS, SPIN)
            else:
                _copy_gathered(out, buf, gathered, e, n, total, cs, rank, root, lo + (segs - 1) * seg, hi, seg,
                               (segs - 1) * programs + pid, WORLD, PEERS, BLOCK, SPIN)


@triton.jit
def _owner(q, root, o):
    """(whether rank q reduces a chunk, as a block of o's shape: the interpreter masks with blocks only;
    which chunk): every rank but root, in rank order (root = WORLD: every rank its own). q and root may
    both be compile-time ints (a launch specialises an int argument equal to 1)."""
    return o * 0 + q != root, q - (q > root) * 1


@triton.jit
def _gather_to_peers(out, buf, heap_bases, mine, n, cs, rank, root, part, i, r, mask, WORLD: tl.constexpr,
                     MODE: tl.constexpr, OUT_HEAP: tl.constexpr, VEC: tl.constexpr):
    """This rank's reduced elements i (r) of chunk `part` into the ranks that take them: "ar": this
    rank's out and, from rank + 1 on, every peer's; "rd": the root's. A peer's out where OUT_HEAP, else
    slot rank of the gather half of that peer's stage buf."""
    if MODE == "ar":
        tl.store(out + part * n + i, r, mask=mask)
    for j in tl.static_range(1, WORLD):
        q = (rank + j) % WORLD
        m = mask
        if MODE == "rd":
            m = m & (i * 0 + q == root)  # a block: the interpreter masks with blocks only
        delta = _peer_offset(heap_bases, q, mine, VEC)
        if OUT_HEAP:
            tl.store(out + delta + part * n + i, r, mask=m)
        else:
            tl.store(buf + delta + (WORLD + rank) * cs + i, r, mask=m)


@triton.jit
def _copy_gathered(out, buf, gathered, e, n, total, cs, rank, root, a, hi, seg, row, WORLD: tl.constexpr,
                   PEERS: tl.constexpr, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    """Once every peer signalled flag row `row` of gathered (its reduced elements [a, a + seg) of its
    chunk landed), those elements from the gather half of buf into their chunks of out."""
    _wait_peers(gathered + row * WORLD, e, rank, WORLD, PEERS, SPIN)
    ar = tl.arange(0, BLOCK)
    for s in range(a, tl.minimum(a + seg, hi), BLOCK):
        i = s + ar
        for k in tl.static_range(1, WORLD):
            q = (rank + k) % WORLD
            _, c = _owner(q, root, i)
            mask = (i < hi) & (c * n + i < total)
            tl.store(out + c * n + i, tl.load(buf + (WORLD + q) * cs + i, mask=mask), mask=mask)


@triton.jit
def _scatter(inp, out, buf, heap_bases, mine, n, total, cs, cols, rank, root, o, mask, WORLD: tl.constexpr,
             MODE: tl.constexpr, VEC: tl.constexpr):
    """Elements o (where mask holds) of what each peer gets of inp into this rank's slot of that peer's
    stage buf, from rank + 1 on; this rank's own part straight into out ("ag", "a2a")."""
    if MODE == "ag":
        x = tl.load(inp + o, mask=mask)
        tl.store(out + rank * n + o, x, mask=mask)
    elif MODE == "a2a":
        own = _a2a_index(o, rank, cols, WORLD)
        tl.store(out + own, tl.load(inp + own, mask=mask), mask=mask)
    for j in tl.static_range(1, WORLD):
        q = (rank + j) % WORLD
        m = mask
        if MODE == "rs":
            x = tl.load(inp + q * n + o, mask=m)
        elif MODE == "ar" or MODE == "rd":
            owns, c = _owner(q, root, o)
            m = m & owns & (c * n + o < total)
            x = tl.load(inp + c * n + o, mask=m)
        elif MODE == "a2a":
            x = tl.load(inp + _a2a_index(o, q, cols, WORLD), mask=m)
        tl.store(buf + _peer_offset(heap_bases, q, mine, VEC) + rank * cs + o, x, mask=m)


@triton.jit
def _unstage(out, buf, n, cs, cols, rank, i, mask, WORLD: tl.constexpr, MODE: tl.constexpr):
    """Elements i (where mask holds) of every peer's slot of this rank's stage buf into their place in
    out: rows q * n on ("ag"), column block q ("a2a")."""
    for j in tl.static_range(1, WORLD):
        q = (rank + j) % WORLD
        y = tl.load(buf + q * cs + i, mask=mask)
        if MODE == "ag":
            tl.store(out + q * n + i, y, mask=mask)
        else:
            tl.store(out + _a2a_index(i, q, cols, WORLD), y, mask=mask)


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
