"""Model weights on the heap: a safetensors checkpoint read straight into heap tensors, and an
nn.Module's parameters and buffers moved onto the heap in place."""
from __future__ import annotations

import difflib
import os
from typing import Callable, Dict, Optional, Tuple

import torch

from .checkpoint import CheckpointError, checkpoint_files, read_entries
from ..errors import SymmetryError
from .read_plan import normalize, plan, slice_runs

Shard = Callable[[str, Tuple[int, ...]], Optional[tuple]]

READERS = min(8, os.cpu_count() or 1)
CHUNK = 8 << 20     # bytes one read keeps, and the size of one pinned staging buffer
MAX_GAP = 32 << 10  # skipped bytes between two runs that are cheaper to read than to seek over


class Loaded(dict):
    """name -> heap tensor, with .stats: what the load read (bytes_read, bytes_kept, reads,
    readers, pinned_bytes: the peak pinned staging memory)."""
    stats: dict


def _layout(path, shard, names):
    """Everything checked, nothing allocated: files, and (name, entry, slice shape, runs) by name."""
    files = checkpoint_files(path)
    entries = read_entries(files)
    if names is None:
        wanted = sorted(entries)
    else:
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"names must be a list of tensor names, got {names!r}")
        wanted = sorted(names)
        if len(set(wanted)) != len(wanted):
            raise ValueError(f"names lists a tensor twice: {sorted(n for n in set(wanted) if wanted.count(n) > 1)}")
        for n in wanted:
            if n not in entries:
                near = difflib.get_close_matches(n, list(entries), 3)
                raise ValueError(f"no tensor {n!r} in {files}" + (f"; did you mean {near}?" if near else
                                 f"; it has {len(entries)} tensors, e.g. {sorted(entries)[:5]}"))
    layout = []
    for n in wanted:
        e = entries[n]
        index = normalize(shard(n, e.shape), e.shape, n) if shard else None
        shape, starts, run = slice_runs(e.shape, e.dtype.itemsize, index)
        layout.append((n, e, shape, starts, run))
    return files, layout


def load_safetensors(ctx, path, shard: Optional[Shard] = None, names=None, *, readers: Optional[int] = None,
                     chunk_bytes: int = CHUNK, max_gap: int = MAX_GAP) -> Dict[str, torch.Tensor]:
    """name -> heap tensor for every tensor of the checkpoint (or of `names`).

    path: a .safetensors file, a list of them, or a directory of shards. shard(name, shape) may
    return a slice or a tuple of slices: only that part is read, and only the file bytes it
    needs (a column slice is read row by row, neighbouring rows as one range). Every file is
    checked first (headers, names, sizes, slices): bad input raises before anything is allocated.
    Then all heap tensors are allocated (sorted by name) and filled by `readers` threads; on a
    GPU through pinned buffers of chunk_bytes (2 per reader at most) copied on a side stream.
    The result's .stats says what was read. Peers may read the tensors after a ctx.barrier().
    Collective: all ranks, same files, same names, same shard shapes, in the same order.
    """
    error, metas = None, None
    try:
        files, layout = _layout(path, shard, names)
        metas = [(n, str(e.dtype), shape) for n, e, shape, _, _ in layout]
    except Exception as e:  # every rank learns of it before any allocates
        error = e
    got = ctx.heap.group.allgather((None if error is None else f"{type(error).__name__}: {error}", metas),
                                   "load_safetensors")
    if error is not None:
        raise error
    failed = {r: msg for r, (msg, _) in enumerate(got) if msg}
    if failed:
        raise CheckpointError(f"load_safetensors: ranks {sorted(failed)} could not load the checkpoint, so no rank "
                              f"does: {failed}")
    diverged = [r for r, (_, m) in enumerate(got) if m != metas]
    if diverged:
        raise SymmetryError(f"load_safetensors: ranks {diverged} would allocate other tensors (names, dtypes or "
                            f"shard shapes) than rank {ctx.rank}; shard() must give every rank the same shapes")
    out, reads = Loaded(), []
    for i, (n, e, shape, starts, run) in enumerate(layout):
        out[n] = ctx.empty(shape, dtype=e.dtype)
        reads += plan(e.file, e.offset, starts, run, i, chunk_bytes, max_gap)
    from .loading import read_into
    dsts = [t.reshape(-1).view(torch.uint8) for t in out.values()]
    out.stats = read_into(files, reads, dsts, readers or READERS, chunk_bytes, 2 * (readers or READERS))
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
