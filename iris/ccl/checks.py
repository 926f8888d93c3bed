"""Every argument check of ctx.ccl, raised before anything is allocated or launched: tensors, shapes,
heap residence, roots and peers, groups. One CollectiveError per problem, naming the call, the
numbers and the fix.
"""
from __future__ import annotations

import torch

from ..distributed.host_collectives import group_ranks
from ..errors import CollectiveError

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)


def tensor(call: str, name: str, t, device) -> None:
    """t is a torch.Tensor on this rank's device, of a dtype the kernels take."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{call}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise CollectiveError(f"{call}: {name} is on {t.device} but this rank's heap is on {device}; move it there "
                              "first")
    if t.dtype not in DTYPES:
        raise CollectiveError(f"{call}: {name} has dtype {t.dtype}, not supported; use one of "
                              f"{', '.join(str(d) for d in DTYPES)}")


def nonempty(call: str, name: str, t) -> None:
    if t.numel() == 0:
        raise CollectiveError(f"{call}: {name} has no elements; there is nothing to exchange")


def same_dtype(call: str, out, inp) -> None:
    if out.dtype != inp.dtype:
        raise CollectiveError(f"{call}: out is {out.dtype} but inp is {inp.dtype}; they must match")


def pair(call: str, out, inp, want, device, ranks) -> None:
    """out and inp of a whole-job or group collective: tensors on device, one dtype, out shaped want
    (None: inp is 0-d, which has no rows to exchange), contiguous."""
    tensor(call, "out", out, device)
    tensor(call, "inp", inp, device)
    same_dtype(call, out, inp)
    if want is None:
        raise CollectiveError(f"{call}: inp must have at least one dimension (rows are exchanged); "
                              f"got a 0-d tensor, use inp.reshape(1)")
    if tuple(out.shape) != tuple(want):
        raise CollectiveError(f"{call}: out has shape {tuple(out.shape)}, expected {tuple(want)} for inp of "
                              f"shape {tuple(inp.shape)} on {ranks} ranks")
    nonempty(call, "inp", inp)
    layout(out, inp)


def layout(out, inp) -> None:
    if not (out.is_contiguous() and inp.is_contiguous()):
        raise CollectiveError("collectives need contiguous out and inp; call .contiguous() first")


def contiguous(call: str, name: str, t) -> None:
    if not t.is_contiguous():
        raise CollectiveError(f"{call}: {name} must be contiguous; call .contiguous() first")


def within(t, span) -> bool:
    """Whether all of t lies in span, (lo, hi): this rank's heap."""
    p = t.data_ptr()
    return span[0] <= p and p + t.nbytes <= span[1]


def on_heap(call: str, name: str, t, span, why: str) -> None:
    """t is a contiguous heap tensor: peers reach it at its heap offset (why says how)."""
    contiguous(call, name, t)
    if not within(t, span):
        raise CollectiveError(f"{call}: {name} must be a heap tensor, the same collective allocation on every rank "
                              f"involved ({why}); allocate it with ctx.empty/ctx.zeros or import it with "
                              "ctx.as_symmetric (collective)")


def overlap(a, b) -> bool:
    return a.data_ptr() < b.data_ptr() + b.nbytes and b.data_ptr() < a.data_ptr() + a.nbytes


def position(call: str, name: str, value, ranks) -> int:
    """value is a position in the group of ranks (Iris numbers roots and peers so)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(ranks):
        raise CollectiveError(f"{call}: {name} must be a position in the group, an int in [0, {len(ranks)}) for its "
                              f"ranks {list(ranks)} (Iris numbers {name} within the group), got {value!r}")
    return value


def not_capturing(device, what="the first call of a collective at a new shape allocates its workspace "
                                "collectively", how="call it once (or all_reduce_preamble)") -> None:
    """Raises where the current stream is capturing a CUDA graph: what cannot be captured; how avoids it."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise CollectiveError(f"{what} and cannot be captured; {how} before capturing the graph")


class Groups:
    """group= resolved and checked once per group: its global ranks in group order, None for every rank
    in order (the whole-job path); and per set of ranks, the int64 device tensor the group and pair
    kernels take (the ranks, then their heap bases)."""

    def __init__(self, rank: int, world: int, bases, device):
        self.rank, self.world, self.bases, self.device = rank, world, bases, device
        self._ranks = {}    # group (or tuple of ranks) -> its ranks, or None
        self._members = {}  # ranks -> device tensor

    def of(self, group, call):
        """(None, world) for group=None or every rank in order; else (the group's ranks, their count)."""
        if group is None:
            return None, self.world
        key = tuple(group) if isinstance(group, list) else group
        try:
            ranks = self._ranks[key]
        except (KeyError, TypeError):
            ranks = self._check(group, call)
            try:
                self._ranks[key] = ranks
            except TypeError:  # an unhashable group: checked every call
                pass
        return ranks, self.world if ranks is None else len(ranks)

    def ranks(self, group, call) -> tuple:
        """The group's global ranks in group order (every rank for None), checked."""
        ranks = self.of(group, call)[0]
        return tuple(range(self.world)) if ranks is None else ranks

    def members(self, ranks) -> torch.Tensor:
        m = self._members.get(ranks)
        if m is None:
            bases = [self.bases[r] for r in ranks]
            m = self._members[ranks] = torch.tensor(list(ranks) + bases, dtype=torch.int64, device=self.device)
        return m

    def _check(self, group, call):
        ranks, w = group_ranks(group, call), self.world
        if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < w for r in ranks):
            raise CollectiveError(f"{call}: group= must hold global ranks in [0, {w}); got {ranks}")
        if len(set(ranks)) != len(ranks):
            raise CollectiveError(f"{call}: group= names a rank twice: {ranks}")
        if self.rank not in ranks:
            raise CollectiveError(f"{call}: rank {self.rank} is not in group= of ranks {ranks}; only the "
                                  "group's ranks make its calls")
        return None if ranks == list(range(w)) else tuple(ranks)
