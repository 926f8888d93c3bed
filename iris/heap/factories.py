"""Factories: torch's tensor factories (empty, zeros, ..., randint) over a SymmetricHeap.

Each call is collective: all ranks, same order, same sizes (a new tensor is a new heap block).
Signatures are torch's: layout (strided only), pin_memory (no effect: a warning), memory_format,
device (the heap's), out (a heap tensor of as many elements; returned viewed with the size asked
for). Every argument is checked before anything is allocated; what the heap cannot honour raises
FactoryArgumentError (a ValueError, and a RuntimeError as Iris's factories raise it).
"""
from __future__ import annotations

import warnings
from numbers import Number
from typing import Optional

import torch

from ..errors import FactoryArgumentError, user_stacklevel
from ..validate import plain_request, request

_STRIDED, _CONTIGUOUS = torch.strided, torch.contiguous_format  # the factories' defaults, looked up once


def unwrapped(size):
    """A factory's *size with one-element tuple/list wrappers taken off: (2, 3), ((2, 3),), ([2, 3],)
    and (((2, 3),),) name the same sizes (as Iris takes them)."""
    while len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = size[0]
    return size


def shape_of(size) -> torch.Size:
    """torch's size convention: ints, or one tuple/list/Size (nested ones unwrapped, as Iris does)."""
    size = tuple(unwrapped(size))
    for s in size:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"sizes must be ints, got {type(s).__name__} {s!r} in {tuple(size)}")
        if s < 0:
            raise ValueError(f"negative dimension {s} in size {tuple(size)}")
        if s >= 1 << 63:
            raise ValueError(f"dimension {s} in size {tuple(size)} does not fit in 64 bits; check the sizes")
    return torch.Size(size)


def device_matches(device, heap_device: torch.device) -> bool:
    """Whether device names the heap's device: its type, and its index where one is given."""
    d = torch.device(device)
    return d.type == heap_device.type and (d.index is None or d.index == (heap_device.index or 0))


def check_layout(layout) -> None:
    if layout not in (None, torch.strided):
        raise ValueError(f"heap tensors are dense: layout must be torch.strided, got {layout}")


def check_pin_memory(pin_memory) -> None:
    if pin_memory:  # Iris accepts it and allocates on the heap all the same
        warnings.warn("pin_memory=True has no effect: heap tensors live in the heap's device memory", stacklevel=5)


def steps_of(steps) -> int:
    """linspace's steps: an int, or one wrapped in tuples or lists ((5,), [5], ((5,),)), as Iris takes it."""
    while isinstance(steps, (tuple, list, torch.Size)) and len(steps) == 1:
        steps = steps[0]
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"linspace: steps must be an int (or one in a 1-element tuple), got {steps!r}")
    return steps


_RANKS = {torch.channels_last: 4, torch.channels_last_3d: 5}  # the formats that fit tensors of one rank only


def strides_for(shape: torch.Size, memory_format=None, like: torch.Tensor | None = None):
    """The strides torch's factories give a new tensor of shape in memory_format (torch.preserve_format:
    like's layout), or None for the contiguous layout. Every format is a permutation of
    numel elements, so a block of numel elements holds it. channels_last (channels_last_3d) asked of a
    tensor that is not 4-d (5-d) falls back to contiguous with a warning, as Iris lays it out, where
    torch raises."""
    if memory_format in (None, torch.contiguous_format) or (memory_format == torch.preserve_format and like is None):
        return None
    rank = _RANKS.get(memory_format)
    if rank is not None and len(shape) != rank:
        warnings.warn(f"memory_format={memory_format} lays out {rank}-d tensors; size {tuple(shape)} is "
                      f"{len(shape)}-d, so the tensor is contiguous (as Iris makes it; torch raises)",
                      stacklevel=user_stacklevel())
        return None
    meta = (torch.empty_like(like, device="meta", memory_format=memory_format) if like is not None
            else torch.empty(shape, device="meta", memory_format=memory_format))
    return meta.stride()


