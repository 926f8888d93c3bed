"""Progress: per-rank counters of frees, written in stream order, that let a freed block be reused at
once (no host collective, no host wait on the device) and still safely against every rank's work.

What matters:
- Frees are collective (all ranks, same order), so the n-th free is epoch n on every rank. At it,
  rank r writes n into its counter (8 bytes of its own heap) in stream order: after every kernel r
  queued before the free, remote stores into peers' copies included. On the host, where work runs
  synchronously, that is a plain store at the free.
- A block freed at epoch n goes back to the pool at once. The allocation that takes it makes the
  current stream wait until every peer's counter is >= n (one cuStreamBatchMemOp of a wait per peer,
  on the peers' mapped counters; hipStreamWaitValue64 per peer; on the host the allocation itself waits). Where every rank synced its
  device and met (ctx.barrier(), ctx.collect()), every epoch before is known passed: no wait at all.
- The one rule: work a rank queues before a free must not wait for work a peer queues after its
  matching free. Broken, the reuse would wait forever; after IRIS_REUSE_TIMEOUT seconds it raises
  ReuseTimeout naming the block and the ranks (GPUs: a watchdog thread notices, lets the stream go
  on and the next heap call on that rank raises).
"""
from __future__ import annotations

import ctypes
import sys
import threading
import time
from typing import Optional

import torch

from .. import settings
from ..errors import CaptureError, DriverError, ReuseTimeout


def _violation(offset: int, nbytes: int, epoch: int, late, rank: int, timeout: float) -> ReuseTimeout:
    ranks = ", ".join(str(p) for p in late)
    return ReuseTimeout(
        f"rank {rank}: reusing the heap block at offset {offset} ({nbytes} bytes), freed as free #{epoch}, waited "
        f"{timeout:g} s for rank(s) {ranks} to finish the work they queued before that free. Some work a rank queued "
        "before a free waits for work a peer queued after its matching free (a flag set only after the reuse, say): "
        "signal before the free, or free after that work. IRIS_REUSE_TIMEOUT sets the limit.",
        offset, late)


class HostProgress:
    """The host driver's counters: stores and waits happen now, in program order. The counters are
    host memory of every rank's heap, mapped here: they are read and written in place."""

    def __init__(self, driver, bases, offset: int, rank: int, timeout: float):
        self.driver, self.rank, self.timeout = driver, rank, timeout
        self.own = bases[rank] + offset
        self.peers = [(p, b + offset) for p, b in enumerate(bases) if p != rank and b]
        self._own = ctypes.c_int64.from_address(self.own)
        self._words = [ctypes.c_int64.from_address(a) for _, a in self.peers]
        self.epoch = 0   # frees passed here: the same on every rank
        self.done = 0    # every rank has passed this epoch (known from a point or a wait)
        self.failed: Optional[ReuseTimeout] = None

    def passed(self) -> int:
        """This rank passes a free: the next epoch, written to its counter. Returns the epoch."""
        self.epoch = epoch = self.epoch + 1
        if not self.peers:  # alone: the stream itself orders this rank's work
            self.done = epoch
            return epoch
        self._own.value = epoch  # what driver.stream_write does on the host, without a ctypes object per call
        return epoch

    def synced(self) -> None:
        """Every rank finished its work and met (a collective point): every epoch so far is passed."""
        self.done = self.epoch

    def wait(self, epoch: int, offset: int, nbytes: int) -> None:
        """Before the block at offset (freed at epoch) is used again: every peer has passed epoch."""
        for word in self._words:  # one look first; the driver's wait yields the core, which a peer may share
            if word.value < epoch:
                break
        else:  # the usual case in a loop whose ranks keep pace
            self.done = epoch
            return
        deadline, late = time.monotonic() + self.timeout, []
        for p, address in self.peers:
            try:
                self.driver.stream_wait(0, address, epoch, max(0.0, deadline - time.monotonic()))
            except DriverError:
                late.append(p)
        if late:
            raise _violation(offset, nbytes, epoch, late, self.rank, self.timeout)
        self.done = epoch

    def raise_failed(self) -> None:
        pass

    def close(self) -> None:
        pass


