"""DeviceTracing: what a kernel's DeviceContext records when it is built with tracing=True.

One event is one row of the records table (int64, FIELDS wide), claimed with an atomic on the
counter; rows past max_events are counted but not written. Until the host enables tracing,
max_events is 0 and a kernel compiled with tracing=True touches nothing. Times are NVIDIA's %globaltimer
(nanoseconds, one clock per GPU) and the SM is %smid. Under the interpreter (the host driver) the
clock is the host's time.time_ns() and the SM is 0: programs run one after another there, so a
host trace shows order and host-side durations, not GPU timing.

tracing is a constexpr of DeviceContext.initialize: a kernel built without it compiles exactly as
before (nothing here is emitted).
"""
import time

import triton
import triton.language as tl

from ..device.aggregate import INTERPRETED, aggregate

FIELDS = ("event", "program_id", "pid_m", "pid_n", "cur_rank", "target_rank", "sm_id", "start_ns", "end_ns",
          "address", "payload_bytes")
WIDTH = tl.constexpr(len(FIELDS))
(EVENT, PROGRAM, PID_M, PID_N, CUR, TARGET, SM, START, END, ADDRESS, PAYLOAD) = (tl.constexpr(i)
                                                                                 for i in range(len(FIELDS)))

if INTERPRETED:
    def _clock(dep=None):
        return time.time_ns()

    def _sm_id():
        return 0
else:
    @triton.jit
    def _clock(dep=None):
        # dep: a value the clock read must wait for (a load's data), so the end time is when it arrived
        if dep is None:
            t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                          pack=1)
        else:
            t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=tl.int64,
                                          is_pure=False, pack=1)
        return t

    @triton.jit
    def _sm_id():
        return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _lowest(address):
    """One address per event: the lowest of a block of pointers."""
    a = tl.cast(address, tl.int64)
    if a.type.is_block():
        a = tl.min(a)
    return a


@triton.jit
def _payload_bytes(address, mask):
    """Bytes the operation moves: the lanes mask lets through, times the element size."""
    size: tl.constexpr = address.dtype.element_ty.primitive_bitwidth // 8
    if mask is None:
        n = address.numel if address.type.is_block() else 1
    else:
        lanes = mask.to(tl.int32) + tl.zeros_like(tl.cast(address, tl.int64)).to(tl.int32)
        n = tl.sum(lanes) if lanes.type.is_block() else lanes
    return n * size


@triton.jit
def _arrived(value):
    """An int32 that depends on every element of value: the clock read after it waits for the data."""
    nonzero = (value != 0).to(tl.int32)
    if nonzero.type.is_block():
        nonzero = tl.max(nonzero)
    return nonzero


@triton.jit
def read_clock(out):
    """Stores the clock events are stamped with (one program): Tracing.clock_offset's probe."""
    tl.store(out, _clock())


@aggregate
class DeviceTracing:
    """This rank's trace buffer inside a kernel (ctx.tracing); built by DeviceContext.initialize."""
    enabled: tl.constexpr
    rank: tl.constexpr
    max_events: tl.tensor
    counter: tl.tensor
    records: tl.tensor

    @triton.constexpr_function
    def __init__(self, enabled, rank, max_events, counter, records):
        self.enabled = tl.constexpr(enabled)
        self.rank = tl.constexpr(rank)
        self.max_events = max_events
        self.counter = counter
        self.records = records

    @triton.jit
    def record_event_start(self, event_id: tl.constexpr, target_rank, address, pid_m=0, pid_n=0, mask=None):
        """Starts an event (Iris's call): event_id a TraceEvent id, target_rank the rank whose memory is
        touched, address the pointer(s) (the lowest is kept), mask the lanes that move data (payload
        bytes). Returns the handle for record_event_end; a no-op returning -1 without tracing."""
        handle = -1
        if self.enabled:
            handle = tl.full((), -1, tl.int32)
            if self.max_events > 0:  # 0: the host has not called ctx.tracing.enable(), nothing to touch
                handle = tl.atomic_add(self.counter, 1, sem="relaxed")
                start = _clock()
                sm = _sm_id()
                row = self.records + handle.to(tl.int64) * WIDTH
                if (handle >= 0) & (handle < self.max_events):
                    tl.store(row + EVENT, event_id)
                    tl.store(row + PROGRAM, tl.program_id(0))
                    tl.store(row + PID_M, pid_m)
                    tl.store(row + PID_N, pid_n)
                    tl.store(row + CUR, self.rank)
                    tl.store(row + TARGET, target_rank)
                    tl.store(row + SM, sm)
                    tl.store(row + START, start)
                    tl.store(row + END, 0)
                    tl.store(row + ADDRESS, _lowest(address))
                    tl.store(row + PAYLOAD, _payload_bytes(address, mask))
        return handle

    @triton.jit
    def record_event_end(self, handle, value=None):
        """Ends the event handle started; value (optional): data the operation returned, so the end
        time waits for it to arrive. A no-op without tracing."""
        if self.enabled:
            if value is None:
                end = _clock()
            else:
                end = _clock(_arrived(value))
            if (handle >= 0) & (handle < self.max_events):
                tl.store(self.records + handle.to(tl.int64) * WIDTH + END, end)
