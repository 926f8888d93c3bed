"""Collectives on one tile at a time, called from inside a user's kernel (Iris's tile API): every
rank's program that holds tile (pid_m, pid_n) calls the same function for that tile, and the tile's
data moves between the ranks' heaps while the rest of the kernel goes on.

Called as DeviceContext methods (ctx.all_reduce_one_shot(tile, src_view, dst_view, locks), ...);
each function here takes that ctx first, or a Ranks (all they use of it: code below the tracing
layer, such as iris.ops, builds one from heap_bases). Views are iris.make_tensor_view's over heap tensors (the
same tensor on every rank); a tile is iris.Tile (with data) or iris.TileView. Edge tiles are masked
to the view, so M and N need not be multiples of the block.

What each rank must have done before the call, and what holds after it:
- all_reduce_atomic, all_reduce_spinlock: dst is zero on every rank before any rank adds (zero it,
  then a barrier); after every rank's kernel has finished (a barrier), dst holds the sum everywhere.
- all_reduce_one_shot, all_reduce_two_shot, reduce_scatter: the caller first stores its tile.data
  into src_view (its own heap) and then sets locks[tile_id] to 1 in its own heap with release at sys
  scope (tl.debug_barrier() first, so every thread's stores are ordered before it); tile_id is
  pid_m * cdiv(N, BLOCK_N) + pid_n. The function waits, with acquire at sys scope, for that lock
  to read 1 on each rank it reads from. Locks start at 0 and are not reset here: zero them and
  barrier before the next use. One-shot writes this rank's dst when it returns; two-shot and
  reduce_scatter write dst of the tile's owner rank (two-shot: then every rank's), complete everywhere
  after a barrier.
- all_reduce_ring, all_gather, all_to_all, gather: no flags. Data read from peers (ring, all_to_all,
  gather) must be complete before the kernel starts (a barrier); stores into peers (all_gather)
  are complete after every rank's kernel has finished (a barrier).
Sums are taken in rank order 0..world-1 in float32 for float16/bfloat16 (integers and float32 in
their own type), this rank's term as the src dtype its peers read, so every rank gets the same bits;
atomic and spinlock add in arrival order. Every wait (a peer's lock reading 1, a lock to take) is
bounded by the heap's spin limit (IRIS_SPIN_LIMIT): one that runs out is noted in the fault record,
the kernel goes on without that peer's part, and the host raises WaitTimeout at its next barrier.

The same bodies serve Triton's DeviceContext (rank and world constexprs: the loops over ranks unroll)
and Gluon's IrisDeviceCtx (rank and world read from the context tensor when the kernel runs: the
same steps in run-time loops; iris/gluon_tiles.py compiles them as Gluon).

Every dtype of the host collectives (float32, bfloat16, float16, int32, int64) works; atomic adds of
bfloat16 compile on GPUs only (Triton's interpreter has no bfloat16 atomic add). Peers are reached
through iris's load, store, atomics and wait, so a job with indirect peers (NVSHMEM) takes their
indirect path with no change here.
"""
import triton
import triton.language as tl

from .aggregate import aggregate
from .atomics import atomic_add, atomic_cas, atomic_xchg
from .faults import TILE_LOCK, _gave_up, _spin_limit
from .near import _relax
from .rma import load, store
from .sync import wait


@aggregate
class Ranks:
    """This rank and the world size (constexprs) and heap_bases (ctx.get_heap_bases()): the part of a
    DeviceContext the tile collectives use."""
    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor

    @triton.constexpr_function
    def __init__(self, rank, world_size, heap_bases):
        self.rank = tl.constexpr(rank)
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases


@triton.jit
def _widen(x):
    """x in the type its sum is taken in: float32 for 16-bit floats, its own type otherwise."""
    if x.dtype == tl.float16 or x.dtype == tl.bfloat16:
        out = x.to(tl.float32)
    else:
        out = x
    return out


@triton.jit
def _tile_id(tile, view):
    """The tile's index in row-major tile order over view: what locks are indexed by."""
    return tile.pid_m * tl.cdiv(view.N, tile.block_n) + tile.pid_n


