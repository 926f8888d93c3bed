"""Argument checks that run before anything is allocated: each raises naming the problem and the fix."""
from __future__ import annotations

import math

import torch

from .errors import ContextClosed

_PYTHON_TYPES = {float: torch.float64, int: torch.int64, bool: torch.bool, complex: torch.complex128}  # as torch
_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
MAX_BYTES = (1 << 63) - 1
_DTYPE = torch.dtype
_CHECKED = {}  # torch.dtype that dtype_of accepted -> its itemsize (so plain_request skips the checks)


def timeout_seconds(value) -> float:
    """A timeout= argument checked: a finite positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"timeout must be a finite positive number of seconds, got {value!r}; e.g. timeout=300")
    return float(value)


def dtype_of(dtype) -> torch.dtype:
    """A torch.dtype from what torch's factories take: a torch.dtype, or float/int/bool/complex."""
    if dtype is None:
        dtype = torch.get_default_dtype()
        _CHECKED[dtype] = dtype.itemsize  # the usual call names no dtype: plain_request takes it from now on
        return dtype
    if isinstance(dtype, type) and dtype in _PYTHON_TYPES:
        return _PYTHON_TYPES[dtype]
    if not isinstance(dtype, torch.dtype):
        name = getattr(dtype, "name", None) or (dtype if isinstance(dtype, str) else getattr(dtype, "__name__", ""))
        hint = f"torch.{name}" if isinstance(getattr(torch, str(name), None), torch.dtype) else "a torch.dtype"
        raise TypeError(f"dtype must be a torch.dtype (as for torch's factories), got {type(dtype).__name__} "
                        f"{dtype!r}; pass {hint}")
    if dtype in _QUANTIZED:
        raise ValueError(f"dtype={dtype} is quantized, which the heap does not hold: allocate the integer "
                         "storage (e.g. torch.int8) and keep scale and zero point beside it")
    _CHECKED[dtype] = dtype.itemsize
    return dtype


def request(size, dtype, requires_grad, shape_of):
    """(shape, dtype) of a factory call, checked: sizes, dtype, gradient, and a byte count that fits."""
    shape, dtype = shape_of(size), dtype_of(dtype)
    if requires_grad and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"requires_grad=True needs a floating point or complex dtype, got {dtype} (as in torch)")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_BYTES:
        raise ValueError(f"size {tuple(shape)} of {dtype} is {nbytes} bytes, more than any heap can hold; "
                         "check the sizes")
    return shape, dtype


def plain_request(size, dtype):
    """(shape, dtype, nbytes) of the usual factory call, or None where request must look closer:
    size is ints (or one int), dtype None or a torch.dtype seen valid before, and the byte count
    fits. A shape returned here is one that request would return, as a tuple."""
    if type(size) is not tuple:
        size = (size,)
    if dtype is None:
        dtype = torch.get_default_dtype()
    n = _CHECKED.get(dtype) if type(dtype) is _DTYPE else None
    if n is None:
        return None
    for s in size:
        if type(s) is not int or not 0 <= s < 1 << 63:
            return None
        n *= s
    return (size, dtype, n) if n < 1 << 63 else None  # n <= MAX_BYTES, a constant here


def heap_tensor(t, call: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{call} takes a heap tensor (from the context's factories), got {type(t).__name__} {t!r}")
    return t


class ClosedHeap:
    """Stands in for the heap (or, named what, another part such as the reserve) of a closed context:
    any use says so (close itself stays a no-op)."""

    def __init__(self, what: str = "heap"):
        self.what = what

    def __getattr__(self, name):
        raise ContextClosed(f"context is closed (tried {self.what}.{name}); create a new one with iris.iris()")

    def close(self) -> None:
        pass
