"""DeviceContext: the rank, world size and heap bases in one Triton aggregate, so kernels call
ctx.load/store/get/put/copy/atomic_* without passing ranks and heap_bases around (Iris's API).

Host side, ctx.get_device_context() returns an int64 tensor [rank, world, heap_base_0, ..., trace slots],
built once per heap; a kernel takes it with rank and world_size as constexprs:

    @triton.jit
    def kernel(context, buf, rank: tl.constexpr, world_size: tl.constexpr):
        ctx = iris.DeviceContext.initialize(context, rank, world_size)
        x = ctx.load(buf + offs, (rank + 1) % world_size)

Every method is the module function of the same name with the caller's rank and heap_bases filled
in; the remote rank comes first, then Iris's keywords, then iris's extras. A context initialized with
tracing=True also records each load, store, get, put, copy and atomic as a trace event
(iris/tracing/device.py); without it the methods compile to the module functions alone.
"""
import triton
import triton.language as tl

from ..tracing.device import DeviceTracing
from ..tracing.events import TraceEvent
from .aggregate import aggregate
from .atomics import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_sub, atomic_xchg,
                      atomic_xor)
from .rma import copy, get, load, put, store
from .sync import signal, wait
from . import tile_collectives as _tiles

HEADER = tl.constexpr(2)  # context tensor: rank, world, one heap base per rank, then the trace slots


