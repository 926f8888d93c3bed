"""PeerMaps: the SymmetricHeap's view of every peer's memory: opening a plain block once, mapping
each peer's new segments in one batched exchange per growth, dropping them again."""
from __future__ import annotations

from contextlib import ExitStack
from typing import Dict, List, Optional

from ..distributed.group import close_fds
from ..errors import HeapOutOfMemory, SymmetryError
from ..allocators.sorted_ints import SortedInts
from ..platform import IpcHandle
from . import reach


def _runs(layout):
    """Contiguous (start, end) runs of sorted (offset, size) pieces: access is set per mapped run."""
    runs = []
    for off, size in sorted(layout):
        if runs and runs[-1][1] == off:
            runs[-1][1] = off + size
        else:
            runs.append([off, off + size])
    return runs


class PeerMaps:
    """Peer views: a VMM heap maps each peer's segments into a reserved range of the same size; a
    plain block is opened once through IPC; a provider's memory comes with its peers' bases."""

    def __init__(self, heap, stats: dict):
        self.heap = heap
        self.driver, self.group, self.alloc, self.symmetry = heap.driver, heap.group, heap.alloc, heap.symmetry
        self._stats = stats  # the heap's counts (heap.stats) of exchanges and growths
        self.rank, self.world, self.peers, self.size = heap.rank, heap.world, heap.peers, heap.size
        self.va: Dict[int, int] = {}  # peer -> where its heap is mapped here (0: indirect, not mapped)
        self._mapped: Dict[int, Dict[int, tuple]] = {p: {} for p in self.peers}  # peer -> offset -> (handle, size)
        self._starts = {p: SortedInts() for p in self.peers}  # the same offsets, for range lookups

    def open(self, undo: ExitStack) -> None:
        """Each peer's view (va), collectively; undo takes back what was opened or reserved."""
        alloc, d = self.alloc, self.driver
        if alloc.vmm:
            for p in self.peers:
                self.va[p] = d.reserve(self.size)
                undo.callback(d.free_va, self.va[p], self.size)
        elif hasattr(alloc, "peer_bases"):  # memory whose peers' copies its provider maps (NVSHMEM)
            self.va.update(reach.narrow(alloc.peer_bases(self.peers), self.rank, self.world))
        else:
            self._open_blocks(undo)

    def _open_blocks(self, undo: ExitStack) -> None:
        """Open each peer's block once: by its VMM handles where it has them (torch's memory with
        expandable_segments:True, which legacy IPC cannot open; shared memory on the host), else by IPC."""
        runs, pages = self.heap.imports.retain_runs([(self.alloc.base, self.size)])
        if runs[0] is not None:
            ptr, start, _ = runs[0]
            parts = [(base - start, size, handle) for base, (size, handle, _) in sorted(pages.items())]
            self._stats["peers_opened_by"] = "vmm handles"
            return self._map_blocks(parts, ptr - start, undo)
        self.heap.imports.release_pages(pages)
        self._stats["peers_opened_by"] = "ipc"
        mine = self.driver.ipc_export(self.alloc.base, self.size)
        own_fds = [mine.fd] if mine.fd is not None else []
        try:
            objs, fds = self.group.exchange((mine.data, mine.offset, mine.size), own_fds, "heap ipc open")
        finally:
            close_fds(own_fds)
        for p in self.peers:
            data, offset, size = objs[p]
            try:
                ptr = self.driver.ipc_open(IpcHandle(data, offset, size, fds[p][0] if fds[p] else None))
            finally:
                close_fds(fds[p])
            undo.callback(self.driver.ipc_close, ptr, size)
            self.va[p] = ptr

    def _map_blocks(self, parts, lead: int, undo: ExitStack) -> None:
        d = self.driver
        own = [d.export(h) for _, _, h in parts]
        for _, _, h in parts:
            d.release(h)  # torch's own mapping keeps the memory alive
        try:
            objs, fds = self.group.exchange((lead, [(rel, size) for rel, size, _ in parts]), own, "heap vmm open")
        finally:
            close_fds(own)
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
                self.va[p] = va + peer_lead
        finally:
            close_fds(fd for p in self.peers for fd in fds[p])

    def grow(self, nbytes: int, offset, new, call: str, undo_new) -> None:
        """One batched exchange: every rank's new segments, mapped into each peer's view.

        Ranks agree on (nbytes, offset); each maps a peer's memory by that peer's own segment list.
        undo_new takes this rank's part back when a peer could not do its own. The exchange also
        carries each rank's garbage queue: blocks queued everywhere are released here."""
        desc = None if new is None else (nbytes, offset)
        own = [self.driver.export(s.handle) for s in new or ()]
        layout = [(s.offset, s.size) for s in new or ()]
        try:
            objs, fds = self.group.exchange((desc, self.symmetry.token(call), layout, self.heap._point()), own,
                                            "heap growth")
        finally:
            close_fds(own)
        self._stats["exchanges"] += 1
        received = [fd for p in self.peers for fd in fds[p]]
        try:
            self.heap._release_agreed([o[3] for o in objs])
        except BaseException:
            close_fds(received)
            raise
        objs, tokens, layouts = [o[0] for o in objs], [o[1] for o in objs], [o[2] for o in objs]
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
                    raise HeapOutOfMemory(nbytes, self.alloc.offsets.free_bytes, self.alloc.capacity,
                                          f"Ranks {failed} could not back it: their devices are out of memory. "
                                          "Free tensors and call ctx.trim() on every rank.")
                raise SymmetryError(f"rank {self.rank} allocated {nbytes} bytes at offset {offset}, but ranks "
                                    f"{diverged} made a different allocation ({[objs[p] for p in diverged]}); every "
                                    "rank must allocate the same sizes in the same order")
            imported = []
            try:
                for p in self.peers:
                    for (off, size), fd in zip(layouts[p], fds[p]):
                        self.import_(p, off, size, fd, imported)
                    for lo, hi in _runs(layouts[p]):
                        self.driver.set_access(self.va[p] + lo, hi - lo)
            except BaseException:
                self.unimport(imported)
                raise
            self._stats["growths"] += 1
        finally:
            close_fds(received)

    def import_(self, peer: int, offset: int, size: int, fd: int, imported: list) -> None:
        """Map peer's segment at offset in its view; imported collects (peer, offset) for unimport."""
        d = self.driver
        handle = d.import_(fd)
        try:
            d.map(self.va[peer] + offset, size, handle)
        except BaseException:
            d.release(handle)
            raise
        self._mapped[peer][offset] = (handle, size)
        self._starts[peer].add(offset)
        imported.append((peer, offset))

    def unimport(self, imported: list) -> None:
        """Take back what import_ mapped, newest first (a failure part way leaves nothing mapped)."""
        for peer, offset in reversed(imported):
            handle, size = self._forget(peer, offset)
            self.driver.unmap(self.va[peer] + offset, size)
            self.driver.release(handle)
        imported.clear()

    def _forget(self, peer: int, offset: int):
        self._starts[peer].remove(offset)
        return self._mapped[peer].pop(offset)

    def drop_range(self, lo: int, hi: int, peers: Optional[List[int]] = None) -> None:
        """Unmap and release every peer segment that starts in [lo, hi)."""
        for p in self.peers if peers is None else peers:
            starts = []
            for offset in self._starts[p].irange(lo):
                if offset >= hi:
                    break
                starts.append(offset)
            for offset in starts:
                handle, size = self._forget(p, offset)
                self.driver.unmap(self.va[p] + offset, size)
                self.driver.release(handle)
