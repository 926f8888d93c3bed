"""Atomics on any rank's copy of the heap: add, sub, cas, xchg, and, or, xor, min, max.

Every function takes ptr: pointer(s) valid in from_rank's (the caller's) view of the heap;
from_rank: the caller; to_rank: the rank whose memory is updated; heap_bases:
ctx.get_heap_bases(); mask: lanes to leave alone (not for cas: tl.atomic_cas has none);
hint: optional vectorization hint for the translated pointer, as for load.
sem: how the caller's other accesses are ordered around the atomic: "relaxed" (not at all),
"acquire" (later ones stay after), "release" (earlier ones complete before), "acq_rel" (both).
scope: who is promised that ordering: "cta" (this program), "gpu" (this device), "sys" (every
device and the host): use "sys" to synchronize with another rank's GPU.

Dtypes are Triton's: add takes fp16/bf16/fp32/fp64/int32/int64 (and unsigned); min, max and xchg
fp32/fp64/int32/int64; and, or, xor int32/int64; cas any 16, 32 or 64-bit type.
"""
import triton
import triton.language as tl

from .translate import _translate
from . import indirect as _indirect
from .indirect import INDIRECT_PEERS


@triton.jit
def _at(ptr, from_rank, to_rank, heap_bases, hint: tl.constexpr):
    return _translate(ptr, from_rank, to_rank, heap_bases, hint)


@triton.jit
def atomic_add(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically adds val to to_rank's memory at ptr; returns the old values.

    ptr, from_rank, to_rank, heap_bases, mask: as in the module docstring.
    sem (default acq_rel) orders the caller's other accesses around this one; scope (default gpu)
    says who may rely on that order: "sys" to synchronize with another rank's GPU.
    """
    if INDIRECT_PEERS:
        return _indirect.atomic(_indirect.ADD, ptr, val, None, from_rank, to_rank, heap_bases,
                                mask, sem, scope, hint)
    return tl.atomic_add(_at(ptr, from_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_sub(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically subtracts val from to_rank's memory at ptr (adds -val); returns the old values.

    ptr, from_rank, to_rank, heap_bases, mask: as in the module docstring.
    sem (default acq_rel) orders the caller's other accesses around this one; scope (default gpu)
    says who may rely on that order: "sys" to synchronize with another rank's GPU.
    """
    if INDIRECT_PEERS:
        return _indirect.atomic(_indirect.ADD, ptr, -val, None, from_rank, to_rank, heap_bases,
                                mask, sem, scope, hint)
    return tl.atomic_add(_at(ptr, from_rank, to_rank, heap_bases, hint), -val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_cas(ptr, cmp, val, from_rank, to_rank, heap_bases, sem: tl.constexpr = None, scope: tl.constexpr = None,
               hint: tl.constexpr = None):
    """Atomically stores val at ptr on to_rank where the memory equals cmp; returns the old values
    (the swap happened where old == cmp).

    cmp: the expected values; ptr, from_rank, to_rank, heap_bases: as in the module docstring.
    sem (default acq_rel) orders the caller's other accesses around this one; scope (default gpu)
    says who may rely on that order: "sys" to synchronize with another rank's GPU.
    """
    if INDIRECT_PEERS:
        return _indirect.atomic(_indirect.CAS, ptr, val, cmp, from_rank, to_rank, heap_bases,
                                None, sem, scope, hint)
    return tl.atomic_cas(_at(ptr, from_rank, to_rank, heap_bases, hint), cmp, val, sem=sem, scope=scope)


@triton.jit
def atomic_xchg(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
                scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically stores val at ptr on to_rank; returns the old values.

    ptr, from_rank, to_rank, heap_bases, mask: as in the module docstring.
    sem (default acq_rel) orders the caller's other accesses around this one; scope (default gpu)
    says who may rely on that order: "sys" to synchronize with another rank's GPU.
    """
    if INDIRECT_PEERS:
        return _indirect.atomic(_indirect.XCHG, ptr, val, None, from_rank, to_rank, heap_bases,
                                mask, sem, scope, hint)
    return tl.atomic_xchg(_at(ptr, from_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_and(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically ands val into to_rank's memory at ptr; returns the old values.

    ptr, from_rank, to_rank, heap_bases, mask: as in the module docstring.
    sem (default acq_rel) orders the caller's other accesses around this one; scope (default gpu)
    says who may rely on that order: "sys" to synchronize with another rank's GPU.
    """
    if INDIRECT_PEERS:
        return _indirect.atomic(_indirect.AND, ptr, val, None, from_rank, to_rank, heap_bases,
                                mask, sem, scope, hint)
    return tl.atomic_and(_at(ptr, from_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_or(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
              scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically ors val into to_rank's memory at ptr; returns the old values.

    ptr, from_rank, to_rank, heap_bases, mask: as in the module docstring.
    sem (default acq_rel) orders the caller's other accesses around this one; scope (default gpu)
    says who may rely on that order: "sys" to synchronize with another rank's GPU.
    """
    if INDIRECT_PEERS:
        return _indirect.atomic(_indirect.OR, ptr, val, None, from_rank, to_rank, heap_bases,
                                mask, sem, scope, hint)
    return tl.atomic_or(_at(ptr, from_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_xor(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically xors val into to_rank's memory at ptr; returns the old values.

    ptr, from_rank, to_rank, heap_bases, mask: as in the module docstring.
    sem (default acq_rel) orders the caller's other accesses around this one; scope (default gpu)
    says who may rely on that order: "sys" to synchronize with another rank's GPU.
    """
    if INDIRECT_PEERS:
        return _indirect.atomic(_indirect.XOR, ptr, val, None, from_rank, to_rank, heap_bases,
                                mask, sem, scope, hint)
    return tl.atomic_xor(_at(ptr, from_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_min(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically stores min(old, val) at ptr on to_rank; returns the old values.

    ptr, from_rank, to_rank, heap_bases, mask: as in the module docstring.
    sem (default acq_rel) orders the caller's other accesses around this one; scope (default gpu)
    says who may rely on that order: "sys" to synchronize with another rank's GPU.
    """
    if INDIRECT_PEERS:
        return _indirect.atomic(_indirect.MIN, ptr, val, None, from_rank, to_rank, heap_bases,
                                mask, sem, scope, hint)
    return tl.atomic_min(_at(ptr, from_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_max(ptr, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    """Atomically stores max(old, val) at ptr on to_rank; returns the old values.

    ptr, from_rank, to_rank, heap_bases, mask: as in the module docstring.
    sem (default acq_rel) orders the caller's other accesses around this one; scope (default gpu)
    says who may rely on that order: "sys" to synchronize with another rank's GPU.
    """
    if INDIRECT_PEERS:
        return _indirect.atomic(_indirect.MAX, ptr, val, None, from_rank, to_rank, heap_bases,
                                mask, sem, scope, hint)
    return tl.atomic_max(_at(ptr, from_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)
