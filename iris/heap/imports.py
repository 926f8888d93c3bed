"""Imports: mapping memory allocated elsewhere (PyTorch's expandable segments, cuMem pools, shared
memory) into the heap without a copy, and sharing it with peers."""
from __future__ import annotations

import bisect
import threading
import time
from typing import Dict, List, Optional

from ..allocators.offsets import round_up
from ..distributed.background import BackgroundExchanges
from ..distributed.group import close_fds
from ..errors import IrisError, SymmetryError
from .lifetime import ImportBlock
from .peers import _runs


class _Clock:
    """Milliseconds per phase, summed over laps: where an import's time goes (the benchmark prints it)."""

    def __init__(self):
        self.laps, self._t = {}, time.perf_counter()

    def lap(self, phase: str) -> None:
        t = time.perf_counter()
        self.laps[phase] = self.laps.get(phase, 0.0) + 1e3 * (t - self._t)
        self._t = t


class Region:
    """Memory that one group of neighbouring imports shares, mapped at offset for nbytes. It stays
    mapped while an import in it is live or any tensor covers one (blocks); once neither holds, it is
    queued under serial and released at a collective point where every rank has queued it."""

    __slots__ = ("offset", "nbytes", "imports", "blocks", "serial")

    def __init__(self, offset: int, nbytes: int, imports: int):
        self.offset, self.nbytes, self.imports, self.blocks, self.serial = offset, nbytes, imports, [], 0


