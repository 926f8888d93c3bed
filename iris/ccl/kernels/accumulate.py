"""The all_reduce variants that accumulate into one buffer on every rank: atomic (remote atomic adds) and
spinlock (a lock per block around a remote read-modify-write)."""
import triton
import triton.language as tl

from ...device.faults import CCL_LOCK, _gave_up
from ...device.near import _relax
from .common import _peer_offset, _signal_wait, _start


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
    ranks 0..r-1 signalled that they have (the interpreter). A lock not taken within SPIN polls is noted in the
    heap's fault record and its block's add skipped (the host raises WaitTimeout)."""
    VEC: tl.constexpr = 16 // (acc.dtype.element_ty.primitive_bitwidth // 8)
    pid, e, mine, lo, hi = _start(counters, heap_bases, rank, per, n)
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
                held = tl.atomic_cas(lock, free, free + 1, sem="acquire", scope="sys")
                go = held != 0
                polls = 1
                while go:  # a scalar loop-carried condition
                    _relax()
                    held = tl.atomic_cas(lock, free, free + 1, sem="acquire", scope="sys")
                    go = held != 0
                    polls += 1
                    if SPIN != 0:
                        stop = go & (polls >= SPIN)
                        if stop:  # noted in the fault record; this block's add is skipped
                            _gave_up(heap_bases, CCL_LOCK, locks + s // BLOCK, rank, q, -1, 0, held, "eq")
                        go = go & (stop == 0)
                if held == 0:
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
