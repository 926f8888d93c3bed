"""The streamed variants: torch.matmul (cuBLAS) computes the GEMM in chunks of rows on the caller's
stream while side streams move finished chunks between ranks with the copy engines (copies from the
peers' heap views), ordered by per-chunk flags on the heap.

The persistent kernels pay for communication with SM time: each program pushes its tile after
computing it, which slows the GEMM itself (benchmarks/gemm_comm.py; docs/performance.md). Here no SM
moves data; SMs only add the partials of a chunk, beyond the first peer's, while cuBLAS works on the
next chunk.
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

Flags: ctl[0] counts calls; a call opens with _start_kernel (tells the peers that this rank finished
reading their buffers in the previous call, waits for the same from them, advances ctl[0]);
flags[p * C + c] on rank r reaching ctl[0] means: rank p's chunk c, for r, lies in p's heap buffer
(c = o * S + s: chunk s of owner o's block; c = w * S + s: chunk s of p's summed block); for
matmul_all_gather: p's chunk c has landed in r's output.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ..ccl.config import Config
from ..ccl.launch import Launcher
from ..device import signal, wait
from .gemm import interpreted

CAPTURE_AFTER = 2  # eager calls with the same tensors before the sequence is captured and replayed


@triton.jit
def _start_kernel(ctl, heap_bases, rank, world):
    """Opens a call: ctl[1 + rank] on every peer := the calls this rank completed (it has read their
    buffers for the last time); waits until every peer did the same here; then ctl[0] += 1."""
    prev = tl.load(ctl, volatile=True)
    for i in range(1, world):
        signal(ctl + 1 + rank, prev, rank, (rank + i) % world, heap_bases)
    for i in range(1, world):
        wait(ctl + 1 + (rank + i) % world, prev, rank, rank, heap_bases, cmp="ge")
    tl.store(ctl, prev + 1)


@triton.jit
def _chunk_kernel(flags, ctl, heap_bases, rank, world, C, idx, peer, SIGNAL: tl.constexpr, WAIT: tl.constexpr):
    """SIGNAL: flags[rank * C + idx] := this call, on rank peer (every peer where peer < 0): this rank's
    chunk idx is in its heap buffer. WAIT: spins until flags[peer * C + idx] here (every peer's where
    peer < 0) reached this call."""
    ep = tl.load(ctl, volatile=True)
    if SIGNAL:
        for i in range(1, world):
            p = (rank + i) % world
            if peer < 0 or p == peer:
                signal(flags + rank * C + idx, ep, rank, p, heap_bases)
    if WAIT:
        for i in range(1, world):
            p = (rank + i) % world
            if peer < 0 or p == peer:
                wait(flags + p * C + idx, ep, rank, rank, heap_bases, cmp="ge")


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


def preamble(ctx, kind: str, output, A, B, chunks: int, comm_sms=None) -> dict:
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
        ws["stage"] = torch.empty(-(-M // w) if w > 2 else 0, N, dtype=dt, device=dev)
    elif kind == "mag":  # the output (a heap tensor) is the buffer: its views are taken at each call
        ws["rows"] = chunk_rows(A.shape[0], chunks)
        C = len(ws["rows"])
    else:
        C = 1
        ws["buf"] = ctx.empty(M, K, dtype=dt)
    ws["C"] = C
    if "buf" in ws:
        ws["views"] = [ws["buf"] if p == ctx.rank else ctx.peer_view(ws["buf"], p) for p in range(w)]
    ws["flags"] = ctx.zeros(w * C, dtype=torch.int64)
    ws["ctl"] = ctx.zeros(1 + w, dtype=torch.int64)
    ws["start"] = Launcher(_start_kernel, (1,), num_warps=1)
    ws["chunk"] = Launcher(_chunk_kernel, (1,), num_warps=1)
    cuda = dev.type == "cuda"
    ws["tx"] = torch.cuda.Stream(dev) if cuda else None
    ws["rx"] = torch.cuda.Stream(dev) if cuda else None
    if ws["kind"] == "ar_ccl":
        ws["ccl"] = Config(comm_sms=comm_sms)
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


def _wait(e):
    if e is not None:
        torch.cuda.current_stream().wait_event(e)


def _all_reduce_ccl(ctx, ws, output, A, B, chunk, r, w, main):
    """Chunks of rows, each reduced by ctx.ccl.all_reduce on a few SMs beside cuBLAS's next chunk."""
    buf = ws["buf"]
    for a, b in ws["rows"]:
        torch.matmul(A[a:b], B, out=buf[a:b])
        with _on(ws["rx"], main):
            ctx.ccl.all_reduce(output[a:b], buf[a:b], config=ws["ccl"])


