"""Views of a call's tensors in the shapes ctx.ccl takes: its bytes as int32 words, one dimension, a
prefix of a byte buffer in a tensor's dtype and shape, the power-of-two size classes of staging (one
shape per class, so ctx.ccl reuses its plan), and the row cache of all_to_all's heap tensors.
"""
from __future__ import annotations

import weakref

import torch

WORDS = (torch.float32, torch.int32)  # dtypes ctx.ccl's copies take as they are (others: viewed as int32)
MIN_CLASS = 4096  # bytes: the smallest staging size class


def like(buf, t):
    """The first t.nbytes bytes of buf (a uint8 view of the heap) seen as a tensor of t's dtype and shape."""
    return buf[:t.nbytes].view(t.dtype).view(t.shape)


def flat(t):
    """t as one dimension (t itself when it is already: a view costs a microsecond)."""
    return t if t.dim() == 1 else t.view(-1)


def as_words(t):
    """t's bytes as int32 words, one dimension, for a copy (ctx.ccl moves int32 and float32 words alike)."""
    if t.dim() != 1:
        t = t.view(-1)
    return t if t.dtype in WORDS else t.view(torch.int32)


def size_class(nbytes: int) -> int:
    """The staging bytes of a tensor of nbytes: the next power of two, at least MIN_CLASS."""
    return max(MIN_CLASS, 1 << (max(nbytes, 1) - 1).bit_length())


class Rows:
    """Per heap tensor, its bytes as one row of int32 words (1, nbytes / 4), the view all_to_all hands
    ctx.ccl, made once: two views cost about two microseconds per call. An entry is dropped with its
    tensor, and made again where the tensor's storage moved (the caller has read its address and size:
    the row's own are kept as ints, as reading them again costs as much as the checks)."""

    def __init__(self):
        self._by_id = {}

    def of(self, t, ptr, nbytes):
        """The row of t, a contiguous tensor at address ptr of nbytes bytes."""
        entry = self._by_id.get(id(t))
        if entry is not None and entry[0]() is t and entry[2] == ptr and entry[3] == nbytes:
            return entry[1]
        row = t.view(1, -1).view(torch.int32)
        key = id(t)
        self._by_id[key] = (weakref.ref(t, lambda _, key=key, table=self._by_id: table.pop(key, None)), row, ptr,
                            nbytes)
        return row
