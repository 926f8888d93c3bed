"""Pointer translation between the ranks' mappings of the symmetric heap, and its checks.

Every device function that takes a rank refuses one outside [0, world) (IRIS_RANK_CHECK, on by
default; read when iris is imported): _reach masks the access (a load reads `other`, or 0; nothing is
written) and notes the first refusal in the fault record (faults.py) in a cold branch, for the host to
raise. The check costs a compare per rank and a predicate per access. IRIS_DEBUG=1 (also read at
import) compiles a fuller check into every device function: the ranks lie in [0, world) and the
pointer lies inside the caller's heap, raised in the kernel (an error under the interpreter, a trap on
GPUs). The kernel learns world, the heap size and where the record is from hidden int64 entries just
before heap_bases[0] (see bases_table), so no device function's signature changes; pass
ctx.get_heap_bases() or ctx.get_device_context() itself, not a copy.
"""
import os

import numpy as np
import torch
import triton
import triton.language as tl

from .. import settings
from ..errors import DeviceCheckError
from .faults import HIDDEN, MAGIC, MAGIC_AT, RANK, WORLD_AT, _note

DEBUG: tl.constexpr = tl.constexpr(settings.DEBUG.get())
RANK_CHECK: tl.constexpr = tl.constexpr(settings.RANK_CHECK.get())
_INTERPRETED: tl.constexpr = tl.constexpr(settings.INTERPRET.get())
if DEBUG:  # device_assert is compiled in only when Triton debugs; it reads TRITON_DEBUG once, at import
    os.environ.setdefault("TRITON_DEBUG", "1")
    if getattr(getattr(triton, "knobs", None), "runtime", None) is not None:
        triton.knobs.runtime.debug = True


def bases_table(bases, size: int, rank: int, device, tail=(), record: int = 0, spin=None) -> torch.Tensor:
    """[record, spin, MAGIC, size, rank, world, base_0, ..., base_{world-1}, *tail]. Sliced at HIDDEN it is
    heap_bases as kernels get it; sliced at HIDDEN - 2 it is a DeviceContext's tensor ([rank, world,
    bases..., tail]), whose heap_bases then has the same hidden entries before it. record: the address
    of the heap's fault record (0: none); spin: the most polls of a device function's wait (None:
    IRIS_SPIN_LIMIT now; 0: for ever)."""
    spin = settings.SPIN_LIMIT.get() if spin is None else spin
    hidden = [record, min(spin, (1 << 31) - 1), MAGIC.value, size, rank, len(bases)]
    return torch.tensor([*hidden, *bases, *tail], dtype=torch.int64, device=device)


def bases_tensor(bases, size: int, rank: int, device, record: int = 0, spin=None) -> torch.Tensor:
    """heap_bases as kernels get it: one int64 per rank, preceded in memory by the hidden entries."""
    return bases_table(bases, size, rank, device, record=record, spin=spin)[HIDDEN:]


@triton.jit
def _fail_unless(ok, msg: tl.constexpr):
    # device_assert is compiled out by Triton's interpreter, whose static_assert checks at run time.
    if _INTERPRETED:
        tl.static_assert(ok, msg)
    else:
        tl.device_assert(ok, msg)


