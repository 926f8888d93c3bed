"""Device functions for Triton kernels over the symmetric heap (Iris names and argument order)."""
from .atomics import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_sub, atomic_xchg,
                      atomic_xor)
from .rma import copy, get, load, put, store
from .sync import barrier_kernel, signal, wait
from .translate import translate
from .aggregate import INTERPRETED

if INTERPRETED:
    from . import interpreter
    interpreter.install()

__all__ = ["atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_sub",
           "atomic_xchg", "atomic_xor", "barrier_kernel", "copy", "get", "load", "put", "signal", "store",
           "translate", "wait"]
