"""Device functions for peers that loads and stores cannot reach (heap_bases entry 0): through NVSHMEM.

rma, atomics and sync hand their calls here only where near.INDIRECT_PEERS is set (a constexpr Triton
folds: without it none of this is in the kernel and no NVSHMEM code is linked; use_indirect_peers and
INDIRECT_PEERS are importable from here too). Each function takes the same arguments, reaches a peer
whose heap_bases entry is 0 through NVSHMEM and any other peer with near.py's loads, atomics and
polls, as rma, atomics and sync do (structured if/else: Triton 3.6 cannot lower an early return from
a run-time branch inside a loop).

A contiguous tile (the masked elements of source and destination are each one range, element for
element) moves with one block-scoped NVSHMEM call made by every thread of the program; any other
tile moves element by element. Where rma's hint equals a 1-D block's length the caller has declared
source and destination each one run: only the mask is tested (nothing without one), and the thread
holding element 0 hands the first addresses to the call through shared memory. Atomics are issued
one element at a time from thread 0 (a tile loops over its elements): NVSHMEM has no float add, min
or max, which loop on compare-and-swap.
A rank outside [0, world) is never far (far() does not read its entry): the near path refuses it as rma
does. Polls of an indirect flag give up after the heap's spin limit, as near._spin's do.
Ordering: sem release/acq_rel (the default) completes the program's earlier NVSHMEM operations
before the atomic (every thread calls nvshmem_quiet, and thread 0 issues the atomic only after a
barrier of the program's threads); NVSHMEM's fetching atomics complete before they return.
"""
import triton
import triton.language as tl

from . import faults as _f
from . import nvshmem as nv
from .near import ADD, CAS, MAX, MIN, XCHG, _atomic_to, _load, _put, _relax, _spin, _unmet
from .near import INDIRECT_PEERS, use_indirect_peers  # noqa: F401 (the context's names for the switch)
from .translate import RANK_CHECK, _reach, _translate


@triton.jit
def far(heap_bases, rank):
    """Whether rank is reached through NVSHMEM (its heap_bases entry is 0). Where RANK_CHECK is on, a rank
    outside [0, world) is not (its entry is not read): the near path then refuses it (translate._reach)."""
    if RANK_CHECK:
        inside = tl.cast(rank, tl.int64).to(tl.uint64, bitcast=True) < \
            tl.load(heap_bases + _f.WORLD_AT).to(tl.uint64, bitcast=True)
        out = tl.load(heap_bases + rank, mask=inside, other=1) == 0
    else:
        out = tl.load(heap_bases + rank) == 0
    return out


@triton.jit
def _bits(x):
    """x's bits as a signed integer of its width (what NVSHMEM's typed calls take)."""
    BITS: tl.constexpr = x.dtype.primitive_bitwidth
    tl.static_assert(BITS == 8 or BITS == 16 or BITS == 32 or BITS == 64,
                     "indirect peers take 8, 16, 32 or 64-bit elements")
    if BITS == 8:
        out = x.to(tl.int8, bitcast=True)
    elif BITS == 16:
        out = x.to(tl.int16, bitcast=True)
    elif BITS == 32:
        out = x.to(tl.int32, bitcast=True)
    else:
        out = x.to(tl.int64, bitcast=True)
    return out


@triton.jit
def _mask(ptr, mask):
    if mask is None:
        out = tl.full(ptr.shape, 1, tl.int1)
    else:
        out = tl.full(ptr.shape, 1, tl.int1) & mask
    return out


@triton.constexpr_function
def _covers(hint, shape):
    """Whether an rma hint declares the whole block one contiguous run: a 1-D block and hint its length."""
    hint = getattr(hint, "value", hint)
    shape = [getattr(d, "value", d) for d in shape]
    return isinstance(hint, int) and not isinstance(hint, bool) and len(shape) == 1 and hint == shape[0]


@triton.jit
def _sum_min_max_min_max(n1, lo1, hi1, dlo1, dhi1, n2, lo2, hi2, dlo2, dhi2):
    return n1 + n2, tl.minimum(lo1, lo2), tl.maximum(hi1, hi2), tl.minimum(dlo1, dlo2), tl.maximum(dhi1, dhi2)


@triton.jit
def _sum_min_max(n1, lo1, hi1, n2, lo2, hi2):
    return n1 + n2, tl.minimum(lo1, lo2), tl.maximum(hi1, hi2)