class Factories:
    """torch's factories whose tensors are new blocks of one heap. Collective: all ranks, same order, same sizes."""

    def __init__(self, heap):
        self.heap, self.device = heap, heap.device

    def made(self, size, dtype, device, out, requires_grad, fill=None, strides=None) -> torch.Tensor:
        """A new heap tensor (or out, checked and viewed with the size asked for, as Iris allows), with
        strides where given, filled outside autograd. requires_grad is checked here and set by the
        caller, last, so that a restrided result is still a leaf."""
        if device is not None:
            self.check_device(device)
        shape, dtype = request(size, dtype, requires_grad, shape_of)
        if out is not None:
            t = self.checked_out(out, shape, dtype)
        else:
            t = self.heap.new_tensor(shape, dtype)
            if strides is not None and strides != t.stride():
                t = torch.as_strided(t, shape, strides)
        if fill is not None:
            with torch.no_grad():
                fill(t)
        return t

    def checked_out(self, out, shape: torch.Size, dtype) -> torch.Tensor:
        """out viewed with shape, checked in Iris's order and words (elements, dtype, heap). Another
        number of elements raises, where torch would resize out: a heap tensor cannot grow in place
        (the next block of every rank's heap sits right after it), and a new block in its place would
        be a collective allocation that out's holders do not see."""
        n = shape.numel()
        if out.numel() != n:
            raise FactoryArgumentError(
                f"The output tensor has {out.numel()} elements, but {n} are required for size {tuple(shape)}: a "
                f"heap tensor cannot be resized in place; pass an out= of {n} elements, or leave out= out for a "
                "new heap tensor")
        if out.dtype != dtype:
            raise FactoryArgumentError(f"The output tensor has dtype {out.dtype}, but {dtype} is required; pass "
                                       f"dtype={out.dtype}, or an out= of {dtype}")
        if not self.heap.contains(out):
            raise FactoryArgumentError("The output tensor is not on the symmetric heap: allocate it with this "
                                       "context's factories (ctx.empty, ctx.zeros, ...), or leave out= out")
        return out if out.shape == shape else out.view(shape)

    def check_device(self, device) -> None:
        """device must name the heap's: its type, and its index where one is given (as Iris checks)."""
        if device is not None and not device_matches(device, self.device):
            raise FactoryArgumentError(f"the heap lives on {self.device}; got device={device!r} (leave it out)")

    def copied(self, ref: torch.Tensor, out=None, requires_grad=False) -> torch.Tensor:
        """A heap tensor (or out) holding ref's values."""
        t = self.made(ref.shape, ref.dtype, None, out, requires_grad, lambda t: t.copy_(ref))
        return t.requires_grad_(requires_grad) if requires_grad else t

    def factory(self, size, dtype, device, out, requires_grad, fill=None, layout=None, pin_memory=False,
                memory_format=None, like=None) -> torch.Tensor:
        if (out is None and device is None and like is None and not requires_grad and not pin_memory
                and (layout is torch.strided or layout is None)
                and (memory_format is torch.contiguous_format or memory_format is None)):
            plain = plain_request(size, dtype)
            if plain is not None:  # the usual call, checked in full: one allocation, one view
                t = self.heap.new_tensor(*plain)
                if fill is not None:
                    with torch.no_grad():
                        fill(t)
                return t
        check_layout(layout)
        check_pin_memory(pin_memory)
        shape = shape_of(size if isinstance(size, tuple) else (size,))
        strides = None if out is not None else strides_for(shape, memory_format, like)
        t = self.made((shape,), dtype, device, out, requires_grad, fill, strides)
        return t.requires_grad_(requires_grad) if requires_grad else t

    def empty(self, *size, out=None, dtype=None, layout=_STRIDED, device=None, requires_grad=False,
              pin_memory=False, memory_format=_CONTIGUOUS) -> torch.Tensor:
        if (out is None and device is None and layout is _STRIDED and memory_format is _CONTIGUOUS
                and not requires_grad and not pin_memory):  # the usual call: factory's short path, inlined
            plain = plain_request(size, dtype)
            if plain is not None:
                return self.heap.new_tensor(*plain)
        return self.factory(size, dtype, device, out, requires_grad, None, layout, pin_memory, memory_format)

    def zeros(self, *size, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False) -> torch.Tensor:
        return self.factory(size, dtype, device, out, requires_grad, lambda t: t.fill_(0), layout)

    def ones(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False) -> torch.Tensor:
        return self.factory(size, dtype, device, out, requires_grad, lambda t: t.fill_(1), layout)

    def full(self, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False) -> torch.Tensor:
        if dtype is None:  # torch infers it from the fill value
            dtype = torch.full((), fill_value).dtype
        return self.factory(size, dtype, device, out, requires_grad, lambda t: t.fill_(fill_value), layout)

    def like(self, t, dtype, layout, device, requires_grad, memory_format, fill=None) -> torch.Tensor:
        """A new heap tensor of t's shape (and dtype, unless given) laid out as memory_format says."""
        return self.factory(tuple(t.shape), dtype or t.dtype, device, None, requires_grad, fill, layout,
                            memory_format=memory_format, like=t)

    def empty_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format) -> torch.Tensor:
        return self.like(t, dtype, layout, device, requires_grad, memory_format)

    def zeros_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format) -> torch.Tensor:
        return self.like(t, dtype, layout, device, requires_grad, memory_format, lambda x: x.fill_(0))

    def ones_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format) -> torch.Tensor:
        return self.like(t, dtype, layout, device, requires_grad, memory_format, lambda x: x.fill_(1))

    def full_like(self, t, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format) -> torch.Tensor:
        return self.like(t, dtype, layout, device, requires_grad, memory_format, lambda x: x.fill_(fill_value))

    def _ranged(self, ref: torch.Tensor, out, layout, requires_grad) -> torch.Tensor:
        check_layout(layout)
        return self.copied(ref, out, requires_grad)

    def arange(self, start: Number, end: Optional[Number] = None, step: Number = 1, *, out=None, dtype=None,
               layout=torch.strided, device=None, requires_grad=False) -> torch.Tensor:
        self.check_device(device)
        if end is None:
            start, end = 0, start
        ref = torch.arange(start, end, step, dtype=dtype if dtype else (out.dtype if out is not None else None),
                           device=self.device)
        return self._ranged(ref, out, layout, requires_grad)

    def linspace(self, start, end, steps: int, *, out=None, dtype=None, layout=torch.strided, device=None,
                 requires_grad=False) -> torch.Tensor:
        self.check_device(device)
        ref = torch.linspace(start, end, steps_of(steps), dtype=dtype if dtype else (out.dtype if out is not None else None),
                             device=self.device)
        return self._ranged(ref, out, layout, requires_grad)

    def rand(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False, pin_memory=False):
        return self.factory(size, dtype, device, out, requires_grad, lambda t: t.uniform_(0, 1, generator=generator),
                            layout, pin_memory)

    def randn(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False, pin_memory=False):
        return self.factory(size, dtype, device, out, requires_grad, lambda t: t.normal_(0, 1, generator=generator),
                            layout, pin_memory)

    def uniform(self, *size, low: float = 0.0, high: float = 1.0, generator=None, out=None, dtype=None,
                layout=torch.strided, device=None, requires_grad=False):
        if not low < high:
            raise ValueError(f"uniform needs low < high, got low={low} high={high}")
        return self.factory(size, dtype, device, out, requires_grad,
                            lambda t: t.uniform_(low, high, generator=generator), layout)

    def randint(self, *args, size=None, generator=None, out=None, dtype=torch.int64, layout=torch.strided,
                device=None, requires_grad=False):
        """randint(high, size) or randint(low, high, size), as torch.randint; size as the other
        factories take it (ints in a tuple or list, nested ones unwrapped)."""
        if size is not None:
            args = (*args, size)
        if len(args) == 2:
            args = (0, *args)
        if len(args) != 3:
            raise FactoryArgumentError(f"randint takes (high, size) or (low, high, size), got {len(args)} "
                                       f"positional arguments {args!r}")
        low, high, size = args
        if not low < high:
            raise FactoryArgumentError(f"randint needs low < high, got low={low} high={high}")
        return self.factory(size, dtype, device, out, requires_grad,
                            lambda t: t.random_(low, high, generator=generator), layout)