@triton.constexpr_function
def _unrolled(world):
    # Triton's DeviceContext and Ranks hold the world size as a compile-time int: the loops over ranks
    # unroll, so one peer's loads are in flight while the next is read. Gluon's IrisDeviceCtx reads it
    # when the kernel runs: there the same steps run in a loop.
    return isinstance(world, int)


@triton.jit
def _part(ctx, r, src, mask, locks, tile_id, WAIT: tl.constexpr):
    """Rank r's tile at src (after its locks[tile_id] reads 1 where WAIT), widened."""
    if WAIT:
        wait(locks + tile_id, 1, ctx.rank, r, ctx.heap_bases, "eq", "acquire", "sys")
        tl.debug_barrier()  # every thread's loads below come after the acquire
    return _widen(load(src, ctx.rank, r, ctx.heap_bases, mask=mask, other=0))


@triton.jit
def _term(ctx, r, own, src, mask, locks, tile_id, WAIT: tl.constexpr):
    """Rank r's term of the sum: this rank's own values (as src's dtype, what its peers read) where it
    holds them, else r's tile read from src."""
    if own is None:
        part = _part(ctx, r, src, mask, locks, tile_id, WAIT)
    elif r == ctx.rank:
        part = _widen(own.to(src.dtype.element_ty))
    else:
        part = _part(ctx, r, src, mask, locks, tile_id, WAIT)
    return part


@triton.jit
def _sum(ctx, own, src, mask, locks, tile_id, WAIT: tl.constexpr):
    """Every rank's tile at src (this rank's from own, the values it holds; own None: read src too)
    summed in rank order. WAIT: first wait for each peer's locks[tile_id] to read 1."""
    acc = _term(ctx, 0, own, src, mask, locks, tile_id, WAIT)
    if _unrolled(ctx.world_size):
        for r in tl.static_range(1, ctx.world_size):
            acc = acc + _term(ctx, r, own, src, mask, locks, tile_id, WAIT)
    else:
        for r in range(1, ctx.world_size):
            acc = acc + _term(ctx, r, own, src, mask, locks, tile_id, WAIT)
    return acc


@triton.jit
def _into(ctx, OP: tl.constexpr, r, ptrs, data, mask, locks, tile_id):
    """data into rank r's memory at ptrs: OP "add" (an atomic add), "locked_add" (read, add, write under
    r's locks[tile_id]) or "store"."""
    if OP == "add":
        atomic_add(ptrs, data, ctx.rank, r, ctx.heap_bases, mask=mask, sem="relaxed", scope="sys")
    elif OP == "locked_add":
        limit = _spin_limit(ctx.heap_bases)
        held = atomic_cas(locks + tile_id, 0, 1, ctx.rank, r, ctx.heap_bases, "acquire", "sys")
        go = held != 0
        polls = 1
        while go:  # a scalar loop-carried condition
            _relax()
            held = atomic_cas(locks + tile_id, 0, 1, ctx.rank, r, ctx.heap_bases, "acquire", "sys")
            go = held != 0
            polls += 1
            stop = go & (limit != 0) & (polls >= limit)
            if stop:  # the lock was never free within the spin limit: noted, and this rank's add is skipped
                _gave_up(ctx.heap_bases, TILE_LOCK, locks + tile_id, ctx.rank, r, -1, 0, held, "eq")
            go = go & (stop == 0)
        if held == 0:
            tl.debug_barrier()  # the whole program reads after the lock is taken ...
            cur = load(ptrs, ctx.rank, r, ctx.heap_bases, mask=mask, other=0)
            store(ptrs, (_widen(cur) + _widen(data)).to(ptrs.dtype.element_ty), ctx.rank, r, ctx.heap_bases,
                  mask=mask)
            tl.debug_barrier()  # ... and has written before it is released
            atomic_xchg(locks + tile_id, 0, ctx.rank, r, ctx.heap_bases, sem="release", scope="sys")
    else:
        store(ptrs, data, ctx.rank, r, ctx.heap_bases, mask=mask)


