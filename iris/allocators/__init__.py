"""Allocators: policy only, over the Driver protocol."""
from .offsets import Offsets
from .torch_bump import TorchAllocator
from .vmem import Segment, VMemAllocator

ALLOCATORS = {"torch": TorchAllocator, "vmem": VMemAllocator}

__all__ = ["ALLOCATORS", "Offsets", "Segment", "TorchAllocator", "VMemAllocator"]
