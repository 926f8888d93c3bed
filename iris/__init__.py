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
from .logging import DEBUG, ERROR, INFO, WARNING, logger, set_logger_level  # noqa: E402
from .timing import do_bench  # noqa: E402
from .distributed import launch, spawn  # noqa: E402
from .device import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_sub,  # noqa: E402
                     atomic_xchg, atomic_xor, barrier_kernel, copy, get, load, put, signal, store, translate, wait)
from .device.context import DeviceContext  # noqa: E402
from .tracing import TraceEvent  # noqa: E402
from .errors import (BootstrapError, CaptureError, ContextClosed, DriverError, HeapOutOfMemory, IrisError,  # noqa: E402
                     SymmetryError)

__all__ = ["BootstrapError", "CaptureError", "ContextClosed", "DEBUG", "DeviceContext", "DriverError", "ERROR",
           "HeapOutOfMemory", "INFO", "Iris", "IrisError", "SymmetryError", "TraceEvent", "WARNING", "atomic_add",
           "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_sub", "atomic_xchg",
           "atomic_xor", "barrier_kernel", "copy", "do_bench", "get", "iris", "launch", "load", "logger", "put",
           "set_logger_level", "signal", "spawn", "store", "translate", "wait"]
