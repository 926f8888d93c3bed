"""Lifetimes: which heap blocks still have tensors, and when a freed block may be handed out again.

Each tensor the heap makes owns an Owner through its storage (see views.py); when the last
storage over a block goes, the block is queued on this rank. Queues are compared at collective
points (growth, barrier, trim, close, ctx.collect()): a block is freed when it is queued on every
rank, all ranks in one order, so offsets never depend on when Python collected garbage.
A freed block (by ctx.free, scope() or that agreement) goes back to the pool at once, so the next
request of its size takes it, at the same offset on every rank. That allocation is made safe in
stream order, not by a collective: each free passes an epoch that every rank writes to its
progress counter after the work it queued before the free, and reusing a block freed at epoch n
makes the current stream wait for every peer's counter to reach n (progress.py); with indirect
peers (NVSHMEM only), whose counters cannot be read here, a freed block waits instead for the next
point where every rank synced its device. ctx.free keeps a tensor over the freed block, carrying
its Owner, for the next request of that shape and dtype (free_tensor). Imported memory
(as_symmetric) is unmapped, not reused: a freed import's region is queued like garbage once its
last tensor goes (negative serials, in the order the regions were freed), and unmapped only when
the point it was agreed at has completed on every rank (an event per point).
A block freed explicitly while a tensor still covers it stays mapped (trim skips it) until that
tensor goes; after close the mappings stay until the last tensor goes.
"""
from __future__ import annotations

from typing import Dict, List

import torch

from ..errors import IrisError


class FreedTensor(torch.Tensor):
    """What a heap tensor becomes once ctx.free gave its block back: every use raises."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        raise IrisError(f"{name} on a heap tensor that ctx.free gave back: its block may hold another tensor now. "
                        "Allocate a new tensor (or free this one later)")


_DEAD = {}  # (dtype, device) -> an empty tensor whose storage a freed tensor takes over


def detach(t: torch.Tensor, dead: torch.Tensor | None = None) -> bool:
    """Make t reach no memory: its storage becomes an empty one (dead: one of t's dtype and device,
    if the caller has it) so the block's owner can go, and every later use raises. False where t is
    part of an autograd graph: it keeps its storage (the block is still given back)."""
    if dead is None:
        key = (t.dtype, t.device)
        dead = _DEAD.get(key)
        if dead is None:
            dead = _DEAD[key] = torch.empty(0, dtype=t.dtype, device=t.device)
    try:
        t.data = dead
        t.__class__ = FreedTensor
    except RuntimeError:
        return False
    return True


class Block:
    """One allocation, from allocate to its release."""

    __slots__ = ("offset", "nbytes", "serial", "tensors", "freed")
    gc, region = True, None  # garbage collection frees it; not imported memory (see ImportBlock)

    def __init__(self, offset: int, nbytes: int, serial: int):
        self.offset, self.nbytes, self.serial, self.tensors, self.freed = offset, nbytes, serial, 0, False


class ImportBlock(Block):
    """An imported tensor's block (as_symmetric): only ctx.free gives it back, with its region."""

    __slots__ = ("gc", "region")

    def __init__(self, offset: int, nbytes: int, region):
        super().__init__(offset, nbytes, -1)
        self.gc, self.region = False, region


class Owner:
    """Lives as long as one tensor storage over a block; counts itself in and out. On GPUs it also
    carries the CUDA array interface its tensor was made from (views.carried_tensor_at)."""

    __slots__ = ("heap", "block", "__cuda_array_interface__")

    def __init__(self, heap, block: Block):
        self.heap, self.block = heap, block
        block.tensors += 1  # heap.owner_added(block), inline: one per allocation
        heap._alive += 1

    def __del__(self):
        try:
            self.heap.owner_gone(self.block)
        except Exception:  # interpreter shutdown: nothing left to tell
            pass


