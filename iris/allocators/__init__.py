"""Allocators: policy only, over the Driver protocol."""
from .offsets import Offsets
from .torch_bump import TorchAllocator
from .vmem import Segment, VMemAllocator

ALLOCATORS = {"torch": TorchAllocator, "vmem": VMemAllocator}
ALIASES = {"vmem_chunked": "vmem"}  # Iris's name for a VMM heap that grows in chunks: what vmem does

__all__ = ["ALIASES", "ALLOCATORS", "Offsets", "Segment", "TorchAllocator", "VMemAllocator"]