@triton.jit
def _into_every_rank(ctx, OP: tl.constexpr, ptrs, data, mask, locks, tile_id):
    """_into every rank, this rank first and then the next ones, so the ranks' writes spread over targets."""
    if _unrolled(ctx.world_size):
        for i in tl.static_range(ctx.world_size):
            _into(ctx, OP, (ctx.rank + i) % ctx.world_size, ptrs, data, mask, locks, tile_id)
    else:
        for i in range(ctx.world_size):
            _into(ctx, OP, (ctx.rank + i) % ctx.world_size, ptrs, data, mask, locks, tile_id)


@triton.jit
def all_reduce_atomic(ctx, tile, dst_view):
    """Adds tile.data into dst_view's tile on every rank with atomic adds (relaxed, sys scope).

    dst must be zero on every rank before any rank adds; the sum is complete after every rank's
    kernel has finished. Dtypes: those of iris.atomic_add (bfloat16 on GPUs only)."""
    ptrs, mask = dst_view.tile_ptr(tile)
    _into_every_rank(ctx, "add", ptrs, tile.data, mask, None, 0)


@triton.jit
def all_reduce_spinlock(ctx, tile, dst_view, locks):
    """Adds tile.data into dst_view's tile on every rank under that rank's lock locks[tile_id]
    (int32, zero when free): take it (compare-and-swap 0 -> 1, acquire, sys), read, add, write,
    release it (exchange to 0, release, sys). Any dtype; dst starts at zero on every rank, and the
    sum is complete after every rank's kernel has finished. Locks are free again afterwards."""
    ptrs, mask = dst_view.tile_ptr(tile)
    _into_every_rank(ctx, "locked_add", ptrs, tile.data, mask, locks, _tile_id(tile, dst_view))


@triton.jit
def all_reduce_one_shot(ctx, tile, src_view, dst_view, locks):
    """Writes the sum of every rank's tile into this rank's dst_view: waits for each peer's
    locks[tile_id] to read 1 and reads its tile from src_view; this rank's part is tile.data."""
    src, mask = src_view.tile_ptr(tile)
    dst, dst_mask = dst_view.tile_ptr(tile)
    acc = _sum(ctx, tile.data, src, mask, locks, _tile_id(tile, dst_view), True)
    tl.store(dst, acc.to(dst.dtype.element_ty), mask=dst_mask)


@triton.jit
def all_reduce_two_shot(ctx, tile, src_view, dst_view, locks):
    """The tile's owner (tile_id % world_size) sums every rank's tile as one-shot does and writes it
    into dst_view on every rank; the other ranks only publish (their caller set their lock)."""
    tile_id = _tile_id(tile, dst_view)
    if tile_id % ctx.world_size == ctx.rank:
        src, mask = src_view.tile_ptr(tile)
        dst, dst_mask = dst_view.tile_ptr(tile)
        out = _sum(ctx, tile.data, src, mask, locks, tile_id, True).to(dst.dtype.element_ty)
        _into_every_rank(ctx, "store", dst, out, dst_mask, None, 0)


@triton.jit
def all_reduce_ring(ctx, tile, src_view, dst_view):
    """Writes the sum of every rank's src_view tile into this rank's dst_view. No flags: src must be
    complete on every rank before the kernel starts. tile: a Tile or TileView (its data is unused)."""
    src, mask = src_view.tile_ptr(tile)
    dst, dst_mask = dst_view.tile_ptr(tile)
    acc = _sum(ctx, None, src, mask, None, 0, False)
    tl.store(dst, acc.to(dst.dtype.element_ty), mask=dst_mask)


