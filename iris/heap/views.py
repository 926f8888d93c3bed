"""Torch tensors over raw addresses, without copying: ctypes buffers on the host, the CUDA array interface on GPUs."""
from __future__ import annotations

import ctypes

import torch


class _CudaArray:
    """The smallest object torch.as_tensor accepts as a view of device memory."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


def bytes_at(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor aliasing [ptr, ptr + nbytes) on device."""
    if device.type == "cpu":
        return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)
    return torch.as_tensor(_CudaArray(ptr, nbytes), device=device)