def _sum_owned(ws, A, B, dst, chunk, r, w, main, done=None):
    """The peers' blocks computed chunk by chunk into the heap buffer, each chunk flagged to its owner;
    then each chunk (a, b) of this rank's block summed into dst(a, b): the peers' partials by the copy
    engine (rx), in rank order from rank + 1, and this rank's by cuBLAS's epilogue (main); done(s, a, b)
    follows each chunk's sum on main."""
    buf, views, owned, S, tx, rx = ws["buf"], ws["views"], ws["owned"], ws["S"], ws["tx"], ws["rx"]
    for s in range(S):  # the peers' chunks first, in the order their owners sum them
        for i in range(1, w):
            o = (r + i) % w
            if s < len(owned[o]):
                a, b = owned[o][s]
                torch.matmul(A[a:b], B, out=buf[a:b])
                with _on(tx, main):
                    chunk(o * S + s, o, True, False)
    for s, (a, b) in enumerate(owned[r]):
        d = dst(a, b)
        with _on(rx):
            chunk(r * S + s, -1, False, True)
            for i in range(1, w):
                src = views[(r + i) % w][a:b]
                if i == 1:
                    d.copy_(src)
                else:
                    ws["stage"][:b - a].copy_(src)
                    d.add_(ws["stage"][:b - a])
            e = _event(rx)
        _wait(e)
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
        for s in range(S):
            for i in range(1, w):
                p = (r + i) % w
                if s < len(owned[p]):
                    a, b = owned[p][s]
                    chunk(w * S + s, p, False, True)
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
            chunk(0, p, False, True)
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
        with _on(tx, main):
            for i in range(1, w):
                p = (r + i) % w
                views[p][r * m + a:r * m + b].copy_(o)
                chunk(s, p, True, False)
    with _on(rx):
        for s in range(len(ws["rows"])):
            chunk(s, -1, False, True)


_SEQUENCES = {"ar": _all_reduce, "ar_ccl": _all_reduce_ccl, "rs": _reduce_scatter, "ag": _all_gather_matmul,
              "mag": _matmul_all_gather}


def _sequence(ctx, output, A, B, ws, bias=None) -> None:
    r, w, hb = ctx.rank, ctx.world, ctx.get_heap_bases()
    ctl, flags, C = ws["ctl"], ws["flags"], ws["C"]
    main = torch.cuda.current_stream() if ws["tx"] is not None else None

    def chunk(idx, peer, sig, wt):
        ws["chunk"](flags, ctl, hb, r, w, C, idx, peer, sig, wt)

    # both side streams join main here, behind the start kernel (a capture must see every stream it joins back)
    if ws["kind"] == "mag":  # only the copies into the peers wait for it: the GEMM starts at once
        with _on(ws["tx"], main):
            ws["start"](ctl, hb, r, w)
        if main is not None:
            ws["rx"].wait_stream(ws["tx"])
    else:
        ws["start"](ctl, hb, r, w)
        if main is not None:
            ws["rx"].wait_stream(main)
            ws["tx"].wait_stream(main)
    _SEQUENCES[ws["kind"]](ctx, ws, output, A, B, chunk, r, w, main, *(() if bias is None else (bias,)))
    if main is not None:
        main.wait_stream(ws["tx"])
        main.wait_stream(ws["rx"])


def run(ctx, output, A, B, ws, bias=None) -> torch.Tensor:
    """The sequence on the current stream, replayed from a graph once the same tensors come back
    (replayed). No host synchronization, except once when capturing."""
    if output.numel():
        replayed(ws, (A, B, output, bias), lambda: _sequence(ctx, output, A, B, ws, bias))
    return output


def replayed(ws, tensors, sequence) -> None:
    """sequence() on the current stream; an eager call with the tensors of the last CAPTURE_AFTER calls
    (addresses and strides; None entries skipped) replays a CUDA graph of it, so that its launches cost
    one. Under the caller's own capture, on the host or the interpreter, it runs as it is; where capture
    fails, it runs as it is from then on and ws["no_graph"] says why."""
    if interpreted() or torch.cuda.is_current_stream_capturing() or "no_graph" in ws \
            or tensors[0].device.type != "cuda":
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
