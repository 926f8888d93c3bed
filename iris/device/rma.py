"""Remote memory access: load, store, get, put and copy across the ranks' heaps.

Positional order follows Iris: the caller's rank comes first and the remote rank second in every
function, and the names say where data flows (from_rank: the rank read, to_rank: the rank written).
A heap pointer is always valid in the caller's view; the function translates it to the rank whose
memory it touches. Masked-out lanes touch no memory. Cache modifiers and eviction policies go to
tl.load/tl.store unchanged (None: Triton's default); parameters iris adds come after Iris's.
A rank outside [0, world) is refused (translate.py, IRIS_RANK_CHECK): no memory is touched for it,
a load reads `other` (or 0), and the host raises DeviceCheckError at its next ctx.barrier().
"""
import triton
import triton.language as tl

from . import indirect as _indirect
from .faults import COPY, GET, LOAD, STORE
from .near import INDIRECT_PEERS, _load, _put
from .translate import RANK_CHECK, _reach, _translate


@triton.jit
def load(ptr, to_rank, from_rank, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = None,
         volatile: tl.constexpr = False, hint: tl.constexpr = None, eviction_policy: tl.constexpr = None):
    """Read from `from_rank`'s copy of the heap into the caller (`to_rank`).

    ptr: pointer(s) valid in to_rank's (the caller's) view; to_rank: the caller;
    from_rank: the rank whose memory is read; heap_bases: ctx.get_heap_bases().
    mask, other, cache_modifier, volatile, eviction_policy: as tl.load (volatile=True bypasses the
        caches itself, so cache_modifier is ignored with it). hint: optional vectorization hint (int or
        tuple) applied as tl.multiple_of/tl.max_contiguous to the translated pointer.
    Returns the values read.
    """
    if INDIRECT_PEERS:
        return _indirect.load(ptr, to_rank, from_rank, heap_bases, mask, other, cache_modifier, volatile, hint,
                              eviction_policy)
    if RANK_CHECK:
        p, m = _reach(ptr, to_rank, from_rank, heap_bases, mask, LOAD, hint)
        return _load(p, m, other, cache_modifier, volatile, eviction_policy)
    p = _translate(ptr, to_rank, from_rank, heap_bases, hint)
    return _load(p, mask, other, cache_modifier, volatile, eviction_policy)


@triton.jit
def store(ptr, value, from_rank, to_rank, heap_bases, mask=None, hint: tl.constexpr = None,
          cache_modifier: tl.constexpr = None, eviction_policy: tl.constexpr = None):
    """Write `value` into `to_rank`'s copy of the heap.

    ptr: pointer(s) valid in from_rank's (the caller's) view; value: what to store;
    from_rank: the caller; to_rank: the rank whose memory is written; heap_bases: ctx.get_heap_bases().
    mask, cache_modifier, eviction_policy: as tl.store. hint: as for load.
    """
    if INDIRECT_PEERS:
        return _indirect.store(ptr, value, from_rank, to_rank, heap_bases, mask, hint, cache_modifier, eviction_policy)
    if RANK_CHECK:
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, STORE, hint)
        tl.store(p, value, mask=m, cache_modifier=cache_modifier, eviction_policy=eviction_policy)
    else:
        p = _translate(ptr, from_rank, to_rank, heap_bases, hint)
        tl.store(p, value, mask=mask, cache_modifier=cache_modifier, eviction_policy=eviction_policy)


@triton.jit
def get(from_ptr, to_ptr, to_rank, from_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
    """Copy `from_rank`'s data at from_ptr into the caller's memory at to_ptr: get(src, dst, me, remote, ...).

    from_ptr: heap pointer(s) valid in the caller's view, read on from_rank; to_ptr: the caller's
    local destination (any memory the caller can write); to_rank: the caller (where the data lands);
    from_rank: the rank read; heap_bases: ctx.get_heap_bases(). Same positions as load and as Iris's
    code and tests call get (its docstring names them the other way round). mask applies to the read
    and the write; other fills masked lanes of the read; load_/store_cache_modifier go to tl.load/
    tl.store. hint: as for load, applied to the remote pointer (a local pointer keeps what the calling
    kernel declares: tl.multiple_of there); a hint equal to a 1-D block's length declares the block one
    contiguous run, which lets an indirect peer's tile skip the address test.
    """
    if INDIRECT_PEERS:
        return _indirect.get(from_ptr, to_ptr, to_rank, from_rank, heap_bases, mask, other, load_cache_modifier,
                             store_cache_modifier, hint)
    if RANK_CHECK:
        p, m = _reach(from_ptr, to_rank, from_rank, heap_bases, mask, GET, hint)
        tl.store(to_ptr, tl.load(p, mask=m, other=other, cache_modifier=load_cache_modifier), mask=m,
                 cache_modifier=store_cache_modifier)
    else:
        data = tl.load(_translate(from_ptr, to_rank, from_rank, heap_bases, hint), mask=mask, other=other,
                       cache_modifier=load_cache_modifier)
        tl.store(to_ptr, data, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
    """Copy the caller's (`from_rank`'s) data at from_ptr into `to_rank`'s heap at to_ptr: put(src, dst, me, remote).

    from_ptr: the caller's local source; to_ptr: heap pointer(s) valid in the caller's view,
    written on to_rank; from_rank: the caller; to_rank: the rank written; heap_bases:
    ctx.get_heap_bases(). mask, other, load_/store_cache_modifier, hint: as for get.
    """
    if INDIRECT_PEERS:
        return _indirect.put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask, other, load_cache_modifier,
                             store_cache_modifier, hint)
    _put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask, other, load_cache_modifier, store_cache_modifier,
         hint)


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask=None, other=None,
         load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
    """Copy from `from_rank`'s heap at src_ptr to `to_rank`'s heap at dst_ptr, issued by `cur_rank`.

    src_ptr, dst_ptr: heap pointers valid in cur_rank's (the caller's) view; from_rank: the rank
    read; to_rank: the rank written; either may be the caller, or neither; heap_bases:
    ctx.get_heap_bases(). mask, other, load_/store_cache_modifier, hint: as for get.
    """
    if INDIRECT_PEERS:
        return _indirect.copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask, other,
                              load_cache_modifier, store_cache_modifier, hint)
    if RANK_CHECK:
        src, m = _reach(src_ptr, cur_rank, from_rank, heap_bases, mask, COPY, hint)
        dst, m = _reach(dst_ptr, cur_rank, to_rank, heap_bases, m, COPY, hint)
        tl.store(dst, tl.load(src, mask=m, other=other, cache_modifier=load_cache_modifier), mask=m,
                 cache_modifier=store_cache_modifier)
    else:
        data = tl.load(_translate(src_ptr, cur_rank, from_rank, heap_bases, hint), mask=mask, other=other,
                       cache_modifier=load_cache_modifier)
        tl.store(_translate(dst_ptr, cur_rank, to_rank, heap_bases, hint), data, mask=mask,
                 cache_modifier=store_cache_modifier)
