"""Lifetimes: which heap blocks still have tensors, and when a freed block may be handed out again.

Each tensor the heap makes owns an Owner through its storage (see views.py); when the last
storage over a block goes, the block is queued on this rank. Queues are compared at collective
points (growth, barrier, trim, close, ctx.collect()): a block is freed when it is queued on every
rank, all ranks in one order, so offsets never depend on when Python collected garbage.
A freed block (by ctx.free, scope() or that agreement) is not reused at once: a kernel that any
rank queued before the free may still read or write it, on this rank's memory or through a peer's
mapping. It waits under the collective point that follows the free, where each rank records an
event on its current stream, and goes back to the pool at the first point where every rank
reports that event complete (ranks agree on the same set; the host runs work synchronously, so
there every point completes at once). Imported memory (as_symmetric) goes the same way: a freed
import's region is queued like garbage once its last tensor goes (negative serials, in the order
the regions were freed), and unmapped only when the point it was agreed at has completed.
A block freed explicitly while a tensor still covers it stays mapped (trim skips it) until that
tensor goes; after close the mappings stay until the last tensor goes.
"""
from __future__ import annotations

from typing import Dict, List

import torch


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
        heap.owner_added(block)

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
        self._freed: list = []                # blocks freed since the last collective point, in free order
        self._waiting: Dict[int, list] = {}   # point -> blocks and regions freed before it or agreed there
        self._points = 0                      # collective points passed: the same count on every rank
        self._events: list = []               # (point, event recorded there on the current stream), oldest first

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

    def _release_agreed(self, states) -> int:
        """Free the blocks queued on every rank (states: each rank's _point()), in serial order, and
        give back to the pool whatever waits under a point that every rank has finished; returns the
        bytes given back. Every rank computes the same from the same lists."""
        queues = [s[0] for s in states]
        common = set(queues[0]).intersection(*queues[1:]) if queues else set()
        for serial in sorted(common):
            block = self._queued.pop(serial)
            if serial < 0:
                self._freed.append(block)  # an import region
            else:
                self.free_block(block)
        self._stats["collected"] += len(common)
        if self._freed:  # queued before this point on every rank: the event recorded here covers them
            self._waiting.setdefault(self._points, []).extend(self._freed)
            self._freed = []
        done, released = min(s[1] for s in states), 0
        for point in [p for p in self._waiting if p <= done]:  # oldest first: dicts keep insertion order
            for block in self._waiting.pop(point):
                released += block.nbytes
                if block.serial < 0:
                    self.imports.release_region(block)
                else:
                    self._release(block.offset)
        return released

    def free_block(self, block: Block) -> int:
        """Take a live block made by allocate out of use (freed explicitly or agreed garbage): it goes
        back to the pool once the work queued before this free has finished on every rank (see
        _point); returns its size. Collective: all ranks, same order."""
        offset = block.offset
        del self._at[offset]
        block.freed = True
        if block.tensors:  # freed while referenced (queued blocks have none)
            self._pinned[block.serial] = block
        else:
            self._queued.pop(block.serial, None)
        self._freed.append(block)
        self._record(~offset)  # the symmetry digest's record of free(offset)
        self._frees += 1
        return block.nbytes

    def collect(self, what: str = "collect") -> int:
        """Wait for this rank's device work, then free blocks whose last tensor died on every rank and
        give back to the pool every block freed before; returns bytes given back. Collective: all ranks."""
        return self._release_agreed(self.group.allgather(self._point(True), what))

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

    def pinned_ranges(self):
        """(offset, nbytes) of freed blocks that a tensor still covers: trim leaves them mapped."""
        return [(b.offset, b.nbytes) for b in self._pinned.values()]
