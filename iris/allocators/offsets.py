"""Offset policy: which offset a request gets and how frees coalesce. Pure arithmetic, no driver.

First fit from the lowest address over an address-ordered free list: deterministic (the same
calls give the same offsets on every rank), compact at the bottom so high chunks can be trimmed,
and neighbours coalesce on free.
"""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple


def round_up(value: int, align: int) -> int:
    return -(-value // align) * align


class Offsets:
    """Hands out [offset, offset + size) ranges of a space of `capacity` bytes."""

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._starts: List[int] = [0]       # free blocks, address order
        self._sizes: List[int] = [capacity]
        self.live: Dict[int, int] = {}      # offset -> size of every allocated block

    @property
    def free_bytes(self) -> int:
        return sum(self._sizes)

    def largest_free(self) -> int:
        return max(self._sizes, default=0)

    def allocate(self, size: int, align: int = 1, top: bool = False) -> Optional[int]:
        """The lowest (or with top, the highest) aligned offset with room for size bytes, or None."""
        if size <= 0 or align <= 0 or align & (align - 1):
            raise ValueError(f"size must be positive and align a power of two, got size={size} align={align}")
        order = range(len(self._starts) - 1, -1, -1) if top else range(len(self._starts))
        for i in order:
            start, length = self._starts[i], self._sizes[i]
            at = (start + length - size) // align * align if top else round_up(start, align)
            if at < start or at + size > start + length:
                continue
            del self._starts[i], self._sizes[i]
            if at + size < start + length:
                self._insert(i, at + size, start + length - at - size)
            if at > start:
                self._insert(i, start, at - start)
            self.live[at] = size
            return at
        return None

    def free(self, offset: int) -> int:
        """Give back the block that starts at offset; returns its size."""
        size = self.live.pop(offset, None)
        if size is None:
            raise ValueError(f"offset {offset} is not the start of a live allocation")
        i = bisect.bisect(self._starts, offset)
        start, end = offset, offset + size
        if i < len(self._starts) and self._starts[i] == end:          # merge the right neighbour
            end += self._sizes[i]
            del self._starts[i], self._sizes[i]
        if i > 0 and self._starts[i - 1] + self._sizes[i - 1] == start:  # merge the left neighbour
            i -= 1
            start = self._starts[i]
            del self._starts[i], self._sizes[i]
        self._insert(i, start, end - start)
        return size

    def is_free(self, start: int, end: int) -> bool:
        """Whether [start, end) lies inside one free block."""
        i = bisect.bisect(self._starts, start) - 1
        return i >= 0 and self._starts[i] + self._sizes[i] >= end

    def free_blocks(self) -> List[Tuple[int, int]]:
        return list(zip(self._starts, self._sizes))

    def _insert(self, i: int, start: int, size: int) -> None:
        self._starts.insert(i, start)
        self._sizes.insert(i, size)
