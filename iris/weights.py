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


def module_to_heap(ctx, module: torch.nn.Module, copy: Optional[bool] = None) -> torch.nn.Module:
    """Put every parameter and buffer of module on the heap, in place, in one batched as_symmetric
    (zero copy where it can). Collective: all ranks, the same module structure."""
    slots = [(sub, kind, name, t) for sub in module.modules() for kind in ("_parameters", "_buffers")
             for name, t in getattr(sub, kind).items() if t is not None]
    # a non-contiguous tensor goes in through a contiguous copy, which the heap keeps alive
    views = ctx.as_symmetric([t.data.contiguous() for _, _, _, t in slots], copy=copy)
    for (sub, kind, name, t), view in zip(slots, views):
        if kind == "_parameters":
            t.data = view
        else:
            sub._buffers[name] = view
    return module
