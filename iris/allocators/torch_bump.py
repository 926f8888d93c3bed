"""TorchAllocator: one block taken from torch at start, handed out by the shared offset policy."""
from __future__ import annotations

import torch

from ..errors import HeapOutOfMemory
from .offsets import CachingOffsets


class TorchAllocator:
    """Peers open the block once through IPC; no collective and no driver call per allocation."""

    vmm = False
    one_host = True  # peers open the block through IPC: the context refuses a job spanning hosts
    reserved = 0  # bytes of size that iris keeps for itself (the context sets it)
    granularity = 1  # heap sizes are taken as asked
    capacity = property(lambda self: self.size - self.reserved)

    def __init__(self, driver, heap_size: int, device: torch.device, group=None):
        if torch.device(device).type == "cpu":  # the host driver shares it by fd: made shared, not copied there
            block = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(heap_size))
        else:
            block = torch.empty(heap_size, dtype=torch.uint8, device=device)
        self.block, self.base, self.size = block, block.data_ptr(), heap_size
        self.offsets = CachingOffsets(heap_size)
        self._policy = self.offsets.allocate
        self.free = self.offsets.free  # free(offset) -> size
        self.reuse = self.offsets.reuse  # reuse(size) -> offset of a freed, backed block of that size, or None

    committed = property(lambda self: self.size)

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
