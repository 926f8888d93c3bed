"""The streamed variants: torch.matmul (cuBLAS) computes the GEMM in chunks of rows on the caller's
stream while side streams move finished chunks between ranks with the copy engines (copies from the
peers' heap views), ordered by per-chunk flags on the heap.

The persistent kernels pay for communication with SM time: each program pushes its tile after
computing it, which slows the GEMM itself (benchmarks/gemm_comm.py; docs/performance.md). Here no SM
moves data; beyond 2 ranks one kernel on the caller's stream sums a chunk's partials from the peers
before cuBLAS adds this rank's.
Eager calls replay a CUDA graph of the whole sequence once the same tensors come back (dozens of
launches then cost one); under the caller's own capture the sequence is captured as it is.

matmul_all_reduce and matmul_reduce_scatter share one shape: every rank owns a block of rows; it
first computes the peers' blocks, chunk by chunk, into its heap buffer; then, for each chunk of its
own block, the copy engines bring the peers' partials and cuBLAS adds its own in the epilogue
(addmm). matmul_all_reduce sums into the heap buffer and every rank then copies each owner's sums,
so NVLink carries each partial and each sum once, and the output is the same bits on every rank.
matmul_all_gather computes this rank's rows by chunks into the output (a heap tensor) and copies
each chunk into the peers' outputs. all_gather_matmul copies the peers' rows of A, each
multiplied as it arrives.

Flags: a call opens with _start_kernel, a device barrier over ctl.
flags[p * C + c] on rank r is 1 while rank p's chunk c, for r, lies in p's heap buffer (c = o * S + s:
chunk s of owner o's block; c = w * S + s: chunk s of p's summed block); for matmul_all_gather: p's
chunk c has landed in r's output. The waiter sets it back to 0; the opening handshake keeps a peer from
setting it again before that. On GPUs the flags are stream memory operations (cuStreamWriteValue64 into
the peer's word, one batched cuStreamWaitValue64 on the own words): they take no SM, where a flag
kernel on a side stream waits for cuBLAS to free one and a spinning one holds an SM the next GEMM
chunk needs. The host runs _chunk_kernel.
"""
from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time

import torch
import triton
import triton.language as tl

from .. import settings
from ..ccl.config import Config
from ..ccl.launch import Launcher
from ..device import barrier_kernel, signal, wait
from ..errors import WaitTimeout
from .gemm import interpreted

CAPTURE_AFTER = 2  # eager calls with the same tensors before the sequence is captured and replayed


@triton.jit
def _start_kernel(ctl, flags, n_flags, heap_bases, rank, world, BLOCK: tl.constexpr):
    """Opens a call: a device barrier over ctl (every rank has ended its previous call, so it has read its
    peers' buffers and set its flags back for the last time). A peer that never came (the spin limit ran
    out; the host raises WaitTimeout naming it at its next barrier) leaves this call's flags set, so that
    the call's waits pass instead of holding the streams for ever. BLOCK: a power of two >= world."""
    barrier_kernel(ctl, rank, world, heap_bases, BLOCK)
    peers = tl.arange(0, BLOCK)
    seen = tl.load(ctl + peers, mask=peers < world, other=0, volatile=True)
    late = tl.sum(((peers < world) & (seen < tl.load(ctl + world, volatile=True))).to(tl.int32), axis=0)
    if late > 0:
        for j in range(0, n_flags, BLOCK):
            tl.store(flags + j + peers, tl.full((BLOCK,), 1, tl.int64), mask=j + peers < n_flags)


@triton.jit
def _chunk_kernel(flags, heap_bases, rank, world, C, idx, peer, SIGNAL: tl.constexpr, WAIT: tl.constexpr):
    """The flags on the host. SIGNAL: flags[rank * C + idx] := 1 on rank peer: this rank's chunk idx is
    in its heap buffer. WAIT: spins until flags[peer * C + idx] here is 1, then sets it back to 0."""
    if SIGNAL:
        signal(flags + rank * C + idx, 1, rank, peer, heap_bases)
    if WAIT:
        wait(flags + peer * C + idx, 1, rank, rank, heap_bases, cmp="ge")
        tl.store(flags + peer * C + idx, 0)


