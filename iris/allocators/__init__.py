"""Allocators: policy only, over the Driver protocol."""
from .nvshmem import NvshmemAllocator
from .offsets import Offsets
from .torch_bump import TorchAllocator
from .vmem import Segment, VMemAllocator

# one signature: (driver, heap_size, device, group)
ALLOCATORS = {"torch": TorchAllocator, "vmem": VMemAllocator, "nvshmem": NvshmemAllocator}

__all__ = ["ALLOCATORS", "NvshmemAllocator", "Offsets", "Segment", "TorchAllocator", "VMemAllocator"]
