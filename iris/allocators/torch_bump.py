"""TorchAllocator: one block taken at start (from torch on GPUs, a sparse memfd on the host),
handed out by the shared offset policy."""
from __future__ import annotations

from contextlib import ExitStack

import torch

from ..errors import HeapOutOfMemory
from .offsets import CachingOffsets


class TorchAllocator:
    """Peers open the block once through IPC; no collective and no driver call per allocation."""

    vmm = False
    one_host = True  # peers open the block through IPC: the context refuses a job spanning hosts
    name = "torch"  # its key in ALLOCATORS
    reserved = 0  # bytes of size that iris keeps for itself, beyond the user's heap_size
    granularity = 1  # heap sizes are taken as asked
    capacity = property(lambda self: self.size - self.reserved)

    def __init__(self, driver, heap_size: int, device: torch.device, group=None, reserved: int = 0):
        self.reserved = reserved
        free, total = driver.mem_info()
        if heap_size > total:  # checked before anything is taken
            raise HeapOutOfMemory(heap_size - reserved, free, heap_size,
                                  f"With iris's own {reserved} bytes it needs {heap_size}, more than the {total} bytes "
                                  "of memory here, and allocator='torch' takes its whole block at start. Use "
                                  "allocator='vmem' (it backs only the chunks in use, so heap_size may exceed memory) "
                                  "or a smaller heap_size.", creating=True)
        self.driver, self._mapped = driver, None
        if torch.device(device).type == "cpu":
            self.block = None
            self.base = self._map_sparse(driver, heap_size)
        else:
            self.block = torch.empty(heap_size, dtype=torch.uint8, device=device)
            self.base = self.block.data_ptr()
        self.size = heap_size
        self.offsets = CachingOffsets(heap_size)
        self._policy = self.offsets.allocate
        self.free = self.offsets.free  # free(offset) -> size
        self.reuse = self.offsets.reuse  # reuse(size) -> offset of a freed, backed block of that size, or None

    committed = property(lambda self: self.size)

    def _map_sparse(self, driver, size: int) -> int:
        """The host's block: a memfd mapped shared, committing pages only when first touched (peers
        open it by its fd, as the heap does with any shared mapping); a file in no filesystem, so a
        failed or killed rank leaves nothing behind."""
        with ExitStack() as undo:
            va = driver.reserve(size)
            undo.callback(driver.free_va, va, size)
            fd = driver.create_sparse(size)
            undo.callback(driver.release, fd)
            driver.map(va, size, fd)
            driver.set_access(va, size)
            undo.pop_all()
        self._mapped = (va, size, fd)
        return va

    def allocate(self, nbytes: int, align: int, may_grow=None):
        offset = self._policy(nbytes, align)
        if offset is None:
            raise HeapOutOfMemory(nbytes, self.offsets.free_bytes, self.capacity,
                                  f"The largest free block is {self.offsets.largest_free()} bytes. Free tensors with "
                                  "ctx.free(), or create the heap with a larger heap_size (or allocator='vmem').")
        return offset, ()

    def undo(self, offset: int, new) -> None:
        self.offsets.free_now(offset)

    def trimmable(self):
        return []

    def release(self, segments) -> None:
        pass

    def close(self) -> None:
        self.block = None
        if self._mapped is not None:
            va, size, fd = self._mapped
            self._mapped = None
            self.driver.free_va(va, size)
            self.driver.release(fd)