@triton.jit
def _check(ptr, from_rank, to_rank, heap_bases):
    """Debug mode: the ranks are in [0, world) and every pointer's element lies in from_rank's heap."""
    ELEM: tl.constexpr = (ptr.dtype.element_ty.primitive_bitwidth + 7) // 8
    _fail_unless(tl.load(heap_bases + MAGIC_AT) == MAGIC,
                 "iris debug: heap_bases is not ctx.get_heap_bases() (a copy?)")
    size = tl.load(heap_bases - 3)
    world = tl.load(heap_bases + WORLD_AT)
    ranks_ok = (from_rank >= 0) & (from_rank < world) & (to_rank >= 0) & (to_rank < world)
    ranks_ok = tl.min((ranks_ok | tl.full([1], 0, tl.int1)).to(tl.int32), axis=None)
    if _INTERPRETED:  # plain Python here: one error that names the values
        _REFUSE_RANKS(ranks_ok, world, from_rank, to_rank)
    else:
        if ranks_ok == 0:
            tl.device_print("iris debug: a rank outside [0, world): world, from_rank, to_rank =", world, from_rank,
                            to_rank)
        _fail_unless(ranks_ok != 0, "iris debug: a rank outside [0, world) (printed above)")
    offset = ptr.to(tl.int64) - tl.load(heap_bases + from_rank)
    inside = (offset >= 0) & (offset + ELEM <= size)
    first_bad = tl.min(tl.where(inside, 1 << 62, offset) | tl.full([1], 0, tl.int64), axis=None)
    if _INTERPRETED:
        _REFUSE_POINTER(first_bad, from_rank, size, tl.load(heap_bases + from_rank))
    else:
        if first_bad != 1 << 62:
            tl.device_print("iris debug: a pointer outside the heap: rank, byte offset, heap size =", from_rank,
                            first_bad, size)
        _fail_unless(first_bad == 1 << 62, "iris debug: a pointer outside the caller's heap (printed above)")


def _values(x) -> list:
    """An interpreted kernel's scalar or block as Python numbers."""
    x = getattr(x, "value", x)  # a constexpr
    return np.asarray(getattr(getattr(x, "handle", None), "data", x)).reshape(-1).tolist()


def _shown(x) -> str:
    v = _values(x)
    return str(v[0]) if len(set(v)) == 1 else str(v[:8])[:-1] + (", ...]" if len(v) > 8 else "]")


def _refuse_ranks(ok, world, from_rank, to_rank) -> None:
    if not _values(ok)[0]:
        raise DeviceCheckError(f"iris debug: a rank outside [0, world): from_rank {_shown(from_rank)}, to_rank "
                               f"{_shown(to_rank)}, world {_shown(world)}")


def _refuse_pointer(first_bad, rank, size, base) -> None:
    offset = _values(first_bad)[0]
    if offset != 1 << 62:
        base = _values(base)[0]
        raise DeviceCheckError(f"iris debug: pointer {hex(base + offset)} is outside rank {_shown(rank)}'s heap "
                               f"[{hex(base)}, {hex(base + _values(size)[0])}): byte offset {offset}, heap size "
                               f"{_values(size)[0]}; allocate the tensor on the heap (ctx.zeros, ctx.empty, ...)")


# Wrapped in constexpr: Triton's dependency scan refuses a plain function named in a kernel, even
# in a branch that only the interpreter takes.
_REFUSE_RANKS: tl.constexpr = tl.constexpr(_refuse_ranks)
_REFUSE_POINTER: tl.constexpr = tl.constexpr(_refuse_pointer)


@triton.jit
def _translate(ptr, from_rank, to_rank, heap_bases, hint: tl.constexpr = None):
    # For ranks the caller knows are in range (iris's own kernels); device functions use _reach.
    if DEBUG:
        _check(ptr, from_rank, to_rank, heap_bases)
    return _shifted(ptr, tl.load(heap_bases + to_rank), tl.load(heap_bases + from_rank), hint)


