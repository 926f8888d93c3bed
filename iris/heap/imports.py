"""Imports: mapping memory allocated elsewhere (PyTorch's expandable segments, cuMem pools, shared
memory) into the heap without a copy, and sharing it with peers."""
from __future__ import annotations

import bisect
from typing import List, Optional

from ..allocators.offsets import round_up
from ..errors import SymmetryError
from .lifetime import Block
from .peers import _close_all, _runs


class Region:
    """Memory that one group of neighbouring imports shares, mapped at offset for nbytes. It stays
    mapped while an import in it is live or any tensor covers one (blocks); once neither holds, it is
    queued under serial and released at a collective point where every rank has queued it."""

    __slots__ = ("offset", "nbytes", "imports", "blocks", "serial")

    def __init__(self, offset: int, nbytes: int, imports: int):
        self.offset, self.nbytes, self.imports, self.blocks, self.serial = offset, nbytes, imports, [], 0


class Imports:
    """The SymmetricHeap's as_symmetric machinery: retain, group, map, exchange."""

    def _retain_runs(self, ranges):
        """Per (ptr, nbytes): (ptr, start, end) of the run of whole VMM pages holding it, None where
        any part is not VMM memory; and pages, base -> [size, handle, an address in it], each retained once (a page
        under two tensors costs one driver call). The caller takes handles with _take and releases
        the rest with _release_pages."""
        pages, bases, runs = {}, [], []
        try:
            for ptr, nbytes in ranges:
                at, start, end = ptr, None, None
                while nbytes and at < ptr + nbytes:
                    i = bisect.bisect_right(bases, at) - 1
                    if i < 0 or at >= bases[i] + pages[bases[i]][0]:
                        found = self.driver.retain(at)
                        if found is None:
                            break
                        handle, base, size = found
                        pages[base] = [size, handle, at]
                        i = bisect.bisect_left(bases, base)
                        bases.insert(i, base)
                    base, size = bases[i], pages[bases[i]][0]
                    if not base <= at < base + size or (end is not None and base != end):
                        break  # not one contiguous run of whole pages
                    start, end, at = base if start is None else start, base + size, base + size
                runs.append((ptr, start, end) if nbytes and at >= ptr + nbytes else None)
        except BaseException:
            self._release_pages(pages)
            raise
        return runs, pages

    def _take(self, pages, base: int):
        """A reference to the page at base that the caller now owns: the one _retain_runs holds the
        first time, a new one after (a page mapped into two regions is released twice)."""
        entry = pages[base]
        if entry[1] is None:
            return self.driver.retain(entry[2])[0]
        handle, entry[1] = entry[1], None
        return handle

    def _release_pages(self, pages) -> None:
        for entry in pages.values():
            if entry[1] is not None:
                self.driver.release(entry[1])
                entry[1] = None

    @staticmethod
    def _groups(runs):
        """Indices of the tensors every rank can map, grouped to share one region: neighbours in
        rank 0's memory whose pages touch, at the same distances on every rank (a model's weights,
        allocated in the same order everywhere, become a few groups)."""
        ok = [i for i in range(len(runs[0])) if all(r[i] is not None for r in runs)]
        groups, ends = [], []
        for i in sorted(ok, key=lambda i: runs[0][i][0]):
            if groups:
                j = groups[-1][0]
                if all(r[i][1] <= e and r[i][0] - r[j][0] == runs[0][i][0] - runs[0][j][0] for r, e in zip(runs, ends)):
                    groups[-1].append(i)
                    ends = [max(e, r[i][2]) for r, e in zip(runs, ends)]
                    continue
            groups.append([i])
            ends = [r[i][2] for r in runs]
        return groups

    def _exported(self, runs, pages):
        """(base, size) of each page under a run, in address order, and an fd exported for each:
        sent with the runs so that one exchange does the whole import."""
        bases = set()
        for r in runs:
            b = None if r is None else r[1]
            while r is not None and b < r[2]:
                bases.add(b)
                b += pages[b][0]
        bases, fds = sorted(bases), []
        try:
            for b in bases:
                fds.append(self.driver.export(pages[b][1]))
        except BaseException:
            _close_all(fds)
            raise
        return [(b, pages[b][0]) for b in bases], fds

    def adopt(self, ranges, metas, call: str) -> List[Optional[int]]:
        """Map the memory behind each (ptr, nbytes) into the heap so that each tensor sits at one
        offset on every rank, and share it with peers. metas name the tensors (ranks must agree).
        Returns each offset, None where some rank cannot map it (nothing mapped; the caller copies).
        Tensors that neighbour each other share a region, so a page under two of them is mapped
        once. One exchange for the batch: each rank sends its runs with an fd per page, so the
        slowest rank is waited for once (fds of pages no rank maps are closed unused). Collective."""
        runs, pages = self._retain_runs(ranges)
        offsets, adopted, imported, received = [None] * len(ranges), [], [], []
        try:
            layout, own = self._exported(runs, pages) if self.peers else ([], [])
            try:
                got, fds = self.group.exchange((runs, metas, layout, self.symmetry.token(call), self._queue()), own,
                                               "as_symmetric")
            finally:
                _close_all(own)
            self.stats["exchanges"] += 1
            received = [fd for p in self.peers for fd in fds[p]]
            self._release_agreed([o[4] for o in got])
            self.symmetry.compare([o[3] for o in got], self.rank, call)
            if any(o[1] != metas for o in got):
                raise SymmetryError(f"{call}: ranks import different tensors: {[o[1] for o in got]}")
            everyone = [o[0] for o in got]
            tables = {p: {b: (size, fd) for (b, size), fd in zip(got[p][2], fds[p])} for p in self.peers}
            views = {p: [] for p in self.peers}  # (offset, size) of each peer page mapped, for set_access
            for group in self._groups(everyone):
                placed = self._place(everyone, group)
                if placed is None:
                    continue  # the tensors sit at different places in their pages: no common offset
                top, span = placed
                region = self._map_own(runs, pages, group, top, span, adopted)
                for i in group:
                    off = region.offset + top + runs[i][0] - runs[group[0]][0]
                    offsets[i] = off
                    self._adopted.setdefault(off, [region, 0])[1] += 1
                    if off not in self._import_blocks:
                        self._import_blocks[off] = block = Block(off, ranges[i][1], -1, gc=False, region=region)
                        region.blocks.append(block)
                for p in self.peers:
                    ptr, base, _ = everyone[p][group[0]]
                    end, at = max(everyone[p][i][2] for i in group), region.offset + top - (ptr - base)
                    while base < end:
                        size, fd = tables[p][base]
                        self._import(p, at, size, fd, imported)
                        views[p].append((at, size))
                        base, at = base + size, at + size
            for p in self.peers:
                for lo, hi in _runs(views[p]):
                    self.driver.set_access(self._peer_va[p] + lo, hi - lo)
        except BaseException:
            self._unimport(imported)
            self._undo_adopted(adopted)
            raise
        finally:
            self._release_pages(pages)
            _close_all(received)
        if adopted:
            self.stats["growths"] += 1
        self.symmetry.record(call)
        return offsets

    def _place(self, everyone, group):
        """(top, span) of the group's region, the same on every rank: its first tensor lands at
        region + top everywhere; None when the ranks' tensors sit at different places in their pages."""
        g, first = self.alloc.chunk, group[0]
        layouts = [(r[first][0] - r[first][1], max(r[i][2] for i in group) - r[first][1]) for r in everyone]
        if len({lead % g for lead, _ in layouts}) > 1:
            return None
        top = max(lead for lead, _ in layouts)
        return top, round_up(max(top - lead + total for lead, total in layouts), g)

    def _map_own(self, runs, pages, group, top, span, adopted) -> Region:
        """Map this rank's pages under the group into a fresh region (noted in adopted)."""
        ptr, base, _ = runs[group[0]]
        end, parts, at = max(runs[i][2] for i in group), [], top - (ptr - base)
        try:
            while base < end:
                parts.append((at, pages[base][0], self._take(pages, base)))
                base, at = base + pages[base][0], at + pages[base][0]
            region, segs = self.alloc.adopt(parts, span)
        except BaseException:
            for _, _, handle in parts:
                self.driver.release(handle)
            raise
        adopted.append((region, segs))
        self._regions[region] = entry = Region(region, span, len(group))
        return entry

    def _undo_adopted(self, adopted) -> None:
        for region, segs in adopted:
            self.alloc.undo(region, segs)
            self._regions.pop(region, None)
            for off in [o for o, (r, _) in self._adopted.items() if r.offset == region]:
                del self._adopted[off]
                self._import_blocks.pop(off, None)

    def _free_import(self, offset: int) -> None:
        """ctx.free of the import at offset. Its region is not unmapped here, as tensors may still
        cover it (touching unmapped memory crashes the process), nor given back to the offset policy
        (an allocation there would land in the user's memory): both wait until _release_region."""
        entry = self._adopted[offset]
        region, entry[1] = entry[0], entry[1] - 1
        if not entry[1]:
            del self._adopted[offset]
            self._import_blocks.pop(offset).freed = True
        region.imports -= 1
        if not region.imports:  # frees are collective, in one order: the same serial on every rank
            self._regions_freed += 1
            region.serial = -self._regions_freed
            self._region_unused(region)

    def _region_unused(self, region: Region) -> None:
        """Queue a region whose imports are all freed once no tensor covers it (bookkeeping only:
        this runs from tensor finalizers)."""
        if region.serial and not self.closed and not any(b.tensors for b in region.blocks):
            self._queued[region.serial] = region

    def _release_region(self, region: Region) -> None:
        """Unmap an agreed region everywhere, hand its handles back, and give its offsets to the policy."""
        del self._regions[region.offset]
        self._drop_peer_range(region.offset, region.offset + region.nbytes)
        self.alloc.release(self.alloc.segments_in(region.offset, region.nbytes))
        self.alloc.free(region.offset)

    def is_adopted(self, offset: int) -> bool:
        """Whether offset holds a tensor that as_symmetric mapped without copying."""
        return offset in self._adopted
