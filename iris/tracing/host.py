"""Tracing: the host side of device tracing, reached as ctx.tracing (Iris's API).

enable() allocates the records table and writes its address into the device context tensor in
place (so kernels and CUDA graphs that already hold the tensor see it); kernels whose
DeviceContext was initialized with tracing=True then record their operations. export() writes
Chrome trace JSON per rank, or merges every rank's events on rank 0 on one clock: each rank
measures its device clock against the host clock (time.time_ns, shared by the ranks of a host)
with a one-thread kernel bracketed by host reads, and shifts its events by the difference.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time

import torch

from .chrome import document, events_of, merge as merge_ranks
from .device import FIELDS, read_clock

_MAX_EVENTS = (1 << 31) - 1  # the device counter is int32
_CALIBRATION_ROUNDS = 5


class Tracing:
    """Device-side event tracing for one context: enable(max_events), reset(), export(filename, merge)."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.enabled = False
        self.max_events = 0
        self.records = None
        self.trace_counter = None  # int32 events claimed since enable()/reset(), on the device (Iris's name)

    def slots(self) -> torch.Tensor:
        """The context tensor's trace slots: max_events, counter address, records address (zeros
        until enable(): kernels then record nothing)."""
        values = ([self.max_events, self.trace_counter.data_ptr(), self.records.data_ptr()] if self.enabled
                  else [0, 0, 0])
        return torch.tensor(values, dtype=torch.int64, device=self._ctx.device)

    def enable(self, max_events: int = 1_000_000) -> None:
        """Allocate room for max_events events (FIELDS int64s each) and start recording from kernels
        whose DeviceContext has tracing=True. Calling it again reallocates and starts over."""
        if isinstance(max_events, bool) or not isinstance(max_events, int) or not 0 < max_events <= _MAX_EVENTS:
            raise ValueError(f"tracing.enable(max_events={max_events!r}): max_events must be an int in "
                             f"[1, {_MAX_EVENTS}]; e.g. tracing.enable(max_events=1_000_000)")
        records = torch.zeros((max_events, len(FIELDS)), dtype=torch.int64, device=self._ctx.device)
        self.trace_counter = torch.zeros(1, dtype=torch.int32, device=self._ctx.device)
        self.records, self.max_events, self.enabled = records, max_events, True
        self._ctx.get_device_context()[-3:] = self.slots()
        self._ctx.info(f"device tracing enabled: room for {max_events} events "
                       f"({records.numel() * records.element_size() >> 20} MiB)")

    def reset(self) -> None:
        """Start a new capture: the count goes back to zero, the buffer stays allocated."""
        if not self.enabled:
            self._ctx.warning("tracing.reset(): tracing is not enabled; call ctx.tracing.enable() first")
            return
        self.trace_counter.zero_()

    def recorded(self) -> int:
        """Events the kernels tried to record since enable()/reset() (more than max_events: some dropped)."""
        if not self.enabled:
            return 0
        self._synchronize()
        return int(self.trace_counter.item())

    def rows(self) -> torch.Tensor:
        """The recorded events as a (n, len(FIELDS)) int64 CPU tensor, in the order they were claimed."""
        n = min(self.recorded(), self.max_events)
        return self.records[:n].cpu() if n else torch.zeros((0, len(FIELDS)), dtype=torch.int64)

    def export(self, filename: str = "trace.json", merge: bool = False) -> dict:
        """Write this rank's events to filename with _rank{r} before .json, and return them as a
        Chrome trace dict. merge=True also gathers every rank's events on rank 0, shifted onto the
        host clock, and writes them to filename there (rank 0 returns the merged dict, the others
        {}). Collective when merge=True: all ranks, same order."""
        ctx = self._ctx
        if not self.enabled:
            ctx.warning("tracing.export(): tracing is not enabled; call ctx.tracing.enable() first")
            return {}
        rows = self.rows()
        dropped = max(0, self.recorded() - self.max_events)
        if dropped:
            ctx.warning(f"tracing: {dropped} events did not fit in max_events={self.max_events}; "
                        "call tracing.enable() with a larger max_events")
        offset, uncertainty = self.clock_offset() if merge else (0, 0)
        events = events_of(rows.tolist(), ctx.get_rank())
        meta = dict(self._metadata(), rank=ctx.get_rank(), dropped_events=dropped, max_events=self.max_events,
                    clock_offset_ns=offset, clock_uncertainty_ns=uncertainty)
        per_rank = document(events, dict(meta, clock=self.clock_name()))
        root, ext = os.path.splitext(filename)
        with open(f"{root}_rank{ctx.get_rank()}{ext or '.json'}", "w") as f:
            json.dump(per_rank, f)
        if not merge:
            return per_rank
        gathered = ctx.group.allgather((events, offset, meta), "tracing.export(merge=True)")
        if ctx.get_rank() != 0:
            return {}
        merged = document(merge_ranks([(e, o) for e, o, _ in gathered]),
                          dict(meta, rank=None, clock="host time.time_ns (ranks aligned)",
                               ranks=[m for _, _, m in gathered]))
        with open(filename, "w") as f:
            json.dump(merged, f)
        ctx.info(f"merged trace of {len(merged['traceEvents'])} entries written to {filename}")
        return merged

    def clock_name(self) -> str:
        return "host time.time_ns" if self._ctx.device.type == "cpu" else "device %globaltimer ns"

    def clock_offset(self) -> tuple:
        """(host ns - device ns, uncertainty ns): the host clock read before and after a kernel that
        reads the device clock; of a few tries, the tightest bracket wins."""
        out = torch.zeros(1, dtype=torch.int64, device=self._ctx.device)
        best = None
        for _ in range(_CALIBRATION_ROUNDS):
            before = time.time_ns()
            read_clock[(1,)](out)
            self._synchronize()
            after = time.time_ns()
            span = after - before
            if best is None or span < best[1]:
                best = ((before + after) // 2 - int(out.item()), span // 2)
        return best

    def _synchronize(self) -> None:
        if self._ctx.device.type == "cuda":
            torch.cuda.synchronize(self._ctx.device)

    def _metadata(self) -> dict:
        ctx = self._ctx
        meta = {"world_size": ctx.get_num_ranks(), "hostname": socket.gethostname(),
                "command_line": " ".join(sys.argv), "fields": list(FIELDS)}
        if ctx.device.type == "cuda":
            props = torch.cuda.get_device_properties(ctx.device)
            meta.update(device=props.name, sm_count=props.multi_processor_count)
        else:
            meta.update(device="host (Triton interpreter)", sm_count=1)
        return meta

