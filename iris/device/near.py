"""Accesses to memory this process maps (a direct peer's heap, through the translated pointer), shared by
rma, atomics and sync and by indirect.py's NVSHMEM paths, and INDIRECT_PEERS, the switch between them.

What matters:
- INDIRECT_PEERS is one tl.constexpr object that every module reading it imports: Triton folds it, so
  where it is False (a job without indirect peers) no NVSHMEM code is in any kernel. It is read from
  IRIS_INDIRECT_PEERS when iris is imported, and use_indirect_peers() turns it on when the context's
  heap has an indirect peer. Set it before the first kernel compiles: Triton compares a kernel's
  globals at each launch and refuses one compiled under the other value.
- _spin is the one poll loop of iris.wait (near and NVSHMEM paths alike bound it the same way): it gives
  up after the spin limit of the heap's tables and notes the wait in the fault record (faults.py).
- _atomic is the one definition of the nine atomics on a mapped pointer, and _atomic_to and _put the
  one body of an atomic and a put to a mapped peer (the rank check included): the public functions
  (and the DeviceContext methods through them) and the indirect path's direct side call them;
  Gluon's IrisDeviceCtx calls _atomic and _atomic_masked too (they compile as Gluon there).
"""
import os

import triton
import triton.language as tl

from .. import settings
from . import nvshmem as nv
from .faults import PUT, _gave_up, _spin_limit
from .translate import RANK_CHECK, _reach, _translate

INDIRECT_PEERS: tl.constexpr = tl.constexpr(bool(settings.INDIRECT_PEERS.get()))
# atomic operations: NVSHMEM's codes where it has the operation (the far path hands them on), then the two it lacks
ADD: tl.constexpr = nv.AMO_ADD
CAS: tl.constexpr = nv.AMO_CAS
XCHG: tl.constexpr = nv.AMO_SWAP
AND: tl.constexpr = nv.AMO_AND
OR: tl.constexpr = nv.AMO_OR
XOR: tl.constexpr = nv.AMO_XOR
MIN: tl.constexpr = tl.constexpr(7)
MAX: tl.constexpr = tl.constexpr(8)


def use_indirect_peers() -> None:
    """Compile the NVSHMEM path into iris's device functions from now on (a heap with an indirect peer)."""
    # re-initialised in place, never rebound: rma, atomics, sync and indirect hold this same object
    INDIRECT_PEERS.__init__(True)


@triton.jit
def _load(p, mask, other, cache_modifier: tl.constexpr, volatile: tl.constexpr, eviction_policy: tl.constexpr):
    # ptxas (CUDA 12.8/12.9, sm_90) fails on ld.volatile with a cache operator: volatile already
    # bypasses the caches, so the modifier is dropped there rather than compiled into a bad instruction.
    if volatile:
        out = tl.load(p, mask=mask, other=other, eviction_policy=eviction_policy, volatile=True)
    else:
        out = tl.load(p, mask=mask, other=other, cache_modifier=cache_modifier, eviction_policy=eviction_policy)
    return out


@triton.jit
def _put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask, other, load_cache_modifier: tl.constexpr,
         store_cache_modifier: tl.constexpr, hint: tl.constexpr):
    """put to a mapped peer (rma.put, and indirect.put's near side): to_rank refused where RANK_CHECK."""
    if RANK_CHECK:
        p, m = _reach(to_ptr, from_rank, to_rank, heap_bases, mask, PUT, hint)
        tl.store(p, tl.load(from_ptr, mask=m, other=other, cache_modifier=load_cache_modifier), mask=m,
                 cache_modifier=store_cache_modifier)
    else:
        data = tl.load(from_ptr, mask=mask, other=other, cache_modifier=load_cache_modifier)
        tl.store(_translate(to_ptr, from_rank, to_rank, heap_bases, hint), data, mask=mask,
                 cache_modifier=store_cache_modifier)


@triton.jit
def _atomic(OP: tl.constexpr, p, val, cmp, mask, sem: tl.constexpr, scope: tl.constexpr):
    """Atomic OP (ADD .. MAX; cmp is compare-and-swap's expected value) on the mapped pointer(s) p;
    returns the old values. mask, sem, scope: as tl.atomic_* (compare-and-swap takes no mask)."""
    if OP == ADD:
        out = tl.atomic_add(p, val, mask=mask, sem=sem, scope=scope)
    elif OP == CAS:
        out = tl.atomic_cas(p, cmp, val, sem=sem, scope=scope)
    elif OP == XCHG:
        out = tl.atomic_xchg(p, val, mask=mask, sem=sem, scope=scope)
    elif OP == AND:
        out = tl.atomic_and(p, val, mask=mask, sem=sem, scope=scope)
    elif OP == OR:
        out = tl.atomic_or(p, val, mask=mask, sem=sem, scope=scope)
    elif OP == XOR:
        out = tl.atomic_xor(p, val, mask=mask, sem=sem, scope=scope)
    elif OP == MIN:
        out = tl.atomic_min(p, val, mask=mask, sem=sem, scope=scope)
    else:
        out = tl.atomic_max(p, val, mask=mask, sem=sem, scope=scope)
    return out


