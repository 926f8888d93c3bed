"""The streamed variants: torch.matmul (cuBLAS) computes the GEMM in chunks of rows on the caller's
stream while side streams move finished chunks between ranks with the copy engines (copies from the
peers' heap views), ordered by per-chunk flags on the heap.

The persistent kernels pay for communication with SM time: each program pushes its tile after
computing it, which slows the GEMM itself (benchmarks/gemm_comm.py; docs/performance.md). Here no SM
moves data; SMs only add the partials of an all-reduce chunk while cuBLAS works on the next chunk.
Eager calls replay a CUDA graph of the whole sequence once the same tensors come back (dozens of
launches then cost one); under the caller's own capture the sequence is captured as it is.

Flags: ctl[0] counts calls; a call opens with _start_kernel (tells the peers that this rank finished
reading their buffers in the previous call, waits for the same from them, advances ctl[0]);
flags[p * C + c] on rank r reaching ctl[0] means: rank p's chunk c, for r, lies in p's heap buffer.
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
    step = -(-rows // max(1, min(chunks, rows)))
    if step > align:
        step = -(-step // align) * align
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


def preamble(ctx, kind: str, output, A, B, chunks: int, comm_sms=None) -> dict:
    """Heap buffer, flags and side streams of one op ("ar", "rs" or "ag") at these shapes; for "ar"
    with comm_sms, each chunk is reduced by ctx.ccl.all_reduce on that many programs instead of the
    copy engine and an add. Collective: all ranks, same order, same sizes."""
    w, dev, dt = ctx.world, A.device, A.dtype
    M, N, K = (w * A.shape[0] if kind == "ag" else A.shape[0]), B.shape[1], A.shape[1]
    ws = {"kind": kind}
    if kind == "ar":
        ws["rows"] = chunk_rows(M, chunks)
        C = len(ws["rows"])
        ws["buf"] = ctx.empty(M, N, dtype=dt)
        ws["stage"] = torch.empty(w if w > 2 else 0, M, N, dtype=dt, device=dev)
    elif kind == "rs":
        ws["rows"] = chunk_rows(M // w, chunks)
        C = w * len(ws["rows"])
        ws["buf"] = ctx.empty(M, N, dtype=dt)
        ws["stage"] = torch.empty(M // w if w > 2 else 0, N, dtype=dt, device=dev)
    else:
        C = 1
        ws["buf"] = ctx.empty(M, K, dtype=dt)
    ws["C"] = C
    ws["views"] = [ws["buf"] if p == ctx.rank else ctx.peer_view(ws["buf"], p) for p in range(w)]
    ws["flags"] = ctx.zeros(w * C, dtype=torch.int64)
    ws["ctl"] = ctx.zeros(1 + w, dtype=torch.int64)
    ws["start"] = Launcher(_start_kernel, (1,), num_warps=1)
    ws["chunk"] = Launcher(_chunk_kernel, (1,), num_warps=1)
    cuda = dev.type == "cuda"
    ws["tx"] = torch.cuda.Stream(dev) if cuda else None
    ws["rx"] = torch.cuda.Stream(dev) if cuda else None
    if kind == "ar" and comm_sms:
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


def _all_reduce(ctx, ws, output, A, B, chunk, r, w, main):
    buf, views, rx = ws["buf"], ws["views"], ws["rx"]
    for i, (a, b) in enumerate(ws["rows"]):
        torch.matmul(A[a:b], B, out=buf[a:b])
        with _on(rx, main):
            if "ccl" in ws:  # iris's all_reduce, on a few SMs beside cuBLAS's next chunk
                ctx.ccl.all_reduce(output[a:b], buf[a:b], config=ws["ccl"])
                continue
            chunk(i, -1, True, True)
            o = output[a:b]
            if w == 2:  # the copy engine straight into the output, then one add
                o.copy_(views[1 - r][a:b])
                o.add_(buf[a:b])  # an fp32 sum of two values: the same bits in either order
                continue
            for p in range(w):  # in rank order, so that every rank gets the same bits
                part = buf[a:b]
                if p != r:
                    part = ws["stage"][p, a:b]
                    part.copy_(views[p][a:b])
                if p == 0:
                    o.copy_(part)
                else:
                    o.add_(part)


def _reduce_scatter(ctx, ws, output, A, B, chunk, r, w, main):
    buf, views, rows, tx, rx = ws["buf"], ws["views"], ws["rows"], ws["tx"], ws["rx"]
    m = A.shape[0] // w
    for s, (a, b) in enumerate(rows):  # the peers' rows first, in the order they will need them
        for i in range(1, w):
            o = (r + i) % w
            torch.matmul(A[o * m + a:o * m + b], B, out=buf[o * m + a:o * m + b])
            with _on(tx, main):
                chunk(o * len(rows) + s, o, True, False)
    for s, (a, b) in enumerate(rows):
        with _on(rx):
            chunk(r * len(rows) + s, -1, False, True)
            for i in range(1, w):  # the peers' partials of these rows, summed into the output
                src = views[(r + i) % w][r * m + a:r * m + b]
                if i == 1:
                    output[a:b].copy_(src)
                else:
                    ws["stage"][a:b].copy_(src)
                    output[a:b].add_(ws["stage"][a:b])
            e = _event(rx)
        _wait(e)
        output[a:b].addmm_(A[r * m + a:r * m + b], B)  # plus this rank's partial, in cuBLAS's epilogue


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


_SEQUENCES = {"ar": _all_reduce, "rs": _reduce_scatter, "ag": _all_gather_matmul}


def _sequence(ctx, output, A, B, ws) -> None:
    r, w, hb = ctx.rank, ctx.world, ctx.get_heap_bases()
    ctl, flags, C = ws["ctl"], ws["flags"], ws["C"]
    main = torch.cuda.current_stream() if ws["tx"] is not None else None

    def chunk(idx, peer, sig, wt):
        ws["chunk"](flags, ctl, hb, r, w, C, idx, peer, sig, wt)

    ws["start"](ctl, hb, r, w)
    if main is not None:  # both side streams join here (a capture must see every stream it joins back)
        ws["tx"].wait_stream(main)
        ws["rx"].wait_stream(main)
    _SEQUENCES[ws["kind"]](ctx, ws, output, A, B, chunk, r, w, main)
    if main is not None:
        main.wait_stream(ws["tx"])
        main.wait_stream(ws["rx"])


def run(ctx, output, A, B, ws) -> torch.Tensor:
    """The sequence on the current stream; an eager call with the tensors of the last CAPTURE_AFTER
    calls replays a graph of it. No host synchronization, except once when capturing."""
    if output.numel() == 0:
        return output
    if ws["tx"] is None or interpreted() or torch.cuda.is_current_stream_capturing() or "no_graph" in ws:
        _sequence(ctx, output, A, B, ws)
        return output
    key = tuple((t.data_ptr(), t.stride()) for t in (A, B, output))
    g = ws.get("graph")
    if g is not None and g[0] == key:
        g[1].replay()
        return output
    seen = ws.get("seen")
    n = seen[1] + 1 if seen is not None and seen[0] == key else 1
    if n <= CAPTURE_AFTER:
        ws["seen"] = (key, n)
        _sequence(ctx, output, A, B, ws)
        return output
    ws.pop("seen", None)
    ws.pop("graph", None)
    graph = torch.cuda.CUDAGraph()
    main = torch.cuda.current_stream()
    s = torch.cuda.Stream(A.device)
    s.wait_stream(main)
    try:
        with torch.cuda.graph(graph, stream=s, capture_error_mode="thread_local"):
            _sequence(ctx, output, A, B, ws)
    except Exception as e:  # noqa: BLE001 - nothing captured ran: launch directly from now on, and say why
        ws["no_graph"] = f"{type(e).__name__}: {e}"
        _sequence(ctx, output, A, B, ws)
        return output
    main.wait_stream(s)
    graph.replay()
    ws["graph"] = (key, graph, (A, B, output))  # keeps the captured tensors alive
    return output
