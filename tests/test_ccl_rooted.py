"""ctx.ccl's rooted collectives (broadcast in Iris's form, reduce, scatter, gather), point to point (send,
recv, sendrecv) and barrier, against torch references: real ranks on the host driver (kernels in the
interpreter) and on GPUs, over the whole job and subset groups, roots at every position. Outputs are
poisoned and checked element by element (a root's peers' outputs must stay poisoned), inputs checked
unchanged; each call's heap input is overwritten by the next call, so a missing "done" signal shows."""
import gc
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import iris
from iris.ccl import CollectiveError, Config, ConfigError, ReduceOp
from iris.ccl.p2p import P2POp, irecv, isend
from test_ccl import POISON, _data, _poisoned, _progress, _reduce, _same, wrong_errors
from test_ccl_groups import OPS, Slots, _dist

ROOT = Path(__file__).resolve().parents[1]


def check_rooted(ctx, heap, group, ranks, dtype, cfg, rep, shapes=((37,), (5, 7))):
    """reduce (out of place, then Iris's in-place form), scatter (then in place), gather and broadcast
    over group (ranks: its global ranks in order), rooted at position rep % len(ranks); returns failures."""
    r, dev, g, ccl = ctx.rank, ctx.device, len(ranks), ctx.ccl
    me, (n,), (m, ncol) = ranks.index(r), shapes[0], shapes[1]
    root, op, bad = rep % g, OPS[rep % 3], []
    tag = (tuple(ranks), str(dtype), root)

    def expect(name, got, want):
        if not _same(got, want):
            bad.append((name,) + tag)

    xs = [_data((n,), dtype, q, rep, dev) for q in ranks]
    x, out = heap((n,), dtype).copy_(xs[me]), _poisoned((n,), dtype, dev)
    ccl.reduce(out, x, dst=root, op=op, group=group, config=cfg)
    expect(f"reduce {op.value}", out, _reduce(xs, op) if me == root else _poisoned((n,), dtype, dev))
    expect("reduce's inp", x, xs[me])
    ccl.reduce(x, dst=root, op=op, group=group, config=cfg)
    expect("reduce in place", x, _reduce(xs, op) if me == root else xs[me])

    xs = [_data((g * m, ncol), dtype, q, rep + 1, dev) for q in ranks]
    x, out = heap((g * m, ncol), dtype).copy_(xs[me]), _poisoned((m, ncol), dtype, dev)
    ccl.scatter(out, x, src=root, group=group, config=cfg)
    expect("scatter", out, xs[root][me * m:(me + 1) * m])
    expect("scatter's inp", x, xs[me])
    ccl.scatter(x[me * m:(me + 1) * m], x, src=root, group=group, config=cfg)
    want = xs[me].clone()
    want[me * m:(me + 1) * m] = xs[root][me * m:(me + 1) * m]
    expect("scatter in place", x, want)

    xs = [_data((m, ncol), dtype, q, rep + 2, dev) for q in ranks]
    x, out = heap((m, ncol), dtype).copy_(xs[me]), _poisoned((g * m, ncol), dtype, dev)
    ccl.gather(out, x, dst=root, group=group, config=cfg)
    expect("gather", out, torch.cat(xs) if me == root else _poisoned((g * m, ncol), dtype, dev))
    expect("gather's inp", x, xs[me])

    xs = [_data((m, ncol), dtype, q, rep + 3, dev) for q in ranks]
    x = heap((m, ncol), dtype).copy_(xs[me])
    ccl.broadcast(x, src=root, group=group, config=cfg)
    expect("broadcast (Iris's form)", x, xs[root])
    return bad


def check_p2p(ctx, heap, group, ranks, dtype, cfg, rep, shapes=((37,), (5, 7))):
    """sendrecv around the group's ring both ways (a rank alone sends to itself), then send/recv between
    positions 2k and 2k+1 (the last of an odd group idles); returns failures."""
    r, dev, g, ccl = ctx.rank, ctx.device, len(ranks), ctx.ccl
    me, (n,), (m, ncol) = ranks.index(r), shapes[0], shapes[1]
    tag, bad = (tuple(ranks), str(dtype)), []
    for step in (1, -1):
        xs = [_data((n,), dtype, q, rep + 4 + step, dev) for q in ranks]
        send, recv = xs[me].clone(), heap((n,), dtype).fill_(POISON)
        ccl.sendrecv(send, recv, dst=(me + step) % g, src=(me - step) % g, group=group, config=cfg)
        if not (_same(recv, xs[(me - step) % g]) and _same(send, xs[me])):
            bad.append(("sendrecv", step) + tag)
    xs = [_data((m, ncol), dtype, q, rep + 6, dev) for q in ranks]
    t = heap((m, ncol), dtype)
    if me % 2 == 0 and me + 1 < g:
        t.copy_(xs[me])
        ccl.send(t, dst=me + 1, group=group, config=cfg)
        if not _same(t, xs[me]):
            bad.append(("send's tensor",) + tag)
    elif me % 2 == 1:
        t.fill_(POISON)
        ccl.recv(t, src=me - 1, group=group, config=cfg)
        if not _same(t, xs[me - 1]):
            bad.append(("recv",) + tag)
    ccl.barrier(group=group)
    return bad