@triton.jit
def _span(a, b, mask):
    """Whether the masked elements of pointer blocks a and b are each one contiguous range, element
    for element; then a's and b's first addresses and the byte count. One fused reduction: a
    program's reductions each cost a shared-memory round trip and a barrier."""
    ES: tl.constexpr = (a.dtype.element_ty.primitive_bitwidth + 7) // 8
    BIG: tl.constexpr = 1 << 62
    m = _mask(a, mask)
    ai = a.to(tl.int64)
    d = b.to(tl.int64) - ai
    n, a0, a1, d0, d1 = tl.reduce((m.to(tl.int32), tl.where(m, ai, BIG), tl.where(m, ai, -BIG),
                                   tl.where(m, d, BIG), tl.where(m, d, -BIG)), None, _sum_min_max_min_max)
    return (n > 0) & (d0 == d1) & (a1 - a0 == (n - 1).to(tl.int64) * ES), a0, a0 + d0, n.to(tl.int64) * ES


@triton.jit
def _run_span(mask, N: tl.constexpr):
    """A tile the caller declared one run (rma's hint equal to its length): whether its masked
    elements are one range, the first one's index and their count; no reduction without a mask."""
    if mask is None:
        out = tl.full([], 1, tl.int1), tl.full([], 0, tl.int32), tl.full([], N, tl.int32)
    else:
        i = tl.arange(0, N)
        m = _mask(i, mask)
        n, i0, i1 = tl.reduce((m.to(tl.int32), tl.where(m, i, N), tl.where(m, i, -1)), None, _sum_min_max)
        out = (n > 0) & (i1 - i0 + 1 == n), i0, n
    return out


@triton.jit
def _move_far(src, dst, pe, mask, other, hint: tl.constexpr, PUT: tl.constexpr):
    """A tile from the caller's src into dst on PE pe (PUT), or from src on pe into the caller's dst:
    one block-scoped NVSHMEM call made by every thread where the masked elements are one contiguous
    range, element by element otherwise. A tile declared one run (hint) records its first addresses
    from the thread that holds element 0 instead of reducing every element's address."""
    m = _mask(dst, mask)
    pe32 = tl.cast(pe, tl.int32)
    ES: tl.constexpr = (dst.dtype.element_ty.primitive_bitwidth + 7) // 8
    whole = tl.full([], 0, tl.int1)
    if len(dst.shape) > 0:
        if _covers(hint, dst.shape):
            N: tl.constexpr = dst.numel
            whole, i0, n = _run_span(mask, N)
            nv.run_first(src.to(tl.int64), dst.to(tl.int64), tl.arange(0, N))
            if whole:
                if PUT:
                    nv.putmem_run(i0.to(tl.int64) * ES, n.to(tl.int64) * ES, pe32)
                else:
                    nv.getmem_run(i0.to(tl.int64) * ES, n.to(tl.int64) * ES, pe32)
        else:
            whole, s0, d0, nbytes = _span(src, dst, mask)
            if whole:
                if PUT:
                    nv.putmem_block(d0, s0, nbytes, pe32)
                else:
                    nv.getmem_block(d0, s0, nbytes, pe32)
    if whole == 0:
        if PUT:
            _store_far(dst, tl.load(src, mask=m, other=other), pe, m)
        else:
            tl.store(dst, _load_far(src, pe, m, other), mask=m)


@triton.jit
def _load_far(ptr, pe, mask, other):
    """The values at ptr (the caller's view) on PE pe, element by element; other where masked."""
    m = _mask(ptr, mask)
    if other is None:
        o = tl.zeros(ptr.shape, ptr.dtype.element_ty)
    else:
        o = (tl.zeros(ptr.shape, ptr.dtype.element_ty) + other).to(ptr.dtype.element_ty)
    got = nv.g(ptr.to(tl.int64), tl.cast(pe, tl.int32), m, _bits(o))
    return got.to(ptr.dtype.element_ty, bitcast=True)


@triton.jit
def _store_far(ptr, value, pe, mask):
    """Writes value at ptr (the caller's view) on PE pe, element by element."""
    m = _mask(ptr, mask)
    v = (tl.zeros(ptr.shape, ptr.dtype.element_ty) + value).to(ptr.dtype.element_ty)
    nv.p(ptr.to(tl.int64), _bits(v), tl.cast(pe, tl.int32), m)


