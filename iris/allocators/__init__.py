"""Allocators: policy only, over the Driver protocol.

An allocator binds its offset policy's allocate, free and reuse once, when it is built, so the usual
allocation and free are one call into the policy (benchmarks/alloc_cost.py, docs/performance.md)."""
from .nvshmem import NvshmemAllocator
from .offsets import Offsets
from .torch_bump import TorchAllocator
from .vmem import Segment, VMemAllocator

# one signature: (driver, heap_size, device, group, reserved=0); each warns of its own rounding
ALLOCATORS = {cls.name: cls for cls in (TorchAllocator, VMemAllocator, NvshmemAllocator)}
ALIASES = {"vmem_chunked": "vmem"}  # Iris's name for a VMM heap that grows in chunks: what vmem does


def allocator_named(name: str):
    """The registry's name for name (Iris's aliases resolved); a clear error for an unknown one."""
    name = ALIASES.get(name, name)
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator {name!r}; use one of {sorted(ALLOCATORS)} (argument or IRIS_ALLOCATOR)")
    return name


def check_heap_size(heap_size) -> int:
    """heap_size as every allocator takes it: a positive int number of bytes."""
    if isinstance(heap_size, bool) or not isinstance(heap_size, int):
        raise TypeError(f"heap_size must be an int number of bytes, got {type(heap_size).__name__} {heap_size!r}")
    if heap_size <= 0:
        raise ValueError(f"heap_size must be positive, got {heap_size}; e.g. heap_size=1 << 30 for 1 GiB")
    return heap_size


__all__ = ["ALIASES", "ALLOCATORS", "NvshmemAllocator", "Offsets", "Segment", "TorchAllocator", "VMemAllocator",
           "allocator_named", "check_heap_size"]