@triton.jit
def _atomic_to(OP: tl.constexpr, ptr, val, cmp, from_rank, to_rank, heap_bases, mask, sem: tl.constexpr,
               scope: tl.constexpr, hint: tl.constexpr, WHAT: tl.constexpr):
    """_atomic on to_rank's memory at ptr (valid in from_rank's view) through this process's mapping: the
    public atomics and indirect.atomic's near side. Where RANK_CHECK refuses a lane, nothing is updated
    there and it returns 0; WHAT: the calling function, for the fault record."""
    if RANK_CHECK:
        p, m = _reach(ptr, from_rank, to_rank, heap_bases, mask, WHAT, hint)
        out = _atomic_masked(OP, p, val, cmp, m, sem, scope)
    else:
        out = _atomic(OP, _translate(ptr, from_rank, to_rank, heap_bases, hint), val, cmp, mask, sem, scope)
    return out


@triton.jit
def _atomic_masked(OP: tl.constexpr, p, val, cmp, m, sem: tl.constexpr, scope: tl.constexpr):
    """_atomic where m is _reach's mask: a refused lane is left alone and returns 0."""
    if OP == CAS:  # no mask: a refused lane swaps cmp for cmp in the caller's memory
        out = tl.where(m, _atomic(CAS, p, tl.where(m, val, cmp), cmp, None, sem, scope), 0)
    else:
        out = tl.where(m, _atomic(OP, p, val, cmp, m, sem, scope), 0)
    return out


@triton.jit
def _unmet(cur, value, cmp: tl.constexpr):
    tl.static_assert(cmp == "eq" or cmp == "ne" or cmp == "ge" or cmp == "gt" or cmp == "le" or cmp == "lt",
                     "cmp must be one of eq, ne, ge, gt, le, lt")
    if cmp == "eq":
        out = cur != value
    elif cmp == "ne":
        out = cur == value
    elif cmp == "ge":
        out = cur < value
    elif cmp == "gt":
        out = cur <= value
    elif cmp == "le":
        out = cur > value
    else:
        out = cur >= value
    return out


if settings.INTERPRET.get():  # as Triton reads it when these functions are made
    def _relax():
        """After a poll that found its flag short, under the interpreter: each rank is a process of the
        host, and the rank that sets the flag may be waiting for this core (as the host driver's
        stream_wait, give it the core)."""
        os.sched_yield()
else:
    @triton.jit
    def _relax():
        """After a poll that found its flag short, on a GPU: nothing (the loop has its SM)."""
        pass


@triton.jit
def _spin(p, value, CMP: tl.constexpr, SEM: tl.constexpr, SCOPE: tl.constexpr, heap_bases, flag, rank, flag_rank,
          WHAT: tl.constexpr, ok):
    """Polls the flag at p (this process's mapping) until it compares CMP to value, or until the spin limit
    (faults._spin_limit) runs out: then WHAT's wait is noted in the fault record (flag: the pointer in
    rank's view, on flag_rank) and the loop ends. Returns the last value read. ok: _reach's mask, whether
    the ranks were in range (False: no poll, no wait; None: not checked)."""
    limit = _spin_limit(heap_bases)
    if ok is None:
        cur = tl.atomic_add(p, 0, sem=SEM, scope=SCOPE)
        go = _unmet(cur, value, CMP)
    else:
        cur = tl.where(ok, tl.atomic_add(p, 0, mask=ok, sem=SEM, scope=SCOPE), 0)
        go = _unmet(cur, value, CMP) & ok
    polls = 1
    while go:  # a scalar loop-carried condition
        _relax()
        cur = tl.atomic_add(p, 0, sem=SEM, scope=SCOPE)
        go = _unmet(cur, value, CMP)
        polls += 1
        stop = go & (limit != 0) & (polls >= limit)
        if stop:
            _gave_up(heap_bases, WHAT, flag, rank, flag_rank, -1, value, cur, CMP)
        go = go & (stop == 0)
    return cur
