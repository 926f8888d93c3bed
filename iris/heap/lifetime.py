"""Lifetimes: which heap blocks still have tensors, and freeing the ones that died on every rank.

Each tensor the heap makes owns an Owner through its storage (see views.py); when the last
storage over a block goes, the block is queued on this rank. Queues are compared at collective
points (growth, barrier, trim, close, ctx.collect()): a block is released when it is queued on
every rank, all ranks in one order, so offsets never depend on when Python collected garbage.
A block freed explicitly while a tensor still covers it stays mapped (trim skips it) until that
tensor goes; after close the mappings stay until the last tensor goes. Memory imported by
as_symmetric is not the heap's to reuse while mapped, so a freed import's region is queued like
garbage once its last tensor goes (negative serials, in the order the regions were freed).
"""
from __future__ import annotations

from typing import Dict, List


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
        block.tensors += 1
        heap._alive += 1

    def __del__(self):
        """Only bookkeeping (no driver call, no collective), as it may run anywhere Python drops a
        tensor; written out here rather than in a heap method, a call less per tensor."""
        try:
            block, heap = self.block, self.heap
            block.tensors -= 1
            heap._alive -= 1
            if not block.tensors:
                if block.freed:
                    heap._pinned.pop(block.serial, None)
                    if block.region is not None:
                        heap._region_unused(block.region)
                elif block.gc and not heap.closed:
                    heap._queued[block.serial] = block
            if heap._teardown_pending and not heap._alive:
                heap._teardown_pending = False
                heap._teardown()
        except Exception:  # interpreter shutdown: nothing left to tell
            pass


class Lifetimes:
    """The SymmetricHeap's part that tracks blocks, their tensors and the garbage queue."""

    def _init_lifetimes(self) -> None:
        self._serial = 0                      # collective allocations so far: the same on every rank
        self._at: Dict[int, Block] = {}       # offset -> live block made by allocate, in allocation order
        self._queued: Dict[int, Block] = {}   # serial -> block whose last tensor died here
        self._pinned: Dict[int, Block] = {}   # serial -> freed block that tensors still cover
        self._alive = 0                       # owners alive, over every block (and peer views)
        self._regions_freed = 0               # import regions whose imports were all freed: -1, -2, ...
        self._teardown_pending = False

    def _queue(self) -> List[int]:
        return sorted(self._queued)

    def _release_agreed(self, queues) -> int:
        """Release the blocks queued on every rank (queues: each rank's list), in serial order;
        returns the bytes released. Every rank computes the same set from the same lists."""
        common = set(queues[0]).intersection(*queues[1:]) if queues else set()
        released = 0
        for serial in sorted(common):
            block = self._queued.pop(serial)
            released += block.nbytes
            if serial < 0:
                self._release_region(block)
            else:
                self.free_block(block)
        self._stats["collected"] += len(common)
        return released

    def free_block(self, block: Block) -> int:
        """Give a live block made by allocate back to the policy (freed explicitly or agreed garbage);
        returns its size. Collective: all ranks, same order."""
        offset = block.offset
        del self._at[offset]
        block.freed = True
        if block.tensors:  # freed while referenced (queued blocks have none)
            self._pinned[block.serial] = block
        else:
            self._queued.pop(block.serial, None)
        self._release(offset)
        self._record(~offset)  # the symmetry digest's record of free(offset)
        self._frees += 1
        return block.nbytes

    def collect(self, what: str = "collect") -> int:
        """Release blocks whose last tensor died on every rank; returns bytes released.
        Collective: all ranks."""
        return self._release_agreed(self.group.allgather(self._queue(), what))

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
