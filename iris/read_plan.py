"""Which file bytes a (sliced) tensor needs, as reads: pure arithmetic, no I/O.

A slice of a row-major tensor is a list of equal runs of bytes (a row slice: one run; a column
slice: one run per row). Runs whose gap is at most max_gap are read as one range, the gaps
going to a scratch buffer (one syscall instead of many; the disk reads whole pages anyway);
larger gaps are skipped. A read keeps at most `chunk` bytes, so it fits one staging buffer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch

IOV_MAX = 1024  # Linux's limit on buffers per preadv


@dataclass
class Read:
    """file bytes [offset, offset + sum of segments), each segment (nbytes, keep); the kept bytes
    land one after another in destination tensor dst from byte dst_offset."""
    file: int
    offset: int
    dst: int
    dst_offset: int
    segments: List[Tuple[int, bool]] = field(default_factory=list)
    kept: int = 0

    @property
    def nbytes(self) -> int:
        return sum(n for n, _ in self.segments)


def normalize(index, shape: Tuple[int, ...], name: str) -> Optional[Tuple[slice, ...]]:
    """shard()'s answer as one slice per dimension (None: the whole tensor); raises on anything
    but slices with positive steps."""
    if index is None:
        return None
    if isinstance(index, slice):
        index = (index,)
    if not isinstance(index, tuple) or not all(isinstance(s, slice) for s in index):
        raise TypeError(f"shard({name!r}, {shape}) must return None, a slice or a tuple of slices; got {index!r}")
    if len(index) > len(shape):
        raise ValueError(f"shard({name!r}, {shape}) returned {len(index)} slices for a {len(shape)}-d tensor")
    for s in index:
        if s.step is not None and s.step <= 0:
            raise ValueError(f"shard({name!r}, {shape}) returned {s}: only positive steps can be read")
    return index + (slice(None),) * (len(shape) - len(index))


def slice_runs(shape: Tuple[int, ...], itemsize: int, index: Optional[Sequence[slice]]):
    """(shape of the slice, byte offset of each run inside the tensor in destination order, run bytes)."""
    if index is None:
        index = (slice(None),) * len(shape)
    rng = [s.indices(d) for s, d in zip(index, shape)]
    lens = tuple(len(range(*r)) for r in rng)
    if 0 in lens or not shape:
        return lens, ([0] if not shape else []), (itemsize if not shape else 0)
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    j, inner = len(shape) - 1, 1
    while j >= 0 and rng[j] == (0, shape[j], 1):  # trailing whole dimensions are contiguous
        inner *= shape[j]
        j -= 1
    if j < 0:
        return lens, [0], inner * itemsize
    base, outer = 0, list(range(j + 1))
    if rng[j][2] == 1:  # dimension j's slice is contiguous too: runs span it
        base, outer, inner = rng[j][0] * strides[j], outer[:-1], inner * lens[j]
    offs = torch.tensor(base, dtype=torch.int64)
    for d in outer:
        offs = offs[..., None] + (torch.arange(lens[d], dtype=torch.int64) * rng[d][2] + rng[d][0]) * strides[d]
    return lens, (offs.reshape(-1) * itemsize).tolist(), inner * itemsize


def plan(file: int, offset: int, starts: Sequence[int], run: int, dst: int, chunk: int, max_gap: int) -> List[Read]:
    """Reads that bring runs (byte offsets `starts` from `offset` in `file`, `run` bytes each) into
    destination dst, each keeping at most chunk bytes."""
    reads: List[Read] = []
    op, dst_off, prev_end = None, 0, None
    for s in starts:
        gap = 0 if prev_end is None else s - prev_end
        if op is not None and (gap > max_gap or op.kept >= chunk or len(op.segments) >= IOV_MAX - 2):
            op = None
        if op is None:
            op = Read(file, offset + s, dst, dst_off)
            reads.append(op)
        elif gap:
            op.segments.append((gap, False))
        pos = 0
        while pos < run:
            if op.kept >= chunk:
                op = Read(file, offset + s + pos, dst, dst_off)
                reads.append(op)
            n = min(chunk - op.kept, run - pos)
            if op.segments and op.segments[-1][1]:
                op.segments[-1] = (op.segments[-1][0] + n, True)
            else:
                op.segments.append((n, True))
            op.kept, dst_off, pos = op.kept + n, dst_off + n, pos + n
        prev_end = s + run
    return reads
