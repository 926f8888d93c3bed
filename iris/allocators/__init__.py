"""Allocators: policy only, over the Driver protocol.

An allocator binds its offset policy's allocate, free and reuse once, when it is built, so the usual
allocation and free are one call into the policy (benchmarks/alloc_cost.py, docs/performance.md)."""
from .nvshmem import NvshmemAllocator
from .offsets import Offsets
from .torch_bump import TorchAllocator
from .vmem import Segment, VMemAllocator

# one signature: (driver, heap_size, device, group)
ALLOCATORS = {"torch": TorchAllocator, "vmem": VMemAllocator, "nvshmem": NvshmemAllocator}
ALIASES = {"vmem_chunked": "vmem"}  # Iris's name for a VMM heap that grows in chunks: what vmem does

__all__ = ["ALIASES", "ALLOCATORS", "NvshmemAllocator", "Offsets", "Segment", "TorchAllocator", "VMemAllocator"]
