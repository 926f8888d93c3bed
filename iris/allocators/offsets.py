"""Offset policy: which offset a request gets and how frees coalesce. Pure arithmetic, no driver.

Best fit, lowest address first among blocks of the same length: deterministic (the same calls give
the same offsets on every rank), and a request takes the low end of its block, so a fresh heap
fills from the bottom and high chunks stay free for trim. Free blocks are indexed by
(length, start) in SortedInts, and by start and by end in dicts: a request and a free cost a
few bisections whatever the heap's state, and neighbours coalesce on free in O(1) lookups.
"""
from __future__ import annotations

from heapq import heappop, heappush
from typing import Dict, Iterator, List, Optional, Tuple

from .sorted_ints import SortedInts


def round_up(value: int, align: int) -> int:
    return -(-value // align) * align


class Offsets:
    """Hands out [offset, offset + size) ranges of a space of `capacity` bytes."""

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._shift = capacity.bit_length()      # a size key is length << shift | start
        self._mask = (1 << self._shift) - 1
        self._length: Dict[int, int] = {}         # free block start -> length
        self._start_of_end: Dict[int, int] = {}   # free block end -> start
        self._by_size = SortedInts()
        self.live: Dict[int, int] = {}            # offset -> size of every allocated block
        self.free_bytes = capacity
        self._add(0, capacity)

    def largest_free(self) -> int:
        key = self._by_size.last()
        return 0 if key is None else key >> self._shift

    def allocate(self, size: int, align: int = 1, top: bool = False) -> Optional[int]:
        """The aligned offset of the smallest free block with room for size bytes (the lowest such
        block among equals; with top, the highest block that fits, at its top), or None."""
        if size <= 0 or align <= 0 or align & (align - 1):
            raise ValueError(f"size must be positive and align a power of two, got size={size} align={align}")
        if top:
            return self._allocate_top(size, align)
        shift, mask = self._shift, self._mask
        key = self._by_size.ceil(size << shift)
        if key is None:
            return None
        start, length = key & mask, key >> shift
        at = (start + align - 1) & -align
        if at + size > start + length:  # alignment padding: look further (only blocks shorter than size + align)
            for key in self._by_size.irange(key + 1):
                start, length = key & mask, key >> shift
                at = (start + align - 1) & -align
                if at + size <= start + length:
                    break
            else:
                return None
        if at == start and size < length:  # the usual case: the low end of a longer block
            rest = at + size
            del self._length[start]
            self._length[rest] = length - size
            self._start_of_end[start + length] = rest
            self._by_size.replace(key, (length - size) << shift | rest)
            self.live[at] = size
            self.free_bytes -= size
        else:
            self._take(start, length, at, size)
        return at

    def _allocate_top(self, size: int, align: int) -> Optional[int]:
        """Rare (imports): a scan of the blocks long enough."""
        best = None
        for start, length in self.free_at_least(size):
            at = (start + length - size) & -align
            if at >= start and (best is None or start > best[0]):
                best = start, length, at
        if best is None:
            return None
        self._take(best[0], best[1], best[2], size)
        return best[2]

    def _take(self, start: int, length: int, at: int, size: int) -> None:
        self._remove(start, length)
        if at > start:
            self._add(start, at - start)
        if at + size < start + length:
            self._add(at + size, start + length - at - size)
        self.live[at] = size
        self.free_bytes -= size

    def free(self, offset: int) -> int:
        """Give back the block that starts at offset; returns its size."""
        size = self.live.pop(offset, None)
        if size is None:
            raise ValueError(f"offset {offset} is not the start of a live allocation")
        self.free_bytes += size
        self._coalesce(offset, size)
        return size

    def _coalesce(self, start: int, size: int) -> None:
        """Index [start, start + size) as free, joined with free neighbours."""
        end = start + size
        right = self._length.get(end)
        if right is not None and start not in self._start_of_end:  # the usual case: it joins the block above
            del self._length[end]
            self._length[start] = size + right
            self._start_of_end[end + right] = start
            shift = self._shift
            self._by_size.replace(right << shift | end, (size + right) << shift | start)
            return
        if right is not None:
            self._remove(end, right)
            end += right
        left = self._start_of_end.get(start)
        if left is not None:
            self._remove(left, start - left)
            start = left
        self._add(start, end - start)

    def free_at_least(self, length: int) -> Iterator[Tuple[int, int]]:
        """(start, length) of every free block of at least length bytes."""
        for key in self._by_size.irange(length << self._shift):
            yield key & self._mask, key >> self._shift

    def free_blocks(self) -> List[Tuple[int, int]]:
        """(start, length) of every free block, in address order."""
        return sorted(self._length.items())

    def _add(self, start: int, length: int) -> None:
        self._length[start] = length
        self._start_of_end[start + length] = start
        self._by_size.add(length << self._shift | start)

    def _remove(self, start: int, length: int) -> None:
        del self._length[start], self._start_of_end[start + length]
        self._by_size.remove(length << self._shift | start)


class CachingOffsets(Offsets):
    """Offsets with torch's caching habit in front: a freed block is kept whole under its exact size,
    and the next request of that size takes the lowest such block (a heap per size: O(log k) in C,
    and the heap still fills from the bottom). A request of a size with nothing cached first gives
    every cached block back to the policy (so it coalesces, and no request takes fresh space while
    freed memory sits in the cache); so does every query of free space (trim's among them).
    Deterministic: the cache follows from the calls alone."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self._cache: Dict[int, List[int]] = {}  # size -> offsets of freed blocks of that size, a min-heap

    def allocate(self, size: int, align: int = 1, top: bool = False) -> Optional[int]:
        cached = self._cache.get(size)
        if cached and not top and not cached[0] & (align - 1) and align > 0 and not align & (align - 1):
            return self.reuse(size)
        self.flush()
        return super().allocate(size, align, top)

    def reuse(self, size: int) -> Optional[int]:
        """The lowest cached block of exactly size bytes, taken, or None: the allocation fast path of a
        caller whose requests share one alignment (a cached block starts where such a request did)."""
        cached = self._cache.get(size)
        if not cached:
            return None
        at = heappop(cached)
        self.live[at] = size
        self.free_bytes -= size
        return at

    free_now = Offsets.free  # free and coalesce at once: for memory that may not stay backed (undone growth)

    def free(self, offset: int) -> int:
        size = self.live.pop(offset, None)
        if size is None:
            raise ValueError(f"offset {offset} is not the start of a live allocation")
        self.free_bytes += size
        cached = self._cache.get(size)
        if cached is None:
            self._cache[size] = [offset]
        else:
            heappush(cached, offset)
        return size

    def flush(self) -> None:
        """Give every cached block back to the policy (the order does not matter: free blocks end
        up the same maximal runs whatever order they coalesce in)."""
        if self._cache:
            cache, self._cache = self._cache, {}
            for size, offsets in cache.items():
                for offset in offsets:
                    self._coalesce(offset, size)

    def largest_free(self) -> int:
        self.flush()
        return super().largest_free()

    def free_at_least(self, length: int) -> Iterator[Tuple[int, int]]:
        self.flush()
        return super().free_at_least(length)

    def free_blocks(self) -> List[Tuple[int, int]]:
        self.flush()
        return super().free_blocks()
