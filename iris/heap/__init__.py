"""The symmetric heap: one allocator, peer views and heap_bases."""
from .symmetric import SymmetricHeap
from .views import bytes_at

__all__ = ["SymmetricHeap", "bytes_at"]