@aggregate
class DeviceContext:
    """This rank's view of the heap inside a kernel; build it with DeviceContext.initialize."""
    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: DeviceTracing

    @triton.constexpr_function
    def __init__(self, rank, world_size, heap_bases, tracing):
        self.rank = tl.constexpr(rank)
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases
        self.tracing = tracing

    @staticmethod
    @triton.jit
    def initialize(context_tensor, rank: tl.constexpr, world_size: tl.constexpr, tracing: tl.constexpr = False):
        """context_tensor: ctx.get_device_context(); rank, world_size: this rank and the number of
        ranks, constexprs of the kernel (so each rank compiles its own kernel, as in Iris);
        tracing: record every operation of this context into ctx.tracing's buffer (after the host's
        ctx.tracing.enable(); without it nothing is written). A constexpr: False compiles no tracing."""
        heap_bases = context_tensor + HEADER
        if tracing:
            slots = heap_bases + world_size
            max_events = tl.load(slots).to(tl.int32)
            counter = tl.load(slots + 1).to(tl.pointer_type(tl.int32))
            records = tl.load(slots + 2).to(tl.pointer_type(tl.int64))
            trace = DeviceTracing(True, rank, max_events, counter, records)
        else:
            trace = DeviceTracing(False, rank, tl.full((), 0, tl.int32), context_tensor, context_tensor)
        return DeviceContext(rank, world_size, heap_bases, trace)

    @triton.jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier: tl.constexpr = None,
             volatile: tl.constexpr = False, hint: tl.constexpr = None, eviction_policy: tl.constexpr = None):
        """from_rank's values at pointer (valid in this rank's view); the rest as iris.load."""
        event = self.tracing.record_event_start(TraceEvent().load, from_rank, pointer, mask=mask)
        out = load(pointer, self.rank, from_rank, self.heap_bases, mask, other, cache_modifier, volatile, hint,
                   eviction_policy)
        self.tracing.record_event_end(event, out)
        return out

    @triton.jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier: tl.constexpr = None,
              hint: tl.constexpr = None, eviction_policy: tl.constexpr = None):
        """Writes value into to_rank's memory at pointer; the rest as iris.store."""
        event = self.tracing.record_event_start(TraceEvent().store, to_rank, pointer, mask=mask)
        store(pointer, value, self.rank, to_rank, self.heap_bases, mask, hint, cache_modifier, eviction_policy)
        self.tracing.record_event_end(event)

    @triton.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = None,
            store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
        """Copies from_rank's data at from_ptr into this rank's to_ptr; the rest as iris.get."""
        event = self.tracing.record_event_start(TraceEvent().get, from_rank, from_ptr, mask=mask)
        get(from_ptr, to_ptr, self.rank, from_rank, self.heap_bases, mask, other, load_cache_modifier,
            store_cache_modifier, hint)
        self.tracing.record_event_end(event)

    @triton.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = None,
            store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
        """Copies this rank's data at from_ptr into to_rank's to_ptr; the rest as iris.put."""
        event = self.tracing.record_event_start(TraceEvent().put, to_rank, to_ptr, mask=mask)
        put(from_ptr, to_ptr, self.rank, to_rank, self.heap_bases, mask, other, load_cache_modifier,
            store_cache_modifier, hint)
        self.tracing.record_event_end(event)

    @triton.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, other=None,
             load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None,
             hint: tl.constexpr = None):
        """Copies from_rank's src_ptr into to_rank's dst_ptr, issued by this rank; as iris.copy. Traced
        with the other rank of the two as the target."""
        event = self.tracing.record_event_start(TraceEvent().copy, from_rank + to_rank - self.rank, dst_ptr,
                                                mask=mask)
        copy(src_ptr, dst_ptr, from_rank, to_rank, self.rank, self.heap_bases, mask, other, load_cache_modifier,
             store_cache_modifier, hint)
        self.tracing.record_event_end(event)

    @triton.jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_add from this rank on to_rank's memory; returns the old values."""
        event = self.tracing.record_event_start(TraceEvent().atomic_add, to_rank, pointer, mask=mask)
        old = atomic_add(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event, old)
        return old

    @triton.jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_sub from this rank on to_rank's memory; returns the old values."""
        event = self.tracing.record_event_start(TraceEvent().atomic_sub, to_rank, pointer, mask=mask)
        old = atomic_sub(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event, old)
        return old

    @triton.jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_cas from this rank on to_rank's memory; returns the old values."""
        event = self.tracing.record_event_start(TraceEvent().atomic_cas, to_rank, pointer)
        old = atomic_cas(pointer, cmp, val, self.rank, to_rank, self.heap_bases, sem, scope, hint)
        self.tracing.record_event_end(event, old)
        return old

    @triton.jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                    hint: tl.constexpr = None):
        """iris.atomic_xchg from this rank on to_rank's memory; returns the old values."""
        event = self.tracing.record_event_start(TraceEvent().atomic_xchg, to_rank, pointer, mask=mask)
        old = atomic_xchg(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event, old)
        return old

    @triton.jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_and from this rank on to_rank's memory; returns the old values."""
        event = self.tracing.record_event_start(TraceEvent().atomic_and, to_rank, pointer, mask=mask)
        old = atomic_and(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event, old)
        return old

    @triton.jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                  hint: tl.constexpr = None):
        """iris.atomic_or from this rank on to_rank's memory; returns the old values."""
        event = self.tracing.record_event_start(TraceEvent().atomic_or, to_rank, pointer, mask=mask)
        old = atomic_or(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event, old)
        return old

    @triton.jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_xor from this rank on to_rank's memory; returns the old values."""
        event = self.tracing.record_event_start(TraceEvent().atomic_xor, to_rank, pointer, mask=mask)
        old = atomic_xor(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event, old)
        return old

    @triton.jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_min from this rank on to_rank's memory; returns the old values."""
        event = self.tracing.record_event_start(TraceEvent().atomic_min, to_rank, pointer, mask=mask)
        old = atomic_min(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event, old)
        return old

    @triton.jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """iris.atomic_max from this rank on to_rank's memory; returns the old values."""
        event = self.tracing.record_event_start(TraceEvent().atomic_max, to_rank, pointer, mask=mask)
        old = atomic_max(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event, old)
        return old

    @triton.jit
    def signal(self, flag_ptr, value, to_rank, op: tl.constexpr = None, sem: tl.constexpr = None,
               scope: tl.constexpr = None):
        """iris.signal from this rank to to_rank's flag; returns the old value."""
        return signal(flag_ptr, value, self.rank, to_rank, self.heap_bases, op, sem, scope)

    @triton.jit
    def wait(self, flag_ptr, value, cmp: tl.constexpr = None, sem: tl.constexpr = None, scope: tl.constexpr = None):
        """iris.wait on this rank's own flag; returns its value."""
        return wait(flag_ptr, value, self.rank, self.rank, self.heap_bases, cmp, sem, scope)

    # tile collectives (iris/device/tile_collectives.py says what each rank must do before and after)
    @triton.jit
    def all_reduce_atomic(self, tile, dst_view):
        """Atomically adds tile.data into dst_view's tile on every rank (dst zero beforehand)."""
        _tiles.all_reduce_atomic(self, tile, dst_view)

    @triton.jit
    def all_reduce_spinlock(self, tile, dst_view, locks):
        """Adds tile.data into dst_view's tile on every rank under that rank's locks[tile_id]."""
        _tiles.all_reduce_spinlock(self, tile, dst_view, locks)

    @triton.jit
    def all_reduce_one_shot(self, tile, src_view, dst_view, locks):
        """Sums every rank's published tile (src_view, locks[tile_id] == 1) into this rank's dst_view."""
        _tiles.all_reduce_one_shot(self, tile, src_view, dst_view, locks)

    @triton.jit
    def all_reduce_two_shot(self, tile, src_view, dst_view, locks):
        """The tile's owner (tile_id % world) sums the published tiles into dst_view on every rank."""
        _tiles.all_reduce_two_shot(self, tile, src_view, dst_view, locks)

    @triton.jit
    def all_reduce_ring(self, tile, src_view, dst_view):
        """Sums every rank's src_view tile (complete before the launch) into this rank's dst_view."""
        _tiles.all_reduce_ring(self, tile, src_view, dst_view)

    @triton.jit
    def reduce_scatter(self, tile, src_view, dst_view, locks):
        """The tile's owner (contiguous runs of tile ids per rank) sums the published tiles into its dst_view."""
        _tiles.reduce_scatter(self, tile, src_view, dst_view, locks)

    @triton.jit
    def all_gather(self, tile, dst_view, dim: tl.constexpr):
        """Stores tile.data into this rank's part (along dim) of dst_view on every rank."""
        _tiles.all_gather(self, tile, dst_view, dim)

    @triton.jit
    def gather(self, tile, src_view, source_rank, hint: tl.constexpr = None):
        """source_rank's values of the tile in src_view."""
        return _tiles.gather(self, tile, src_view, source_rank, hint)

    @triton.jit
    def all_to_all(self, tile, src_view, dst_view, N_per_rank):
        """Fills this rank's dst_view tile with column chunk `rank` of each peer's src_view (N_per_rank
        columns each; Iris's parameter name)."""
        _tiles.all_to_all(self, tile, src_view, dst_view, N_per_rank)
