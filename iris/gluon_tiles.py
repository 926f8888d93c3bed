"""The tile API for @gluon.jit kernels: Tile, TileView and make_tensor_view as Gluon needs them, and
the tile collectives that IrisDeviceCtx's methods call (all_reduce_atomic, ..., all_to_all, with the
names and argument order of iris.DeviceContext's).

    from iris.gluon import IrisDeviceCtx, Tile, TileView, make_tensor_view

    layout: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0])
    tile = Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, acc.to(gl.bfloat16))    # data in any 2-D layout
    view = TileView(pid_m, pid_n, BLOCK_M, BLOCK_N, layout)              # coordinates and a layout
    ctx.all_reduce_one_shot(tile, make_tensor_view(pub, M, N, N, 1), make_tensor_view(out, ...), locks)

What matters:
- One set of bodies. The collectives are iris/device/tile_collectives.py's functions compiled as
  Gluon (gluon.jit of the same Python function, as iris/device/near.py's atomics are), and a view is
  iris.TensorView itself; what Gluon adds is where a tile's row and column indices live: a Tile's
  come in the slices of its data's layout, a TileView's in the slices of the layout it is given (Gluon
  has no default layout for gl.arange), so every pointer, mask and loaded block of a tile has the
  tile's layout. What each rank must do before and after each call is tile_collectives.py's docstring.
- The rank and world size are run-time values (IrisDeviceCtx reads them from the context tensor, so
  one compiled kernel serves every rank); the bodies walk the ranks with run-time loops for that.
- Gluon has no interpreter: these compile and run on GPUs only. A job whose heap has an indirect peer
  (NVSHMEM) is refused when a kernel compiles: Gluon kernels reach direct peers only.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.core import _aggregate as aggregate

from .device import tile_collectives as _bodies
from .device.near import INDIRECT_PEERS
from .device.tiles import TensorView, _tile_layout


@gluon.jit
def _indices(pid_m, pid_n, block_m: gl.constexpr, block_n: gl.constexpr, layout: gl.constexpr):
    """Row and column indices of tile (pid_m, pid_n), in the slices of the 2-D layout."""
    return (pid_m * block_m + gl.arange(0, block_m, layout=gl.SliceLayout(1, layout)),
            pid_n * block_n + gl.arange(0, block_n, layout=gl.SliceLayout(0, layout)))


@aggregate
class TileView:
    """A tile's coordinates without data: (pid_m, pid_n) in units of (block_m, block_n) elements, and
    the 2-D distributed layout (e.g. gl.BlockedLayout, kept as data_layout) that its indices,
    pointers and the blocks loaded through them take."""
    pid_m: gl.tensor
    pid_n: gl.tensor
    block_m: gl.constexpr
    block_n: gl.constexpr
    data_layout: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n, layout):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = gl.constexpr(block_m)
        self.block_n = gl.constexpr(block_n)
        self.data_layout = gl.constexpr(layout)

    @gluon.jit
    def indices(self):
        """(rows, cols): the tile's row and column indices, unmasked."""
        return _indices(self.pid_m, self.pid_n, self.block_m, self.block_n, self.data_layout)

    layout = gluon.jit(_tile_layout.fn)


@aggregate
class Tile:
    """A tile's coordinates and its values: data is a [block_m, block_n] block in a 2-D distributed
    layout (e.g. a GEMM's accumulator cast to the output's dtype); the tile's indices take that layout."""
    pid_m: gl.tensor
    pid_n: gl.tensor
    block_m: gl.constexpr
    block_n: gl.constexpr
    data: gl.tensor

    @gluon.constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n, data):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = gl.constexpr(block_m)
        self.block_n = gl.constexpr(block_n)
        self.data = data

    @gluon.jit
    def indices(self):
        """(rows, cols): the tile's row and column indices, unmasked, in the slices of data's layout."""
        layout: gl.constexpr = self.data.type.layout  # Triton 3.6 passes a layout on only as a constexpr
        return _indices(self.pid_m, self.pid_n, self.block_m, self.block_n, layout)

    layout = gluon.jit(_tile_layout.fn)


@gluon.jit
def make_tensor_view(ptr, M, N, stride_m, stride_n):
    """iris.TensorView of the M x N tensor at ptr with element strides stride_m (rows) and stride_n
    (columns), any strides: as iris.make_tensor_view, for Gluon kernels."""
    return TensorView(ptr, gl.to_tensor(M), gl.to_tensor(N), gl.to_tensor(stride_m), gl.to_tensor(stride_n))


@aggregate
class Ranks:
    """What the tile collectives read of a context: this rank, the world size and heap_bases, here as
    run-time values (IrisDeviceCtx's cur_rank, num_ranks and heap_bases)."""
    rank: gl.tensor
    world_size: gl.tensor
    heap_bases: gl.tensor

    @gluon.constexpr_function
    def __init__(self, rank, world_size, heap_bases):
        self.rank = rank
        self.world_size = world_size
        self.heap_bases = heap_bases


@gluon.jit
def direct_only():
    """Refuses, when a kernel compiles, a job whose heap has an indirect peer."""
    gl.static_assert(not INDIRECT_PEERS, "iris.gluon.IrisDeviceCtx reaches direct peers only (through the heap's "
                                         "mappings), and this job's heap has an indirect peer (NVSHMEM): call the "
                                         "same functions from a @triton.jit kernel with iris.DeviceContext, which "
                                         "takes the NVSHMEM path (for ctx.ccl: Config(use_gluon=False))")


# The collectives: tile_collectives.py's bodies compiled as Gluon; each takes a Ranks first.
all_reduce_atomic = gluon.jit(_bodies.all_reduce_atomic.fn)
all_reduce_spinlock = gluon.jit(_bodies.all_reduce_spinlock.fn)
all_reduce_one_shot = gluon.jit(_bodies.all_reduce_one_shot.fn)
all_reduce_two_shot = gluon.jit(_bodies.all_reduce_two_shot.fn)
all_reduce_ring = gluon.jit(_bodies.all_reduce_ring.fn)
reduce_scatter = gluon.jit(_bodies.reduce_scatter.fn)
all_gather = gluon.jit(_bodies.all_gather.fn)
gather = gluon.jit(_bodies.gather.fn)
all_to_all = gluon.jit(_bodies.all_to_all.fn)
