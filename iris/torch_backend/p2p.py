"""Point to point over ctx.ccl's send and recv through the context's mailbox, and torch's coalescing
(which batches point-to-point calls). Sends are held back until the next call, as NCCL's batched ones.
"""
from __future__ import annotations

import torch

from .calls import Calls
from .checks import refuse
from .views import like


class PointToPoint(Calls):
    """send, recv and coalescing; the transfers that Calls._enter queues."""

    def send(self, tensors, dstRank, tag=0):
        self._p2p([(True, t, dstRank) for t in tensors])
        return self._work(tensors, flush=self._enter)

    def recv(self, tensors, srcRank, tag=0):
        self._p2p([(False, t, srcRank) for t in tensors])
        return self._work(tensors)

    def recv_anysource(self, tensors, tag=0):
        raise refuse("recv (from any source)", "a receive names its source; pass src=")

    def _p2p(self, transfers):
        """Sends wait in a queue until a receive, a wait(), or any other call of this group: then they go
        together with it, as NCCL's batched ones, so a ring of isends then irecvs cannot wait on itself."""
        self._queued.extend(transfers)
        if any(not sending for sending, _, _ in transfers):
            self._enter()

    def _transfer(self, transfers):
        """Transfers through the mailbox in pieces of its slot size, interleaved: piece k of every send,
        then piece k of every receive, so an exchange larger than the mailbox (a ring) cannot wait on
        itself. A tensor that is not whole 4-byte words on this device passes through a padded copy."""
        jobs = []
        for sending, t, peer in transfers:
            if peer == self._r:
                raise refuse("send" if sending else "recv", f"the peer {peer} is this rank; copy locally")
            if t.numel() == 0:
                continue
            if t.is_contiguous() and t.nbytes % 4 == 0 and t.device == self._device:
                words, copy = t.view(-1).view(torch.int32), None
            else:
                words = torch.empty(-(-t.nbytes // 4), dtype=torch.int32, device=self._device)
                copy = like(words.view(torch.uint8), t)
                if sending:
                    copy.copy_(t)
            jobs.append((sending, t, peer, words, copy))
        box, step, ccl = self._shared.mailbox, self._shared.words, self._ccl
        pieces = max((j[3].numel() for j in jobs), default=0)
        for at in range(0, pieces, step):
            for sending in (True, False):
                for s, t, peer, words, _ in jobs:
                    if s == sending and at < words.numel():
                        call = ccl.send if sending else ccl.recv
                        call(words[at:at + step], peer, group=self._ccl_group, p2p_state=box)
        for sending, t, _, _, copy in jobs:
            if not sending and copy is not None:
                t.copy_(copy)

    def _start_coalescing(self, device=None):
        self._enter()

    def _end_coalescing(self, device=None):
        self._enter()
        return self._work([])

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing
