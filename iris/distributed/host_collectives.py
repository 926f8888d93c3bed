"""Host-side collectives over the job's group: broadcast of Python values and tensors; the ranks of a
`group=` argument, and the check that one means the whole job (the only group iris's barriers span)."""
from __future__ import annotations

import numpy as np
import torch


def group_ranks(group, call: str) -> list:
    """The global ranks of group (a torch.distributed group, or a list/tuple of ranks), in the group's
    order (torch's group rank); a set or frozenset is sorted."""
    if isinstance(group, (set, frozenset)):
        return sorted(group)
    if isinstance(group, (list, tuple, range)):
        return list(group)
    try:
        import torch.distributed as dist
        return list(dist.get_process_group_ranks(group))
    except (ImportError, AttributeError, KeyError, RuntimeError, TypeError, ValueError) as e:
        raise TypeError(f"{call}: group must be None, a list of ranks or a torch.distributed group; "
                        f"got {type(group).__name__} ({e})") from None


def covers_job(group, world: int, call: str) -> None:
    """Accept group=None, or a torch.distributed group / list of ranks that holds every rank; a
    subset raises NotImplementedError naming the ranks (iris's flags and channel span the job)."""
    if group is None:
        return
    ranks = sorted(group_ranks(group, call))
    if ranks != list(range(world)):
        raise NotImplementedError(f"{call}(group=ranks {ranks}): iris synchronizes the whole job of {world} ranks "
                                  "only; pass group=None, or synchronize a subset with iris.signal/iris.wait "
                                  "in a kernel")


def broadcast(group, value, src: int):
    """src's value on every rank: a Python object, number or numpy array, and a tensor as a numpy
    array of its shape and dtype (what Iris's broadcast returns; bfloat16, which numpy lacks, as
    float32, exactly). Collective: all ranks, same order; only src's value is read, the others may
    pass None."""
    if not 0 <= src < group.world:
        raise ValueError(f"broadcast: src {src} is not a rank of this job [0, {group.world})")
    wire = None
    if group.rank == src:
        if isinstance(value, torch.Tensor):
            wire = ("tensor", value.detach().cpu().contiguous())
        elif isinstance(value, np.ndarray):
            wire = ("ndarray", value)
        else:
            wire = ("object", value)
    kind, got = group.allgather(wire, f"broadcast from rank {src}")[src]
    if kind == "tensor":
        return (got.float() if got.dtype == torch.bfloat16 else got).numpy().copy()
    return np.array(got, copy=True) if kind == "ndarray" else got
