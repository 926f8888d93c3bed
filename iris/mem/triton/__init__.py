"""iris.mem.triton: the Triton device API at Iris's module path (iris/device/ holds it)."""
from ...device.tiles import TensorView, Tile, TileView, make_tensor_view
from .context import Context, DeviceContext
from .ops import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_sub, atomic_xchg,
                  atomic_xor, copy, get, load, put, store)

__all__ = ["Context", "DeviceContext", "TensorView", "Tile", "TileView", "atomic_add", "atomic_and", "atomic_cas",
           "atomic_max", "atomic_min", "atomic_or", "atomic_sub", "atomic_xchg", "atomic_xor", "copy", "get", "load",
           "make_tensor_view", "put", "store"]