@triton.jit
def _shifted(ptr, to_base, from_base, hint: tl.constexpr):
    # The bases are arbitrary 64-bit addresses and their difference may be negative; it is added
    # in whole elements so that ptr keeps its type. Heap bases are at least 256-byte aligned, and
    # telling the compiler the offset is a multiple of 16 bytes keeps 128-bit accesses. hint (rma's)
    # goes on the pointer made here: Triton keeps tl.multiple_of/max_contiguous only on a value that
    # an operation of the same function produced, and drops it on an argument of an inlined function
    # (so the difference is taken here too).
    ELEM: tl.constexpr = (ptr.dtype.element_ty.primitive_bitwidth + 7) // 8  # int1 is stored in a byte
    delta = to_base - from_base
    if ELEM > 1:
        delta = delta // ELEM
    if len(delta.shape) == 0:
        delta = tl.multiple_of(delta, 16 // ELEM)
    out = ptr + delta
    if hint is not None:
        out = tl.max_contiguous(tl.multiple_of(out, hint), hint)
    return out


@triton.jit
def _reach(ptr, from_rank, to_rank, heap_bases, mask, WHAT: tl.constexpr, hint: tl.constexpr = None):
    """(ptr translated from from_rank's view to to_rank's memory, the mask of the access): _translate
    with RANK_CHECK's refusal (call it only where RANK_CHECK is on). A lane whose ranks are outside
    [0, world) is masked out (it reads rank 0's base for both ranks, so it stays at ptr, the caller's
    own memory, which a compare-and-swap then leaves as it is), and the first refusal is noted in the fault record as
    WHAT's. A table without iris's hidden entries (a copy) has no world to check against: every lane
    passes, as with the check off."""
    if DEBUG:
        _check(ptr, from_rank, to_rank, heap_bases)
    return _in_world(ptr, from_rank, to_rank, heap_bases, mask, WHAT, hint)


@triton.jit
def _in_world(ptr, from_rank, to_rank, heap_bases, mask, WHAT: tl.constexpr, hint: tl.constexpr = None):
    """_reach without IRIS_DEBUG's fuller check (Gluon's IrisDeviceCtx calls it: _check is Triton's only)."""
    world = tl.load(heap_bases + WORLD_AT).to(tl.uint64, bitcast=True)
    # one unsigned compare per rank: a negative rank is a huge unsigned one
    ok = (tl.cast(from_rank, tl.int64).to(tl.uint64, bitcast=True) < world) & \
        (tl.cast(to_rank, tl.int64).to(tl.uint64, bitcast=True) < world)
    if len(ok.shape) == 0:
        if ok == 0:  # cold: a refusal
            ours = tl.load(heap_bases + MAGIC_AT) == MAGIC
            if ours:
                _note(heap_bases, RANK, WHAT, from_rank, to_rank, world, 0, 0, 0, 0)
            ok = ok | (ours == 0)
    else:
        ok = _refuse_lanes(ok, from_rank, to_rank, heap_bases, WHAT)
    to_base = tl.load(heap_bases + tl.where(ok, to_rank, 0))
    out = _shifted(ptr, to_base, tl.load(heap_bases + tl.where(ok, from_rank, 0)), hint)
    if mask is not None:
        ok = mask & ok
    if _INTERPRETED:  # the interpreter splats a scalar comparison in its operands' dtype, which masks refuse
        ok = (tl.zeros(ptr.shape, tl.int32) + ok.to(tl.int32)) != 0
    return out, ok


@triton.jit
def _refuse_lanes(ok, from_rank, to_rank, heap_bases, WHAT: tl.constexpr):
    """_reach's refusal for blocks of ranks: one reduction says whether any lane is refused; the lowest
    refused ranks are noted."""
    if tl.max((ok == 0).to(tl.int32), axis=None) != 0:
        ours = tl.load(heap_bases + MAGIC_AT) == MAGIC
        if ours:
            big = tl.full([], 1 << 62, tl.int64)
            _note(heap_bases, RANK, WHAT, tl.min(tl.where(ok, big, from_rank), axis=None),
                  tl.min(tl.where(ok, big, to_rank), axis=None), tl.load(heap_bases + WORLD_AT), 0, 0, 0, 0)
        ok = (ok.to(tl.int32) | (ours == 0).to(tl.int32)) != 0  # in int32: the interpreter's mixed dtypes
    return ok


@triton.jit
def translate(ptr, from_rank, to_rank, heap_bases):
    """Where `ptr` (valid in `from_rank`'s view of the heap) points in `to_rank`'s copy.

    ptr: a pointer or block of pointers into the heap, as seen by from_rank (normally the caller).
    from_rank, to_rank: ranks (scalars, or blocks of ranks for one pointer per rank).
    heap_bases: the int64 tensor from ctx.get_heap_bases(): entry r is where rank r's heap is
        mapped in this process. Returns pointers of ptr's type into to_rank's memory.
    """
    return _translate(ptr, from_rank, to_rank, heap_bases)
