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
from .near import ADD, AND, CAS, INDIRECT_PEERS, MAX, MIN, OR, XCHG, XOR, _atomic
from .translate import RANK_CHECK, _reach, _translate


@triton.jit
def atomic_add(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically adds val to to_rank's memory at ptr; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    if INDIRECT_PEERS:
        return _indirect.atomic(ADD, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint,
                                _f.ATOMIC_ADD)
    if RANK_CHECK:
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, _f.ATOMIC_ADD, hint)
        return tl.where(m, _atomic(ADD, p, val, None, m, sem, scope), 0)
    return _atomic(ADD, _translate(ptr, from_rank, to_rank, heap_bases, hint), val, None, mask, sem, scope)


@triton.jit
def atomic_sub(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically subtracts val from to_rank's memory at ptr (adds -val); returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    if INDIRECT_PEERS:
        return _indirect.atomic(ADD, ptr, -val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint,
                                _f.ATOMIC_SUB)
    if RANK_CHECK:
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, _f.ATOMIC_SUB, hint)
        return tl.where(m, _atomic(ADD, p, -val, None, m, sem, scope), 0)
    return _atomic(ADD, _translate(ptr, from_rank, to_rank, heap_bases, hint), -val, None, mask, sem, scope)


@triton.jit
def atomic_cas(ptr, cmp, val, from_rank, to_rank, heap_bases, sem: tl.constexpr = None, scope: tl.constexpr = None,
               hint: tl.constexpr = None):
    """Atomically stores val at ptr on to_rank where the memory equals cmp; returns the old values
    (the swap happened where old == cmp).
    cmp: the expected values; ptr, from_rank, to_rank, heap_bases, sem, scope, hint: as in the module
    docstring."""
    if INDIRECT_PEERS:
        return _indirect.atomic(CAS, ptr, val, cmp, from_rank, to_rank, heap_bases, None, sem, scope, hint,
                                _f.ATOMIC_CAS)
    if RANK_CHECK:  # compare-and-swap has no mask: a refused lane swaps cmp for cmp in the caller's memory
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, None, _f.ATOMIC_CAS, hint)
        return tl.where(m, _atomic(CAS, p, tl.where(m, val, cmp), cmp, None, sem, scope), 0)
    return _atomic(CAS, _translate(ptr, from_rank, to_rank, heap_bases, hint), val, cmp, None, sem, scope)


@triton.jit
def atomic_xchg(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
                scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically stores val at ptr on to_rank; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    if INDIRECT_PEERS:
        return _indirect.atomic(XCHG, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint,
                                _f.ATOMIC_XCHG)
    if RANK_CHECK:
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, _f.ATOMIC_XCHG, hint)
        return tl.where(m, _atomic(XCHG, p, val, None, m, sem, scope), 0)
    return _atomic(XCHG, _translate(ptr, from_rank, to_rank, heap_bases, hint), val, None, mask, sem, scope)


@triton.jit
def atomic_and(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically ands val into to_rank's memory at ptr; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    if INDIRECT_PEERS:
        return _indirect.atomic(AND, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint,
                                _f.ATOMIC_AND)
    if RANK_CHECK:
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, _f.ATOMIC_AND, hint)
        return tl.where(m, _atomic(AND, p, val, None, m, sem, scope), 0)
    return _atomic(AND, _translate(ptr, from_rank, to_rank, heap_bases, hint), val, None, mask, sem, scope)


@triton.jit
def atomic_or(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
              scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically ors val into to_rank's memory at ptr; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    if INDIRECT_PEERS:
        return _indirect.atomic(OR, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint,
                                _f.ATOMIC_OR)
    if RANK_CHECK:
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, _f.ATOMIC_OR, hint)
        return tl.where(m, _atomic(OR, p, val, None, m, sem, scope), 0)
    return _atomic(OR, _translate(ptr, from_rank, to_rank, heap_bases, hint), val, None, mask, sem, scope)


@triton.jit
def atomic_xor(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically xors val into to_rank's memory at ptr; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    if INDIRECT_PEERS:
        return _indirect.atomic(XOR, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint,
                                _f.ATOMIC_XOR)
    if RANK_CHECK:
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, _f.ATOMIC_XOR, hint)
        return tl.where(m, _atomic(XOR, p, val, None, m, sem, scope), 0)
    return _atomic(XOR, _translate(ptr, from_rank, to_rank, heap_bases, hint), val, None, mask, sem, scope)


@triton.jit
def atomic_min(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically stores min(old, val) at ptr on to_rank; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    if INDIRECT_PEERS:
        return _indirect.atomic(MIN, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint,
                                _f.ATOMIC_MIN)
    if RANK_CHECK:
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, _f.ATOMIC_MIN, hint)
        return tl.where(m, _atomic(MIN, p, val, None, m, sem, scope), 0)
    return _atomic(MIN, _translate(ptr, from_rank, to_rank, heap_bases, hint), val, None, mask, sem, scope)


@triton.jit
def atomic_max(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically stores max(old, val) at ptr on to_rank; returns the old values.
    ptr, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as in the module docstring."""
    if INDIRECT_PEERS:
        return _indirect.atomic(MAX, ptr, val, None, from_rank, to_rank, heap_bases, mask, sem, scope, hint,
                                _f.ATOMIC_MAX)
    if RANK_CHECK:
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, _f.ATOMIC_MAX, hint)
        return tl.where(m, _atomic(MAX, p, val, None, m, sem, scope), 0)
    return _atomic(MAX, _translate(ptr, from_rank, to_rank, heap_bases, hint), val, None, mask, sem, scope)
