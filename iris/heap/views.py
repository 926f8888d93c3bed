"""Torch tensors over raw addresses, without copying, each with an owner (any object) that lives
exactly as long as the last tensor, view, slice, dtype view or untyped_storage() handle over the
memory: that is how the heap learns when a block's last tensor is gone.

GPUs: the memory is wrapped in an UntypedStorage that does not own it, and the owner set as an
attribute of that storage (torch keeps a storage's Python object alive as long as the C++ storage).
The host: torch.frombuffer over a ctypes array carrying the owner (torch holds the buffer as long
as the storage); measured faster there than the storage path (benchmarks/tensor_at_cost.py)."""
from __future__ import annotations

import ctypes
import math

import torch

_storage_at = torch._C._construct_storage_from_data_pointer  # (ptr, device, nbytes): a non-owning storage
_templates = {}  # (dtype, device) -> an empty tensor; template.new(storage) is a tensor of its dtype over storage


def tensor_at(ptr: int, shape, dtype: torch.dtype, device: torch.device, owner=None, nbytes=None) -> torch.Tensor:
    """A contiguous tensor of shape (a tuple or torch.Size) and dtype at ptr on device, made in one
    step; owner lives exactly as long as the tensor's storage. nbytes: the size, if known."""
    return tensor_maker(device)(ptr, shape, dtype, device, owner, nbytes)


def tensor_maker(device: torch.device):
    """tensor_at for device, chosen once."""
    return host_tensor_at if device.type == "cpu" else device_tensor_at


def device_tensor_at(ptr: int, shape, dtype: torch.dtype, device: torch.device, owner=None, nbytes=None):
    """tensor_at through a non-owning storage (any device, the host included)."""
    if nbytes is None:
        nbytes = math.prod(shape) * dtype.itemsize
    storage = _storage_at(ptr, device, nbytes)
    if owner is not None:
        storage.owner = owner
    template = _templates.get((dtype, device))
    if template is None:
        template = _templates[(dtype, device)] = torch.empty(0, dtype=dtype, device=device)
    t = template.new(storage)  # one C++ call: an empty tensor of the template's kind, set_ to storage
    return t if len(shape) == 1 else t.view(shape)


def host_tensor_at(ptr: int, shape, dtype: torch.dtype, device=None, owner=None, nbytes=None) -> torch.Tensor:
    """tensor_at for host memory, through frombuffer."""
    if nbytes is None:
        nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:  # frombuffer refuses empty buffers: an empty slice of a one-byte one
        buf = (ctypes.c_uint8 * 1).from_address(ptr)
        buf.owner = owner
        return torch.frombuffer(buf, dtype=torch.uint8)[:0].view(dtype).view(shape)
    buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
    buf.owner = owner
    t = torch.frombuffer(buf, dtype=dtype)
    return t if len(shape) == 1 else t.view(shape)


def bytes_at(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor aliasing [ptr, ptr + nbytes) on device."""
    return tensor_at(ptr, (nbytes,), torch.uint8, device, None, nbytes)