@triton.jit
def reduce_scatter(ctx, tile, src_view, dst_view, locks):
    """Tiles are owned in contiguous runs: rank r owns tile ids [r*T//w, (r+1)*T//w) of the T tiles
    of dst_view (the last rank also the remainder). The owner waits for each peer's lock, sums every
    rank's tile (its own from tile.data) and writes it into its own dst_view; other ranks only publish."""
    tile_id = _tile_id(tile, dst_view)
    per_rank = dst_view.number_of_tiles(tile.block_m, tile.block_n) // ctx.world_size
    first = per_rank * ctx.rank
    if ctx.rank == ctx.world_size - 1:
        owned = tile_id >= first
    else:
        owned = (tile_id >= first) & (tile_id < first + per_rank)
    if owned:
        src, mask = src_view.tile_ptr(tile)
        dst, dst_mask = dst_view.tile_ptr(tile)
        acc = _sum(ctx, tile.data, src, mask, locks, tile_id, True)
        tl.store(dst, acc.to(dst.dtype.element_ty), mask=dst_mask)


@triton.jit
def all_gather(ctx, tile, dst_view, dim: tl.constexpr):
    """Stores this rank's tile into its part of dst_view on every rank: dst_view is the gathered
    tensor (world*M x N for dim 0, M x world*N for dim 1) and this rank's part starts at row (dim 0)
    or column (dim 1) rank * M (or N). The tile is masked to the local M x N, so edge tiles never
    write into the next rank's part."""
    tl.static_assert(dim == 0 or dim == 1, "all_gather: dim must be 0 (rows) or 1 (columns)")
    rows, cols = tile.indices()
    if dim == 0:
        local_m = dst_view.M // ctx.world_size
        mine = (rows[:, None] < local_m) & (cols[None, :] < dst_view.N)
        ptrs, mask = dst_view.tile_ptr_from_indices(rows + local_m * ctx.rank, cols)
    else:
        local_n = dst_view.N // ctx.world_size
        mine = (rows[:, None] < dst_view.M) & (cols[None, :] < local_n)
        ptrs, mask = dst_view.tile_ptr_from_indices(rows, cols + local_n * ctx.rank)
    _into_every_rank(ctx, "store", ptrs, tile.data, mine & mask, None, 0)


@triton.jit
def gather(ctx, tile, src_view, source_rank, hint: tl.constexpr = None):
    """source_rank's values of the tile in src_view (0 outside the view); hint: as iris.load's."""
    ptrs, mask = src_view.tile_ptr(tile)
    return load(ptrs, ctx.rank, source_rank, ctx.heap_bases, mask=mask, other=0, hint=hint)


@triton.jit
def _chunk_from(ctx, s, first, last, owner, src, dst, mask):
    """all_to_all's columns of dst owned by rank s (owner == s), read from s's src, where the tile
    holds any (first <= s <= last)."""
    if (s >= first) & (s <= last):
        mask = mask & (owner[None, :] == s)
        tl.store(dst, load(src, ctx.rank, s, ctx.heap_bases, mask=mask), mask=mask)


@triton.jit
def all_to_all(ctx, tile, src_view, dst_view, n_per_rank):
    """Fills this rank's dst_view tile from the peers: columns [s*n_per_rank, (s+1)*n_per_rank) of
    dst come from rank s's src columns [rank*n_per_rank, (rank+1)*n_per_rank). Both views are
    M x world*n_per_rank; src must be complete on every rank before the kernel starts."""
    rows, cols = tile.indices()
    dst, dst_mask = dst_view.tile_ptr(tile)
    owner = cols // n_per_rank
    # tensors lead these products: the interpreter wraps constexpr * tensor in a constexpr
    src, src_mask = src_view.tile_ptr_from_indices(rows, cols - owner * n_per_rank + n_per_rank * ctx.rank)
    first = (tile.pid_n * tile.block_n) // n_per_rank
    last = (tile.pid_n * tile.block_n + tile.block_n - 1) // n_per_rank
    if _unrolled(ctx.world_size):
        for s in tl.static_range(ctx.world_size):
            _chunk_from(ctx, s, first, last, owner, src, dst, dst_mask & src_mask)
    else:
        for s in range(ctx.world_size):
            _chunk_from(ctx, s, first, last, owner, src, dst, dst_mask & src_mask)
