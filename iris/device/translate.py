"""Pointer translation between the ranks' mappings of the symmetric heap."""
import triton
import triton.language as tl


@triton.jit
def _translate(ptr, from_rank, to_rank, heap_bases):
    # The bases are arbitrary 64-bit addresses and their difference may be negative; it is added
    # in whole elements so that ptr keeps its type. Heap bases are at least 256-byte aligned, and
    # telling the compiler the offset is a multiple of 16 bytes keeps 128-bit accesses.
    ELEM: tl.constexpr = (ptr.dtype.element_ty.primitive_bitwidth + 7) // 8  # int1 is stored in a byte
    delta = tl.load(heap_bases + to_rank) - tl.load(heap_bases + from_rank)
    if ELEM > 1:
        delta = delta // ELEM
    if len(delta.shape) == 0:
        delta = tl.multiple_of(delta, 16 // ELEM)
    return ptr + delta


@triton.jit
def translate(ptr, from_rank, to_rank, heap_bases):
    """Where `ptr` (valid in `from_rank`'s view of the heap) points in `to_rank`'s copy.

    ptr: a pointer or block of pointers into the heap, as seen by from_rank (normally the caller).
    from_rank, to_rank: ranks (scalars, or blocks of ranks for one pointer per rank).
    heap_bases: the int64 tensor from ctx.get_heap_bases(): entry r is where rank r's heap is
        mapped in this process. Returns pointers of ptr's type into to_rank's memory.
    """
    return _translate(ptr, from_rank, to_rank, heap_bases)
