"""DeviceContext: the rank, world size and heap bases in one Triton aggregate, so kernels call
ctx.load/store/get/put/copy/atomic_* without passing ranks and heap_bases around (Iris's API).

Host side, ctx.get_device_context() returns an int64 tensor [rank, world, heap_base_0, ...],
built once per heap; a kernel takes it with rank and world_size as constexprs:

    @triton.jit
    def kernel(context, buf, rank: tl.constexpr, world_size: tl.constexpr):
        ctx = iris.DeviceContext.initialize(context, rank, world_size)
        x = ctx.load(buf + offs, (rank + 1) % world_size)

Every method is the module function of the same name with the caller's rank and heap_bases filled
in; the remote rank comes first, then Iris's keywords, then iris's extras.
"""
import triton
import triton.language as tl
from triton.language.core import _aggregate as aggregate  # Triton >= 3.4: 3.6 and 3.9 both have it
from triton.runtime.interpreter import InterpretedFunction

from .atomics import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_sub, atomic_xchg,
                      atomic_xor)
from .rma import copy, get, load, put, store
from .sync import signal, wait

HEADER = tl.constexpr(2)  # context tensor: rank, world, then one heap base per rank


def _aggregate_or_plain(cls):
    """A Triton aggregate when kernels compile. The interpreter (the host driver) has no aggregates
    and runs kernels as Python: there DeviceContext is a plain class whose methods call the same
    @triton.jit functions with self."""
    if not isinstance(load, InterpretedFunction):
        return aggregate(cls)
    body = {}
    for name, member in vars(cls).items():
        if not isinstance(member, staticmethod) and hasattr(member, "fn") and callable(member):
            fn = member.fn if name == "__init__" else member  # a constexpr_function's body runs as it is
            member = (lambda f: lambda self, *args, **kwargs: f(self, *args, **kwargs))(fn)
        body[name] = member
    return type(cls.__name__, (), body)


@_aggregate_or_plain
class DeviceContext:
    """This rank's view of the heap inside a kernel; build it with DeviceContext.initialize."""
    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor

    @triton.constexpr_function
    def __init__(self, rank, world_size, heap_bases):
        self.rank = tl.constexpr(rank)
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases

    @staticmethod
    @triton.jit
    def initialize(context_tensor, rank: tl.constexpr, world_size: tl.constexpr):
        """context_tensor: ctx.get_device_context(); rank, world_size: this rank and the number of
        ranks, constexprs of the kernel (so each rank compiles its own kernel, as in Iris)."""
        return DeviceContext(rank, world_size, context_tensor + HEADER)

    @triton.jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier: tl.constexpr = None,
             volatile: tl.constexpr = False, hint: tl.constexpr = None, eviction_policy: tl.constexpr = None):
        """from_rank's values at pointer (valid in this rank's view); the rest as iris.load."""
        return load(pointer, self.rank, from_rank, self.heap_bases, mask, other, cache_modifier, volatile, hint,
                    eviction_policy)

    @triton.jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier: tl.constexpr = None,
              hint: tl.constexpr = None, eviction_policy: tl.constexpr = None):
        """Writes value into to_rank's memory at pointer; the rest as iris.store."""
        store(pointer, value, self.rank, to_rank, self.heap_bases, mask, hint, cache_modifier, eviction_policy)

    @triton.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = None,
            store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
        """Copies from_rank's data at from_ptr into this rank's to_ptr; the rest as iris.get."""
        get(from_ptr, to_ptr, self.rank, from_rank, self.heap_bases, mask, other, load_cache_modifier,
            store_cache_modifier, hint)

    @triton.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = None,
            store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
        """Copies this rank's data at from_ptr into to_rank's to_ptr; the rest as iris.put."""
        put(from_ptr, to_ptr, self.rank, to_rank, self.heap_bases, mask, other, load_cache_modifier,
            store_cache_modifier, hint)

    @triton.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, other=None,
             load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None,
             hint: tl.constexpr = None):
        """Copies from_rank's src_ptr into to_rank's dst_ptr, issued by this rank; as iris.copy."""
        copy(src_ptr, dst_ptr, from_rank, to_rank, self.rank, self.heap_bases, mask, other, load_cache_modifier,
             store_cache_modifier, hint)

    @triton.jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_add from this rank on to_rank's memory; returns the old values."""
        return atomic_add(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_sub from this rank on to_rank's memory; returns the old values."""
        return atomic_sub(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_cas from this rank on to_rank's memory; returns the old values."""
        return atomic_cas(pointer, cmp, val, self.rank, to_rank, self.heap_bases, sem, scope, hint)

    @triton.jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                    hint: tl.constexpr = None):
        """iris.atomic_xchg from this rank on to_rank's memory; returns the old values."""
        return atomic_xchg(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_and from this rank on to_rank's memory; returns the old values."""
        return atomic_and(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                  hint: tl.constexpr = None):
        """iris.atomic_or from this rank on to_rank's memory; returns the old values."""
        return atomic_or(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_xor from this rank on to_rank's memory; returns the old values."""
        return atomic_xor(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_min from this rank on to_rank's memory; returns the old values."""
        return atomic_min(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_max from this rank on to_rank's memory; returns the old values."""
        return atomic_max(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def signal(self, flag_ptr, value, to_rank, op: tl.constexpr = None, sem: tl.constexpr = None,
               scope: tl.constexpr = None):
        """iris.signal from this rank to to_rank's flag; returns the old value."""
        return signal(flag_ptr, value, self.rank, to_rank, self.heap_bases, op, sem, scope)

    @triton.jit
    def wait(self, flag_ptr, value, cmp: tl.constexpr = None, sem: tl.constexpr = None, scope: tl.constexpr = None):
        """iris.wait on this rank's own flag; returns its value."""
        return wait(flag_ptr, value, self.rank, self.rank, self.heap_bases, cmp, sem, scope)
