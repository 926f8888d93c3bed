"""The Work a call of the backend hands back: the call is already queued on a stream, and wait() orders
the waiting stream after it, as NCCL's does (and, for a barrier, the host)."""
from __future__ import annotations

import torch
import torch.distributed as dist


class Work(dist.Work):
    """A call already queued on `stream`: wait() makes the current stream wait for it (and the host,
    for a barrier: block); flush, if set, queues what the call held back (a send) first; the future
    holds the call's tensors."""

    def __init__(self):
        super().__init__()
        self.result, self.stream, self.block, self.flush = [], None, False, None

    def wait(self, timeout=None):
        if self.flush is not None:
            self.flush()
        s = self.stream
        if s is not None:
            current = torch.cuda.current_stream(s.device)
            if current != s:
                current.wait_stream(s)
            if self.block:
                s.synchronize()
        return True

    def is_completed(self):
        return self.stream is None or self.stream.query()

    def is_success(self):
        return True

    def exception(self):
        return None

    def get_future(self):
        fut = torch.futures.Future(devices=[self.stream.device] if self.stream is not None else None)
        fut.set_result(self.result)
        return fut
