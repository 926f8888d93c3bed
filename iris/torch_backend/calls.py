"""Calls: what every call of an "iris" group does around its work, and the state the ops read.

Before a call queues anything on the caller's stream it passes Calls._enter, the one place for what
must go first: the sends point to point holds back (p2p.py). The context's one device order across
streams (iris/ccl/order.py) is kept below: every ctx.ccl call passes it, and so does the staging area
before it hands out its views (staging.py). After, Calls._done hands back its Work
where the caller keeps one (Calls._work), else None. The fast paths of the ops inline both gates to
save a call each: `if self._queued: self._enter()` first, `return self._work(...) if opts.asyncOp else
None` last; what goes before or after every call goes in these three methods and those gates.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from .views import Rows
from .work import Work


class Calls(dist.ProcessGroup):
    """A process group over ctx (ctx.ccl's calls, with group= for a sub-group): its members, this rank's
    heap bounds, and the frame of every call."""

    def __init__(self, ctx, shared, rank, size, ranks, name):
        super().__init__(rank, size)
        # rank() and size() go through torch's C++ trampoline, which looks for Python overrides each call
        self._r, self._w = rank, size
        self.ctx, self._shared, self._name = ctx, shared, name
        index = {g: i for i, g in enumerate(shared.global_ranks)}
        members = [index[g] for g in ranks]  # the members as the context's ranks
        self._ccl_group = None if members == list(range(ctx.world)) else members
        self._members = members
        self._device = ctx.get_device()
        self._ccl = ctx.ccl  # the context's one CCL object (ctx.ccl is a property)
        self._lo = ctx.heap.bases[ctx.rank]
        self._hi = self._lo + ctx.heap.size
        self._cuda = self._device.type == "cuda"
        self._queued = []  # sends held back (p2p.py): _enter queues them before the next call
        self._rows = Rows()
        self._spare = None  # the last Work handed out (see _work)

    def _enter(self):
        """Before a call queues anything on the caller's stream: the sends held back go first, so that a
        ring of isends then irecvs cannot wait on itself. A send's Work.wait() passes here too."""
        if self._queued:
            queued, self._queued = self._queued, []
            self._transfer(queued)

    def _done(self, opts, result):
        """What a collective returns: its Work where the caller keeps one (async_op=True, and every call
        from C++: DDP's hooks, functional collectives, whose options say async), else None. The call
        is already ordered on the current stream, which is all that waiting on it would give, and
        torch's dist.X skips wait() when a backend returns None."""
        return self._work(result) if opts is None or opts.asyncOp else None

    def _work(self, result, block=False, flush=None):
        """The call's Work. Making one through torch's binding costs microseconds, so the last one is
        reused once nobody holds it any more (its caller waited on it and let it go)."""
        w = self._spare
        if w is None or sys.getrefcount(w) > 3:  # 3: this attribute, w, getrefcount's argument
            w = self._spare = Work()
        w.result, w.block, w.flush = result, block, flush
        w.stream = torch.cuda.current_stream(self._device) if self._cuda else None
        return w

    def _direct(self, t) -> bool:
        """Whether ctx.ccl can take t as it is: contiguous, on this rank's heap (memory of this rank's
        device: the address range says so without building t.device)."""
        p = t.data_ptr()
        return self._lo <= p and p + t.nbytes <= self._hi and t.is_contiguous()

    def _each(self, call, outputs, inputs, opts):
        """A coalesced form: call(output, input, opts) per pair, in order."""
        for o, i in zip(outputs, inputs):
            call(o, i, opts)
        return self._done(opts, outputs)
