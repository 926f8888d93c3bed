"""Torch tensors over raw addresses, without copying, each with an owner (any object) that lives
exactly as long as the last tensor, view, slice, dtype view or untyped_storage() handle over the
memory: that is how the heap learns when a block's last tensor is gone.

GPUs: torch.as_tensor over an object exposing __cuda_array_interface__ and carrying the owner
(torch holds that object as long as the storage). The host: torch.frombuffer over a ctypes array
carrying the owner. Both cost the least host time of the ways benchmarks/tensor_at_cost.py compares
(figures in docs/performance.md)."""
from __future__ import annotations

import ctypes
import math

import torch

# numpy type strings torch reads from __cuda_array_interface__; other dtypes (bfloat16, float8...)
# are made as the unsigned int of their size and viewed.
_TYPESTR = {torch.bool: "|b1", torch.uint8: "|u1", torch.int8: "|i1", torch.int16: "<i2", torch.int32: "<i4",
            torch.int64: "<i8", torch.float16: "<f2", torch.float32: "<f4", torch.float64: "<f8",
            torch.complex64: "<c8", torch.complex128: "<c16"}
_UINT = {1: "|u1", 2: "<u2", 4: "<u4", 8: "<u8"}


class _CudaArray:
    """The smallest object torch.as_tensor accepts as a view of device memory, carrying an owner that
    has no slot for the interface itself (carried_tensor_at fills it in)."""

    __slots__ = ("__cuda_array_interface__", "owner")

    def __init__(self, owner):
        self.owner = owner


def tensor_at(ptr: int, shape, dtype: torch.dtype, device: torch.device, owner=None, nbytes=None) -> torch.Tensor:
    """A contiguous tensor of shape (a tuple or torch.Size) and dtype at ptr on device, made in one
    step; owner lives exactly as long as the tensor's storage. nbytes: the size, if known."""
    return tensor_maker(device)(ptr, shape, dtype, device, owner, nbytes)


def tensor_maker(device: torch.device, carrier: bool = False):
    """tensor_at for device, chosen once. carrier: owners will have a __cuda_array_interface__ slot
    to carry the interface themselves (one object less per tensor on GPUs)."""
    if device.type == "cpu":
        return host_tensor_at
    return carried_tensor_at if carrier else device_tensor_at


def carried_tensor_at(ptr: int, shape, dtype: torch.dtype, device: torch.device, owner, nbytes=None):
    """device_tensor_at where owner itself carries the interface (it must have the slot)."""
    typestr = _TYPESTR.get(dtype)
    owner.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape if type(shape) is tuple else tuple(shape),
                                      "typestr": typestr or _UINT[dtype.itemsize], "version": 2}
    t = torch.as_tensor(owner, device=device)
    return t if typestr else t.view(dtype)


def device_tensor_at(ptr: int, shape, dtype: torch.dtype, device: torch.device, owner=None, nbytes=None):
    """tensor_at for device memory, for any owner (nbytes is not needed: the interface carries the shape)."""
    return carried_tensor_at(ptr, shape, dtype, device, _CudaArray(owner))


_ARRAYS = {}  # nbytes -> ctypes.c_uint8 * nbytes: the type is looked up once per size, not built per tensor


def _bytes_type(nbytes: int):
    if len(_ARRAYS) >= 4096:  # sizes a program uses are few; a sweep over many must not grow this forever
        _ARRAYS.clear()
    t = _ARRAYS[nbytes] = ctypes.c_uint8 * nbytes
    return t


def host_tensor_at(ptr: int, shape, dtype: torch.dtype, device=None, owner=None, nbytes=None) -> torch.Tensor:
    """tensor_at for host memory, through frombuffer."""
    if nbytes is None:
        nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:  # frombuffer refuses empty buffers: an empty slice of a one-byte one
        buf = (ctypes.c_uint8 * 1).from_address(ptr)
        buf.owner = owner
        return torch.frombuffer(buf, dtype=torch.uint8)[:0].view(dtype).view(shape)
    buf = (_ARRAYS.get(nbytes) or _bytes_type(nbytes)).from_address(ptr)
    buf.owner = owner
    t = torch.frombuffer(buf, dtype=dtype)
    return t if len(shape) == 1 else t.view(shape)


def bytes_at(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor aliasing [ptr, ptr + nbytes) on device."""
    return tensor_at(ptr, (nbytes,), torch.uint8, device, None, nbytes)