class StreamProgress:
    """GPU counters: writes and waits are queued on the current stream; the host never waits."""

    def __init__(self, driver, bases, offset: int, rank: int, timeout: float, device: torch.device):
        self.driver, self.rank, self.timeout, self.device = driver, rank, timeout, device
        self.own = bases[rank] + offset
        self.peers = [(p, b + offset) for p, b in enumerate(bases) if p != rank and b]
        self.epoch = 0
        self.done = 0           # passed everywhere, for every stream (from a point that synced the devices)
        self._waited = (0, 0)   # (stream, epoch) the last wait covered: later work on that stream is after it
        self._awaited = None    # (epoch, offset, nbytes) of the newest wait, for the watchdog
        self.failed: Optional[ReuseTimeout] = None
        self._raw_stream = torch._C._cuda_getCurrentRawStream
        self._capturing = torch._C._cuda_isCurrentStreamCapturing  # torch.cuda.is_current_stream_capturing's call
        self._write = driver.stream_write
        self._wait = driver.stream_waiter([a for _, a in self.peers]) if self.peers else None
        self._index = device.index
        self._watchdog = None
        self._stop = threading.Event()
        if self.peers:  # the watchdog's stream and buffers, made now: made while a wait is queued, the
            # driver may hold the stream's creation (with the GIL) until that wait ends, which is the watchdog's job
            from .views import device_tensor_at
            self._side = torch.cuda.Stream(device)
            self._counters = [(p, device_tensor_at(a, (1,), torch.int64, device)) for p, a in self.peers]
            self._seen = torch.zeros(len(self.peers), dtype=torch.int64, pin_memory=True)

    def passed(self) -> int:
        if self._capturing():  # a captured write would set the counter back on each replay
            raise CaptureError("ctx.free (or a scope's exit) during CUDA graph capture: the graph uses the tensor's "
                               "memory on every replay, so it must stay allocated while the graph lives. Free it after "
                               "capture ends (and after the last replay), or allocate it before capture.")
        self.epoch = epoch = self.epoch + 1
        if not self.peers:  # alone: the stream itself orders this rank's work
            self.done = epoch
            return epoch
        self._write(self._raw_stream(self._index), self.own, epoch)
        return epoch

    def synced(self) -> None:
        self.done = self.epoch

    def raise_failed(self) -> None:
        """Raise the ReuseTimeout the watchdog found, once (the rank may go on to a collective point)."""
        failed, self.failed = self.failed, None
        if failed is not None:
            raise failed

    def wait(self, epoch: int, offset: int, nbytes: int) -> None:
        if self.failed is not None:
            self.raise_failed()
        stream = self._raw_stream(self._index)
        last_stream, last = self._waited
        if stream == last_stream and epoch <= last:
            return
        capturing = self._capturing()
        try:
            self._wait(stream, epoch)
        except DriverError as e:
            if capturing:
                raise CaptureError(f"reusing a heap block inside CUDA graph capture needs a stream wait on the peers' "
                                   f"progress, which this driver cannot capture ({e}). Call ctx.barrier() before "
                                   "capturing: blocks freed before it are reused with no wait.") from e
            raise
        if capturing:  # the wait runs at each replay: nothing is outstanding now, nor is eager work ordered by it
            return
        self._waited = (stream, epoch)
        self._awaited = (epoch, offset, nbytes)
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="iris-reuse-watchdog", daemon=True)
            self._watchdog.start()

    def _watch(self) -> None:
        """Reads the peers' counters while a wait is outstanding; one that outlives the timeout is a
        broken ordering rule: record it, say so, and let the stream go on (writing the awaited value
        into this process's view of the late counters), so the rank raises instead of hanging."""
        torch.cuda.set_device(self.device)
        self.driver.relax_capture()  # its reads must not break a graph another thread is capturing
        side, seen_now, counters = self._side, self._seen, self._counters
        seen, since = None, None
        while not self._stop.wait(0.05):
            awaited = self._awaited
            if awaited is None:
                since = None
                continue
            epoch, offset, nbytes = awaited
            with torch.cuda.stream(side):
                for i, (_, c) in enumerate(counters):
                    seen_now[i:i + 1].copy_(c, non_blocking=True)
            side.synchronize()
            values = seen_now.tolist()
            if values != seen or since is None:  # a peer moved on: a long kernel is not a broken rule
                seen, since = values, time.monotonic()
            late = [p for (p, _), v in zip(counters, values) if v < epoch]
            if not late:
                if self._awaited is awaited:
                    self._awaited = None
                continue
            if time.monotonic() - since < self.timeout:
                continue
            self.failed = _violation(offset, nbytes, epoch, late, self.rank, self.timeout)
            print(f"iris: {self.failed}", file=sys.stderr, flush=True)
            for p, address in self.peers:
                if p in late:
                    self.driver.stream_write(side.cuda_stream, address, epoch)
            side.synchronize()
            self._awaited = None
            self._watchdog = None  # the next wait starts a new one
            return

    def close(self) -> None:
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=1.0)


def make_progress(driver, bases, offset: int, rank: int, device: torch.device):
    """The progress counters for a heap whose counter block sits at offset on every rank."""
    timeout = settings.REUSE_TIMEOUT.get()
    if device.type == "cpu":
        return HostProgress(driver, bases, offset, rank, timeout)
    return StreamProgress(driver, bases, offset, rank, timeout, device)
