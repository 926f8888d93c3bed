"""Atomics on any rank's copy of the heap: add, sub, cas, xchg, and, or, xor, min, max.

Every function takes ptr: pointer(s) valid in from_rank's (the caller's) view of the heap;
from_rank: the caller; to_rank: the rank whose memory is updated; heap_bases:
ctx.get_heap_bases(); mask: lanes to leave alone (not for cas: tl.atomic_cas has none);
hint: optional vectorization hint for the translated pointer, as for load.
sem (default "acq_rel"): how the caller's other accesses are ordered around the atomic: "relaxed"
(not at all), "acquire" (later ones stay after), "release" (earlier ones complete before), "acq_rel"
(both). scope (default "gpu"): who is promised that ordering: "cta" (this program), "gpu" (this
device), "sys" (every device and the host): use "sys" to synchronize with another rank's GPU.
Every function returns the old values. A rank outside [0, world) is refused (translate.py,
IRIS_RANK_CHECK): nothing is updated for it, it returns 0 (as do masked lanes), and the host raises
DeviceCheckError at its next ctx.barrier().

Dtypes are Triton's: add takes fp16/bf16/fp32/fp64/int32/int64 (and unsigned); min, max and xchg
fp32/fp64/int32/int64; and, or, xor int32/int64; cas any 16, 32 or 64-bit type. Each function issues
near._atomic with its operation on the translated pointer, or hands the call to the NVSHMEM path
where INDIRECT_PEERS is set.
"""
import triton
import triton.language as tl

from . import indirect as _indirect
from . import faults as _f
from .near import ADD, AND, CAS, INDIRECT_PEERS, MAX, MIN, OR, XCHG, XOR, _atomic_to


@triton.jit
def _any(OP: tl.constexpr, ptr, val, cmp, from_rank, to_rank, heap_bases, mask, sem: tl.constexpr,
         scope: tl.constexpr, hint: tl.constexpr, WHAT: tl.constexpr):
    """Every atomic here: through NVSHMEM where the job has indirect peers, else on the mapped pointer."""
    if INDIRECT_PEERS:
        return _indirect.atomic(OP, ptr, val, cmp, from_rank, to_rank, heap_bases, mask, sem, scope, hint, WHAT)
    return _atomic_to(OP, ptr, val, cmp, from_rank, to_rank, heap_bases, mask, sem, scope, hint, WHAT)


@triton.jit
def atomic_add(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically adds val to to_rank's memory at ptr; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    return _any(ADD, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint, _f.ATOMIC_ADD)


@triton.jit
def atomic_sub(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically subtracts val from to_rank's memory at ptr (adds -val); returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    return _any(ADD, ptr, -val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint, _f.ATOMIC_SUB)


@triton.jit
def atomic_cas(ptr, cmp, val, from_rank, to_rank, heap_bases, sem: tl.constexpr = None, scope: tl.constexpr = None,
               hint: tl.constexpr = None):
    """Atomically stores val at ptr on to_rank where the memory equals cmp; returns the old values
    (the swap happened where old == cmp).
    cmp: the expected values; ptr, from_rank, to_rank, heap_bases, sem, scope, hint: as in the module
    docstring."""
    return _any(CAS, ptr, val, cmp, from_rank, to_rank, heap_bases, None, sem, scope, hint, _f.ATOMIC_CAS)


@triton.jit
def atomic_xchg(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
                scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically stores val at ptr on to_rank; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    return _any(XCHG, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint, _f.ATOMIC_XCHG)


@triton.jit
def atomic_and(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically ands val into to_rank's memory at ptr; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    return _any(AND, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint, _f.ATOMIC_AND)


@triton.jit
def atomic_or(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
              scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically ors val into to_rank's memory at ptr; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    return _any(OR, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint, _f.ATOMIC_OR)


@triton.jit
def atomic_xor(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically xors val into to_rank's memory at ptr; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    return _any(XOR, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint, _f.ATOMIC_XOR)


@triton.jit
def atomic_min(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically stores min(old, val) at ptr on to_rank; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    return _any(MIN, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint, _f.ATOMIC_MIN)


@triton.jit
def atomic_max(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically stores max(old, val) at ptr on to_rank; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    return _any(MAX, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint, _f.ATOMIC_MAX)