def check_errors(ctx, heap, outside):
    """Bad calls raise before anything is launched or allocated: the heap and the plans stay as they were.
    outside: a group that does not hold this rank."""
    dev, w, ccl = ctx.device, ctx.world, ctx.ccl
    live, plans = set(ctx.heap.alloc.offsets.live), len(ccl.plans)
    h, plain = heap((10,), torch.float32), torch.ones(10, device=dev)
    h2 = heap((2 * w, 3), torch.float32)
    nxt = (ctx.rank + 1) % w
    cases = [
        (lambda: ccl.reduce(plain.clone(), plain), CollectiveError, "heap tensor"),
        (lambda: ccl.reduce(torch.ones(11, device=dev), h), CollectiveError, "must match"),
        (lambda: ccl.reduce(plain, h, dst=w), CollectiveError, "position"),
        (lambda: ccl.reduce(plain, h, dst=True), CollectiveError, "position"),
        (lambda: ccl.reduce(plain, h, op="prod"), CollectiveError, "op must be"),
        (lambda: ccl.reduce(h[1:], h[:9]), CollectiveError, "in place"),
        (lambda: ccl.reduce(plain, h, group=outside), CollectiveError, "not in group"),
        (lambda: ccl.reduce(torch.ones(10, dtype=torch.float64, device=dev), h), CollectiveError, "not supported"),
        (lambda: ccl.reduce(torch.ones(10, dtype=torch.int32, device=dev), h), CollectiveError, "must match"),
        (lambda: ccl.scatter(torch.ones(3, 3, device=dev), h2), CollectiveError, "stacked"),
        (lambda: ccl.scatter(torch.ones(2, 3, device=dev), h2, src=-1), CollectiveError, "position"),
        (lambda: ccl.scatter(h2[:2], h2) if ctx.rank else ccl.scatter(h2[2:4], h2), CollectiveError, "chunk"),
        (lambda: ccl.gather(torch.ones(2 * w + 1, 3, device=dev), h2[:2]), CollectiveError, "stacked"),
        (lambda: ccl.gather(h2, h2[:2]), CollectiveError, "separate heap inp"),
        (lambda: ccl.gather([1.0], h), TypeError, "torch.Tensor"),
        (lambda: ccl.broadcast(h, src=w), CollectiveError, "position"),
        (lambda: ccl.broadcast(h, 1, src=1), CollectiveError, "twice"),
        (lambda: ccl.send(h, dst=ctx.rank), CollectiveError, "itself"),
        (lambda: ccl.recv(plain, src=nxt), CollectiveError, "heap tensor"),
        (lambda: ccl.send(h, dst=w), CollectiveError, "position"),
        (lambda: ccl.sendrecv(plain, h, dst=ctx.rank, src=nxt), CollectiveError, "only then"),
        (lambda: ccl.sendrecv(torch.ones(9, device=dev), h, dst=nxt, src=nxt), CollectiveError, "same shape"),
        (lambda: ccl.sendrecv(h, h, dst=nxt, src=nxt), CollectiveError, "overlaps"),
        (lambda: ccl.sendrecv(plain, plain.clone(), dst=nxt, src=nxt), CollectiveError, "heap tensor"),
        (lambda: ccl.barrier(group=outside), CollectiveError, "not in group"),
    ]
    bad = wrong_errors(cases)
    if set(ctx.heap.alloc.offsets.live) != live or len(ccl.plans) != plans:
        bad.append("the heap or the plans changed")
    return bad


def check_barrier_waits(ctx, group, ranks):
    """The first rank of ranks arrives late; the others' barrier must not return before it arrived."""
    if ctx.rank not in ranks:
        return []
    ctx.ccl.barrier(group=group)  # all start the clock together (a barrier that did not wait fails below)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    if ctx.rank == ranks[0]:
        time.sleep(1.0)
    start = time.monotonic()
    ctx.ccl.barrier(group=group)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    waited = time.monotonic() - start
    return [] if ctx.rank == ranks[0] or waited > 0.8 else [("barrier returned early", tuple(ranks), waited)]


def groups_of(ctx, dist):
    """(group, its ranks in order, slot): the whole job (None), every rank in reverse order, and on 4 ranks
    A = [0, 2] (a torch group), B = [1, 2, 3] (a list), C = (3, 1) (a tuple, sharing the pair (1, 3) with
    B) and this rank alone. Each rank runs its groups in this order, so rank 2 alternates A and B and
    ranks 1 and 3 alternate B and C while rank 0 works with A only."""
    r, w = ctx.rank, ctx.world
    out = [(None, list(range(w)), 0), (list(range(w))[::-1], list(range(w))[::-1], 1)]
    if w == 4:
        a = dist.new_group([0, 2])
        out += [(a, [0, 2], 2), ([1, 2, 3], [1, 2, 3], 3), ((3, 1), [3, 1], 4), ([r], [r], 5)]
    return out


