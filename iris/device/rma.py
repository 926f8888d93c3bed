"""Remote memory access: load, store, get, put and copy across the ranks' heaps.

`from_rank`/`to_rank` follow Iris: a pointer is always valid in the caller's view of the heap;
the function translates it to the rank whose memory it touches. Masked-out lanes touch no memory.
Cache modifiers and eviction policies go to tl.load/tl.store unchanged (None: Triton's default).
"""
import triton
import triton.language as tl

from .translate import _translate


@triton.jit
def _hint(ptr, hint: tl.constexpr):
    if hint is not None:
        ptr = tl.max_contiguous(tl.multiple_of(ptr, hint), hint)
    return ptr


@triton.jit
def load(ptr, to_rank, from_rank, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = None,
         eviction_policy: tl.constexpr = None, volatile: tl.constexpr = False, hint: tl.constexpr = None):
    """Read from `from_rank`'s copy of the heap into the caller (`to_rank`).

    ptr: pointer(s) valid in to_rank's (the caller's) view; to_rank: the caller;
    from_rank: the rank whose memory is read; heap_bases: ctx.get_heap_bases().
    mask, other, cache_modifier, eviction_policy, volatile: as tl.load.
    hint: optional vectorization hint (int or tuple) applied as tl.multiple_of/tl.max_contiguous
        to the translated pointer. Returns the values read.
    """
    p = _hint(_translate(ptr, to_rank, from_rank, heap_bases), hint)
    return tl.load(p, mask=mask, other=other, cache_modifier=cache_modifier, eviction_policy=eviction_policy,
                   volatile=volatile)


@triton.jit
def store(ptr, value, from_rank, to_rank, heap_bases, mask=None, cache_modifier: tl.constexpr = None,
          eviction_policy: tl.constexpr = None, hint: tl.constexpr = None):
    """Write `value` into `to_rank`'s copy of the heap.

    ptr: pointer(s) valid in from_rank's (the caller's) view; value: what to store;
    from_rank: the caller; to_rank: the rank whose memory is written; heap_bases: ctx.get_heap_bases().
    mask, cache_modifier, eviction_policy: as tl.store. hint: as for load.
    """
    p = _hint(_translate(ptr, from_rank, to_rank, heap_bases), hint)
    tl.store(p, value, mask=mask, cache_modifier=cache_modifier, eviction_policy=eviction_policy)


@triton.jit
def get(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
    """Copy `from_rank`'s data at from_ptr into the caller's (`to_rank`'s) memory at to_ptr.

    from_ptr: heap pointer(s) valid in the caller's view, read on from_rank; to_ptr: the caller's
    local destination (any memory the caller can write); from_rank: the rank read;
    to_rank: the caller; heap_bases: ctx.get_heap_bases(). mask applies to the read and the write;
    other fills masked lanes of the read; load_/store_cache_modifier go to tl.load/tl.store.
    hint: as for load, applied to the remote pointer and to_ptr.
    """
    data = tl.load(_hint(_translate(from_ptr, to_rank, from_rank, heap_bases), hint), mask=mask, other=other,
                   cache_modifier=load_cache_modifier)
    tl.store(_hint(to_ptr, hint), data, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
    """Copy the caller's (`from_rank`'s) data at from_ptr into `to_rank`'s heap at to_ptr.

    from_ptr: the caller's local source; to_ptr: heap pointer(s) valid in the caller's view,
    written on to_rank; from_rank: the caller; to_rank: the rank written; heap_bases:
    ctx.get_heap_bases(). mask, other, load_/store_cache_modifier, hint: as for get.
    """
    data = tl.load(_hint(from_ptr, hint), mask=mask, other=other, cache_modifier=load_cache_modifier)
    tl.store(_hint(_translate(to_ptr, from_rank, to_rank, heap_bases), hint), data, mask=mask,
             cache_modifier=store_cache_modifier)


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask=None, other=None,
         load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
    """Copy from `from_rank`'s heap at src_ptr to `to_rank`'s heap at dst_ptr, issued by `cur_rank`.

    src_ptr, dst_ptr: heap pointers valid in cur_rank's (the caller's) view; from_rank: the rank
    read; to_rank: the rank written; either may be the caller, or neither; heap_bases:
    ctx.get_heap_bases(). mask, other, load_/store_cache_modifier, hint: as for get.
    """
    data = tl.load(_hint(_translate(src_ptr, cur_rank, from_rank, heap_bases), hint), mask=mask, other=other,
                   cache_modifier=load_cache_modifier)
    tl.store(_hint(_translate(dst_ptr, cur_rank, to_rank, heap_bases), hint), data, mask=mask,
             cache_modifier=store_cache_modifier)
