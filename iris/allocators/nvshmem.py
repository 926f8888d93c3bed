"""NvshmemAllocator: one large piece of NVSHMEM's symmetric heap, handed out by iris's offset policy.

The piece is taken collectively once, when the heap is made; after that an allocation is local
arithmetic (no collective, no NVSHMEM call), as with the torch allocator. Peers' copies come from
nvshmem_ptr, which is 0 for a peer reachable only through NVSHMEM's device API.
"""
from __future__ import annotations

import torch

from ..errors import HeapOutOfMemory, ProviderUnavailable
from .offsets import CachingOffsets


class NvshmemAllocator:
    """nvshmem_free is collective, so the piece goes back only when every rank closes with no
    tensor left over it (the heap agrees on that); otherwise it stays until NVSHMEM finalizes."""

    vmm = False
    one_host = False  # peers on other hosts are reached through NVSHMEM's device API
    name = "nvshmem"  # its key in ALLOCATORS
    reserved = 0  # bytes of size that iris keeps for itself, beyond the user's heap_size
    granularity = 1
    capacity = property(lambda self: self.size - self.reserved)

    def __init__(self, driver, heap_size: int, device: torch.device, group, reserved: int = 0):
        if device.type != "cuda":
            raise ProviderUnavailable(f"allocator='nvshmem' needs a CUDA GPU; this heap is on {device}. "
                                      "Use allocator='torch' or 'vmem'")
        from ..platform import nvshmem as runtime
        self._runtime = runtime
        runtime.ensure_init(lambda raw: group.allgather(raw, "nvshmem unique id")[0], group.rank, group.world,
                            device.index, heap_size)
        self.rank, self.world, self.reserved = group.rank, group.world, reserved
        self.base, self.size = runtime.malloc(heap_size), heap_size
        self._kept = False
        self.offsets = CachingOffsets(heap_size)
        self._policy = self.offsets.allocate
        self.free = self.offsets.free  # free(offset) -> size
        self.reuse = self.offsets.reuse  # reuse(size) -> offset of a freed block of that size, or None

    committed = property(lambda self: self.size)
    free_is_collective = True

    def peer_bases(self, peers) -> dict:
        """peer -> where its piece is mapped here (nvshmem_ptr), 0 where it is not reachable by load and store."""
        return {p: self._runtime.check_peer(self.base, p, self.rank) for p in peers}

    def allocate(self, nbytes: int, align: int, may_grow=None):
        offset = self._policy(nbytes, align)
        if offset is None:
            raise HeapOutOfMemory(nbytes, self.offsets.free_bytes, self.capacity,
                                  f"The largest free block is {self.offsets.largest_free()} bytes. Free tensors with "
                                  "ctx.free(), or create the heap with a larger heap_size.")
        return offset, ()

    def undo(self, offset: int, new) -> None:
        self.offsets.free_now(offset)

    def trimmable(self):
        return []  # NVSHMEM gives memory back only a whole allocation at a time, collectively

    def release(self, segments) -> None:
        pass

    def keep(self) -> None:
        """Leave the piece to NVSHMEM's finalize: some rank still holds tensors over it, so the
        ranks cannot free it together."""
        self._kept = True

    def close(self) -> None:
        if self.base and not self._kept:
            self._runtime.free(self.base)
        self.base = 0