@triton.jit
def load(ptr, to_rank, from_rank, heap_bases, mask, other, cache_modifier: tl.constexpr, volatile: tl.constexpr,
         hint: tl.constexpr, eviction_policy: tl.constexpr):
    """rma.load, with from_rank reached through NVSHMEM where it is indirect."""
    if far(heap_bases, from_rank):
        out = _load_far(ptr, from_rank, mask, other)
    else:
        if RANK_CHECK:
            p, m = _reach(ptr, to_rank, from_rank, heap_bases, mask, _f.LOAD, hint)
            out = _load(p, m, other, cache_modifier, volatile, eviction_policy)
        else:
            out = _load(_translate(ptr, to_rank, from_rank, heap_bases, hint), mask, other, cache_modifier, volatile,
                        eviction_policy)
    return out


@triton.jit
def store(ptr, value, from_rank, to_rank, heap_bases, mask, hint: tl.constexpr, cache_modifier: tl.constexpr,
          eviction_policy: tl.constexpr):
    """rma.store, with to_rank reached through NVSHMEM where it is indirect."""
    if far(heap_bases, to_rank):
        _store_far(ptr, value, to_rank, mask)
    else:
        if RANK_CHECK:
            p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, _f.STORE, hint)
            tl.store(p, value, mask=m, cache_modifier=cache_modifier, eviction_policy=eviction_policy)
        else:
            tl.store(_translate(ptr, from_rank, to_rank, heap_bases, hint), value, mask=mask,
                     cache_modifier=cache_modifier, eviction_policy=eviction_policy)


@triton.jit
def get(from_ptr, to_ptr, to_rank, from_rank, heap_bases, mask, other, load_cache_modifier: tl.constexpr,
        store_cache_modifier: tl.constexpr, hint: tl.constexpr):
    """rma.get, with from_rank reached through NVSHMEM where it is indirect."""
    if far(heap_bases, from_rank):
        _move_far(from_ptr, to_ptr, from_rank, mask, other, hint, False)
    else:
        if RANK_CHECK:
            p, m = _reach(from_ptr, to_rank, from_rank, heap_bases, mask, _f.GET, hint)
            tl.store(to_ptr, tl.load(p, mask=m, other=other, cache_modifier=load_cache_modifier), mask=m,
                     cache_modifier=store_cache_modifier)
        else:
            data = tl.load(_translate(from_ptr, to_rank, from_rank, heap_bases, hint), mask=mask,
                           other=other, cache_modifier=load_cache_modifier)
            tl.store(to_ptr, data, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask, other, load_cache_modifier: tl.constexpr,
        store_cache_modifier: tl.constexpr, hint: tl.constexpr):
    """rma.put, with to_rank reached through NVSHMEM where it is indirect."""
    if far(heap_bases, to_rank):
        _move_far(from_ptr, to_ptr, to_rank, mask, other, hint, True)
    else:
        _put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask, other, load_cache_modifier,
             store_cache_modifier, hint)


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask, other, load_cache_modifier: tl.constexpr,
         store_cache_modifier: tl.constexpr, hint: tl.constexpr):
    """rma.copy, with from_rank and to_rank each reached through NVSHMEM where indirect."""
    src_far = far(heap_bases, from_rank)
    dst_far = far(heap_bases, to_rank)
    if src_far & (to_rank == cur_rank):
        _move_far(src_ptr, dst_ptr, from_rank, mask, other, hint, False)
    elif dst_far & (from_rank == cur_rank):
        _move_far(src_ptr, dst_ptr, to_rank, mask, other, hint, True)
    elif RANK_CHECK:  # a far side's translation is made and not used: its base is 0, the caller's is not
        src, m = _reach(src_ptr, cur_rank, from_rank, heap_bases, mask, _f.COPY, hint)
        dst, m = _reach(dst_ptr, cur_rank, to_rank, heap_bases, m, _f.COPY, hint)
        if src_far:
            data = _load_far(src_ptr, from_rank, m, other)
        else:
            data = tl.load(src, mask=m, other=other, cache_modifier=load_cache_modifier)
        if dst_far:
            _store_far(dst_ptr, data, to_rank, m)
        else:
            tl.store(dst, data, mask=m, cache_modifier=store_cache_modifier)
    else:
        if src_far:
            data = _load_far(src_ptr, from_rank, mask, other)
        else:
            data = tl.load(_translate(src_ptr, cur_rank, from_rank, heap_bases, hint), mask=mask,
                           other=other, cache_modifier=load_cache_modifier)
        if dst_far:
            _store_far(dst_ptr, data, to_rank, mask)
        else:
            tl.store(_translate(dst_ptr, cur_rank, to_rank, heap_bases, hint), data, mask=mask,
                     cache_modifier=store_cache_modifier)


