"""One device order for every collective of a context, whatever stream each call comes from.

A context's collectives share device resources that have one owner at a time: epoch counters and flag
rows per plan, the reserve's pairwise counters, the fused ops' workspaces, the torch backend's staging
area and mailbox. Two calls in flight at once on two streams (FSDP2 all-gathers on one stream and
reduce-scatters on another) would use them together, and each rank's device could run the two in
another order, so a flag of one call would satisfy the other's wait. The rule: calls are ordered on the
device in host call order. A call from the stream of the previous call needs nothing (stream order);
a call from another stream first makes its stream wait for everything already queued on the previous
one (an event), as ProcessGroupNCCL orders its work behind the caller's stream.

Captured calls form chains of their own, one per capture (the driver's capture id): a captured call waits
for the previous call of the same capture where it came from another of the capture's streams, and for
nothing outside it (a capture begins on work its caller ordered, and an event recorded outside the
capture would invalidate it). The eager chain runs on through captures: the first eager call after one
waits for the last eager call before it. A graph replayed on a stream is ordered like an eager call made
from that stream where whoever replays it calls enter() first (iris.ops's own replays do).
"""
from __future__ import annotations

import torch


class StreamOrder:
    """The streams of the previous eager and captured collective calls, and the waits that move a chain."""
    __slots__ = ("index", "last", "eager", "captured", "raw", "capture_id", "switches", "event", "streams")

    def __init__(self, device: torch.device, capture_id):
        self.index = device.index if device.type == "cuda" else None
        self.last = None          # raw stream of the previous call where it was eager and nothing was captured since
        self.eager = None         # raw stream of the previous eager call
        self.captured = None      # (capture id, raw stream) of the previous captured call
        self.raw = torch._C._cuda_getCurrentRawStream if self.index is not None else None
        self.capture_id = capture_id  # the driver's: raw stream -> id of the capture it is part of now, 0 if none
        self.switches = 0         # waits queued so far (tests and benchmarks read it)
        self.event = None         # one event serves every switch: a wait takes the record made before it
        self.streams = {}         # raw stream -> torch.cuda.ExternalStream, made once per stream

    def enter(self) -> None:
        """Called before a collective queues anything on the current stream."""
        if self.raw is None:  # the host driver runs every call synchronously, in program order
            return
        stream = self.raw(self.index)
        if stream == self.last:  # eager, from the previous eager call's stream: stream order is enough
            return
        self._switch(stream)

    def _switch(self, stream: int) -> None:
        capture = self.capture_id(stream)
        if capture:
            previous = self.captured
            if previous is None or previous[0] != capture:  # a call from the eager stream, captured with it,
                last = self.last                               # passed enter()'s shortcut unseen
                previous = (capture, last) if last is not None and self.capture_id(last) == capture else None
            self.last = None  # calls from the eager stream come here until the next eager call
            self.captured = (capture, stream)
            if previous is not None and previous[1] != stream:
                self._wait(previous[1], stream)
            return
        previous, self.eager = self.eager, stream
        self.last = stream
        # a capture begun on the previous stream since holds its queue: a record there would be captured
        if previous is not None and previous != stream and not self.capture_id(previous):
            self._wait(previous, stream)

    def _wait(self, previous: int, stream: int) -> None:
        if self.event is None:
            self.event = torch.cuda.Event()
        self.event.record(self._stream(previous))
        self._stream(stream).wait_event(self.event)
        self.switches += 1

    def _stream(self, raw: int):
        s = self.streams.get(raw)
        if s is None:
            if len(self.streams) >= 64:  # streams come and go (a caller's side streams): keep a few
                self.streams.clear()
            s = self.streams[raw] = torch.cuda.ExternalStream(raw, device=self.index)
        return s
