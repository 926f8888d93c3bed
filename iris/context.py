"""Iris: the user's handle on a symmetric heap: ranks, torch-like tensor factories, barriers."""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from numbers import Number
from typing import Optional

import torch

from . import distributed
from .allocators import ALLOCATORS
from .heap import SymmetricHeap
from .platform import get_driver
from .validate import ClosedHeap, heap_tensor, request

ALIGN = 256


def _shape(size) -> torch.Size:
    """torch's size convention: ints, or one tuple/list/Size."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    for s in size:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"sizes must be ints, got {type(s).__name__} {s!r} in {tuple(size)}")
        if s < 0:
            raise ValueError(f"negative dimension {s} in size {tuple(size)}")
        if s >= 1 << 63:
            raise ValueError(f"dimension {s} in size {tuple(size)} does not fit in 64 bits; check the sizes")
    return torch.Size(size)


def _check_heap_size(heap_size) -> int:
    if isinstance(heap_size, bool) or not isinstance(heap_size, int):
        raise TypeError(f"heap_size must be an int number of bytes, got {type(heap_size).__name__} {heap_size!r}")
    if heap_size <= 0:
        raise ValueError(f"heap_size must be positive, got {heap_size}; e.g. heap_size=1 << 30 for 1 GiB")
    return heap_size


class Iris:
    """A symmetric heap shared by every rank of the job. Creating one is collective: all ranks."""

    def __init__(self, heap_size: int = 1 << 30, allocator: Optional[str] = None, platform: Optional[str] = None,
                 timeout: Optional[float] = None):
        heap_size = _check_heap_size(heap_size)
        name = os.environ.get("IRIS_ALLOCATOR") or allocator or "torch"
        if name not in ALLOCATORS:
            raise ValueError(f"unknown allocator {name!r}; use one of {sorted(ALLOCATORS)} (argument or IRIS_ALLOCATOR)")
        self.allocator_name = name
        self._imported = {}  # (address, nbytes, dtype, shape) of an imported tensor -> (heap view, tensor)
        self._imported_at = {}  # heap offset -> keys of _imported there, so free forgets an import in O(1)
        self.driver = get_driver(platform)
        self.group = distributed.connect(timeout)
        self.rank, self.world = self.group.rank, self.group.world
        alloc = None
        try:
            index = self.rank % self.driver.device_count()
            self.driver.set_device(index)
            if self.driver.torch_device == "cpu":
                self.device = torch.device("cpu")
            else:
                torch.cuda.set_device(index)
                self.device = torch.device("cuda", index)
            alloc = (ALLOCATORS[name](self.driver, heap_size) if name == "vmem"
                     else ALLOCATORS[name](self.driver, heap_size, self.device))
            self.heap = SymmetricHeap(alloc, self.driver, self.group, self.device)
            # device_barrier's flags: allocated first, so no scope() or free can take them
            self._barrier_flags = self.zeros(self.world + 1, dtype=torch.int64)
            self.barrier()  # every rank's flags are zero before any rank signals into them
        except BaseException as e:
            self.group.abort(f"creating the heap: {type(e).__name__}: {e}")  # the others learn why
            made = self.heap if hasattr(self, "heap") else alloc  # release what this rank made
            if made is not None:
                made.close()
            raise

    # -- who and where -----------------------------------------------------
    def get_rank(self) -> int:
        return self.rank

    def get_num_ranks(self) -> int:
        return self.world

    def get_device(self) -> torch.device:
        return self.device

    def get_heap_bases(self) -> torch.Tensor:
        """int64 tensor on the heap's device: entry r is where rank r's heap is mapped in this process."""
        return self.heap.heap_bases

    @property
    def heap_size(self) -> int:
        return self.heap.size

    def barrier(self) -> None:
        """Waits for this rank's device work, then for every rank. Collective: all ranks."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.heap.check_symmetry()

    # -- memory ------------------------------------------------------------
    def is_symmetric(self, t: torch.Tensor) -> bool:
        """Whether all of t lies on this heap (so every rank has a copy at the same offset)."""
        return self.heap.contains(t)

    def peer_view(self, t: torch.Tensor, rank: int) -> torch.Tensor:
        """rank's copy of heap tensor t, mapped in this process: host code can read and write it."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is not in [0, {self.world})")
        offset = self.heap.offset_of(t)
        base = self.heap.tensor(0, (self.heap.size,), torch.uint8, rank)
        return torch.as_strided(base.view(t.dtype) if offset % t.element_size() == 0 else base,
                                t.shape, t.stride(), offset // t.element_size())

    def free(self, t: torch.Tensor) -> None:
        """Give t's block back for reuse. Collective: all ranks free the same tensors in the same order."""
        offset = self.heap.offset_of(heap_tensor(t, "free"))
        self.heap.free(offset)
        keys = self._imported_at.get(offset)
        if keys:  # forget the import this was (one of those at this offset, its shape and dtype first)
            key = next((k for k in keys if k[2] == t.dtype and k[3] == tuple(t.shape)), keys[0])
            keys.remove(key)
            del self._imported[key]
            if not keys:
                del self._imported_at[offset]

    def trim(self) -> int:
        """Give memory with no live tensor back to the device; returns bytes released. Collective."""
        return self.heap.trim()

    def _made(self, size, dtype, device, out, requires_grad, fill=None) -> torch.Tensor:
        """A new heap tensor (or out, checked), filled outside autograd, then requires_grad as asked."""
        self._check_device(device)
        shape, dtype = request(size, dtype, requires_grad, _shape)
        if out is not None:
            if not self.is_symmetric(out) or out.shape != shape or out.dtype != dtype:
                raise ValueError(f"out must be a heap tensor of shape {tuple(shape)} and dtype {dtype}; got "
                                 f"{'a heap' if self.is_symmetric(out) else 'a non-heap'} tensor of shape "
                                 f"{tuple(out.shape)} and dtype {out.dtype}")
            t = out
        else:
            t = self.heap.tensor(self.heap.allocate(shape.numel() * dtype.itemsize, ALIGN), shape, dtype)
        if fill is not None:
            with torch.no_grad():
                fill(t)
        return t.requires_grad_(requires_grad) if requires_grad else t

    def _check_device(self, device) -> None:
        if device is not None and torch.device(device).type != self.device.type:
            raise ValueError(f"the heap lives on {self.device}; got device={device!r} (leave it out)")

    def _copied(self, ref: torch.Tensor, out, requires_grad) -> torch.Tensor:
        return self._made(ref.shape, ref.dtype, None, out, requires_grad, lambda t: t.copy_(ref))

    # -- factories (collective: all ranks, same order, same sizes) ---------
    def empty(self, *size, dtype=None, device=None, out=None, requires_grad=False) -> torch.Tensor:
        return self._made(size, dtype, device, out, requires_grad)

    def zeros(self, *size, dtype=None, device=None, out=None, requires_grad=False) -> torch.Tensor:
        return self._made(size, dtype, device, out, requires_grad, lambda t: t.fill_(0))

    def ones(self, *size, dtype=None, device=None, out=None, requires_grad=False) -> torch.Tensor:
        return self._made(size, dtype, device, out, requires_grad, lambda t: t.fill_(1))

    def full(self, size, fill_value, *, dtype=None, device=None, out=None, requires_grad=False) -> torch.Tensor:
        if dtype is None:  # torch infers it from the fill value
            dtype = torch.full((), fill_value).dtype
        return self._made((size,) if isinstance(size, int) else size, dtype, device, out, requires_grad,
                          lambda t: t.fill_(fill_value))

    def empty_like(self, t, *, dtype=None, requires_grad=False) -> torch.Tensor:
        return self.empty(t.shape, dtype=dtype or t.dtype, requires_grad=requires_grad)

    def zeros_like(self, t, *, dtype=None, requires_grad=False) -> torch.Tensor:
        return self.zeros(t.shape, dtype=dtype or t.dtype, requires_grad=requires_grad)

    def ones_like(self, t, *, dtype=None, requires_grad=False) -> torch.Tensor:
        return self.ones(t.shape, dtype=dtype or t.dtype, requires_grad=requires_grad)

    def full_like(self, t, fill_value, *, dtype=None, requires_grad=False) -> torch.Tensor:
        return self.full(t.shape, fill_value, dtype=dtype or t.dtype, requires_grad=requires_grad)

    def arange(self, start: Number, end: Optional[Number] = None, step: Number = 1, *, dtype=None, device=None,
               out=None, requires_grad=False) -> torch.Tensor:
        self._check_device(device)
        if end is None:
            start, end = 0, start
        ref = torch.arange(start, end, step, dtype=dtype if dtype else (out.dtype if out is not None else None),
                           device=self.device)
        return self._copied(ref, out, requires_grad)

    def linspace(self, start, end, steps: int, *, dtype=None, device=None, out=None,
                 requires_grad=False) -> torch.Tensor:
        self._check_device(device)
        ref = torch.linspace(start, end, steps, dtype=dtype if dtype else (out.dtype if out is not None else None),
                             device=self.device)
        return self._copied(ref, out, requires_grad)

    def rand(self, *size, generator=None, dtype=None, device=None, out=None, requires_grad=False):
        return self._made(size, dtype, device, out, requires_grad, lambda t: t.uniform_(0, 1, generator=generator))

    def randn(self, *size, generator=None, dtype=None, device=None, out=None, requires_grad=False):
        return self._made(size, dtype, device, out, requires_grad, lambda t: t.normal_(0, 1, generator=generator))

    def uniform(self, *size, low: float = 0.0, high: float = 1.0, generator=None, dtype=None, device=None,
                out=None, requires_grad=False):
        if not low < high:
            raise ValueError(f"uniform needs low < high, got low={low} high={high}")
        return self._made(size, dtype, device, out, requires_grad,
                          lambda t: t.uniform_(low, high, generator=generator))

    def randint(self, *args, size=None, generator=None, dtype=torch.int64, device=None, out=None,
                requires_grad=False):
        """randint(high, size) or randint(low, high, size), as torch.randint."""
        if size is not None:
            args = (*args, size)
        if len(args) == 2:
            args = (0, *args)
        if len(args) != 3:
            raise TypeError("randint takes (high, size) or (low, high, size)")
        low, high, size = args
        if not low < high:
            raise ValueError(f"randint needs low < high, got low={low} high={high}")
        return self._made((size,) if isinstance(size, int) else size, dtype, device, out, requires_grad,
                          lambda t: t.random_(low, high, generator=generator))

    # -- importing existing tensors ----------------------------------------
    def as_symmetric(self, t, copy: Optional[bool] = None):
        """A heap tensor with t's contents. Collective: all ranks, the same tensors in the same order.

        Zero copy where t's memory is VMM-backed (PyTorch with expandable_segments:True, cuMem
        allocations, another heap; shared memory on the host) and the heap is vmem: the result
        aliases t. Otherwise copy=None copies with a warning, copy=False raises, copy=True always
        copies. ctx.is_zero_copy(result) tells which. Importing t again returns the same view.
        t may be a list or tuple of tensors: one batched import, one exchange for all; returns a list.
        """
        batch = isinstance(t, (list, tuple))
        tensors = list(t) if batch else [t]
        if copy not in (None, True, False):
            raise TypeError(f"copy must be None, True or False, got {copy!r}")
        for x in tensors:
            self._check_importable(x)
        keys = [self._import_key(x) for x in tensors]
        out, todo, first = [None] * len(tensors), [], {}
        for i, (x, key) in enumerate(zip(tensors, keys)):
            if self.heap.contains(x):
                out[i] = x
            elif key in self._imported:
                out[i] = self._imported[key][0]
            elif key not in first:  # a repeat in this batch takes its first occurrence's view
                first[key] = i
                todo.append(i)
        call = f"as_symmetric({len(todo)} tensors)" if batch else f"as_symmetric({tuple(t.shape)}, {t.dtype})"
        offsets = [None] * len(todo)
        if todo and self.heap.alloc.vmm and copy is not True:
            xs = [tensors[i] for i in todo]
            offsets = self.heap.adopt([(self.heap.address(x), x.numel() * x.element_size()) for x in xs],
                                      [(tuple(x.shape), str(x.dtype)) for x in xs], call)
        for i, offset in zip(todo, offsets):
            x = tensors[i]
            out[i] = self.heap.tensor(offset, x.shape, x.dtype) if offset is not None else self._copy_in(x, copy, call)
            self._imported[keys[i]] = (out[i], x)  # holding x keeps its allocator off the memory
            self._imported_at.setdefault(self.heap.offset_of(out[i]), []).append(keys[i])
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

    def _import_key(self, t: torch.Tensor) -> tuple:
        return self.heap.address(t), t.numel() * t.element_size(), t.dtype, tuple(t.shape)

    def _copy_in(self, t: torch.Tensor, copy: Optional[bool], call: str) -> torch.Tensor:
        why = ("the torch allocator cannot map memory it did not allocate; use allocator='vmem'"
               if not self.heap.alloc.vmm else
               "its memory (on some rank) is not VMM-backed; on GPUs set "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch allocates it, on the host "
               "use t.share_memory_()")
        if copy is False:
            raise ValueError(f"{call}: zero copy is impossible: {why}")
        if copy is None:
            warnings.warn(f"{call} copied {t.numel() * t.element_size()} bytes into the heap: {why}", stacklevel=3)
        return self._copied(t, None, False)

    def load_safetensors(self, path: str, shard=None, names=None) -> dict:
        """name -> heap tensor, read from a safetensors file (see iris.weights). Collective."""
        from .weights import load_safetensors
        return load_safetensors(self, path, shard, names)

    def module_to_heap(self, module: torch.nn.Module, copy: Optional[bool] = None) -> torch.nn.Module:
        """Move module's parameters and buffers onto the heap in place (see iris.weights). Collective."""
        from .weights import module_to_heap
        return module_to_heap(self, module, copy)

    def is_zero_copy(self, t: torch.Tensor) -> bool:
        """Whether t is a heap view that aliases memory imported by as_symmetric."""
        return self.heap.contains(t) and self.heap.is_adopted(self.heap.offset_of(t))

    @contextmanager
    def scope(self):
        """Frees, at exit, every tensor the factories allocated inside. Collective: all ranks."""
        mark = set(self.heap.alloc.offsets.live)
        try:
            yield self
        finally:
            for offset in sorted(set(self.heap.alloc.offsets.live) - mark):
                self.heap.free(offset)

    # -- lifetime ----------------------------------------------------------
    def close(self) -> None:
        """Release the heap and leave the job; idempotent. Collective while peers are alive."""
        if getattr(self, "heap", None) is not None:
            try:
                self.heap.close()
            finally:
                self._imported, self._imported_at = {}, {}
                self.heap = ClosedHeap()  # any later use raises ContextClosed

    def __enter__(self) -> "Iris":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Iris(rank={self.rank}, world={self.world}, device={self.device}, allocator={self.allocator_name}, "
                f"heap_size={self.heap.size})")

    # -- device barrier (iris/device/sync.py) -------------------------------
    def device_barrier(self) -> None:
        """Barrier of every rank that runs on the device, in stream order: no host round trip, and
        capturable in a CUDA graph. Collective: all ranks."""
        from .device.sync import barrier_kernel
        barrier_kernel[(1,)](self._barrier_flags, self.rank, self.world, self.heap.heap_bases,
                             BLOCK=max(2, 1 << (self.world - 1).bit_length()), num_warps=1)


def iris(heap_size: int = 1 << 30, allocator: Optional[str] = None, platform: Optional[str] = None,
         timeout: Optional[float] = None) -> Iris:
    """Create this job's symmetric heap. Collective: every rank calls it with the same arguments."""
    return Iris(heap_size, allocator, platform, timeout)
