"""iris: multi-GPU programming in Triton over a symmetric heap."""
import os as _os

from .platform import detect as _detect

try:
    _host = _detect() == "host"
except ValueError:  # a bad IRIS_PLATFORM: iris.iris() and `iris info` report it
    _host = False
if _host:  # kernels over host memory run in Triton's interpreter
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from .context import Iris, iris  # noqa: E402
from .distributed import launch, spawn  # noqa: E402
from .device import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_sub,  # noqa: E402
                     atomic_xchg, atomic_xor, barrier_kernel, copy, get, load, put, signal, store, translate, wait)
from .errors import BootstrapError, ContextClosed, DriverError, HeapOutOfMemory, IrisError, SymmetryError  # noqa: E402

__all__ = ["BootstrapError", "ContextClosed", "DriverError", "HeapOutOfMemory", "Iris", "IrisError", "SymmetryError", "atomic_add",
           "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_sub", "atomic_xchg",
           "atomic_xor", "barrier_kernel", "copy", "get", "iris", "launch", "load", "put", "signal", "spawn", "store",
           "translate", "wait"]
