"""Torch tensors over raw addresses, without copying, the same way on the host and on GPUs.

The memory is wrapped in an UntypedStorage that does not own it. torch keeps a storage's Python
object alive exactly as long as the C++ storage (every tensor, view, slice or dtype view over it,
and every untyped_storage() handle), so an owner set as an attribute of that object learns when
the last of them is gone."""
from __future__ import annotations

import math

import torch

_storage_at = torch._C._construct_storage_from_data_pointer  # (ptr, device, nbytes): a non-owning storage
_templates = {}  # (dtype, device) -> an empty tensor; template.new(storage) is a tensor of its dtype over storage


def tensor_at(ptr: int, shape, dtype: torch.dtype, device: torch.device, owner=None, nbytes=None) -> torch.Tensor:
    """A contiguous tensor of shape (a tuple or torch.Size) and dtype at ptr on device; owner (any
    object) lives exactly as long as the tensor's storage. nbytes: the size, if the caller knows it."""
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


def bytes_at(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor aliasing [ptr, ptr + nbytes) on device."""
    return tensor_at(ptr, (nbytes,), torch.uint8, device, None, nbytes)
