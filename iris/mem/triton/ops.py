"""iris.mem.triton.ops: the device functions at Iris's module path (iris/device/rma.py, atomics.py)."""
from ...device import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_sub, atomic_xchg,
                       atomic_xor, copy, get, load, put, store)

__all__ = ["atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_sub",
           "atomic_xchg", "atomic_xor", "copy", "get", "load", "put", "store"]
