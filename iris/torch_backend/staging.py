"""The heap resources every group over one context shares: the staging area (for tensors not on the
heap) and the send/recv mailbox, allocated once, with the context's first group (heap allocation is
collective over the whole context, and a sub-group's call runs on its members only).

The rule they rely on, with ctx.ccl's epochs and workspaces: one call of a context in flight at a time
(a call's staging views are reused by the next call). Calls queued on one stream keep it, in order;
calls from two streams (FSDP2's) keep it because stage() passes the context's stream order
(iris/ccl/order.py) before it hands out a view: a call from another stream than the previous one
first waits for what that stream queued, the previous call's use of the area included.
"""
from __future__ import annotations

import weakref

import torch

from .checks import refuse
from .views import MIN_CLASS

BY_CONTEXT = weakref.WeakKeyDictionary()  # context -> its Shared


class Shared:
    """One context's staging area, mailbox (words: its slot in int32 words) and ranks as torch's
    global ranks."""

    def __init__(self, ctx, global_ranks, options):
        self.global_ranks = list(global_ranks)
        staging = options.staging_bytes
        if staging is None:
            staging = max(MIN_CLASS * (ctx.world + 1), ctx.heap_size // 4)
        words = options.mailbox_bytes // 4
        self.staging = ctx.empty(staging, dtype=torch.uint8)
        self.mailbox = ctx.ccl.init_p2p(max_numel=words, dtype=torch.int32)
        self.words = words
        self.order = ctx.ccl.order.enter  # before a view is handed out (the module's rule)

    def stage(self, call, *sizes):
        """Consecutive byte views of the staging area, each of the given size (size-class multiples)."""
        area = self.staging
        if sum(sizes) > area.numel():
            raise refuse(call, f"needs {sum(sizes)} bytes of staging but the area holds {area.numel()}; raise "
                               "Options(staging_bytes=...) (and the heap: Options(heap_size=...) or IRIS_HEAP_SIZE), "
                               "or pass heap tensors (ctx.empty, ctx.as_symmetric), which need none")
        self.order()
        out, at = [], 0
        for n in sizes:
            out.append(area[at:at + n])
            at += n
        return out
