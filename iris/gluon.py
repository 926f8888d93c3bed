"""IrisDeviceCtx: iris's device API for @gluon.jit kernels (Iris's Gluon context, NVIDIA here: warps
of 32 threads; the caller picks the layouts, these methods keep them).

    from iris.gluon import IrisDeviceCtx          # or: from iris.experimental.iris_gluon import ...

    @gluon.jit
    def kernel(IrisDeviceCtx: gl.constexpr, context_tensor, buf, peer: gl.constexpr, BLOCK: gl.constexpr):
        ctx = IrisDeviceCtx.initialize(context_tensor)
        layout: gl.constexpr = gl.BlockedLayout([BLOCK // 128], [32], [4], [0])
        offs = gl.arange(0, BLOCK, layout=layout)
        x = ctx.load(buf + offs, peer)

    kernel[grid](IrisDeviceCtx, ctx.get_device_context(), buf, 1, 512, num_warps=4)

The rank and world size come from the context tensor at run time (as in Iris), so one compiled
kernel serves every rank. Every method that takes a rank refuses one outside [0, world) as the Triton
device functions do (IRIS_RANK_CHECK, on by default): the access is masked out and the host raises
DeviceCheckError at its next look (ctx.barrier(), ctx.close()). Translation is iris's: a pointer
valid in this rank's view, moved by the difference of the two ranks' heap bases. The bodies they
share with the Triton device functions (near.py's atomics, translate.py's refusal) are called as
they are: a @triton.jit function called from a Gluon kernel compiles as Gluon. Gluon has no interpreter: these kernels run on GPUs only.
A job whose heap has an indirect peer (NVSHMEM) is refused when a kernel compiles.

The tile API (iris/gluon_tiles.py) is here too: Tile, TileView (which takes the layout its indices
use), make_tensor_view, and the methods all_reduce_atomic, all_reduce_spinlock, all_reduce_one_shot,
all_reduce_two_shot, all_reduce_ring, reduce_scatter, all_gather, gather and all_to_all, with
iris.DeviceContext's names and argument order.
"""
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.core import _aggregate as aggregate

from . import gluon_tiles as _tiles
from .device import faults as F
from .device.near import ADD, AND, CAS, MAX, MIN, OR, XCHG, XOR, _atomic, _atomic_masked
from .device.translate import RANK_CHECK, _in_world
from .gluon_tiles import Tile, TileView, make_tensor_view

__all__ = ["IrisDeviceCtx", "Tile", "TileView", "make_tensor_view"]


@gluon.jit
def _load(ptr, mask, other, cache_modifier: gl.constexpr, volatile: gl.constexpr):
    # None means Triton's default modifier (Triton 3.6's Gluon rejects a string default passed on);
    # ptxas rejects ld.volatile with a cache operator, and volatile bypasses the caches anyway
    if (cache_modifier is None) or volatile:
        out = gl.load(ptr, mask=mask, other=other, volatile=volatile)
    else:
        out = gl.load(ptr, mask=mask, other=other, cache_modifier=cache_modifier, volatile=volatile)
    return out


@gluon.jit
def _store(ptr, value, mask, cache_modifier: gl.constexpr):
    if cache_modifier is None:
        gl.store(ptr, value, mask=mask)
    else:
        gl.store(ptr, value, mask=mask, cache_modifier=cache_modifier)