@triton.jit
def _quiet_for(sem: tl.constexpr):
    if sem is None or sem == "release" or sem == "acq_rel":
        nv.quiet(0)


@triton.jit
def _amo1(OP: tl.constexpr, addr, a, b, pe):
    """One atomic on the integer bits a (b: the value of a compare-and-swap), from thread 0."""
    return nv.amo(OP, addr, a, b, pe)


@triton.jit
def _combine(OP: tl.constexpr, old, val):
    """The value a compare-and-swap loop stores: old op val, in the element's own type."""
    if OP == ADD:
        out = old + val
    elif OP == MIN:
        out = tl.minimum(old, val)
    else:
        out = tl.maximum(old, val)
    return out


@triton.jit
def _one(OP: tl.constexpr, addr, val, cmp, pe, dtype: tl.constexpr):
    """One element's atomic OP (ADD, CAS, XCHG, AND, OR, XOR, MIN, MAX) at address addr on pe;
    returns the old value as dtype. Native where NVSHMEM has it, else a compare-and-swap loop."""
    v = tl.cast(val, dtype)
    vb = _bits(v)
    zero = vb ^ vb
    if OP == CAS:
        old = _amo1(nv.AMO_CAS, addr, _bits(tl.cast(cmp, dtype)), vb, pe)
    elif OP == MIN or OP == MAX or (OP == ADD and dtype.is_floating()):
        old = _amo1(nv.AMO_FETCH, addr, zero, zero, pe)
        seen = old ^ (zero - 1)  # differs from old: the loop runs at least once
        while seen != old:
            seen = old
            new = _bits(_combine(OP, seen.to(dtype, bitcast=True), v))
            old = _amo1(nv.AMO_CAS, addr, seen, new, pe)
    else:  # ADD (integers), XCHG, AND, OR, XOR: NVSHMEM's own, same codes
        old = _amo1(OP, addr, vb, zero, pe)
    return old.to(dtype, bitcast=True)


@triton.jit
def _atomic_far(OP: tl.constexpr, ptr, val, cmp, pe, mask, sem: tl.constexpr):
    """Atomic OP on PE pe at ptr (the caller's view); returns the old values, element by element.
    Masked-out elements are left alone and return 0."""
    dtype: tl.constexpr = ptr.dtype.element_ty
    BITS: tl.constexpr = dtype.primitive_bitwidth
    tl.static_assert(BITS == 32 or BITS == 64, "atomics on indirect peers take 32 or 64-bit elements")
    pe32 = tl.cast(pe, tl.int32)
    _quiet_for(sem)
    if len(ptr.shape) == 0:
        if cmp is None:
            c = val
        else:
            c = cmp
        out = _one(OP, ptr.to(tl.int64), val, c, pe32, dtype)
        if mask is not None:
            out = tl.where(mask, out, tl.zeros([], dtype))
    else:
        N: tl.constexpr = ptr.numel
        idx = tl.reshape(tl.arange(0, N), ptr.shape)
        addrs = ptr.to(tl.int64)
        vals = _bits((tl.zeros(ptr.shape, dtype) + val).to(dtype))
        if cmp is None:
            cmps = vals
        else:
            cmps = _bits((tl.zeros(ptr.shape, dtype) + cmp).to(dtype))
        live = _mask(ptr, mask).to(tl.int32)
        out = tl.zeros(ptr.shape, dtype)
        for i in range(N):
            here = idx == i
            if tl.sum(tl.where(here, live, 0), axis=None) != 0:
                a = tl.sum(tl.where(here, addrs, 0), axis=None)
                v = tl.sum(tl.where(here, vals, 0), axis=None).to(dtype, bitcast=True)
                c = tl.sum(tl.where(here, cmps, 0), axis=None).to(dtype, bitcast=True)
                out = tl.where(here, _one(OP, a, v, c, pe32, dtype), out)
    return out


