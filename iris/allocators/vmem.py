"""VMemAllocator: one large virtual reservation, physical segments created only when allocations need them."""
from __future__ import annotations

import bisect
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, List, Tuple

from ..errors import DriverError, HeapOutOfMemory
from .offsets import Offsets, round_up

DEFAULT_CHUNK = 2 << 20


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

    def __init__(self, driver, heap_size: int, chunk_size: int = DEFAULT_CHUNK):
        self.driver = driver
        g = driver.granularity()
        self.chunk = round_up(max(chunk_size, g), g)
        self.size = round_up(heap_size, self.chunk)
        if self.size != heap_size:
            warnings.warn(f"heap_size={heap_size} is not a multiple of the {self.chunk}-byte chunk: "
                          f"rounded up to {self.size}", stacklevel=4)
        self.base = driver.reserve(self.size)
        self.offsets = Offsets(self.size)
        self.segments: List[Segment] = []   # address order

    @property
    def committed(self) -> int:
        return sum(s.size for s in self.segments)

    def allocate(self, nbytes: int, align: int) -> Tuple[int, List[Segment]]:
        """The offset, and the segments created for it (the heap shares those with peers)."""
        offset = self.offsets.allocate(nbytes, align)
        if offset is None:
            raise HeapOutOfMemory(nbytes, self.offsets.free_bytes, self.size,
                                  f"The largest free block is {self.offsets.largest_free()} bytes. "
                                  "Free tensors with ctx.free(), or create the heap with a larger heap_size "
                                  "(a vmem heap may exceed device memory).")
        new: List[Segment] = []
        try:
            for lo, hi in self._holes(offset, offset + nbytes):
                new.append(self._map_new(lo, hi - lo))
        except DriverError as e:
            self.undo(offset, new)
            if not e.oom:
                raise
            free, total = self.driver.mem_info()
            err = HeapOutOfMemory(nbytes, free, self.size,
                                  f"The device is out of memory: {self.committed} bytes committed by this heap, "
                                  f"{free} of {total} bytes free on the device. Free tensors and call ctx.trim().")
            err.during_growth = True
            raise err from e
        for seg in new:
            bisect.insort(self.segments, seg, key=lambda s: s.offset)
        return offset, new

    def undo(self, offset: int, new: List[Segment]) -> None:
        """Take back an allocation and the segments made for it (a peer could not grow)."""
        self.offsets.free(offset)
        self.release(new)

    def _holes(self, start: int, end: int) -> List[Tuple[int, int]]:
        """The unbacked chunk-aligned runs of [start, end)."""
        start, end = start // self.chunk * self.chunk, round_up(end, self.chunk)
        i = bisect.bisect([s.offset for s in self.segments], start) - 1
        holes, at = [], start
        for seg in self.segments[max(i, 0):]:
            if seg.offset >= end:
                break
            if seg.offset > at:
                holes.append((at, seg.offset))
            at = max(at, seg.offset + seg.size)
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

    def free(self, offset: int) -> int:
        return self.offsets.free(offset)

    def adopt(self, parts: List[Tuple[int, int, Any]], span: int) -> Tuple[int, List[Segment]]:
        """Map foreign handles, (offset in region, size, handle) each, into a fresh region of span bytes.

        The region is taken from the top of the heap, where our own segments rarely reach; it must
        hold none of them. The handles become the heap's to release.
        """
        span = round_up(span, self.chunk)
        region = self.offsets.allocate(span, self.chunk, top=True)
        i = 0 if region is None else bisect.bisect_left(self.segments, region, key=lambda s: s.offset)
        if region is None or any(region < s.offset + s.size and s.offset < region + span  # segments it would hit
                                 for s in self.segments[max(i - 1, 0):i + 1]):
            if region is not None:
                self.offsets.free(region)
            raise HeapOutOfMemory(span, self.offsets.free_bytes, self.size,
                                  "No unbacked region is left to map the tensor into; trim or enlarge the heap.")
        segments = []
        with ExitStack() as undo:
            undo.callback(self.offsets.free, region)
            for rel, size, handle in parts:
                self.driver.map(self.base + region + rel, size, handle)
                undo.callback(self.driver.unmap, self.base + region + rel, size)
                segments.append(Segment(region + rel, size, handle, foreign=True))
            lo, hi = parts[0][0], parts[-1][0] + parts[-1][1]
            self.driver.set_access(self.base + region + lo, hi - lo)
            undo.pop_all()
        for seg in segments:
            bisect.insort(self.segments, seg, key=lambda s: s.offset)
        return region, segments

    def segments_in(self, offset: int, size: int) -> List[Segment]:
        return [s for s in self.segments if offset <= s.offset < offset + size]

    def trimmable(self) -> List[Segment]:
        """Segments with no live allocation in them."""
        return [s for s in self.segments if not s.foreign and self.offsets.is_free(s.offset, s.offset + s.size)]

    def release(self, segments: List[Segment]) -> None:
        """Unmap and release segments (the heap has dropped peer views first)."""
        for seg in segments:
            if seg in self.segments:
                self.segments.remove(seg)
            self.driver.unmap(self.base + seg.offset, seg.size)
            self.driver.release(seg.handle)

    def close(self) -> None:
        self.release(list(self.segments))
        self.driver.free_va(self.base, self.size)
