"""SymmetricHeap: one allocator's memory, a view of every peer's, and heap_bases for kernels."""
from __future__ import annotations

import bisect
import os
from contextlib import ExitStack
from typing import Dict, List, Optional

import torch

from ..errors import BootstrapError, HeapOutOfMemory, SymmetryError
from ..allocators.offsets import round_up
from ..device.translate import bases_tensor
from ..platform import IpcHandle
from .symmetry import SymmetryCheck, mode_from_env
from .views import bytes_at


def _close_all(fds) -> None:
    for fd in fds:
        os.close(fd)


def _runs(layout):
    """Contiguous (start, end) runs of sorted (offset, size) pieces: access is set per mapped run."""
    runs = []
    for off, size in sorted(layout):
        if runs and runs[-1][1] == off:
            runs[-1][1] = off + size
        else:
            runs.append([off, off + size])
    return runs


class SymmetricHeap:
    """Peers see each other's heap: a VMM heap maps each peer's segments into a reserved range of
    the same size; a plain block is opened once through IPC. Creating it is collective."""

    def __init__(self, allocator, driver, group, device: torch.device):
        self.alloc, self.driver, self.group, self.device = allocator, driver, group, device
        self.rank, self.world, self.size = group.rank, group.world, allocator.size
        self.peers = [p for p in range(self.world) if p != self.rank]
        self.symmetry = SymmetryCheck(mode_from_env())
        self._adopted: Dict[int, list] = {}  # offset of an imported tensor -> [region, imports there]
        self._regions: Dict[int, list] = {}  # region of imported memory -> [span, live tensors in it]
        self.stats = {"allocations": 0, "frees": 0, "growths": 0, "exchanges": 0, "trims": 0}
        self._imports: Dict[int, Dict[int, tuple]] = {p: {} for p in self.peers}  # peer -> offset -> (handle, size)
        self._peer_va: Dict[int, int] = {}
        with ExitStack() as undo:
            if allocator.vmm:
                for p in self.peers:
                    self._peer_va[p] = driver.reserve(self.size)
                    undo.callback(driver.free_va, self._peer_va[p], self.size)
            else:
                self._open_peer_blocks(undo)
            self.bases = [allocator.base if p == self.rank else self._peer_va[p] for p in range(self.world)]
            self.heap_bases = bases_tensor(self.bases, self.size, device)  # hidden entries for IRIS_DEBUG
            self.views = [bytes_at(b, self.size, device) for b in self.bases]
            self._peer_blocks = undo.pop_all()  # closing it unmaps a block heap's peers
        self.closed = False

    def _open_peer_blocks(self, undo: ExitStack) -> None:
        """Open each peer's block once: by its VMM handles where it has them (torch's memory with
        expandable_segments:True, which legacy IPC cannot open; shared memory on the host), else by IPC."""
        runs, pages = self._retain_runs([(self.alloc.base, self.size)])
        if runs[0] is not None:
            ptr, start, _ = runs[0]
            parts = [(base - start, size, handle) for base, (size, handle, _) in sorted(pages.items())]
            self.stats["peers_opened_by"] = "vmm handles"
            return self._map_peer_blocks(parts, ptr - start, undo)
        self._release_pages(pages)
        self.stats["peers_opened_by"] = "ipc"
        mine = self.driver.ipc_export(self.alloc.base, self.size)
        own_fds = [mine.fd] if mine.fd is not None else []
        try:
            objs, fds = self.group.exchange((mine.data, mine.offset, mine.size), own_fds, "heap ipc open")
        finally:
            _close_all(own_fds)
        for p in self.peers:
            data, offset, size = objs[p]
            try:
                ptr = self.driver.ipc_open(IpcHandle(data, offset, size, fds[p][0] if fds[p] else None))
            finally:
                _close_all(fds[p])
            undo.callback(self.driver.ipc_close, ptr, size)
            self._peer_va[p] = ptr

    def _map_peer_blocks(self, parts, lead: int, undo: ExitStack) -> None:
        d = self.driver
        own = [d.export(h) for _, _, h in parts]
        for _, _, h in parts:
            d.release(h)  # torch's own mapping keeps the memory alive
        try:
            objs, fds = self.group.exchange((lead, [(rel, size) for rel, size, _ in parts]), own, "heap vmm open")
        finally:
            _close_all(own)
        try:
            for p in self.peers:
                peer_lead, layout = objs[p]
                total = layout[-1][0] + layout[-1][1]
                va = d.reserve(total)
                undo.callback(d.free_va, va, total)
                for (rel, size), fd in zip(layout, fds[p]):
                    handle = d.import_(fd)
                    undo.callback(d.release, handle)
                    d.map(va + rel, size, handle)
                    undo.callback(d.unmap, va + rel, size)
                d.set_access(va, total)
                self._peer_va[p] = va + peer_lead
        finally:
            _close_all(fd for p in self.peers for fd in fds[p])

    # -- allocation --------------------------------------------------------
    def allocate(self, nbytes: int, align: int = 256) -> int:
        """Offset of a new block of nbytes. Collective: all ranks, same order, same sizes."""
        call = f"allocate({nbytes}, align={align})"
        if self.symmetry.mode == "full":
            self.check_symmetry(call)
        try:
            offset, new = self.alloc.allocate(max(nbytes, 1), align)
        except HeapOutOfMemory as e:
            if getattr(e, "during_growth", False):
                self._grow(nbytes, None, None, call, None)  # peers grew; tell them this rank could not
            raise
        if new:
            self._grow(nbytes, offset, new, call, lambda: self.alloc.undo(offset, new))
        self.symmetry.record(call)
        self.stats["allocations"] += 1
        return offset

    def _grow(self, nbytes: int, offset, new, call: str, undo_new) -> None:
        """One batched exchange: every rank's new segments, mapped into each peer's view.

        Ranks agree on (nbytes, offset); each maps a peer's memory by that peer's own segment list.
        undo_new takes this rank's part back when a peer could not do its own."""
        desc = None if new is None else (nbytes, offset)
        own = [self.driver.export(s.handle) for s in new or ()]
        layout = [(s.offset, s.size) for s in new or ()]
        try:
            objs, fds = self.group.exchange((desc, self.symmetry.token(call), layout), own, "heap growth")
        finally:
            _close_all(own)
        self.stats["exchanges"] += 1
        objs, tokens, layouts = [o[0] for o in objs], [o[1] for o in objs], [o[2] for o in objs]
        received = [fd for p in self.peers for fd in fds[p]]
        try:
            if desc is None:
                return
            try:
                self.symmetry.compare(tokens, self.rank, "a heap growth")
            except SymmetryError:
                undo_new()
                raise
            failed = [p for p in self.peers if objs[p] is None]
            diverged = [p for p in self.peers if objs[p] is not None and objs[p] != desc]
            if failed or diverged:
                undo_new()
                if failed:
                    raise HeapOutOfMemory(nbytes, self.alloc.offsets.free_bytes, self.size,
                                          f"Ranks {failed} could not back it: their devices are out of memory. "
                                          "Free tensors and call ctx.trim() on every rank.")
                raise SymmetryError(f"rank {self.rank} allocated {nbytes} bytes at offset {offset}, but ranks "
                                    f"{diverged} made a different allocation ({[objs[p] for p in diverged]}); every "
                                    "rank must allocate the same sizes in the same order")
            with ExitStack() as undo:
                for p in self.peers:
                    for (off, size), fd in zip(layouts[p], fds[p]):
                        self._import(p, off, size, fd, undo)
                    for lo, hi in _runs(layouts[p]):
                        self.driver.set_access(self._peer_va[p] + lo, hi - lo)
                undo.pop_all()
            self.stats["growths"] += 1
        finally:
            _close_all(received)

    def _import(self, peer: int, offset: int, size: int, fd: int, undo: ExitStack) -> None:
        d, va = self.driver, self._peer_va[peer] + offset
        handle = d.import_(fd)
        undo.callback(d.release, handle)
        d.map(va, size, handle)
        undo.callback(d.unmap, va, size)
        self._imports[peer][offset] = (handle, size)
        undo.callback(self._imports[peer].pop, offset)

    def free(self, offset: int) -> int:
        """Give a block back for reuse. Collective: all ranks, same order."""
        call = f"free(offset={offset})"
        if offset not in self._adopted:
            size = self.alloc.free(offset)
        else:  # an imported tensor: its region goes when its last tensor does
            entry = self._adopted[offset]
            region, entry[1] = entry[0], entry[1] - 1
            if not entry[1]:
                del self._adopted[offset]
            self._regions[region][1] -= 1
            size = 0
            if not self._regions[region][1]:
                span = self._regions.pop(region)[0]
                self._drop_peer_range(region, region + span)  # unmap it everywhere, hand the handles back
                self.alloc.release(self.alloc.segments_in(region, span))
                size = self.alloc.free(region)
        self.symmetry.record(call)
        self.stats["frees"] += 1
        return size

    def check_symmetry(self, pending: str = "", what: str = "barrier") -> None:
        """Compare every rank's call digest; doubles as a barrier. Collective: all ranks."""
        tokens = self.group.allgather(self.symmetry.token(pending), what)
        self.symmetry.compare(tokens, self.rank, f"{what} before {pending}" if pending else what)

    def trim(self) -> int:
        """Give segments without live data back to the device on every rank; returns bytes released.
        Collective: all ranks."""
        segments = self.alloc.trimmable()
        desc = [(s.offset, s.size) for s in segments]
        got = self.group.allgather((desc, self.symmetry.token("trim()")), "trim")
        self.symmetry.compare([g[1] for g in got], self.rank, "trim")
        diverged = [p for p, g in enumerate(got) if g[0] != desc]
        if diverged:
            raise SymmetryError(f"trim: ranks {diverged} hold different free segments than rank {self.rank}; "
                                "the ranks' allocations have diverged")
        for offset, size in desc:
            self._drop_peer_range(offset, offset + size)
        self.alloc.release(segments)
        self.stats["trims"] += 1
        return sum(size for _, size in desc)

    def _drop_peer_range(self, lo: int, hi: int, peers: Optional[List[int]] = None) -> None:
        """Unmap and release every peer segment that starts in [lo, hi)."""
        for p in self.peers if peers is None else peers:
            for offset in [o for o in self._imports[p] if lo <= o < hi]:
                handle, size = self._imports[p].pop(offset)
                self.driver.unmap(self._peer_va[p] + offset, size)
                self.driver.release(handle)

    # -- importing memory allocated elsewhere -------------------------------
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

    def adopt(self, ranges, metas, call: str) -> List[Optional[int]]:
        """Map the memory behind each (ptr, nbytes) into the heap so that each tensor sits at one
        offset on every rank, and share it with peers. metas name the tensors (ranks must agree).
        Returns each offset, None where some rank cannot map it (nothing mapped; the caller copies).
        Tensors that neighbour each other share a region, so a page under two of them is mapped
        and exported once. One allgather and one exchange for the batch. Collective."""
        g = self.alloc.chunk
        runs, pages = self._retain_runs(ranges)
        offsets, adopted, segments = [None] * len(ranges), [], []
        try:
            got = self.group.allgather((runs, metas), "as_symmetric")
            if any(m != metas for _, m in got):
                raise SymmetryError(f"{call}: ranks import different tensors: {[m for _, m in got]}")
            everyone = [r for r, _ in got]
            for group in self._groups(everyone):
                first = group[0]
                layouts = [(r[first][0] - r[first][1], max(r[i][2] for i in group) - r[first][1]) for r in everyone]
                if len({lead % g for lead, _ in layouts}) > 1:
                    continue  # the tensors sit at different places in their pages: no common offset
                top = max(lead for lead, _ in layouts)  # every rank's first tensor lands at region + top
                span = round_up(max(top - lead + total for lead, total in layouts), g)
                ptr, start, _ = runs[first]
                end, parts = max(runs[i][2] for i in group), []
                try:
                    base = start
                    while base < end:
                        parts.append((top - (ptr - start) + base - start, pages[base][0], self._take(pages, base)))
                        base += pages[base][0]
                    region, segs = self.alloc.adopt(parts, span)
                except BaseException:
                    for _, _, handle in parts:
                        self.driver.release(handle)
                    raise
                adopted.append((region, segs))
                segments += segs
                self._regions[region] = [span, len(group)]
                for i in group:
                    off = region + top + runs[i][0] - ptr
                    offsets[i] = off
                    self._adopted.setdefault(off, [region, 0])[1] += 1
        except BaseException:
            self._undo_adopted(adopted)
            raise
        finally:
            self._release_pages(pages)
        if segments:
            self._grow(len(segments), [r for r, _ in adopted], segments, call, lambda: self._undo_adopted(adopted))
        self.symmetry.record(call)
        return offsets

    def _undo_adopted(self, adopted) -> None:
        for region, segs in adopted:
            self.alloc.undo(region, segs)
            self._regions.pop(region, None)
            for off in [o for o, (r, _) in self._adopted.items() if r == region]:
                del self._adopted[off]

    def is_adopted(self, offset: int) -> bool:
        """Whether offset holds a tensor that as_symmetric mapped without copying."""
        return offset in self._adopted

    # -- views -------------------------------------------------------------
    def tensor(self, offset: int, shape, dtype: torch.dtype, rank: Optional[int] = None) -> torch.Tensor:
        """The tensor at offset in rank's heap as seen from this process (default: our own)."""
        n = torch.Size(shape).numel() * dtype.itemsize
        view = self.views[self.rank if rank is None else rank]
        return view[offset:offset + n].view(dtype).view(shape)

    @staticmethod
    def address(t: torch.Tensor) -> int:
        """Where t's first element is, also for a tensor with no elements (whose data_ptr() is 0)."""
        return t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()

    def offset_of(self, t: torch.Tensor) -> int:
        """Byte offset of t's first element in this rank's heap; raises if t is not on the heap."""
        offset = self.address(t) - self.bases[self.rank]
        if not 0 <= offset < self.size or t.device != self.device:
            raise ValueError(f"tensor at {self.address(t):#x} on {t.device} is not on this rank's symmetric heap "
                             f"[{self.bases[self.rank]:#x}, +{self.size}) on {self.device}; allocate it with the "
                             "context's factories (ctx.empty, ctx.zeros, ...) or import it with ctx.as_symmetric")
        return offset

    def contains(self, t: torch.Tensor) -> bool:
        if t.device != self.device:
            return False
        start = self.address(t) - self.bases[self.rank]
        span = 0 if t.numel() == 0 else sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
        return 0 <= start and start + span * t.element_size() <= self.size

    # -- lifetime ----------------------------------------------------------
    def close(self) -> None:
        """Unmap peers, release memory, leave the group; idempotent. Collective when peers are alive."""
        if self.closed:
            return
        self.closed = True
        diverged, reported = None, self.symmetry.reported
        try:
            self.check_symmetry(what="close")  # compares digests, as every collective point does
        except SymmetryError as e:
            diverged = None if reported else e  # raised once this rank's memory is released
        except (BootstrapError, OSError):
            pass  # a peer is gone: still release what this rank holds
        try:
            self._drop_peer_range(0, self.size)
            self._peer_blocks.close()  # peer reservations, or peer blocks opened once
            self.alloc.close()
        finally:
            self.views, self.heap_bases = None, None
            self.group.close()
        if diverged is not None:
            raise diverged
