"""AsSymmetric: existing tensors onto the heap, zero copy where their memory can be mapped.

What matters:
- Importing the same tensor (address, bytes, dtype, shape) again returns the same heap view, until
  ctx.free forgets it; the import holds the source tensor so its allocator keeps off the memory.
- Where the memory cannot be mapped (not VMM-backed on some rank, or a heap that cannot adopt), the
  tensor is copied into a new block: with a warning, or an error under copy=False.
- Collective: all ranks import the same tensors in the same order.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch


class AsSymmetric:
    """The heap's imports by source tensor, and the copy fallback; heap.as_symmetric(t) imports."""

    def __init__(self, heap, factories):
        self.heap, self.factories, self.device = heap, factories, heap.device
        self._imported = {}  # (address, nbytes, dtype, shape) of an imported tensor -> (heap view, tensor)
        self.starts = {}  # heap offset -> keys of _imported there: free forgets an import in O(1), and leaves it to ctx.free

    def __call__(self, t, copy: Optional[bool] = None):
        """A heap tensor with t's contents (t may be a list or tuple: one batched import, a list
        back). Collective: all ranks, the same tensors in the same order."""
        batch = isinstance(t, (list, tuple))
        tensors = list(t) if batch else [t]
        if copy not in (None, True, False):
            raise TypeError(f"copy must be None, True or False, got {copy!r}")
        for x in tensors:
            self._check_importable(x)
        heap = self.heap
        keys = [(heap.address(x), x.numel() * x.element_size(), x.dtype, tuple(x.shape)) for x in tensors]
        out, todo, first = [None] * len(tensors), [], {}
        for i, (x, key) in enumerate(zip(tensors, keys)):
            if heap.contains(x):
                out[i] = x
            elif key in self._imported:
                out[i] = self._imported[key][0]
            elif key not in first:  # a repeat in this batch takes its first occurrence's view
                first[key] = i
                todo.append(i)
        call = f"as_symmetric({len(todo)} tensors)" if batch else f"as_symmetric({tuple(t.shape)}, {t.dtype})"
        offsets = [None] * len(todo)
        if todo and heap.alloc.vmm and copy is not True:
            metas = [(tuple(tensors[i].shape), str(tensors[i].dtype)) for i in todo]
            offsets = heap.imports.adopt([keys[i][:2] for i in todo], metas, call)
        for i, offset in zip(todo, offsets):
            x = tensors[i]
            out[i] = heap.tensor(offset, x.shape, x.dtype) if offset is not None else self._copy_in(x, copy, call)
            self._imported[keys[i]] = (out[i], x)  # holding x keeps its allocator off the memory
            self.starts.setdefault(heap.offset_of(out[i]), []).append(keys[i])
        for i, key in enumerate(keys):
            if out[i] is None:
                out[i] = out[first[key]]
        return out if batch else out[0]

    def _check_importable(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"as_symmetric takes a torch.Tensor (or a list of them), got {type(t).__name__}")
        if t.device != self.device:
            raise ValueError(f"as_symmetric: the tensor is on {t.device} but this rank's heap is on {self.device}; "
                             f"move it first (t.to('{self.device}'))")
        if not t.is_contiguous():
            raise ValueError("as_symmetric needs a contiguous tensor (its bytes must be one range); "
                             "call t.contiguous() first, which copies")

    def _copy_in(self, t: torch.Tensor, copy: Optional[bool], call: str) -> torch.Tensor:
        alloc = self.heap.alloc
        why = (f"the {alloc.name} allocator cannot map memory it did not allocate; use allocator='vmem'"
               if not alloc.vmm else
               "its memory (on some rank) is not VMM-backed; on GPUs set "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch allocates it, on the host "
               "use t.share_memory_()")
        if copy is False:
            raise ValueError(f"{call}: zero copy is impossible: {why}")
        if copy is None:
            warnings.warn(f"{call} copied {t.numel() * t.element_size()} bytes into the heap: {why}", stacklevel=4)
        return self.factories.copied(t)

    def is_zero_copy(self, t: torch.Tensor) -> bool:
        """Whether t is a heap view that aliases memory imported without a copy."""
        return self.heap.contains(t) and self.heap.imports.is_adopted(self.heap.offset_of(t))

    def imported_at(self, offset: int) -> bool:
        """Whether an import (mapped or copied) starts at heap offset."""
        return offset in self.starts

    def forget(self, offset: int, t: torch.Tensor) -> None:
        """Forget the import at offset that t is (one of those there, its shape and dtype first), once
        the heap has freed it: importing its source again makes a new one."""
        keys = self.starts.get(offset) if self.starts else None
        if keys:
            key = next((k for k in keys if k[2] == t.dtype and k[3] == tuple(t.shape)), keys[0])
            keys.remove(key)
            del self._imported[key]
            if not keys:
                del self.starts[offset]

    def clear(self) -> None:
        """Drop every import's view and source (the heap is closing: they must not hold it)."""
        self._imported.clear()
        self.starts.clear()  # in place: the heap reads this dict on ctx.free's usual path