class Lifetimes:
    """The SymmetricHeap's part that tracks blocks, their tensors, the garbage queue and freed blocks
    waiting for the work queued before their free."""

    def _init_lifetimes(self) -> None:
        self._serial = 0                      # collective allocations so far: the same on every rank
        self._at: Dict[int, Block] = {}       # offset -> live block made by allocate, in allocation order
        self._queued: Dict[int, Block] = {}   # serial -> block whose last tensor died here
        self._pinned: Dict[int, Block] = {}   # serial -> freed block that tensors still cover
        self._alive = 0                       # owners alive, over every block (and peer views)
        self._teardown_pending = False
        self._freed: list = []                # import regions freed since the last collective point, in free order
        self._waiting: Dict[int, list] = {}   # point -> import regions freed before it or agreed there
        self._points = 0                      # collective points passed: the same count on every rank
        self._events: list = []               # (point, event recorded there on the current stream), oldest first
        self._fence: Dict[int, int] = {}      # offset of a freed block in the pool -> its free's epoch, until passed
        self.progress = None                  # the progress counters (use_counters)
        self._dead: Dict[torch.dtype, torch.Tensor] = {}  # dtype -> an empty tensor freed tensors are detached to
        self._kept: Dict[int, tuple] = {}     # offset of a block ctx.free gave back -> (block, tensor, shape, dtype)
        self._parked = None                   # with indirect peers: offsets freed since the last synced point
        self._scopes: List[list] = []         # per open scope, weak references to the tensors handed out in it
        self._track = None                    # the innermost scope's list.append, or None outside scopes

    def use_counters(self, counters: torch.Tensor, park: bool = False) -> None:
        """Reuse in stream order from now on: counters is a zeroed heap tensor of at least 8 bytes at
        the same offset on every rank, which only the heap writes. park: some rank of the job has an
        indirect peer, whose progress it cannot read (see _parked); every rank must be told alike, as
        a rank that reuses at once where another parks would hand out other offsets."""
        from .progress import make_progress
        self.progress = make_progress(self.driver, self.bases, counters.data_ptr() - self._base, self.rank,
                                      self.device)
        if park:
            self._parked = []

    def owner_added(self, block: Block) -> None:
        """A tensor storage over block was made (Owner)."""
        block.tensors += 1
        self._alive += 1

    def owner_gone(self, block: Block) -> None:
        """A tensor storage over block went: queue the block as garbage once none is left. Only
        bookkeeping (no driver call, no collective), as it may run anywhere Python drops a tensor."""
        block.tensors -= 1
        self._alive -= 1
        if not block.tensors:
            if block.freed:
                self._pinned.pop(block.serial, None)
                if block.region is not None:
                    self.imports.region_unused(block.region)
            elif block.gc and not self.closed:
                self._queued[block.serial] = block
        if self._teardown_pending and not self._alive:
            self._teardown_pending = False
            self._teardown()

    def _point(self, sync=None):
        """This rank's part of a collective point: (its garbage queue, the last point whose work has
        finished here). Blocks freed since the last point now wait under this one; on GPUs an event
        recorded here on the current stream marks the work queued before them. sync: a stream, or
        True for the whole device, to wait for first (then that work is known to have finished)."""
        if self.progress is not None and self.progress.failed is not None:
            self.progress.raise_failed()
        self._points = point = self._points + 1
        if self._capturable:  # a GPU
            if torch.cuda.is_current_stream_capturing():  # no event may be recorded or queried in capture
                return sorted(self._queued), (self._events[0][0] if self._events else point) - 1
            if self._freed or self._waiting or self._queued:
                event = torch.cuda.Event()
                event.record()
                self._events.append((point, event))
            if sync is True:
                torch.cuda.synchronize(self.device)
            elif sync is not None:
                sync.synchronize()
            while self._events and self._events[0][1].query():
                del self._events[0]
        if self._freed:
            self._waiting[point], self._freed = self._freed, []
        return sorted(self._queued), (self._events[0][0] - 1 if self._events else point)

    def _release_agreed(self, states, synced: bool = False) -> int:
        """Free the blocks queued on every rank (states: each rank's _point()), in serial order (one
        epoch for them all), and unmap the import regions that wait under a point every rank has
        finished; returns the bytes freed and unmapped. synced: every rank waited for its device
        before the point, so every free before it has passed (on the host, every point is so).
        Every rank computes the same from the same lists."""
        queues = [s[0] for s in states]
        common = set(queues[0]).intersection(*queues[1:]) if queues else set()
        epoch, released = None, 0
        for serial in sorted(common):
            block = self._queued.pop(serial)
            if serial < 0:
                self._freed.append(block)  # an import region
            else:
                if epoch is None:
                    epoch = self.progress.passed()
                released += self.free_block(block, epoch)
        self._stats["collected"] += len(common)
        if (synced or not self._capturable) and self.progress is not None:
            self.progress.synced()
            self._fence.clear()
            if self._parked:  # every rank, indirect peers included, finished its work before the point
                for offset in self._parked:
                    self._release(offset)
                self._parked.clear()
        if self._freed:  # queued before this point on every rank: the event recorded here covers them
            self._waiting.setdefault(self._points, []).extend(self._freed)
            self._freed = []
        done = min(s[1] for s in states)
        for point in [p for p in self._waiting if p <= done]:  # oldest first: dicts keep insertion order
            for region in self._waiting.pop(point):
                released += region.nbytes
                self.imports.release_region(region)
        return released

    def free_block(self, block: Block, epoch: int = 0) -> int:
        """Take a live block made by allocate out of use (freed explicitly or agreed garbage) and give
        it back to the pool now; the allocation that takes it again waits, in stream order, for every
        rank's work queued before this free (epoch: the free's, if already passed). Returns its size.
        Collective: all ranks, same order."""
        self._give_back(block, epoch or self.progress.passed())  # first: during capture it raises, nothing changed
        if block.tensors:  # freed while referenced (queued blocks have none)
            self._pinned[block.serial] = block
        else:
            self._queued.pop(block.serial, None)
        if self._kept:
            self._kept.pop(block.offset, None)  # an older block's tensor there must not serve this one's reuse
        return block.nbytes

    def free_tensor(self, t: torch.Tensor) -> bool:
        """ctx.free's usual call in one step: t (a plain torch.Tensor) is the whole live block it
        starts, made by allocate and not a copied import. Frees the block, detaches t and returns True;
        False, with nothing done, where the caller must look closer. Collective: all ranks, same order.

        Where t's storage is the block's only one and t is contiguous, a new tensor over that storage
        (t.detach(), before t is detached) is kept with the block: the next request of t's shape and
        dtype that the pool hands this block to gets it, with the block's Owner, instead of a new view
        (benchmarks/alloc_cost.py --reuse). Only this rank's tensors change: offsets do not."""
        offset = t.data_ptr() - self._base  # addresses are unique in a process: no device check
        block = self._at.get(offset)
        nbytes = t.nbytes
        if block is None or block.nbytes != nbytes or not nbytes or offset in self._copied_imports:
            return False
        self._give_back(block, self.progress.passed())  # first: during capture it raises, nothing changed
        dtype = t.dtype
        dead = self._dead.get(dtype)
        if dead is None:
            dead = self._dead[dtype] = torch.empty(0, dtype=dtype, device=self.device)
        kept = t.detach() if block.tensors == 1 and t.is_contiguous() else None
        shape = t.shape
        if not detach(t, dead):
            kept = None
        if kept is not None:
            self._kept[offset] = (block, kept, shape, dtype)
        else:
            if block.tensors:  # freed while referenced
                self._pinned[block.serial] = block
            if self._kept:
                self._kept.pop(offset, None)
        return True

    def _give_back(self, block: Block, epoch: int) -> None:
        """The part of every free of a block made by allocate: out of the live blocks, back to the pool
        (or parked until a synced point, with indirect peers), and into the symmetry digest."""
        offset = block.offset
        del self._at[offset]
        block.freed = True
        if epoch > self.progress.done:  # alone, every free is passed at once: its reuse needs no wait
            self._fence[offset] = epoch
        if self._parked is None:
            self._release(offset)
        else:
            self._parked.append(offset)
        self._record(~offset)  # the symmetry digest's record of free(offset)
        self._frees += 1

    def _drop_kept(self) -> None:
        """Let go of the tensors kept with freed blocks (before the pool's free blocks are looked at
        as a whole: a miss, trim, close). A block whose tensor the user still views stays pinned."""
        if self._kept:
            kept, self._kept = self._kept, {}
            blocks = [entry[0] for entry in kept.values()]
            kept.clear()  # their owners go here, unless the user still holds views of the tensors
            for block in blocks:
                if block.tensors and block.freed:
                    self._pinned[block.serial] = block

    def _reused(self, offset: int, nbytes: int) -> None:
        """The pool handed out offset: the current stream waits for the peers' work before its free."""
        epoch = self._fence.pop(offset, 0)
        if epoch > self.progress.done:
            self.progress.wait(epoch, offset, nbytes)

    def _fresh(self, offset: int, nbytes: int) -> None:
        """The policy handed out offset, maybe over several freed blocks merged: wait for all of them."""
        if self._fence:
            epoch = max(self._fence.values())
            self._fence.clear()
            if epoch > self.progress.done:
                self.progress.wait(epoch, offset, nbytes)

    def collect(self, what: str = "collect") -> int:
        """Wait for this rank's device work, then free blocks whose last tensor died on every rank and
        unmap the import regions freed before; returns the regions' bytes. Collective: all ranks."""
        return self._release_agreed(self.group.allgather(self._point(True), what), synced=True)

    def next_serial(self) -> int:
        """The serial the next allocation gets: a mark for offsets_since."""
        return self._serial + 1

    def offsets_since(self, mark: int) -> List[int]:
        """Offsets of live blocks allocated at or after serial mark, in allocation order."""
        out = []
        for block in reversed(self._at.values()):  # a dict keeps insertion order: allocation order here
            if block.serial < mark:
                break
            out.append(block.offset)
        return out[::-1]

    def open_scope(self):
        """Start a scope (ctx.scope): returns its mark for close_scope. From now on, until it closes,
        the tensors new_tensor hands out are remembered weakly."""
        held = []
        self._scopes.append(held)
        self._track = held.append
        return self.next_serial(), held

    def close_scope(self, mark) -> None:
        """Free every block allocated since the scope opened that is still live, in allocation order.
        A tensor handed out for one that is still alive is detached as ctx.free detaches (any use
        raises); views made of it still reach the block, as after ctx.free. Collective: all ranks."""
        serial, held = mark
        scopes = self._scopes
        if scopes and scopes[-1] is held:
            scopes.pop()
        else:  # scopes closed out of order
            for i in range(len(scopes) - 1, -1, -1):
                if scopes[i] is held:
                    del scopes[i]
                    break
        self._track = scopes[-1].append if scopes else None
        handed = {}
        for r in held:
            t = r()
            if t is not None and type(t) is torch.Tensor:
                handed[t.data_ptr() - self._base] = t
        held.clear()
        for offset in self.offsets_since(serial):
            t = handed.get(offset) if handed else None
            if t is None or not self.free_tensor(t):  # no tensor left, or one free_tensor leaves (an import)
                self.free(offset)

    def pinned_ranges(self):
        """(offset, nbytes) of freed blocks that a tensor still covers: trim leaves them mapped."""
        return [(b.offset, b.nbytes) for b in self._pinned.values()]