class Imports:
    """A SymmetricHeap's memory mapped from elsewhere (as_symmetric's machinery: retain, group, map,
    exchange) and the regions it lives in until every rank has freed it."""

    IMPORT_STEP = 32  # pages whose fds travel in one background exchange

    def __init__(self, heap, stats: dict):
        self.heap = heap
        self.driver, self.group, self.alloc, self.symmetry = heap.driver, heap.group, heap.alloc, heap.symmetry
        self._stats = stats  # the heap's counts (heap.stats) of exchanges and growths
        self.rank, self.world, self.peers = heap.rank, heap.world, heap.peers
        self.adopted: Dict[int, list] = {}  # offset of an imported tensor -> [its Region, imports there]
        self.regions: Dict[int, Region] = {}  # offset of a region of imported memory -> it
        self.blocks: Dict[int, ImportBlock] = {}  # offset of an imported tensor -> its block
        self.regions_freed = 0  # regions whose imports were all freed: serials -1, -2, ... in free order

    def retain_runs(self, ranges):
        """Per (ptr, nbytes): (ptr, start, end) of the run of whole VMM pages holding it, None where
        any part is not VMM memory; and pages, base -> [size, handle, an address in it], each retained once (a page
        under two tensors costs one driver call). The caller takes handles with _take and releases
        the rest with release_pages."""
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
            self.release_pages(pages)
            raise
        return runs, pages

    def _take(self, pages, base: int):
        """A reference to the page at base that the caller now owns: the one retain_runs holds the
        first time, a new one after (a page mapped into two regions is released twice)."""
        entry = pages[base]
        if entry[1] is None:
            return self.driver.retain(entry[2])[0]
        handle, entry[1] = entry[1], None
        return handle

    def release_pages(self, pages) -> None:
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

    @staticmethod
    def _layout(runs, pages):
        """(base, size) of each page under a run, in address order: what peers need to map them."""
        bases = set()
        for r in runs:
            b = None if r is None else r[1]
            while r is not None and b < r[2]:
                bases.add(b)
                b += pages[b][0]
        return [(b, pages[b][0]) for b in sorted(bases)]

    @staticmethod
    def _wanted(runs, sizes, plan):
        """Bases of one rank's pages under the placed groups, in address order: the fds it sends."""
        bases = set()
        for group, _ in plan:
            base, end = runs[group[0]][1], max(runs[i][2] for i in group)
            while base < end:
                bases.add(base)
                base += sizes[base]
        return sorted(bases)

    def adopt(self, ranges, metas, call: str) -> List[Optional[int]]:
        """Map the memory behind each (ptr, nbytes) into the heap so that each tensor sits at one
        offset on every rank, and share it with peers. metas name the tensors (ranks must agree).
        Returns each offset, None where some rank cannot map it (nothing mapped; the caller copies).
        Tensors that neighbour each other share a region, so a page under two of them is mapped
        once. Collective.

        First one small exchange of every rank's runs and page layout, from which every rank works
        out the same plan (which tensors share a region, where each region goes, which pages each
        rank sends). Then fds are exported and sent in steps of IMPORT_STEP pages by a background
        thread, while this thread exports the next step and maps its own pages: waiting for a
        slower peer hides behind this rank's own driver calls. Peers' pages are mapped as their
        steps arrive. timings (ms per phase) lands in stats["as_symmetric_ms"]."""
        clock = _Clock()
        runs, pages = self.retain_runs(ranges)
        clock.lap("retain")
        offsets, adopted, imported, received = [None] * len(ranges), [], [], {p: {} for p in self.peers}
        closer = None
        try:
            layout = self._layout(runs, pages)
            point = self.heap._point()
            got = self.group.allgather((runs, metas, layout, self.symmetry.token(call), point), "as_symmetric")
            self._stats["exchanges"] += 1
            clock.lap("plan exchange")
            self.heap._release_agreed([o[4] for o in got])
            self.symmetry.compare([o[3] for o in got], self.rank, call)
            if any(o[1] != metas for o in got):
                raise SymmetryError(f"{call}: ranks import different tensors: {[o[1] for o in got]}")
            everyone = [o[0] for o in got]
            plan = [(g, placed) for g in self._groups(everyone) for placed in [self._place(everyone, g)]
                    if placed is not None]  # None: the tensors sit at different places in their pages
            sizes = [dict(o[2]) for o in got]
            wanted = [self._wanted(everyone[q], sizes[q], plan) for q in range(self.world)]
            step = self.IMPORT_STEP
            steps = -(-max(map(len, wanted)) // step) if self.peers else 0
            self._stats["exchanges"] += steps
            clock.lap("plan")
            with BackgroundExchanges(self.group, steps, "as_symmetric pages") as stream:
                try:
                    own = wanted[self.rank]
                    for k in range(steps):
                        stream.send(self._export_pages(pages, own[k * step:(k + 1) * step]))
                    clock.lap("export")
                    regions = [self._map_own(runs, pages, g, top, span, adopted) for g, (top, span) in plan]
                    clock.lap("map own")
                    taken = [0]

                    def fd_of(p, base):
                        while base not in received[p]:
                            clock.lap("import peers")
                            self._take_step(stream, wanted, received, taken, step)
                            clock.lap("wait for peers")
                        return received[p][base]

                    views = {p: [] for p in self.peers}  # (offset, size) of each peer page mapped
                    for (group, (top, span)), region in zip(plan, regions):
                        for i in group:
                            off = region.offset + top + runs[i][0] - runs[group[0]][0]
                            offsets[i] = off
                            self.adopted.setdefault(off, [region, 0])[1] += 1
                            if off not in self.blocks:
                                self.blocks[off] = block = ImportBlock(off, ranges[i][1], region)
                                region.blocks.append(block)
                        for p in self.peers:
                            ptr, base, _ = everyone[p][group[0]]
                            end, at = max(everyone[p][i][2] for i in group), region.offset + top - (ptr - base)
                            while base < end:
                                size = sizes[p][base]
                                self.heap.peer_maps.import_(p, at, size, fd_of(p, base), imported)
                                views[p].append((at, size))
                                base, at = base + size, at + size
                    clock.lap("import peers")
                    while taken[0] < steps:  # a peer may still report a failure in a later step
                        self._take_step(stream, wanted, received, taken, step)
                    clock.lap("wait for peers")
                    # every peer fd is imported: close them on a thread while the driver sets access
                    # (cuda-bindings releases the GIL in driver calls; benchmarks/import_weights.py's
                    # `close fds` phase, docs/performance.md)
                    fds, received = [fd for p in received for fd in received[p].values()], {}
                    closer = threading.Thread(target=close_fds, args=(fds,), name="iris-close-fds")
                    closer.start()
                    for p in self.peers:
                        for lo, hi in _runs(views[p]):
                            self.driver.set_access(self.heap.peer_maps.va[p] + lo, hi - lo)
                    clock.lap("set access peers")
                except BaseException as e:
                    stream.fail(f"{type(e).__name__}: {e}")
                    raise
        except BaseException:
            self.heap.peer_maps.unimport(imported)
            self._undo_adopted(adopted)
            raise
        finally:
            self.release_pages(pages)
            if closer is not None:
                closer.join()
            close_fds(fd for p in received for fd in received[p].values())
            clock.lap("close fds")
            self._stats["as_symmetric_ms"] = clock.laps
        if adopted:
            self._stats["growths"] += 1
        self.symmetry.record(call)
        return offsets

    def _export_pages(self, pages, bases):
        """An fd for each page at bases (none left open if one export fails)."""
        fds = []
        try:
            for b in bases:
                fds.append(self.driver.export(pages[b][1]))
        except BaseException:
            close_fds(fds)
            raise
        return fds

    def _take_step(self, stream, wanted, received, taken, step) -> None:
        """The next step's fds, filed under their pages' bases; a peer's failure raises here."""
        k = taken[0]
        taken[0] += 1
        notes, fds = stream.next()
        for p in self.peers:
            received[p].update(zip(wanted[p][k * step:(k + 1) * step], fds[p]))
        failed = {p: n for p, n in enumerate(notes) if n is not None and p != self.rank}
        if failed:
            raise IrisError(f"as_symmetric: ranks {sorted(failed)} failed while sharing their pages "
                               f"({'; '.join(f'rank {p}: {n}' for p, n in sorted(failed.items()))}); "
                               "nothing was imported on any rank")

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
        self.regions[region] = entry = Region(region, span, len(group))
        return entry

    def _undo_adopted(self, adopted) -> None:
        for region, segs in adopted:
            self.alloc.undo(region, segs)
            self.regions.pop(region, None)
            for off in [o for o, (r, _) in self.adopted.items() if r.offset == region]:
                del self.adopted[off]
                self.blocks.pop(off, None)

    def free(self, offset: int) -> None:
        """ctx.free of the import at offset. Its region is not unmapped here, as tensors may still
        cover it (touching unmapped memory crashes the process), nor given back to the offset policy
        (an allocation there would land in the user's memory): both wait until release_region."""
        entry = self.adopted[offset]
        region, entry[1] = entry[0], entry[1] - 1
        if not entry[1]:
            del self.adopted[offset]
            self.blocks.pop(offset).freed = True
        region.imports -= 1
        if not region.imports:  # frees are collective, in one order: the same serial on every rank
            self.regions_freed += 1
            region.serial = -self.regions_freed
            self.region_unused(region)

    def region_unused(self, region: Region) -> None:
        """Queue a region whose imports are all freed once no tensor covers it (bookkeeping only:
        this runs from tensor finalizers)."""
        if region.serial and not self.heap.closed and not any(b.tensors for b in region.blocks):
            self.heap._queued[region.serial] = region

    def release_region(self, region: Region) -> None:
        """Unmap an agreed region everywhere, hand its handles back, and give its offsets to the policy."""
        del self.regions[region.offset]
        self.heap.peer_maps.drop_range(region.offset, region.offset + region.nbytes)
        self.alloc.undo(region.offset, self.alloc.segments_in(region.offset, region.nbytes))

    def is_adopted(self, offset: int) -> bool:
        """Whether offset holds a tensor that as_symmetric mapped without copying."""
        return offset in self.adopted
