"""iris: multi-GPU programming in Triton over a symmetric heap."""
import os as _os

from .platform import detect as _detect

if _detect() == "host":  # kernels over host memory run in Triton's interpreter
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from .context import Iris, iris  # noqa: E402
from .distributed import launch, spawn  # noqa: E402
from .errors import BootstrapError, DriverError, HeapOutOfMemory, IrisError, SymmetryError  # noqa: E402

__all__ = ["BootstrapError", "DriverError", "HeapOutOfMemory", "Iris", "IrisError", "SymmetryError", "iris",
           "launch", "spawn"]
