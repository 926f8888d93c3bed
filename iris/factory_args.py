"""torch's factory keywords that a heap tensor can honour: layout, pin_memory, memory_format, out."""
from __future__ import annotations

import warnings

import torch


def check_layout(layout) -> None:
    if layout not in (None, torch.strided):
        raise ValueError(f"heap tensors are dense: layout must be torch.strided, got {layout}")


def check_pin_memory(pin_memory) -> None:
    if pin_memory:  # Iris accepts it and allocates on the heap all the same
        warnings.warn("pin_memory=True has no effect: heap tensors live in the heap's device memory", stacklevel=4)


def out_as(out, shape: torch.Size):
    """out viewed with shape where it holds as many elements (as Iris allows), else out unchanged so
    the allocation's own check explains the mismatch."""
    if out is None or tuple(out.shape) == tuple(shape):
        return out
    if out.numel() != shape.numel():
        raise ValueError(f"out has {out.numel()} elements but size {tuple(shape)} needs {shape.numel()}")
    return out.view(shape)


def restride(t: torch.Tensor, memory_format=None, like: torch.Tensor | None = None) -> torch.Tensor:
    """t (contiguous, fresh) laid out in memory_format; torch.preserve_format keeps like's strides.
    The block holds exactly numel elements, and every format is a permutation of them."""
    if memory_format in (None, torch.contiguous_format) or (memory_format == torch.preserve_format and like is None):
        return t
    meta = (torch.empty_like(like, device="meta", memory_format=memory_format) if like is not None
            else torch.empty(t.shape, device="meta", memory_format=memory_format))
    if meta.stride() == t.stride():
        return t
    return torch.as_strided(t, t.shape, meta.stride(), t.storage_offset())
