"""Which file bytes a (sliced) tensor needs, as reads: pure arithmetic, no I/O.

A slice of a row-major tensor is a list of equal runs of bytes (a row slice: one run; a column
slice: one run per row). Runs whose gap is at most max_gap are read as one range, the gaps
going to a scratch buffer (one syscall instead of many; the disk reads whole pages anyway);
larger gaps are skipped. A read keeps at most `chunk` bytes, so it fits one staging buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

IOV_MAX = 1024  # Linux's limit on buffers per preadv


@dataclass
class Read:
    """count runs of `run` bytes, `stride` bytes apart from file offset `offset`, read as one range
    (the gaps between runs are read and dropped); the runs land one after another in destination
    tensor dst from byte dst_offset."""
    file: int
    offset: int
    dst: int
    dst_offset: int
    count: int
    stride: int
    run: int

    @property
    def kept(self) -> int:
        return self.count * self.run

    @property
    def nbytes(self) -> int:
        return (self.count - 1) * self.stride + self.run

    @property
    def contiguous(self) -> bool:
        return self.count == 1 or self.stride == self.run


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
        return lens, np.zeros(0 if shape else 1, dtype=np.int64), (0 if shape else itemsize)
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    j, inner = len(shape) - 1, 1
    while j >= 0 and rng[j] == (0, shape[j], 1):  # trailing whole dimensions are contiguous
        inner *= shape[j]
        j -= 1
    if j < 0:
        return lens, np.zeros(1, dtype=np.int64), inner * itemsize
    base, outer = 0, list(range(j + 1))
    if rng[j][2] == 1:  # dimension j's slice is contiguous too: runs span it
        base, outer, inner = rng[j][0] * strides[j], outer[:-1], inner * lens[j]
    offs = np.array(base, dtype=np.int64)
    for d in outer:
        offs = offs[..., None] + (np.arange(lens[d], dtype=np.int64) * rng[d][2] + rng[d][0]) * strides[d]
    return lens, offs.reshape(-1) * itemsize, inner * itemsize


def plan(file: int, offset: int, starts: Sequence[int], run: int, dst: int, chunk: int, max_gap: int) -> List[Read]:
    """Reads that bring runs (byte offsets `starts` from `offset` in `file`, `run` bytes each) into
    destination dst, each reading at most chunk bytes: a run longer than chunk is split; shorter
    runs are grouped while they are evenly spaced with gaps of at most max_gap."""
    if not len(starts) or not run:
        return []
    if run >= chunk:  # big runs (a row slice, a whole tensor): pieces of chunk bytes
        return [Read(file, offset + int(s) + p, dst, i * run + p, 1, run, min(chunk, run - p))
                for i, s in enumerate(starts) for p in range(0, run, chunk)]
    st = np.asarray(starts, dtype=np.int64)
    n = len(st)
    step = np.full(n, run, dtype=np.int64)  # step[i]: distance from run i-1 to run i
    step[1:] = np.diff(st)
    new = np.ones(n, dtype=bool)
    new[1:] = step[1:] - run > max_gap  # a wide gap starts a new read
    new[2:] |= step[2:] != step[1:-1]  # and so does a change of spacing
    first = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    stride = step[np.minimum(first + 1, n - 1)][group]  # spacing inside each group
    per = np.maximum((chunk - run) // stride + 1, 1)  # runs that fit chunk bytes of range
    new |= (np.arange(n) - first[group]) % per == 0
    heads = np.flatnonzero(new).tolist() + [n]
    strides, starts = stride.tolist(), st.tolist()
    return [Read(file, offset + starts[a], dst, a * run, b - a, strides[a] if b - a > 1 else run, run)
            for a, b in zip(heads[:-1], heads[1:])]
