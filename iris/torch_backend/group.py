"""IrisGroup: a torch.distributed ProcessGroup whose collectives are ctx.ccl's calls, and torch's
backend creator that makes one.

Every call is collective as torch's are: all ranks of the group, same order, same sizes. Calls are
ordered on the current stream (ctx.ccl launches there); one that asks for a Work (async_op, or any
call from torch's C++ side) gets one whose wait() orders the waiting stream after it, as NCCL's does,
and one that does not gets None, which torch's dist.X takes as done (calls.py). A tensor on the heap
(contiguous, of a dtype ctx.ccl moves) is handed to ctx.ccl as it is; any other is copied into the
context's staging area (staging.py), a prefix of it rounded up to a power-of-two size class, so
ctx.ccl sees one shape per class and reuses its plan. The ops live by kind in gathers.py,
reductions.py, all_to_all.py, rooted.py and p2p.py.
"""
from __future__ import annotations

import atexit
import gc

import torch
import torch.distributed as dist

from ..context import Iris
from ..distributed.bootstrap import from_store
from .all_to_all import AllToAll
from .checks import refuse
from .options import NAME, checked, heap_size_setting
from .p2p import PointToPoint
from .rooted import Rooted
from .staging import BY_CONTEXT, Shared

# DDP keeps its process group in reference cycles; freed only at interpreter shutdown, torch aborts the
# process ("terminate called without an active exception"). Collect them while the interpreter lives.
atexit.register(gc.collect)


def create(dist_options, options):
    """torch's backend creator (extended API): the group of dist_options' ranks over a context built
    from its store, or over the one of Options(ctx=...) or of an earlier "iris" group."""
    options = checked(options)
    rank, size = dist_options.group_rank, dist_options.group_size
    ranks = list(dist_options.global_ranks_in_group) or list(range(size))
    ctx = options.ctx
    if ctx is None:
        ctx = next((c for c, s in list(BY_CONTEXT.items()) if set(ranks) <= set(s.global_ranks)), None)
    if ctx is None:
        heap = heap_size_setting() if options.heap_size is None else options.heap_size
        timeout = dist_options.timeout.total_seconds()
        ctx = Iris(heap_size=heap, allocator=options.allocator, timeout=timeout,
                   group=from_store(dist_options.store, rank, size, timeout))
        BY_CONTEXT[ctx] = Shared(ctx, ranks, options)
    elif ctx not in BY_CONTEXT:
        if ctx.world != (dist.get_world_size() if dist.is_initialized() else size):
            raise ValueError(f"Options(ctx=...): the context spans {ctx.world} ranks but torch's job has "
                             f"{size}; adopt a context of the whole job")
        BY_CONTEXT[ctx] = Shared(ctx, range(ctx.world), options)
    return IrisGroup(ctx, BY_CONTEXT[ctx], rank, size, ranks, dist_options.group_id)


def context_of(group=None):
    """The iris context of an "iris" process group (None: the default group)."""
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if not isinstance(pg, IrisGroup):
        raise ValueError(f"{pg!r} is not a process group of the {NAME!r} backend; "
                         f"make it with dist.init_process_group({NAME!r}) or dist.new_group(backend={NAME!r})")
    return pg.ctx


class IrisGroup(Rooted, AllToAll, PointToPoint):
    """A process group of the "iris" backend over ctx (ctx.ccl's calls, with group= for a sub-group)."""

    def getBackendName(self):
        return NAME

    def _get_backend_name(self):
        return NAME

    @property
    def group_name(self):
        return self._name

    def getGroupName(self):
        return self._name

    def __repr__(self):
        return f"IrisGroup(rank {self._r} of {self._w}, context ranks {self._members})"

    def barrier(self, opts=None):
        """Every member meets on the device, then (at wait(), as NCCL's barrier) the host waits for it."""
        if self._cuda and torch.cuda.is_current_stream_capturing():
            raise refuse("barrier", "blocks the host until every member has reached it, which a CUDA graph cannot "
                                     "capture; inside the graph call iris.torch_backend.context().ccl.barrier() (a "
                                     "device barrier), or call dist.barrier() outside it")
        self._enter()
        self._ccl.barrier(group=self._ccl_group)
        return self._work([], block=True)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        raise refuse("monitored_barrier", "gloo's host barrier with rank reports; use dist.barrier()")