@triton.jit
def atomic(OP: tl.constexpr, ptr, val, cmp, from_rank, to_rank, heap_bases, mask, sem: tl.constexpr,
           scope: tl.constexpr, hint: tl.constexpr, WHAT: tl.constexpr):
    """The atomics of iris.device.atomics (OP: ADD .. MAX; cmp for CAS), with to_rank reached
    through NVSHMEM where it is indirect. WHAT: the calling function, for the fault record."""
    if far(heap_bases, to_rank):
        out = _atomic_far(OP, ptr, val, cmp, to_rank, mask, sem)
    else:
        out = _atomic_to(OP, ptr, val, cmp, from_rank, to_rank, heap_bases, mask, sem, scope, hint, WHAT)
        out = out.to(ptr.dtype.element_ty)  # cas: val's type
    return out


@triton.jit
def signal(flag_ptr, value, from_rank, to_rank, heap_bases, ADD_IT: tl.constexpr, sem: tl.constexpr,
           scope: tl.constexpr):
    """sync.signal (ADD_IT: op="add", else set), with to_rank reached through NVSHMEM where indirect."""
    if ADD_IT:
        out = atomic(ADD, flag_ptr, value, None, from_rank, to_rank, heap_bases, None, sem, scope, None, _f.SIGNAL)
    else:
        out = atomic(XCHG, flag_ptr, value, None, from_rank, to_rank, heap_bases, None, sem, scope, None, _f.SIGNAL)
    return out


@triton.jit
def wait(flag_ptr, value, from_rank, to_rank, heap_bases, CMP: tl.constexpr, sem: tl.constexpr,
         scope: tl.constexpr):
    """sync.wait, polling through NVSHMEM where to_rank is indirect."""
    if far(heap_bases, to_rank):
        cur = wait_far(flag_ptr, value, to_rank, CMP, heap_bases, from_rank)
    else:
        if RANK_CHECK:
            p, m = _reach(flag_ptr, from_rank, to_rank, heap_bases, None, _f.WAIT_FN)
            cur = _spin(p, value, CMP, sem, scope, heap_bases, flag_ptr, from_rank, to_rank, _f.WAIT_FN, m)
        else:
            cur = _spin(_translate(flag_ptr, from_rank, to_rank, heap_bases), value, CMP, sem, scope, heap_bases,
                        flag_ptr, from_rank, to_rank, _f.WAIT_FN, None)
    return cur


@triton.jit
def wait_far(flag_ptr, value, pe, CMP: tl.constexpr, heap_bases, rank):
    """Polls the flag at flag_ptr on PE pe until it compares CMP to value, or until the spin limit runs
    out (noted in the fault record, as near._spin does); returns the last value read."""
    dtype: tl.constexpr = flag_ptr.dtype.element_ty
    zero = _bits(tl.zeros([], dtype))
    pe32 = tl.cast(pe, tl.int32)
    limit = _f._spin_limit(heap_bases)
    cur = _amo1(nv.AMO_FETCH, flag_ptr.to(tl.int64), zero, zero, pe32).to(dtype, bitcast=True)
    go = _unmet(cur, value, CMP)
    polls = 1
    while go:  # a scalar loop-carried condition
        _relax()
        cur = _amo1(nv.AMO_FETCH, flag_ptr.to(tl.int64), zero, zero, pe32).to(dtype, bitcast=True)
        go = _unmet(cur, value, CMP)
        polls += 1
        stop = go & (limit != 0) & (polls >= limit)
        if stop:
            _f._gave_up(heap_bases, _f.WAIT_FN, flag_ptr, rank, pe, -1, value, cur, CMP)
        go = go & (stop == 0)
    return cur


@triton.jit
def announce(flags, rank, world, heap_bases, epoch):
    """sync.barrier_kernel's epoch into flags[rank] on every rank: through NVSHMEM (after
    nvshmem_quiet) where the rank is indirect, with a release exchange where it is direct."""
    nv.quiet(0)
    for r in range(world):
        if far(heap_bases, r):
            _amo1(nv.AMO_SWAP, (flags + rank).to(tl.int64), epoch, epoch ^ epoch, r)
        else:
            tl.atomic_xchg(_translate(flags + rank, rank, r, heap_bases), epoch, sem="release", scope="sys")
