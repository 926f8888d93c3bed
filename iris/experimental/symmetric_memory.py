"""SymmetricAddressMap and address_map, where providers and Iris's programs import them from (defined in
iris/heap/address_map.py, below the heap that builds them)."""
from ..heap.address_map import SymmetricAddressMap, address_map

__all__ = ["SymmetricAddressMap", "address_map"]