def run_all(ctx, dist, dtypes, reps, cfg, shapes=((37,), (5, 7)), groups=None):
    """Every check over every group of groups_of (or the first `groups` of them), then a late rank at
    the barrier of the whole job, of every rank reversed and (on 4 ranks) of A. Groups of every rank run
    all reps; a smaller group runs as many as put its root at each of its positions and cover the
    dtypes (more would repeat its roots: what turns with them beyond that, the dtype and the reduction,
    is the whole job's to cover)."""
    r, w = ctx.rank, ctx.world
    nbytes = 8 * w * max(shapes[0][0], shapes[1][0] * shapes[1][1])
    slots = Slots(ctx, 6, nbytes)
    groups = groups_of(ctx, dist)[:groups]
    bad = check_errors(ctx, lambda s, d: slots(0, s, d), [q for q in range(w) if q != r])
    for rep in range(reps):  # rep turns the root (a position) and the reduction
        dtype = dtypes[rep % len(dtypes)]
        for group, ranks, slot in groups:
            if r in ranks and (len(ranks) == w or rep < max(len(ranks), len(dtypes))):
                heap = lambda s, d, slot=slot: slots(slot, s, d)  # noqa: E731
                bad += check_rooted(ctx, heap, group, ranks, dtype, cfg, rep, shapes)
                bad += check_p2p(ctx, heap, group, ranks, dtype, cfg, rep, shapes)
    for group, ranks, _ in groups[:3]:
        bad += check_barrier_waits(ctx, group, ranks)
    return bad


def check_mailbox(ctx, cfg, rep, dtype=torch.float32, cap=64):
    """send/recv(p2p_state=) of plain tensors through a mailbox (init_p2p), as Iris's tests/ccl/test_p2p
    uses it: pairs 2k -> 2k+1 (three messages in a row, into a poisoned and a transposed tensor), a
    ring and all pairs by batch_isend_irecv, and bad tensors refused before anything is launched."""
    r, w, dev, ccl = ctx.rank, ctx.world, ctx.device, ctx.ccl
    box, bad = ccl.init_p2p(max_numel=cap, dtype=dtype), []
    for k, shape in enumerate(((1,), (5, 7), (cap,))):
        x = _data(shape, dtype, r ^ 1, rep + k, dev)
        if r % 2 == 0 and r + 1 < w:
            ccl.send(_data(shape, dtype, r, rep + k, dev), dst=r + 1, p2p_state=box, config=cfg)
        elif r % 2 == 1:
            got = torch.full(shape[::-1], POISON, dtype=dtype, device=dev).t()  # not contiguous
            ccl.recv(got, src=r - 1, p2p_state=box, config=cfg)
            if not _same(got, x):
                bad.append(("mailbox pair", shape))
    for ops in ([(isend, (r + 1) % w), (irecv, (r - 1) % w)], [(f, q) for f in (isend, irecv) for q in range(w)
                                                                 if q != r]):
        sent = {q: _data((11,), dtype, 100 * r + q, rep, dev) for q in range(w)}
        got = {q: torch.full((11,), POISON, dtype=dtype, device=dev) for q in range(w)}
        works = ccl.batch_isend_irecv([P2POp(f, sent[q] if f is isend else got[q], q) for f, q in ops], box)
        for work in works:
            work.wait()
        for f, q in ops:
            if f is irecv and not _same(got[q], _data((11,), dtype, 100 * q + r, rep, dev)):
                bad.append(("mailbox batch", len(ops), q))
    plain = torch.ones(10, device=dev)
    fits = torch.ones(10, dtype=dtype, device=dev)  # the box's dtype and within its size: only the config is wrong
    bad += wrong_errors([
        (lambda: ccl.send(plain.int(), dst=(r + 1) % w, p2p_state=box), CollectiveError, "mailbox holds up to"),
        (lambda: ccl.recv(torch.ones(cap + 1, device=dev), src=(r + 1) % w, p2p_state=box), CollectiveError,
         "init_p2p(max_numel"),
        (lambda: ccl.send(torch.ones(4, 3, dtype=dtype, device=dev).t(), dst=(r + 1) % w, p2p_state=box), CollectiveError,
         "contiguous"),
        (lambda: ccl.batch_isend_irecv([P2POp(print, plain, 0)], box), CollectiveError, "isend, irecv"),
        (lambda: ccl.init_p2p(max_numel=0), CollectiveError, "max_numel must be"),
        (lambda: ccl.init_p2p(max_numel=8, config="fast"), ConfigError, "must be an iris.ccl.Config"),
        (lambda: ccl.send(fits, dst=(r + 1) % w, p2p_state=box, config={"block_size": 16}), ConfigError,
         "must be an iris.ccl.Config"),
        (lambda: ccl.all_reduce(plain, plain, config="fast"), ConfigError, "must be an iris.ccl.Config"),
    ])
    return bad


