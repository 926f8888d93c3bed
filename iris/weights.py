"""Model weights on the heap: a safetensors checkpoint read straight into heap tensors, and an
nn.Module's parameters and buffers moved onto the heap in place."""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch

Shard = Callable[[str, Tuple[int, ...]], Optional[tuple]]


def load_safetensors(ctx, path: str, shard: Optional[Shard] = None, names=None) -> Dict[str, torch.Tensor]:
    """name -> heap tensor for every tensor of the checkpoint (or of `names`).

    shard(name, shape) may return a tuple of slices: only that part is read (it must have the
    same shape on every rank). Bytes go from the file's pages to the heap tensor; nothing is
    staged on the device. Collective: all ranks, same file, same names, same shard shapes.
    """
    from safetensors import safe_open

    out = {}
    with safe_open(path, framework="pt", device="cpu") as f:
        for name in sorted(f.keys() if names is None else names):
            part = f.get_slice(name)
            index = shard(name, tuple(part.get_shape())) if shard else None
            src = part[index] if index is not None else part[:]
            dst = ctx.empty(src.shape, dtype=src.dtype)
            dst.copy_(src)
            out[name] = dst
    return out


def _to_heap(ctx, t: torch.Tensor, copy: Optional[bool]) -> torch.Tensor:
    # a non-contiguous tensor would need a temporary: copy it into the heap rather than alias one
    return ctx.as_symmetric(t, copy=copy) if t.is_contiguous() else ctx.as_symmetric(t.contiguous(), copy=True)


def module_to_heap(ctx, module: torch.nn.Module, copy: Optional[bool] = None) -> torch.nn.Module:
    """Put every parameter and buffer of module on the heap, in place (zero copy where as_symmetric
    can). Collective: all ranks, the same module structure."""
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                p.data = _to_heap(ctx, p.data, copy)
        for name, b in list(sub._buffers.items()):
            if b is not None:
                sub._buffers[name] = _to_heap(ctx, b, copy)
    return module