@triton.jit
def _sum_kernel(dst, src, n, stride, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    """dst[:n] := the sum of the PARTS runs src[i * stride:][:n], added in float32: the peers' partials of
    a chunk in one pass (torch.sum over them took 2.5 times as long on an H200)."""
    step = tl.num_programs(0) * BLOCK
    for start in range(tl.program_id(0) * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        acc = tl.load(src + offs, mask=m).to(tl.float32)
        for i in tl.static_range(1, PARTS):
            acc += tl.load(src + i * tl.cast(stride, tl.int64) + offs, mask=m).to(tl.float32)
        tl.store(dst + offs, acc.to(dst.dtype.element_ty), mask=m)


class _StreamFlags:
    """The flags on GPUs, as stream memory operations on the current stream (module docstring): a wait is
    one batch of waits for every flag named, then a write of 0 to each (inside the batch, the writes did
    not wait for the waits on an H200)."""

    def __init__(self, ctx, flags, C):
        self.driver, self.r, self.C = ctx.driver, ctx.rank, C
        self.words = [flags.data_ptr() if p == ctx.rank else ctx.peer_view(flags, p).data_ptr()
                      for p in range(ctx.world)]
        self.waiters = {}

    def __call__(self, idx, peers, sig, wt):
        stream = torch.cuda.current_stream().cuda_stream
        if sig:
            for p in peers:
                self.driver.stream_write(stream, self.words[p] + 8 * (self.r * self.C + idx), 1)
        if wt:
            own = [self.words[self.r] + 8 * (p * self.C + idx) for p in peers]
            key = (idx, peers)
            if key not in self.waiters:
                self.waiters[key] = self.driver.stream_waiter(own)
            self.waiters[key](stream, 1)
            for address in own:
                self.driver.stream_write(stream, address, 0)


def chunk_rows(rows: int, chunks: int, align: int = 128) -> list:
    """[(start, stop)]: rows split into at most `chunks` nonempty pieces, starts aligned where rows allow."""
    if rows <= 0:
        return []
    step = -(-rows // max(1, min(chunks, rows)))
    if step > align:
        step = -(-step // align) * align
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


def owned_chunks(M: int, w: int, chunks: int) -> list:
    """Per rank p, the chunks [(start, stop)] of the rows it owns, [p * M // w, (p + 1) * M // w)."""
    bounds = [p * M // w for p in range(w + 1)]
    return [[(bounds[p] + a, bounds[p] + b) for a, b in chunk_rows(bounds[p + 1] - bounds[p], chunks)]
            for p in range(w)]


def preamble(ctx, kind: str, output, A, B, chunks: int, comm_sms=None, watch=None) -> dict:
    """Heap buffer, flags and side streams of one op ("ar", "rs", "ag" or "mag") at these shapes; chunks:
    per owner's block ("ar", "rs"), of this rank's rows ("mag"); "ar" with comm_sms: chunks of
    all rows, each reduced by ctx.ccl.all_reduce on comm_sms programs instead.
    Collective: all ranks, same order, same sizes."""
    w, dev, dt = ctx.world, A.device, A.dtype
    M, N, K = (w * A.shape[0] if kind == "ag" else A.shape[0]), B.shape[1], A.shape[1]
    ws = {"kind": kind}
    if kind == "ar" and comm_sms:
        ws["kind"], ws["rows"], C = "ar_ccl", chunk_rows(M, chunks), 1
        ws["buf"] = ctx.empty(M, N, dtype=dt)
    elif kind in ("ar", "rs"):
        ws["owned"] = owned_chunks(M, w, chunks)
        S = max(len(c) for c in ws["owned"])
        C = (w + 1) * S if kind == "ar" else w * S  # "ar": the summed blocks' flags too
        ws["S"] = S
        ws["buf"] = ctx.empty(M, N, dtype=dt)
        # beyond 2 ranks the peers' partials of a chunk land in slots, summed by one kernel; two sets of
        # slots let the copies of chunk s + 1 run while the sum of chunk s waits for cuBLAS
        rows = max(b - a for c in ws["owned"] for a, b in c)
        ws["slots"] = torch.empty(min(S, 2) if w > 2 else 0, w - 1, rows, N, dtype=dt, device=dev)
        programs = 4 * torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 2
        ws["sum"] = Launcher(_sum_kernel, (programs,), num_warps=8)
    elif kind == "mag":  # the output (a heap tensor) is the buffer: its views are taken at each call
        ws["rows"] = chunk_rows(A.shape[0], chunks)
        C = len(ws["rows"])
    else:
        C = 1
        ws["buf"] = ctx.empty(M, K, dtype=dt)
    ws["C"] = C
    ws["watch"] = watch if dev.type == "cuda" else None
    if ws["watch"] is not None:  # where the watch reads ctl and the flags (pinned now, not while a wait is queued)
        ws["watched"] = torch.empty(1 + w + w * C, dtype=torch.int64, pin_memory=True)
    if "buf" in ws:
        ws["views"] = [ws["buf"] if p == ctx.rank else ctx.peer_view(ws["buf"], p) for p in range(w)]
    ws["flags"] = ctx.zeros(w * C, dtype=torch.int64)
    ws["ctl"] = ctx.zeros(1 + w, dtype=torch.int64)
    ws["start"] = Launcher(_start_kernel, (1,), num_warps=1)
    cuda = dev.type == "cuda"
    ws["chunk"] = _StreamFlags(ctx, ws["flags"], C) if cuda else Launcher(_chunk_kernel, (1,), num_warps=1)
    # from torch's pool of high-priority streams: the caller's streams and the capture streams come from the
    # other pool, and one of them taking tx's or rx's place would serialize the copies behind the GEMMs
    ws["tx"] = torch.cuda.Stream(dev, priority=-1) if cuda else None
    ws["rx"] = torch.cuda.Stream(dev, priority=-1) if cuda else None
    if ws["kind"] == "ar_ccl":
        ws["ccl"] = Config(comm_sms=comm_sms)
        ws["zero"] = torch.zeros(N, dtype=dt, device=dev)  # addmm's bias: the GEMM through cuBLASLt
        for a, b in ws["rows"]:  # its workspaces too, so that the first call can be captured
            ctx.ccl.all_reduce_preamble(output[a:b], ws["buf"][a:b], config=ws["ccl"])
    ctx.barrier()  # every rank's flags are zero before any peer signals into them
    return ws


@contextlib.contextmanager
def _on(stream, after=None):
    """The block on stream, once stream has caught up with `after`; inline where there are no streams."""
    if stream is None:
        yield
        return
    if after is not None:
        stream.wait_stream(after)
    with torch.cuda.stream(stream):
        yield


def _event(stream):
    if stream is None:
        return None
    e = torch.cuda.Event()
    e.record(stream)
    return e


def _wait(e, stream=None):
    if e is not None:
        (stream or torch.cuda.current_stream()).wait_event(e)


def _all_reduce_ccl(ctx, ws, output, A, B, chunk, r, w, main):
    """Chunks of rows, each reduced by ctx.ccl.all_reduce on comm_sms programs beside cuBLAS's next chunk,
    which leaves it those SMs."""
    buf, zero = ws["buf"], ws["zero"]
    for a, b in ws["rows"]:
        with _carved(ws["ccl"].comm_sms):
            torch.addmm(zero, A[a:b], B, out=buf[a:b])
        with _on(ws["rx"], main):
            ctx.ccl.all_reduce(output[a:b], buf[a:b], config=ws["ccl"])


@contextlib.contextmanager
def _carved(sms):
    """cuBLAS's GEMMs inside leave `sms` SMs to other streams' kernels: torch's experimental SM carveout,
    which its cuBLASLt path reads (addmm with a bias vector takes it; torch.matmul's cuBLAS path ignores
    it, so a kernel on another stream waits for the GEMM's SMs)."""
    carve = getattr(torch._C, "_set_sm_carveout_experimental", None)
    if carve is None:
        yield
        return
    before = torch._C._get_sm_carveout_experimental()
    carve(sms)
    try:
        yield
    finally:
        carve(before)


def _sum_owned(ws, A, B, dst, chunk, r, w, main, done=None):
    """The peers' blocks computed chunk by chunk into the heap buffer, each chunk flagged to its owner;
    then each chunk (a, b) of this rank's block summed into dst(a, b): the peers' partials brought by the
    copy engine (rx), from rank - 1 down (the order the peers computed them in), and this rank's added
    by cuBLAS's epilogue (main); done(s, a, b) follows each chunk's sum on main."""
    buf, views, owned, S, tx, rx, slots = ws["buf"], ws["views"], ws["owned"], ws["S"], ws["tx"], ws["rx"], ws["slots"]
    for s in range(S):  # the peers' chunks first, in the order their owners sum them
        for i in range(1, w):
            o = (r + i) % w
            if s < len(owned[o]):
                a, b = owned[o][s]
                torch.matmul(A[a:b], B, out=buf[a:b])
                with _on(tx, main):
                    chunk(o * S + s, (o,), True, False)
    summed = []
    for s, (a, b) in enumerate(owned[r]):
        d = dst(a, b)
        part = slots[s % len(slots), :, :b - a] if w > 2 else None
        with _on(rx):
            if w > 2 and s >= len(slots):  # this set of slots is free once chunk s - 2's sum has read it
                _wait(summed[s - len(slots)], rx)
            for i in range(w - 1, 0, -1):
                chunk(r * S + s, ((r + i) % w,), False, True)
                (d if w == 2 else part[i - 1]).copy_(views[(r + i) % w][a:b])
            e = _event(rx)
        _wait(e)
        if w > 2:
            ws["sum"](d, part, d.numel(), part.stride(0), w - 1, 2048)
            summed.append(_event(main))
        d.addmm_(A[a:b], B)
        if done is not None:
            done(s, a, b)


def _all_reduce(ctx, ws, output, A, B, chunk, r, w, main):
    """A reduce-scatter into this rank's block of the heap buffer, then every rank copies every block."""
    buf, views, owned, S, tx, rx = ws["buf"], ws["views"], ws["owned"], ws["S"], ws["tx"], ws["rx"]

    def done(s, a, b):  # the sums of chunk s are in the heap buffer: tell the peers, keep a copy
        with _on(tx, main):
            chunk(w * S + s, -1, True, False)
            output[a:b].copy_(buf[a:b])

    _sum_owned(ws, A, B, lambda a, b: buf[a:b], chunk, r, w, main, done)
    with _on(rx):
        for s in range(S):  # chunk s of every owner: one wait, then the copies back to back
            owners = tuple(p for p in ((r + i) % w for i in range(1, w)) if s < len(owned[p]))
            chunk(w * S + s, owners, False, True)
            for p in owners:
                a, b = owned[p][s]
                output[a:b].copy_(views[p][a:b])


def _reduce_scatter(ctx, ws, output, A, B, chunk, r, w, main):
    m = A.shape[0] // w
    _sum_owned(ws, A, B, lambda a, b: output[a - r * m:b - r * m], chunk, r, w, main)


def _all_gather_matmul(ctx, ws, output, A, B, chunk, r, w, main):
    buf, views, tx, rx = ws["buf"], ws["views"], ws["tx"], ws["rx"]
    m = A.shape[0]
    with _on(tx, main):
        buf[r * m:(r + 1) * m].copy_(A)
        chunk(0, -1, True, False)
    torch.matmul(A, B, out=output[r * m:(r + 1) * m])
    for i in range(1, w):  # the next rank's rows, then the one after, ...
        p = (r + i) % w
        with _on(rx):
            chunk(0, (p,), False, True)
            buf[p * m:(p + 1) * m].copy_(views[p][p * m:(p + 1) * m])
            e = _event(rx)
        _wait(e)
        torch.matmul(buf[p * m:(p + 1) * m], B, out=output[p * m:(p + 1) * m])


def _matmul_all_gather(ctx, ws, output, A, B, chunk, r, w, main, bias=None):
    """This rank's rows by chunks into its rows of the output (a heap tensor), each copied into every
    peer's output and flagged there; the call ends once every peer's chunks have landed here. Copies
    into the peers, not from them: when a rank's call ends nobody reads its output (a user may
    overwrite it at once), and the opening handshake keeps peers from writing before it starts."""
    m, tx, rx = A.shape[0], ws["tx"], ws["rx"]
    views = [None if p == r else ctx.peer_view(output, p) for p in range(w)]
    for s, (a, b) in enumerate(ws["rows"]):
        o = output[r * m + a:r * m + b]
        if bias is None:
            torch.matmul(A[a:b], B, out=o)
        else:
            torch.addmm(bias[a:b, None].to(o.dtype), A[a:b], B, out=o)
        with _on(tx, main):  # the copies back to back, then the flags
            for i in range(1, w):
                p = (r + i) % w
                views[p][r * m + a:r * m + b].copy_(o)
            chunk(s, -1, True, False)
    with _on(rx):
        for s in range(len(ws["rows"])):
            chunk(s, -1, False, True)


_SEQUENCES = {"ar": _all_reduce, "ar_ccl": _all_reduce_ccl, "rs": _reduce_scatter, "ag": _all_gather_matmul,
              "mag": _matmul_all_gather}


def _sequence(ctx, output, A, B, ws, bias=None) -> None:
    r, w, hb = ctx.rank, ctx.world, ctx.get_heap_bases()
    ctl, flags, C = ws["ctl"], ws["flags"], ws["C"]
    main = torch.cuda.current_stream() if ws["tx"] is not None else None
    flagged = ws["chunk"]

    def chunk(idx, peers, sig, wt):
        """Signal (sig) or wait for (wt) flag idx of each rank in peers (a tuple; -1: every peer)."""
        peers = tuple((r + i) % w for i in range(1, w)) if peers == -1 else peers
        if main is not None:
            flagged(idx, peers, sig, wt)
        else:
            for p in peers:
                flagged(flags, hb, r, w, C, idx, p, sig, wt)

    start = (ctl, flags, w * C, hb, r, w, triton.next_power_of_2(w))
    # both side streams join main here, behind the start kernel (a capture must see every stream it joins back)
    if ws["kind"] == "mag":  # only the copies into the peers wait for it: the GEMM starts at once
        with _on(ws["tx"], main):
            ws["start"](*start)
        if main is not None:
            ws["rx"].wait_stream(ws["tx"])
    else:
        ws["start"](*start)
        if main is not None:
            ws["rx"].wait_stream(main)
            ws["tx"].wait_stream(main)
    _SEQUENCES[ws["kind"]](ctx, ws, output, A, B, chunk, r, w, main, *(() if bias is None else (bias,)))
    if main is not None:
        main.wait_stream(ws["tx"])
        main.wait_stream(ws["rx"])


def run(ctx, output, A, B, ws, bias=None) -> torch.Tensor:
    """The sequence on the current stream, replayed from a graph once the same tensors come back
    (replayed). No host synchronization, except once when capturing. An eager call on a GPU is
    watched (Watch)."""
    if output.numel():
        watch = ws.get("watch")
        capturing = None if watch is None else torch.cuda.is_current_stream_capturing()
        watch = None if capturing else watch
        begun = watch and watch.mark()
        replayed(ws, (A, B, output, bias), lambda: _sequence(ctx, output, A, B, ws, bias), capturing)
        if watch is not None:
            watch.add(ws, begun, watch.mark())
    return output


class Watch:
    """The eager streamed calls of one context in flight on its GPU, and a thread that releases one whose
    peer stopped after the opening barrier. The chunks' stream waits (memory operations) have no spin
    limit: once every rank has opened a call, a peer that dies before it has sent its chunks would hold
    this rank's streams, and its next synchronisation, for ever. A call still running `timeout` seconds
    after it began (IRIS_TIMEOUT), with every rank past the opening barrier, is released: the thread
    writes 1 into all of the call's flags on this rank (a side stream's memory operations, which no
    wait holds), so the waits pass; the result is wrong, the workspace is dropped, and the next
    streamed call or ctx.barrier() raises WaitTimeout naming the peers whose chunks never came.
    Calls captured into a graph by the caller are not watched: the host does not see their replays."""

    def __init__(self, ctx):
        self.ctx, self.failed = ctx, None
        self.timeout = getattr(ctx.group, "timeout", None) or settings.TIMEOUT.get()
        self.calls = collections.deque()  # (ws, begun, ended): events around each call
        self.spare = collections.deque()  # events of ended calls, recorded again by later ones
        # made now: made while a wait is queued, the driver may hold a stream's creation until that wait ends
        self._side = torch.cuda.Stream(ctx.device)
        self._stop = threading.Event()
        self._thread = None

    def mark(self) -> torch.cuda.Event:
        e = self.spare.pop() if self.spare else torch.cuda.Event()
        e.record()
        return e

    def add(self, ws, begun, ended) -> None:
        self.calls.append((ws, begun, ended))
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="iris-streamed-watchdog", daemon=True)
            self._thread.start()

    def raise_failed(self) -> None:
        """Raise the WaitTimeout of a released call, once."""
        failed, self.failed = self.failed, None
        if failed is not None:
            raise failed

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _watch(self) -> None:
        torch.cuda.set_device(self.ctx.device)
        self.ctx.driver.relax_capture()  # its reads must not break a graph another thread is capturing
        since = None
        while not self._stop.wait(0.05):
            while self.calls and self.calls[0][2].query():
                self.spare.extend(self.calls.popleft()[1:])
                since = None
            if not self.calls or not self.calls[0][1].query():
                continue  # nothing in flight, or the oldest call has not begun (work before it runs)
            since = since or time.monotonic()
            if time.monotonic() - since < self.timeout:
                continue
            ws = self.calls[0][0]
            w, rank = self.ctx.world, self.ctx.rank
            seen, n = ws["watched"], w + 1
            with torch.cuda.stream(self._side):
                seen[:n].copy_(ws["ctl"], non_blocking=True)
                seen[n:].copy_(ws["flags"], non_blocking=True)
            self._side.synchronize()
            ctl, flags = seen[:n], seen[n:]
            if bool((ctl[:w] < ctl[w]).any()):  # the opening barrier still waits for a late peer: the spin
                continue                        # limit bounds that wait, and the start kernel then releases
            arrived = flags.view(w, -1).ne(0).any(1).tolist()  # a peer with a flag set is sending
            late = [p for p in range(w) if p != rank and not arrived[p]] or [p for p in range(w) if p != rank]
            ws["dead"] = True
            self.failed = WaitTimeout(
                f"rank {rank}: a streamed fused op ({ws['kind']}) was still waiting for its peers' chunks "
                f"{self.timeout:g} s after every rank had opened the call; rank(s) "
                f"{', '.join(map(str, late))} stopped sending them (the process died or is stuck). The call was "
                "released and its result is wrong; the op's workspace is dropped (the next call builds one, "
                "collectively). IRIS_TIMEOUT sets the limit.")
            print(f"iris: {self.failed}", file=sys.stderr, flush=True)
            for i in range(ws["flags"].numel()):
                self.ctx.driver.stream_write(self._side.cuda_stream, ws["flags"].data_ptr() + 8 * i, 1)
            self._side.synchronize()
            since = None


def replayed(ws, tensors, sequence, capturing=None) -> None:
    """sequence() on the current stream; an eager call with the tensors of the last CAPTURE_AFTER calls
    (addresses and strides; None entries skipped) replays a CUDA graph of it, so that its launches cost
    one. Under the caller's own capture (capturing, where the caller already asked), on the host or the
    interpreter, it runs as it is; where capture fails, it runs as it is from then on and ws["no_graph"]
    says why."""
    if interpreted() or tensors[0].device.type != "cuda" or "no_graph" in ws \
            or (torch.cuda.is_current_stream_capturing() if capturing is None else capturing):
        sequence()
        return
    key = tuple((t.data_ptr(), t.stride()) for t in tensors if t is not None)
    g = ws.get("graph")
    if g is not None and g[0] == key:
        g[1].replay()
        return
    seen = ws.get("seen")
    n = seen[1] + 1 if seen is not None and seen[0] == key else 1
    if n <= CAPTURE_AFTER:
        ws["seen"] = (key, n)
        sequence()
        return
    ws.pop("seen", None)
    ws.pop("graph", None)
    graph = torch.cuda.CUDAGraph()
    main = torch.cuda.current_stream()
    s = torch.cuda.Stream(tensors[0].device)
    s.wait_stream(main)
    try:
        with torch.cuda.graph(graph, stream=s, capture_error_mode="thread_local"):
            sequence()
    except Exception as e:  # noqa: BLE001 - nothing captured ran: launch directly from now on, and say why
        ws["no_graph"] = f"{type(e).__name__}: {e}"
        sequence()
        return
    main.wait_stream(s)
    graph.replay()
    ws["graph"] = (key, graph, tensors)  # keeps the captured tensors alive
