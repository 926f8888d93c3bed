"""Tiles and tensor views for the tile collectives (Iris's names): which block of a 2-D tensor a
program works on, and where that block lies in memory.

    tile = iris.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, data)   # coordinates and the values computed
    view = iris.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)     # coordinates only
    dst = iris.make_tensor_view(ptr, M, N, stride_m, stride_n)
    ptrs, mask = dst.tile_ptr(tile)

A tile (pid_m, pid_n) covers rows pid_m*BLOCK_M .. +BLOCK_M and columns pid_n*BLOCK_N .. +BLOCK_N;
its mask is false outside the M x N view, so edge tiles of any size are handled by masking and never
touch memory past the view. Views take any strides (a transposed or sliced tensor); offsets are
computed in int64, so views larger than 2**31 elements work.
"""
import triton
import triton.language as tl

from .aggregate import aggregate


@triton.jit
def _block_ptrs(ptr, M, N, stride_m, stride_n, rows, cols):
    """Pointers of rows x cols (index vectors) in an M x N view, and the in-bounds mask."""
    offs = rows[:, None].to(tl.int64) * stride_m + cols[None, :].to(tl.int64) * stride_n
    mask = (rows[:, None] >= 0) & (rows[:, None] < M) & (cols[None, :] >= 0) & (cols[None, :] < N)
    return ptr + offs, mask


# Tile's and TileView's methods (the same for both)
@triton.jit
def _tile_indices(tile):
    """(rows, cols): the tile's row and column indices, unmasked."""
    return (tile.pid_m * tile.block_m + tl.arange(0, tile.block_m),
            tile.pid_n * tile.block_n + tl.arange(0, tile.block_n))


@triton.jit
def _tile_layout(tile, M, N):
    """(rows, cols, mask) of the tile in an M x N tensor."""
    rows, cols = tile.indices()  # the tile's own: Gluon's tiles place them in their layout
    return rows, cols, (rows[:, None] < M) & (cols[None, :] < N)


@aggregate
class TileView:
    """A tile's coordinates without data: (pid_m, pid_n) in units of (block_m, block_n) elements."""
    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr

    @triton.constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)

    indices = _tile_indices
    layout = _tile_layout


@aggregate
class Tile:
    """A tile's coordinates and its values (data: a [block_m, block_n] block, e.g. a GEMM's accumulator
    already cast to the output's dtype)."""
    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr
    data: tl.tensor

    @triton.constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n, data):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)
        self.data = data

    indices = _tile_indices
    layout = _tile_layout


@aggregate
class TensorView:
    """An M x N tensor at ptr with element strides (stride_m, stride_n); build it with make_tensor_view."""
    ptr: tl.tensor
    M: tl.tensor
    N: tl.tensor
    stride_m: tl.tensor
    stride_n: tl.tensor

    @triton.constexpr_function
    def __init__(self, ptr, M, N, stride_m, stride_n):
        self.ptr = ptr
        self.M = M
        self.N = N
        self.stride_m = stride_m
        self.stride_n = stride_n

    @triton.jit
    def tile_ptr(self, tile):
        """(pointers, mask) of tile (a Tile or TileView) in this view; the mask is false outside M x N."""
        rows, cols = tile.indices()
        return _block_ptrs(self.ptr, self.M, self.N, self.stride_m, self.stride_n, rows, cols)

    @triton.jit
    def tile_ptr_from_indices(self, rows, cols):
        """(pointers, mask) of the block at these row and column index vectors."""
        return _block_ptrs(self.ptr, self.M, self.N, self.stride_m, self.stride_n, rows, cols)

    @triton.jit
    def offset_tile_ptr(self, tile, offset_m=0, offset_n=0, src_mask=None):
        """(pointers, mask) of tile moved by (offset_m, offset_n) elements, its mask and'ed with src_mask."""
        rows, cols = tile.indices()
        ptrs, mask = _block_ptrs(self.ptr, self.M, self.N, self.stride_m, self.stride_n, rows + offset_m,
                                 cols + offset_n)
        if src_mask is not None:
            mask = mask & src_mask
        return ptrs, mask

    @triton.jit
    def number_of_tiles(self, block_m: tl.constexpr, block_n: tl.constexpr):
        """How many block_m x block_n tiles cover the view."""
        return tl.cdiv(self.M, block_m) * tl.cdiv(self.N, block_n)


@triton.jit
def _scalar(x):
    # a constexpr (a kernel's constexpr argument, or an int Triton specialised to 1) becomes a tensor,
    # the type TensorView's fields have; a tensor keeps its own integer type
    return x + tl.zeros((), tl.int32)


@triton.jit
def make_tensor_view(ptr, M, N, stride_m, stride_n):
    """A TensorView of the M x N tensor at ptr with element strides stride_m (rows) and stride_n
    (columns): any strides, so transposed and sliced tensors work. The view of a heap tensor is valid
    in this rank's address space; the tile collectives translate it to the rank they touch."""
    return TensorView(ptr, _scalar(M), _scalar(N), _scalar(stride_m), _scalar(stride_n))
