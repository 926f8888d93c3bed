"""One device order for every collective of a context, whatever stream each call comes from.

A context's collectives share device resources that have one owner at a time: epoch counters and flag
rows per plan, the reserve's pairwise counters, the fused ops' workspaces, the torch backend's staging
area and mailbox. Two calls in flight at once on two streams (FSDP2 all-gathers on one stream and
reduce-scatters on another) would use them together, and each rank's device could run the two in
another order, so a flag of one call would satisfy the other's wait. The rule: calls are ordered on the
device in host call order. A call from the stream of the previous call needs nothing (stream order);
a call from another stream first makes its stream wait for everything already queued on the previous
one (an event), as ProcessGroupNCCL orders its work behind the caller's stream. Under CUDA graph
capture the same wait is captured where both streams take part in the capture; a call that enters or
leaves capture starts the chain afresh (capture begins on work the caller already ordered).
"""
from __future__ import annotations

import torch


class StreamOrder:
    """The stream of the previous collective call, and the wait that moves the chain to a new stream."""
    __slots__ = ("index", "last", "capturing", "raw", "switches", "event", "streams")

    def __init__(self, device: torch.device):
        self.index = device.index if device.type == "cuda" else None
        self.last = None          # raw stream of the previous call
        self.capturing = False    # whether that call was captured
        self.raw = torch._C._cuda_getCurrentRawStream if self.index is not None else None
        self.switches = 0         # waits queued so far (tests and benchmarks read it)
        self.event = None         # one event serves every switch: a wait takes the record made before it
        self.streams = {}         # raw stream -> torch.cuda.ExternalStream, made once per stream

    def enter(self) -> None:
        """Called before a collective queues anything on the current stream."""
        if self.raw is None:  # the host driver runs every call synchronously, in program order
            return
        stream = self.raw(self.index)
        if stream == self.last:
            return
        self._switch(stream)

    def _switch(self, stream: int) -> None:
        capturing = torch.cuda.is_current_stream_capturing()
        last, self.last = self.last, stream
        if last is None or capturing != self.capturing:
            self.capturing = capturing
            return
        if self.event is None:
            self.event = torch.cuda.Event()
        self.event.record(self._stream(last))
        self._stream(stream).wait_event(self.event)
        self.switches += 1

    def _stream(self, raw: int):
        s = self.streams.get(raw)
        if s is None:
            if len(self.streams) >= 64:  # streams come and go (a caller's side streams): keep a few
                self.streams.clear()
            s = self.streams[raw] = torch.cuda.ExternalStream(raw, device=self.index)
        return s