def check_mailbox_split(ctx, dtype=torch.float32, cap=64, block=16):
    """Two messages in a row to a peer that has taken neither, with configs that split them differently
    (one program, then four): each arrives whole, and every launch splits a slot as the mailbox does.
    Were program p of a message to own another part of the slot than program p of the one before, a
    program whose own previous part was free would overwrite the earlier message unread: on a GPU,
    where programs run at once (under the interpreter they run in order, and only the split is seen)."""
    r, w, dev, ccl, bad = ctx.rank, ctx.world, ctx.device, ctx.ccl, []
    box = ccl.init_p2p(max_numel=cap, dtype=dtype, config=Config(block_size=block, comm_sms=4))
    configs = (Config(block_size=block, comm_sms=1), Config(block_size=block, comm_sms=4))
    if r % 2 == 0 and r + 1 < w:
        for k, cfg in enumerate(configs):
            ccl.send(_data((cap,), dtype, r, k, dev), dst=r + 1, p2p_state=box, config=cfg)
    elif r % 2 == 1:
        for k, cfg in enumerate(configs):
            got = torch.full((cap,), POISON, dtype=dtype, device=dev)
            ccl.recv(got, src=r - 1, p2p_state=box, config=cfg)
            if not _same(got, _data((cap,), dtype, r - 1, k, dev)):
                bad.append(("mailbox message overwritten by the next", k))
    for plan in box.plans.values():
        per = plan.args[plan.fn.arg_names.index("per")]
        if per != getattr(box, "per", None) or plan.grid != (-(-cap // per),):
            bad.append(("mailbox launch splits a slot its own way", plan.grid, per))
    return bad


def check_mailbox_released(ctx):
    """A mailbox every rank dropped goes back to the heap at the next collective point: the launches of
    its transfers, which iris keeps for the next call, do not keep it alive."""
    r, w = ctx.rank, ctx.world
    box = ctx.ccl.init_p2p(max_numel=4096, dtype=torch.float32)
    x = torch.arange(8, dtype=torch.float32, device=ctx.device) + r
    if r % 2 == 0 and r + 1 < w:
        ctx.ccl.send(x, dst=r + 1, p2p_state=box)
    elif r % 2 == 1:
        ctx.ccl.recv(x, src=r - 1, p2p_state=box)
    del box
    gc.collect()
    released = ctx.collect()
    return [] if released >= w * 4096 * 4 else [("mailbox kept after every rank dropped it", released)]


def _rooted_reduces(ctx):
    return {k for k in ctx.ccl.plans if isinstance(k, tuple) and k[:2] == ("rooted", "reduce")}


def _store_reduces(ctx):
    return {k for k, p in ctx.ccl.plans.items() if isinstance(k, tuple) and k[0] == "reduce"}


def check_store_reduce(ctx, cfg, dtypes, n0):
    """The whole-job reduce by stores over 3+ ranks (GPUs take it from STORE_REDUCE bytes; over 2 ranks the
    rooted kernel runs, at every size) at every size here, n0 and a few elements more: every root, every
    reduction, into a plain out and a heap out and in place, back to back over both copies of its stage;
    only the root's out changes, inp never does (but in place). On a GPU also a CUDA graph of two of them
    replayed with new data. Last, a rank that gives up waiting."""
    from iris.ccl import rooted
    keep, rooted.STORE_REDUCE = rooted.STORE_REDUCE, 0
    r, w, dev, bad, seen = ctx.rank, ctx.world, ctx.device, [], set()
    ctx.ccl.free()
    try:
        for rep in range(2 * w):
            root, op, dtype = rep % w, OPS[rep % 3], dtypes[rep % len(dtypes)]
            n = n0 + rep * w + rep % 2  # a part that is not a whole number of blocks in some reps
            xs = [_data((n,), dtype, q, rep, dev) for q in range(w)]
            want = _reduce(xs, op)
            x = ctx.empty((n,), dtype=dtype).copy_(xs[r])
            for where, out in (("plain", _poisoned((n,), dtype, dev)),
                               ("heap", ctx.empty((n,), dtype=dtype).fill_(POISON))):
                ctx.ccl.reduce(out, x, dst=root, op=op, config=cfg)
                if not _same(out, want if r == root else _poisoned((n,), dtype, dev)):
                    bad.append(("reduce by stores", where, root, op.value, str(dtype)))
                if not _same(x, xs[r]):
                    bad.append(("reduce by stores changed inp", root))
            ctx.ccl.reduce(x, dst=root, op=op, config=cfg)
            if not _same(x, want if r == root else xs[r]):
                bad.append(("reduce by stores in place", root, op.value, str(dtype)))
            seen |= {k[6] for k in _store_reduces(ctx)}
            if w > 2 and _rooted_reduces(ctx):
                bad.append(("a rooted reduce plan was built beside the one by stores", rep))
            ctx.ccl.free()  # a stage a shape: each rep's go back
        if seen != ({False, True} if w > 2 else set()):
            bad.append(("the reduce by stores ran into the outs", seen))
        if dev.type == "cuda":
            bad += _store_reduce_graph(ctx, n0, cfg)
        if w == 2:
            return bad
        # a rank that never makes the call: rank 0's waits give up and its next barrier says so
        spin = Config(block_size=16, comm_sms=1, spin_limit=20)
        x, out = ctx.full((4 * w,), 1.0), _poisoned((4 * w,), torch.float32, dev)
        ctx.ccl.reduce_preamble(out, x, dst=0, config=spin)
        if r == 0:
            ctx.ccl.reduce(out, x, dst=0, config=spin)
        try:
            ctx.barrier()
            raised = ""
        except iris.WaitTimeout as e:
            raised = str(e)
        want = ("rank 0: ctx.ccl.reduce (pipelined) gave up waiting for rank 1: flag row 0 (program 0, "
                "wait 1 of the call) never reached epoch 1") if r == 0 else ""
        if not raised.startswith(want) or (want == "") != (raised == ""):
            bad.append(f"reduce by stores' WaitTimeout: {raised!r}")
        ctx.barrier()
        ctx.ccl.free()
    finally:
        rooted.STORE_REDUCE = keep
    return bad


def check_store_reduce_no_room(ctx):
    """A whole-job reduce whose stage does not fit in the heap runs a form that stages nothing instead,
    right, and leaves the heap as it was (the block freed for it is still there to take)."""
    from iris.ccl import rooted
    from iris.errors import HeapOutOfMemory
    r, w, dev, bad = ctx.rank, ctx.world, ctx.device, []
    if w == 2:
        return bad
    keep, rooted.STORE_REDUCE = rooted.STORE_REDUCE, 0
    ctx.ccl.free()
    n = 1 << 18  # 1 MiB of float32; the stage takes at least 2 MiB
    xs = [_data((n,), torch.float32, q, 7, dev) for q in range(w)]
    x, fill = ctx.empty((n,), dtype=torch.float32).copy_(xs[r]), []
    try:
        while True:
            fill.append(ctx.empty((n,), dtype=torch.float32))
    except HeapOutOfMemory:
        pass
    ctx.free(fill.pop())
    try:
        ctx.ccl.reduce(x, dst=w - 1)
        if not _same(x, _reduce(xs, ReduceOp.SUM) if r == w - 1 else xs[r]):
            bad.append("reduce with no room for its stage")
        if any(isinstance(k, tuple) and k[0] == "reduce" for k in ctx.ccl.plans):
            bad.append("a reduce by stores was planned with no room for its stage")
        fill.append(ctx.empty((n,), dtype=torch.float32))  # the block left free is still free
    except HeapOutOfMemory as e:
        bad.append(f"no room: {e}")
    finally:
        rooted.STORE_REDUCE = keep
        for t in fill:
            ctx.free(t)
        ctx.free(x)
        ctx.ccl.free()
    return bad


def _replays(ctx, x, out, calls, seed):
    """calls() run once, then captured in one CUDA graph and replayed 3 times, each after new data into x
    (rank q's: _data(seed + rep)) and POISON into out; yields (rep, every rank's data) after each replay."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    calls()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    for rep in range(3):
        xs = [_data(tuple(x.shape), x.dtype, q, seed + rep, dev) for q in range(w)]
        x.copy_(xs[r])
        out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        yield rep, xs


def _store_reduce_graph(ctx, n, cfg):
    """A reduce by stores into a plain out and one in place, to two roots, captured in one CUDA graph and
    replayed with new data."""
    r, w, dev, ccl, bad = ctx.rank, ctx.world, ctx.device, ctx.ccl, []
    x, out = ctx.empty((n,), dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16, device=dev)

    def calls():
        ccl.reduce(out, x, dst=w - 1, config=cfg)
        ccl.reduce(x, dst=0, config=cfg)

    for rep, xs in _replays(ctx, x, out, calls, 80):
        want = _reduce(xs, ReduceOp.SUM)
        if not _same(out, want if r == w - 1 else _poisoned((n,), x.dtype, dev)):
            bad.append(("reduce by stores replayed", rep))
        if not _same(x, want if r == 0 else xs[r]):
            bad.append(("reduce by stores in place replayed", rep))
    return bad


def check_spread(ctx, cfg, dtypes, n0, graph=False):
    """reduce and broadcast on heap tensors over 3+ members, the work spread over the members but the root
    (GPUs take it from SPREAD's bytes; on the host from 0): the whole job, every rank reversed and on 4
    ranks B = [1, 2, 3], every root, every reduction, out of place (a heap out) and in place, broadcast
    in both forms; only the root's out changes in a reduce, inp never (but in place); sizes n0 + a few
    elements, parts not a whole number of blocks. graph: also a reduce and a broadcast captured in a CUDA
    graph, replayed with new data. Returns failures."""
    from iris.ccl import rooted
    keep = rooted.SPREAD
    if ctx.device.type != "cuda":
        rooted.SPREAD = dict.fromkeys(keep, 0)
    r, w, dev, ccl, bad = ctx.rank, ctx.world, ctx.device, ctx.ccl, []
    every = list(range(w))
    groups = [(None, every), (every[::-1], every[::-1])] + [([1, 2, 3], [1, 2, 3])] * (w == 4)
    top = n0 + 16 * w
    bufs = [ctx.empty((top,), dtype=torch.float64) for _ in range(2)]  # the same offsets on every rank
    try:
        for rep in range(2 * w):
            dtype = dtypes[rep % len(dtypes)]
            n = n0 + 5 * rep + 1
            x, out = (b.view(dtype)[:n] for b in bufs)
            for group, ranks in groups:
                if r not in ranks:
                    continue
                g, me = len(ranks), ranks.index(r)
                root, op = rep % g, OPS[rep % 3]
                tag = (tuple(ranks), str(dtype), root, n)
                xs = [_data((n,), dtype, q, rep, dev) for q in ranks]
                x.copy_(xs[me])
                out.fill_(POISON)
                ccl.reduce(out, x, dst=root, op=op, group=group, config=cfg)
                if not _same(out, _reduce(xs, op) if me == root else _poisoned((n,), dtype, dev)):
                    bad.append(("spread reduce", op.value) + tag)
                if not _same(x, xs[me]):
                    bad.append(("spread reduce changed inp",) + tag)
                ccl.reduce(x, dst=root, op=op, group=group, config=cfg)
                if not _same(x, _reduce(xs, op) if me == root else xs[me]):
                    bad.append(("spread reduce in place", op.value) + tag)
                x.copy_(xs[me])
                out.fill_(POISON)
                ccl.broadcast(out, x, src=ranks[root], group=group, config=cfg)
                if not _same(out, xs[root]) or not _same(x, xs[me]):
                    bad.append(("spread broadcast",) + tag)
                ccl.broadcast(x, src=root, group=group, config=cfg)
                if not _same(x, xs[root]):
                    bad.append(("spread broadcast in place",) + tag)
        spread = [k for k, p in ccl.plans.items() if getattr(p, "variant", "") == "spread"]
        if w > 2 and {k[1] for k in spread} != {"reduce", "broadcast"}:
            bad.append(("reduce and broadcast did not both spread", spread))
        if w == 2 and spread:
            bad.append(("spread over 2 ranks", spread))
        if graph and w > 2:
            bad += _spread_graph(ctx, x, out, w)
    finally:
        rooted.SPREAD = keep
    return bad


def _spread_graph(ctx, x, out, w):
    """A spread reduce and broadcast of the whole job captured in one CUDA graph, replayed with new data."""
    r, dev, ccl, n, bad = ctx.rank, ctx.device, ctx.ccl, x.numel(), []
    root = w - 1

    def calls():
        ccl.reduce(out, x, dst=root)
        ccl.broadcast(x, src=1)

    for rep, xs in _replays(ctx, x, out, calls, 70):
        if not _same(out, _reduce(xs, ReduceOp.SUM) if r == root else _poisoned((n,), x.dtype, dev)):
            bad.append(("spread reduce replayed", rep))
        if not _same(x, xs[1]):
            bad.append(("spread broadcast replayed", rep))
    return bad


def check_repeats(ctx):
    """A call that repeats the previous one (ctx.ccl.recent) skips its checks and plan lookup, with new data
    each time; another root, op, Config or tensor, or a tensor whose storage moved, is checked as a first
    call: refused where wrong, right where not."""
    r, w, dev, ccl, bad = ctx.rank, ctx.world, ctx.device, ctx.ccl, []
    f32, n, m, cfg = torch.float32, 37, 5, Config(block_size=16, comm_sms=2)
    x, out, plain = ctx.empty((n,), dtype=f32), torch.empty(n, device=dev), torch.ones(n, device=dev)
    xg, outg = ctx.empty((m, 3), dtype=f32), torch.empty(w * m, 3, device=dev)
    xs_, outs = ctx.empty((w * m, 3), dtype=f32), torch.empty(m, 3, device=dev)
    bc = ctx.empty((m, 3), dtype=f32)

    def reduce(rep, dst=0, op=ReduceOp.SUM, config=cfg, inp=x):
        xs = [_data((n,), f32, q, rep, dev) for q in range(w)]
        inp.copy_(xs[r])
        out.fill_(POISON)
        ccl.reduce(out, inp, dst=dst, op=op, config=config)
        if not _same(out, _reduce(xs, op) if r == dst else _poisoned((n,), f32, dev)):
            bad.append(("reduce", rep, dst, op.value))

    def others(rep, root):
        xs = [_data((m, 3), f32, q, rep, dev) for q in range(w)]
        xg.copy_(xs[r])
        outg.fill_(POISON)
        ccl.gather(outg, xg, dst=root, config=cfg)
        if not _same(outg, torch.cat(xs) if r == root else _poisoned((w * m, 3), f32, dev)):
            bad.append(("gather", rep, root))
        xs = [_data((w * m, 3), f32, q, rep, dev) for q in range(w)]
        xs_.copy_(xs[r])
        outs.fill_(POISON)
        ccl.scatter(outs, xs_, src=root, config=cfg)
        if not _same(outs, xs[root][r * m:(r + 1) * m]):
            bad.append(("scatter", rep, root))
        for form in ("Iris", "torch"):
            xs = [_data((m, 3), f32, q, rep + 7, dev) for q in range(w)]
            bc.copy_(xs[r])
            ccl.broadcast(bc, src=root, config=cfg) if form == "Iris" else ccl.broadcast(bc, bc, src=root)
            if not _same(bc, xs[root]):
                bad.append(("broadcast", form, rep, root))

    for rep in range(3):
        reduce(rep)
        others(rep, w - 1)
        if rep and any(ccl.recent[k] is not seen[k] for k in seen):  # the same calls again: the memos stay
            bad.append(("a repeated call checked again", rep))
        seen = {k: ccl.recent[k] for k in ("reduce", "gather", "scatter")}  # broadcast's two forms take turns
    was = ccl.recent["broadcast"]
    ccl.broadcast(bc, bc, src=w - 1)
    if ccl.recent["broadcast"] is not was:
        bad.append("a repeated broadcast checked again")
    xs = [_data((m, 3), f32, q, 3, dev) for q in range(w)]
    bc.copy_(xs[r])
    ccl.broadcast(bc, bc, src=0)  # another root
    if not _same(bc, xs[0]):
        bad.append(("broadcast", "torch", "another root"))
    others(3, 0)  # another root
    reduce(4, dst=1)
    reduce(5, dst=1, op=ReduceOp.MAX)
    was = ccl.recent["reduce"]
    cfg.block_size = 32
    reduce(6, dst=1, op=ReduceOp.MAX)
    if ccl.recent["reduce"] is was:
        bad.append("a changed Config was not checked")
    x2 = ctx.empty((n,), dtype=f32)
    reduce(7, dst=1, op=ReduceOp.MAX, inp=x2)
    reduce(8, dst=1, op=ReduceOp.MAX)
    cases = [
        (lambda: ccl.reduce(out, x, dst=w, op=ReduceOp.MAX, config=cfg), CollectiveError, "position"),
        (lambda: ccl.reduce(out, x, dst=True, op=ReduceOp.MAX, config=cfg), CollectiveError, "position"),
        (lambda: ccl.reduce(out, x, dst=1, op="prod", config=cfg), CollectiveError, "op must be"),
        (lambda: ccl.reduce(out, x, dst=1, op=ReduceOp.MAX, config="fast"), ConfigError, "must be an iris.ccl.Config"),
        (lambda: ccl.reduce(out, plain, dst=1, op=ReduceOp.MAX, config=cfg), CollectiveError, "heap tensor"),
        (lambda: ccl.reduce(out, x, dst=1, op=ReduceOp.MAX, config=cfg, group=[(r + 1) % w]), CollectiveError,
         "not in group"),
        (lambda: ccl.gather(outg, xg, dst=w, config=cfg), CollectiveError, "position"),
        (lambda: ccl.scatter(outs, xs_, src=-1, config=cfg), CollectiveError, "position"),
        (lambda: ccl.broadcast(bc, src=w, config=cfg), CollectiveError, "position"),
        (lambda: ccl.broadcast(bc, bc, src=w), CollectiveError, "src must be a rank"),
    ]
    bad += wrong_errors(cases)
    cfg.block_size = 3
    bad += wrong_errors([(lambda: ccl.reduce(out, x, dst=1, op=ReduceOp.MAX, config=cfg), ConfigError,
                          "power of two")])
    cfg.block_size = 16
    reduce(9, dst=1, op=ReduceOp.MAX)  # every refused call left the right one as it was
    x.set_(plain.clone())  # the same tensor object, its storage moved off the heap
    bad += wrong_errors([(lambda: ccl.reduce(out, x, dst=1, op=ReduceOp.MAX, config=cfg), CollectiveError,
                          "heap tensor")])
    bc.set_(torch.empty(m, 3, device=dev))  # broadcast stages a tensor off the heap: right results still
    others(10, 0)
    sq, sq_out = ctx.full((4, 4), 1.0), torch.empty(4, 4, device=dev)
    for _ in range(2):
        ccl.reduce(sq_out, sq, dst=0)
    sq_out.t_()  # the same object and shape, restrided in place
    bad += wrong_errors([(lambda: ccl.reduce(sq_out, sq, dst=0), CollectiveError, "contiguous")])
    return bad


def rank_host(world, dtypes, reps):
    ctx = iris.iris(heap_size=1 << 24)
    dist = _dist(ctx)
    bad = run_all(ctx, dist, dtypes, reps, Config(block_size=16, comm_sms=2))  # 2 programs, partial blocks
    bad += check_spread(ctx, Config(block_size=16, comm_sms=2), dtypes, 3 * 16 * world)
    bad += check_store_reduce_no_room(ctx)
    bad += check_store_reduce(ctx, Config(block_size=16, comm_sms=2), dtypes, 3 * 16 * world)  # a rank gives up
    bad += check_mailbox(ctx, Config(block_size=16, comm_sms=2), 0)
    bad += check_mailbox_split(ctx)
    bad += check_mailbox_released(ctx)
    dist.destroy_process_group()
    ctx.close()
    return bad


@pytest.mark.parametrize("world", [2, 4])
def test_rooted_and_p2p_host(world):
    """2 ranks: 3 reps turn dtype and reduction together, so each dtype, each reduction and both roots
    run (more reps would repeat a dtype's reduction at the other root: 4 ranks turn them apart)."""
    dtypes = [torch.float32, torch.bfloat16, torch.int32] if world == 2 else [torch.float32, torch.int64]
    out = iris.spawn(rank_host, world, args=(world, dtypes, 3 if world == 2 else 4))
    for r, bad in enumerate(out):
        assert not bad, f"rank {r} of {world}: {bad[:10]}"


def rank_repeats():
    ctx = iris.iris(heap_size=1 << 22)
    bad = check_repeats(ctx)
    ctx.barrier()
    ctx.close()
    return bad


def test_repeated_calls_host():
    out = iris.spawn(rank_repeats, 2)
    assert not any(out), "; ".join(f"rank {r}: {bad[:10]}" for r, bad in enumerate(out) if bad)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_iris_rooted_program_runs():
    """tests/iris_rooted_program.py: Iris's tests/ccl broadcast, reduce, scatter, gather, send/recv and barrier
    tests as Iris writes them (torch.distributed references on gloo), 2 ranks."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "iris_rooted_program.py"), str(_free_port())],
                          env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "rank 0: OK" in out and "rank 1: OK" in out, out[-3000:]


# -- GPUs: 2 and 4 ranks (on however many GPUs there are), larger sizes, a CUDA graph replayed -----------
def graph_wrong(ctx, heap, group, ranks, shapes, replays):
    """reduce, scatter, gather, broadcast, a sendrecv ring and a barrier over group, captured in one CUDA
    graph and replayed with new data copied into the captured inputs; returns wrong replays."""
    r, dev, g, ccl = ctx.rank, ctx.device, len(ranks), ctx.ccl
    me, (n,), (m, ncol) = ranks.index(r), shapes[0], shapes[1]
    dtype, root = torch.bfloat16, g - 1
    red, sc, ga, bc, rv = (heap(i, s, dtype) for i, s in enumerate(((n,), (g * m, ncol), (m, ncol), (m, ncol), (n,))))
    red_out, sc_out, ga_out = (torch.empty(s, dtype=dtype, device=dev) for s in ((n,), (m, ncol), (g * m, ncol)))
    send = torch.empty(n, dtype=dtype, device=dev)

    def calls():
        ccl.reduce(red_out, red, dst=root, group=group)
        ccl.scatter(sc_out, sc, src=root, group=group)
        ccl.gather(ga_out, ga, dst=root, group=group)
        ccl.broadcast(bc, src=root, group=group)
        ccl.sendrecv(send, rv, dst=(me + 1) % g, src=(me - 1) % g, group=group)
        ccl.barrier(group=group)

    calls()  # builds every plan outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    wrong = 0
    for rep in range(replays):
        d = [[_data(s, dtype, q, 10 * rep + k, dev) for q in ranks]
             for k, s in enumerate(((n,), (g * m, ncol), (m, ncol), (m, ncol), (n,)))]
        for t, xs in zip((red, sc, ga, bc, send), d):
            t.copy_(xs[me])
        for t in (red_out, sc_out, ga_out, rv):
            t.fill_(POISON)
        graph.replay()
        ok = (_same(red_out, _reduce(d[0], ReduceOp.SUM) if me == root else _poisoned((n,), dtype, dev))
              and _same(sc_out, d[1][root][me * m:(me + 1) * m])
              and _same(ga_out, torch.cat(d[2]) if me == root else _poisoned((g * m, ncol), dtype, dev))
              and _same(bc, d[3][root]) and _same(rv, d[4][(me - 1) % g]))
        wrong += not ok
    return wrong


def rank_gpu(replays):
    ctx = iris.iris(heap_size=1 << 30)  # the reduces by stores of check_spread stage 2-3x their tensor
    dist = _dist(ctx)
    # the default Config (many programs, 16-byte vectors), bf16 (the host runs every dtype): the whole job,
    # every rank reversed, and on 4 ranks A = [0, 2] and B = [1, 2, 3]
    bad = run_all(ctx, dist, [torch.bfloat16], 2, None, (((3 << 16) + 5,), (1000, 129)), groups=4)
    bad += check_spread(ctx, None, [torch.bfloat16, torch.float32], (2 << 20) + 3, graph=True)
    shapes = ((1 << 20) - 3,), (999, 65)
    slots = [Slots(ctx, 5, 4 << 20) for _ in range(2)]  # bf16: 2 MiB the largest
    plans = [(None, list(range(ctx.world)), 0)]
    if ctx.world == 4:
        plans.append(([3, 1], [3, 1], 1))
    for group, ranks, k in plans:
        if ctx.rank in ranks:
            wrong = graph_wrong(ctx, lambda i, s, d, k=k: slots[k](i, s, d), group, ranks, shapes, replays)
            if wrong:
                bad.append(("graph", tuple(ranks), wrong))
    bad += check_store_reduce(ctx, None, [torch.bfloat16, torch.float32], (1 << 20) + 3)  # a rank gives up
    dist.destroy_process_group()
    ctx.close()
    return bad


def rank_mailbox_gpu(replays):
    """The mailbox checks at GPU sizes, then a ring by batch_isend_irecv captured in a CUDA graph and
    replayed with new data (the message counts advance on the device)."""
    ctx = iris.iris(heap_size=1 << 28)
    r, w, dev, ccl = ctx.rank, ctx.world, ctx.device, ctx.ccl
    bad = []
    for rep in range(3):
        bad += check_mailbox(ctx, None, rep, torch.bfloat16, cap=(1 << 20) + 3)
        _progress(ctx, f"mailbox round {rep} checked")
    bad += check_mailbox_split(ctx, torch.bfloat16, cap=1 << 22, block=4096)
    _progress(ctx, "mailbox messages split differently checked")
    box, n = ccl.init_p2p(max_numel=1 << 16, dtype=torch.bfloat16), (1 << 16) - 5
    send, got = torch.empty(n, dtype=torch.bfloat16, device=dev), torch.empty(n, dtype=torch.bfloat16, device=dev)
    ring = [P2POp(isend, send, (r + 1) % w), P2POp(irecv, got, (r - 1) % w)]
    ccl.batch_isend_irecv(ring, box)  # builds the plans outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ccl.batch_isend_irecv(ring, box)
    for rep in range(replays):
        send.copy_(_data((n,), torch.bfloat16, r, 50 + rep, dev))
        got.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        if not _same(got, _data((n,), torch.bfloat16, (r - 1) % w, 50 + rep, dev)):
            bad.append(("mailbox graph replay", rep))
    _progress(ctx, "mailbox graph checked")
    ctx.barrier()
    ctx.close()
    return bad


@pytest.mark.gpu
def test_mailbox_gpu():
    """send/recv(p2p_state=) and batch_isend_irecv on 2 ranks at GPU sizes, eager and from a CUDA graph."""
    out = iris.spawn(rank_mailbox_gpu, 2, args=(10,))
    assert not any(out), "; ".join(f"rank {r}: {bad[:10]}" for r, bad in enumerate(out) if bad)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_rooted_and_p2p_gpu(world):
    out = iris.spawn(rank_gpu, world, args=(int(os.environ.get("IRIS_CCL_REPLAYS", 20)),))
    for r, bad in enumerate(out):
        assert not bad, f"rank {r} of {world}: {bad[:10]}"
