"""iris.tensor_creation: Iris's module of factory helpers, each a thin call into the heap's
factories (iris/heap/factories.py), so a program or test written against Iris's module gets the
same checks, words and tensors as ctx.zeros and the rest. heap is a context's ctx.heap; iris_device
its device. The factories are collective: all ranks, same order, same sizes.
"""
from __future__ import annotations

import math

import torch

from .errors import FactoryArgumentError
from .heap.factories import check_layout, device_matches, shape_of, unwrapped


def parse_size(size):
    """(size, number of elements) of a factory's *size: ints, or one tuple or list, nested ones
    unwrapped, returned as given (a list stays a list)."""
    size = unwrapped(size)
    return size, math.prod(shape_of(size))


def is_valid_device(device, iris_device) -> bool:
    """Whether device names iris_device: None, its type with no index, or its type and index."""
    return device is None or device_matches(device, torch.device(iris_device))


def throw_if_invalid_device(device, iris_device) -> None:
    if not is_valid_device(device, iris_device):
        raise FactoryArgumentError(f"the heap lives on {iris_device}; got device={device!r} (leave it out)")


def throw_if_invalid_output_tensor(heap, tensor: torch.Tensor, num_elements: int, dtype: torch.dtype) -> None:
    """tensor can be a factory's out= for num_elements of dtype: the factories' check, in Iris's order
    (elements, dtype, heap)."""
    heap.factories.checked_out(tensor, torch.Size((num_elements,)), dtype)


def apply_layout(tensor: torch.Tensor, layout) -> torch.Tensor:
    """tensor, where layout is torch.strided (heap tensors are dense); ValueError otherwise."""
    check_layout(layout)
    return tensor


def zeros(heap, iris_device, size, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    return heap.factories.zeros(size, out=out, dtype=dtype, layout=layout, requires_grad=requires_grad)


def ones(heap, iris_device, size, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    return heap.factories.ones(size, out=out, dtype=dtype, layout=layout, requires_grad=requires_grad)


def full(heap, iris_device, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None,
         requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    return heap.factories.full(size, fill_value, out=out, dtype=dtype, layout=layout, requires_grad=requires_grad)


def zeros_like(heap, iris_device, input: torch.Tensor, *, dtype=None, layout=None, device=None, requires_grad=False,
               memory_format=torch.preserve_format):
    throw_if_invalid_device(device, iris_device)
    return heap.factories.zeros_like(input, dtype=dtype, layout=layout, requires_grad=requires_grad,
                                     memory_format=memory_format)