@aggregate
class IrisDeviceCtx:
    """This rank's view of the heap inside a Gluon kernel; build it with IrisDeviceCtx.initialize."""
    cur_rank: gl.tensor
    num_ranks: gl.tensor
    heap_bases: gl.tensor

    @gluon.constexpr_function
    def __init__(self, cur_rank, num_ranks, heap_bases):
        self.cur_rank = cur_rank
        self.num_ranks = num_ranks
        self.heap_bases = heap_bases

    @staticmethod
    @gluon.jit
    def initialize(context_tensor, tracing: gl.constexpr = False):
        """context_tensor: ctx.get_device_context() ([rank, world, heap_base_0, ...]). Device tracing
        is recorded by Triton kernels' DeviceContext; here tracing must stay False."""
        gl.static_assert(not tracing, "iris.gluon.IrisDeviceCtx records no trace events: use tracing=False "
                                      "(iris.DeviceContext in a @triton.jit kernel traces)")
        return IrisDeviceCtx(gl.load(context_tensor), gl.load(context_tensor + 1), context_tensor + 2)

    @gluon.jit
    def _translate(self, ptr, from_rank, to_rank):
        """ptr (valid in from_rank's view) as to_rank's memory: moved by the bases' difference."""
        _tiles.direct_only()
        delta = gl.load(self.heap_bases + to_rank) - gl.load(self.heap_bases + from_rank)
        return tl.cast(tl.cast(ptr, gl.int64) + delta, ptr.dtype)

    @gluon.jit
    def _reach(self, ptr, rank, mask, WHAT: gl.constexpr):
        """(ptr as rank's memory, the access's mask) with the Triton device functions' refusal of a rank
        outside [0, world) (translate._in_world), noted as WHAT's; call it only where RANK_CHECK is on.
        IRIS_DEBUG's pointer check is Triton's only. Gluon splats a scalar mask only inside a binary
        operation, so a missing mask becomes ptr's block of True first."""
        _tiles.direct_only()
        if mask is None:
            mask = tl.cast(ptr, gl.int64) == tl.cast(ptr, gl.int64)
        return _in_world(ptr, self.cur_rank, rank, self.heap_bases, mask, WHAT)

    @gluon.jit
    def _atomic(self, OP: gl.constexpr, ptr, val, cmp, rank, mask, sem: gl.constexpr, scope: gl.constexpr,
                WHAT: gl.constexpr):
        """Atomic OP at rank's ptr; with RANK_CHECK a refused lane is left alone and returns 0."""
        if RANK_CHECK:
            p, m = self._reach(ptr, rank, mask, WHAT)
            out = _atomic_masked(OP, p, val, cmp, m, sem, scope)
        else:
            out = _atomic(OP, self._translate(ptr, self.cur_rank, rank), val, cmp, mask, sem, scope)
        return out

    @gluon.jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier: gl.constexpr = None,
             volatile: gl.constexpr = False):
        """from_rank's values at pointer (valid in this rank's view)."""
        if RANK_CHECK:
            pointer, mask = self._reach(pointer, from_rank, mask, F.LOAD)
        else:
            pointer = self._translate(pointer, self.cur_rank, from_rank)
        return _load(pointer, mask, other, cache_modifier, volatile)

    @gluon.jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier: gl.constexpr = None):
        """Writes value into to_rank's memory at pointer."""
        if RANK_CHECK:
            pointer, mask = self._reach(pointer, to_rank, mask, F.STORE)
        else:
            pointer = self._translate(pointer, self.cur_rank, to_rank)
        _store(pointer, value, mask, cache_modifier)

    @gluon.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, other=None, load_cache_modifier: gl.constexpr = None,
            store_cache_modifier: gl.constexpr = None):
        """Copies from_rank's data at from_ptr into this rank's to_ptr."""
        if RANK_CHECK:
            from_ptr, mask = self._reach(from_ptr, from_rank, mask, F.GET)
        else:
            from_ptr = self._translate(from_ptr, self.cur_rank, from_rank)
        _store(to_ptr, _load(from_ptr, mask, other, load_cache_modifier, False), mask, store_cache_modifier)

    @gluon.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, other=None, load_cache_modifier: gl.constexpr = None,
            store_cache_modifier: gl.constexpr = None):
        """Copies this rank's data at from_ptr into to_rank's to_ptr."""
        if RANK_CHECK:
            to_ptr, mask = self._reach(to_ptr, to_rank, mask, F.PUT)
        else:
            to_ptr = self._translate(to_ptr, self.cur_rank, to_rank)
        _store(to_ptr, _load(from_ptr, mask, other, load_cache_modifier, False), mask, store_cache_modifier)

    @gluon.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, other=None,
             load_cache_modifier: gl.constexpr = None, store_cache_modifier: gl.constexpr = None):
        """Copies from_rank's src_ptr into to_rank's dst_ptr (both valid in this rank's view); this rank
        must be one of the two."""
        if RANK_CHECK:
            src_ptr, mask = self._reach(src_ptr, from_rank, mask, F.COPY)
            dst_ptr, mask = self._reach(dst_ptr, to_rank, mask, F.COPY)
        else:
            src_ptr = self._translate(src_ptr, self.cur_rank, from_rank)
            dst_ptr = self._translate(dst_ptr, self.cur_rank, to_rank)
        _store(dst_ptr, _load(src_ptr, mask, other, load_cache_modifier, False), mask, store_cache_modifier)

    @gluon.jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem: gl.constexpr = None, scope: gl.constexpr = None):
        """Atomically adds val at to_rank's pointer; returns the old values. sem: relaxed, acquire,
        release or acq_rel (default); scope: cta, gpu (default) or sys (another GPU watches)."""
        return self._atomic(ADD, pointer, val, None, to_rank, mask, sem, scope, F.ATOMIC_ADD)

    @gluon.jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem: gl.constexpr = None, scope: gl.constexpr = None):
        """Atomically subtracts val (adds -val) at to_rank's pointer; returns the old values."""
        return self._atomic(ADD, pointer, -val, None, to_rank, mask, sem, scope, F.ATOMIC_SUB)

    @gluon.jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem: gl.constexpr = None, scope: gl.constexpr = None):
        """Writes val at to_rank's pointer where it holds cmp; returns the old values."""
        return self._atomic(CAS, pointer, val, cmp, to_rank, None, sem, scope, F.ATOMIC_CAS)

    @gluon.jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem: gl.constexpr = None, scope: gl.constexpr = None):
        """Atomically swaps val into to_rank's pointer; returns the old values."""
        return self._atomic(XCHG, pointer, val, None, to_rank, mask, sem, scope, F.ATOMIC_XCHG)

    @gluon.jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem: gl.constexpr = None, scope: gl.constexpr = None):
        """Atomic bitwise xor at to_rank's pointer; returns the old values."""
        return self._atomic(XOR, pointer, val, None, to_rank, mask, sem, scope, F.ATOMIC_XOR)

    @gluon.jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem: gl.constexpr = None, scope: gl.constexpr = None):
        """Atomic bitwise and at to_rank's pointer; returns the old values."""
        return self._atomic(AND, pointer, val, None, to_rank, mask, sem, scope, F.ATOMIC_AND)

    @gluon.jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem: gl.constexpr = None, scope: gl.constexpr = None):
        """Atomic bitwise or at to_rank's pointer; returns the old values."""
        return self._atomic(OR, pointer, val, None, to_rank, mask, sem, scope, F.ATOMIC_OR)

    @gluon.jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem: gl.constexpr = None, scope: gl.constexpr = None):
        """Atomic minimum at to_rank's pointer; returns the old values."""
        return self._atomic(MIN, pointer, val, None, to_rank, mask, sem, scope, F.ATOMIC_MIN)

    @gluon.jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem: gl.constexpr = None, scope: gl.constexpr = None):
        """Atomic maximum at to_rank's pointer; returns the old values."""
        return self._atomic(MAX, pointer, val, None, to_rank, mask, sem, scope, F.ATOMIC_MAX)

    # tile collectives: iris/device/tile_collectives.py's bodies compiled as Gluon (iris/gluon_tiles.py);
    # that module's docstring says what each rank must do before and after. Tiles: iris.gluon.Tile or
    # TileView; views: iris.gluon.make_tensor_view's.
    @gluon.jit
    def _ranks(self):
        _tiles.direct_only()
        return _tiles.Ranks(self.cur_rank, self.num_ranks, self.heap_bases)

    @gluon.jit
    def all_reduce_atomic(self, tile, dst_view):
        """Atomically adds tile.data into dst_view's tile on every rank (dst zero beforehand)."""
        _tiles.all_reduce_atomic(self._ranks(), tile, dst_view)

    @gluon.jit
    def all_reduce_spinlock(self, tile, dst_view, locks):
        """Adds tile.data into dst_view's tile on every rank under that rank's locks[tile_id]."""
        _tiles.all_reduce_spinlock(self._ranks(), tile, dst_view, locks)

    @gluon.jit
    def all_reduce_one_shot(self, tile, src_view, dst_view, locks):
        """Sums every rank's published tile (src_view, locks[tile_id] == 1) into this rank's dst_view."""
        _tiles.all_reduce_one_shot(self._ranks(), tile, src_view, dst_view, locks)

    @gluon.jit
    def all_reduce_two_shot(self, tile, src_view, dst_view, locks):
        """The tile's owner (tile_id % world) sums the published tiles into dst_view on every rank."""
        _tiles.all_reduce_two_shot(self._ranks(), tile, src_view, dst_view, locks)

    @gluon.jit
    def all_reduce_ring(self, tile, src_view, dst_view):
        """Sums every rank's src_view tile (complete before the launch) into this rank's dst_view."""
        _tiles.all_reduce_ring(self._ranks(), tile, src_view, dst_view)

    @gluon.jit
    def reduce_scatter(self, tile, src_view, dst_view, locks):
        """The tile's owner (contiguous runs of tile ids per rank) sums the published tiles into its dst_view."""
        _tiles.reduce_scatter(self._ranks(), tile, src_view, dst_view, locks)

    @gluon.jit
    def all_gather(self, tile, dst_view, dim: gl.constexpr):
        """Stores tile.data into this rank's part (along dim) of dst_view on every rank."""
        _tiles.all_gather(self._ranks(), tile, dst_view, dim)

    @gluon.jit
    def gather(self, tile, src_view, source_rank, hint: gl.constexpr = None):
        """source_rank's values of the tile in src_view, in the tile's layout."""
        return _tiles.gather(self._ranks(), tile, src_view, source_rank, hint)

    @gluon.jit
    def all_to_all(self, tile, src_view, dst_view, N_per_rank):
        """Fills this rank's dst_view tile with column chunk `rank` of each peer's src_view (N_per_rank
        columns each; Iris's parameter name)."""
        _tiles.all_to_all(self._ranks(), tile, src_view, dst_view, N_per_rank)
