"""VMemAllocator: one large virtual reservation, physical segments created only when allocations need them."""
from __future__ import annotations

import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import DriverError, HeapOutOfMemory, user_stacklevel
from .offsets import CachingOffsets, round_up
from .sorted_ints import SortedInts

DEFAULT_CHUNK = 2 << 20


def always() -> bool:
    """may_grow where growth is always allowed (no CUDA graph capture to ask about)."""
    return True


@dataclass
class Segment:
    """Physical memory backing [offset, offset + size) of the heap."""

    offset: int
    size: int
    handle: Any
    foreign: bool = False  # memory someone else allocated, mapped here by as_symmetric


class VMemAllocator:
    """Policy over the Driver protocol: runs unchanged on CUDA, HIP and the host.

    heap_size may exceed device memory (oversubscription): only backed segments consume it.
    Allocation inside backed segments makes no driver call.
    """

    vmm = True
    one_host = True  # peers import chunks by fd: the context refuses a job spanning hosts
    name = "vmem"  # its key in ALLOCATORS
    reserved = 0  # bytes of size that iris keeps for itself, beyond the user's heap_size
    capacity = property(lambda self: self.size - self.reserved)

    def __init__(self, driver, heap_size: int, device=None, group=None, reserved: int = 0,
                 chunk_size: int = DEFAULT_CHUNK):
        self.driver, self.reserved = driver, reserved
        g = driver.granularity()
        self.chunk = self.granularity = round_up(max(chunk_size, g), g)  # sizes round up to it
        self.size = round_up(heap_size, self.chunk)
        if (heap_size - reserved) % self.chunk:  # the user's part
            warnings.warn(f"heap_size={heap_size - reserved} is not a multiple of the {self.chunk}-byte chunk of the "
                          f"{self.name} allocator: rounded up; the heap holds {self.size - reserved} bytes",
                          stacklevel=user_stacklevel())
        self.base = driver.reserve(self.size)
        self.offsets = CachingOffsets(self.size)
        self._policy = self.offsets.allocate
        self.free = self.offsets.free  # free(offset) -> size
        self.reuse = self.offsets.reuse  # reuse(size) -> offset of a freed, backed block of that size, or None
        self._segs: Dict[int, Segment] = {}   # offset -> segment
        self._seg_starts = SortedInts()       # their offsets, for lookups by bisection
        self.committed = 0
        self._last = (0, 0)  # [start, end) of the segment that backed the last request (a cache)

    @property
    def segments(self) -> List[Segment]:
        """Every backed segment, in address order."""
        return [self._segs[o] for o in self._seg_starts]

    def allocate(self, nbytes: int, align: int, may_grow=always) -> Tuple[Optional[int], Sequence[Segment]]:
        """The offset, and the segments created for it (the heap shares those with peers); (None, ())
        when the request would need new segments and may_grow() says no (asked only then)."""
        offset = self._policy(nbytes, align)
        if offset is None:
            raise HeapOutOfMemory(nbytes, self.offsets.free_bytes, self.capacity,
                                  f"The largest free block is {self.offsets.largest_free()} bytes. "
                                  "Free tensors with ctx.free(), or create the heap with a larger heap_size "
                                  "(a vmem heap may exceed device memory).")
        lo, hi = self._last
        if lo <= offset and offset + nbytes <= hi:  # the usual case: inside the segment the last request used
            return offset, ()
        holes = self._holes(offset, offset + nbytes)
        if not holes:
            return offset, ()
        if not may_grow():
            self.offsets.free_now(offset)
            return None, ()
        new: List[Segment] = []
        try:
            for lo, hi in holes:
                new.append(self._map_new(lo, hi - lo))
        except DriverError as e:
            self.undo(offset, new)
            if not e.oom:
                raise
            free, total = self.driver.mem_info()
            err = HeapOutOfMemory(nbytes, free, self.capacity,
                                  f"The device is out of memory: {self.committed} bytes committed by this heap, "
                                  f"{free} of {total} bytes free on the device. Free tensors and call ctx.trim().")
            err.during_growth = True
            raise err from e
        for seg in new:
            self._index(seg)
        return offset, new

    def undo(self, offset: int, new: List[Segment]) -> None:
        """Take back an allocation and the segments made for it (a peer could not grow, or an import's
        region is unmapped). Its block is not cached: reuse() hands out only backed memory."""
        self.offsets.free_now(offset)
        self.release(new)

    def _holes(self, start: int, end: int) -> List[Tuple[int, int]]:
        """The unbacked chunk-aligned runs of [start, end)."""
        start, end = start // self.chunk * self.chunk, round_up(end, self.chunk)
        at, below = start, self._seg_starts.floor(start)
        if below is not None:
            at = max(at, below + self._segs[below].size)
            if at >= end:
                self._last = below, at  # inside one backed segment: the next request likely is too
                return []
        holes = []
        for off in self._seg_starts.irange(at):
            if off >= end:
                break
            if off > at:
                holes.append((at, off))
            at = max(at, off + self._segs[off].size)
        if at < end:
            holes.append((at, end))
        return holes

    def _map_new(self, offset: int, size: int) -> Segment:
        d, va = self.driver, self.base + offset
        with ExitStack() as undo:
            handle = d.create(size)
            undo.callback(d.release, handle)
            d.map(va, size, handle)
            undo.callback(d.unmap, va, size)
            d.set_access(va, size)
            undo.pop_all()
        return Segment(offset, size, handle)


    def adopt(self, parts: List[Tuple[int, int, Any]], span: int) -> Tuple[int, List[Segment]]:
        """Map foreign handles, (offset in region, size, handle) each, into a fresh region of span bytes.

        The region is taken from the top of the heap, where our own segments rarely reach; it must
        hold none of them. The handles become the heap's to release.
        """
        span = round_up(span, self.chunk)
        region = self.offsets.allocate(span, self.chunk, top=True)
        if region is None or self._holes(region, region + span) != [(region, region + span)]:  # segments it would hit
            if region is not None:
                self.offsets.free_now(region)
            raise HeapOutOfMemory(span, self.offsets.free_bytes, self.capacity,
                                  "No unbacked region is left to map the tensor into; trim or enlarge the heap.")
        segments = []
        with ExitStack() as undo:
            undo.callback(self.offsets.free_now, region)
            for rel, size, handle in parts:
                self.driver.map(self.base + region + rel, size, handle)
                undo.callback(self.driver.unmap, self.base + region + rel, size)
                segments.append(Segment(region + rel, size, handle, foreign=True))
            lo, hi = parts[0][0], parts[-1][0] + parts[-1][1]
            self.driver.set_access(self.base + region + lo, hi - lo)
            undo.pop_all()
        for seg in segments:
            self._index(seg)
        return region, segments

    def _index(self, seg: Segment) -> None:
        self._segs[seg.offset] = seg
        self._seg_starts.add(seg.offset)
        self.committed += seg.size

    def segments_in(self, offset: int, size: int) -> List[Segment]:
        """Segments that start in [offset, offset + size), in address order."""
        out = []
        for off in self._seg_starts.irange(offset):
            if off >= offset + size:
                break
            out.append(self._segs[off])
        return out

    def trimmable(self) -> List[Segment]:
        """Own segments with no allocation in them, in address order: only free blocks of at least
        a chunk can hold one, so the cost follows those blocks, not the heap."""
        out = []
        for start, length in self.offsets.free_at_least(self.chunk):
            out += [s for s in self.segments_in(start, length) if not s.foreign and s.offset + s.size <= start + length]
        return sorted(out, key=lambda s: s.offset)

    def release(self, segments: List[Segment]) -> None:
        """Unmap and release segments (the heap has dropped peer views first)."""
        self._last = (0, 0)
        for seg in segments:
            if self._segs.get(seg.offset) is seg:
                del self._segs[seg.offset]
                self._seg_starts.remove(seg.offset)
                self.committed -= seg.size
            self.driver.unmap(self.base + seg.offset, seg.size)
            self.driver.release(seg.handle)

    def close(self) -> None:
        self.release(self.segments)
        self.driver.free_va(self.base, self.size)
