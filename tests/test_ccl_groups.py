"""ctx.ccl over subset groups (group=) against torch references: real ranks on the host driver (kernels
in the interpreter) and on GPUs. Outputs are poisoned before every call and checked element by element;
every call overwrites the inp its peers just read, so a missing "done" signal shows as wrong data."""
import math
import os

import pytest
import torch

import iris
from iris.ccl import CollectiveError, Config, ReduceOp
from test_ccl import POISON, _data, _dist, _poisoned, _reduce, _same, graph_wrong, wrong_errors

OPS = (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN)


class Slots:
    """A heap buffer per group, allocated by every rank (heap allocation is collective, group calls are
    not): a group's inp is a view of its start, so it sits at the same offset on every rank."""

    def __init__(self, ctx, count, nbytes):
        self.bufs = [ctx.empty(nbytes, dtype=torch.uint8) for _ in range(count)]

    def __call__(self, slot, shape, dtype):
        return self.bufs[slot][:math.prod(shape) * dtype.itemsize].view(dtype).view(shape)


def check_calls(ctx, heap, group, ranks, dtype, cfg, rep, shapes=((37,), (5, 7))):
    """Every collective over group (ranks: its global ranks in order), out of place then in place;
    returns failures."""
    r, dev, g = ctx.rank, ctx.device, len(ranks)
    me, (n,), (m, ncol) = ranks.index(r), shapes[0], shapes[1]
    tag, bad, ccl = (tuple(ranks), str(dtype), rep), [], ctx.ccl

    def run(name, call, out, want, x=None, x_want=None):
        call()
        if not _same(out, want) or (x is not None and not _same(x, x_want)):
            bad.append((name,) + tag)

    op = OPS[rep % 3]
    xs = [_data((n,), dtype, q, rep, dev) for q in ranks]
    want = _reduce(xs, op)
    x, out = heap((n,), dtype).copy_(xs[me]), _poisoned((n,), dtype, dev)
    run(f"all_reduce {op.value}", lambda: ccl.all_reduce(out, x, op=op, group=group, config=cfg), out, want, x, xs[me])
    run("all_reduce in place", lambda: ccl.all_reduce(x, x, op=op, group=group, config=cfg), x, want)

    xs = [_data((m, ncol), dtype, q, rep + 1, dev) for q in ranks]
    x, out = heap((m, ncol), dtype).copy_(xs[me]), _poisoned((g * m, ncol), dtype, dev)
    run("all_gather", lambda: ccl.all_gather(out, x, group=group, config=cfg), out, torch.cat(xs), x, xs[me])

    xs = [_data((g * m, ncol), dtype, q, rep + 2, dev) for q in ranks]
    want = _reduce(xs, ReduceOp.SUM)[me * m:(me + 1) * m]
    x, out = heap((g * m, ncol), dtype).copy_(xs[me]), _poisoned((m, ncol), dtype, dev)
    run("reduce_scatter", lambda: ccl.reduce_scatter(out, x, group=group, config=cfg), out, want, x, xs[me])
    run("reduce_scatter in place", lambda: ccl.reduce_scatter(x[me * m:(me + 1) * m], x, group=group, config=cfg),
        x[me * m:(me + 1) * m], want)

    xs = [_data((m, ncol * g), dtype, q, rep + 3, dev) for q in ranks]
    want = torch.cat([xs[q][:, me * ncol:(me + 1) * ncol] for q in range(g)], 1)
    x, out = heap((m, ncol * g), dtype).copy_(xs[me]), _poisoned((m, ncol * g), dtype, dev)
    run("all_to_all", lambda: ccl.all_to_all(out, x, group=group, config=cfg), out, want, x, xs[me])
    run("all_to_all in place", lambda: ccl.all_to_all(x, x, group=group, config=cfg), x, want)

    src = ranks[rep % g]
    xs = [_data((m, ncol), dtype, q, rep + 4, dev) for q in ranks]
    want = xs[ranks.index(src)]
    x, out = heap((m, ncol), dtype).copy_(xs[me]), _poisoned((m, ncol), dtype, dev)
    run(f"broadcast from {src}", lambda: ccl.broadcast(out, x, src=src, group=group, config=cfg), out, want, x, xs[me])
    run("broadcast in place", lambda: ccl.broadcast(x, x, src=src, group=group, config=cfg), x, want)
    return bad


def check_group_errors(ctx, heap, pair):
    """Bad group calls raise before anything is allocated: the heap and the plans stay as they were."""
    r, dev, w = ctx.rank, ctx.device, ctx.world
    live, plans = set(ctx.heap.alloc.offsets.live), len(ctx.ccl.plans)
    mine = [r, (r + 1) % w]  # a group holding this rank
    h = heap((10,), torch.float32)
    cases = [
        (lambda: ctx.ccl.all_reduce(torch.ones(10, device=dev), torch.ones(10, device=dev), group=mine),
         CollectiveError, "ctx.as_symmetric"),
        (lambda: ctx.ccl.all_reduce(h, h, group=[q for q in range(w) if q != r]), CollectiveError, "not in group"),
        (lambda: ctx.ccl.all_gather(torch.ones(10, device=dev), h, group=pair), CollectiveError, "expected"),
        (lambda: ctx.ccl.all_gather(heap((20,), torch.float32), heap((20,), torch.float32)[10 * pair.index(r):][:10],
                                    group=pair), CollectiveError, "in place"),
        (lambda: ctx.ccl.reduce_scatter(torch.ones(1, device=dev), heap((3,), torch.float32), group=pair),
         CollectiveError, "multiple"),
        (lambda: ctx.ccl.all_to_all(heap((2, 3), torch.float32), heap((2, 3), torch.float32), group=pair),
         CollectiveError, "N*world"),
        (lambda: ctx.ccl.broadcast(h, h, src=next(q for q in range(w) if q not in pair), group=pair),
         CollectiveError, "not in the group"),
        (lambda: ctx.ccl.all_reduce(h, h, group=[r, r]), CollectiveError, "twice"),
        (lambda: ctx.ccl.all_reduce(h, h, group=[r, w]), CollectiveError, "global ranks"),
        (lambda: ctx.ccl.all_reduce(h, h, group="ranks"), TypeError, "torch.distributed group"),
        (lambda: ctx.ccl.all_reduce(torch.ones(10, dtype=torch.int32, device=dev), h, group=pair),
         CollectiveError, "must match"),
    ]
    bad = wrong_errors(cases if r in pair else cases[:2])  # the others are pair's calls
    if set(ctx.heap.alloc.offsets.live) != live or len(ctx.ccl.plans) != plans:
        bad.append("the heap or the plans changed")
    return bad


def check_group_spin_limit(ctx, heap):
    """Config.spin_limit: rank 0 calls over [0, 1] while rank 1 never does; the program gives up and marks
    its seen row. Leaves the pair's counters out of step: the last group call of the job."""
    bad = []
    if ctx.rank == 0:
        cfg = Config(block_size=16, comm_sms=1, spin_limit=20)
        x, out = heap((16,), torch.float32).fill_(1), _poisoned((16,), torch.float32, ctx.device)
        ctx.ccl.all_reduce(out, x, group=[0, 1], config=cfg)
        if not (ctx.ccl.seen[0, 0] < 0).item():
            bad.append("a program whose peer never came did not mark seen")
    try:
        ctx.barrier()
        raised = ""
    except iris.WaitTimeout as e:
        raised = str(e)
    want = "rank 0: a group collective gave up waiting for group member 1" if ctx.rank == 0 else ""
    if not raised.startswith(want) or (want == "") != (raised == ""):
        bad.append(f"WaitTimeout at the barrier: {raised!r}")
    return bad


def run_groups(ctx, dist, dtypes, reps, big=()):
    """World 4: A = [0, 2] (a torch group, strided), B = [1, 2, 3] (a list), C = (3, 1) (a tuple in its own
    order, sharing the pair (1, 3) with B), each rank alone, and every rank in reverse order. Each rank
    makes its groups' calls in one order, so rank 2 alternates A and B, ranks 1 and 3 alternate B and C,
    and rank 0 works with A only while 1 and 3 run B and C. reps: rounds over dtypes; big: pairs of
    shapes for check_calls, run with the default config over A and B."""
    r, w = ctx.rank, ctx.world
    a = dist.new_group([0, 2])
    nbytes = 8 * max([4 * 5 * 7 * w] + [math.prod(s) * w for shapes in big for s in shapes])
    slots = Slots(ctx, 5, nbytes)
    groups = [(a, [0, 2], 0), ([1, 2, 3], [1, 2, 3], 1), ((3, 1), [3, 1], 2), ([r], [r], 3),
              (list(range(w))[::-1], list(range(w))[::-1], 4)]
    cfg = Config(block_size=16, comm_sms=2)  # two programs, one with two steps, partial last blocks
    bad = check_group_errors(ctx, lambda s, d: slots(0, s, d), [0, 2])
    for rep in range(reps * len(dtypes)):  # rep also turns the reduction and broadcast's root
        for group, ranks, slot in groups:
            if r in ranks and (slot != 4 or rep == 0):
                bad += check_calls(ctx, lambda s, d: slots(slot, s, d), group, ranks, dtypes[rep % len(dtypes)], cfg,
                                   rep)
    for shapes in big:  # GPU sizes with the default config: many programs, 16-byte vectors
        for group, ranks, slot in groups[:2]:
            if r in ranks:
                bad += check_calls(ctx, lambda s, d: slots(slot, s, d), group, ranks, torch.bfloat16, None, 0,
                                   shapes)
    return bad, a, slots


def rank_groups(dtypes, reps):
    ctx = iris.iris(heap_size=1 << 24)
    dist = _dist(ctx)
    bad, _, slots = run_groups(ctx, dist, dtypes, reps)
    bad += check_group_spin_limit(ctx, lambda s, d: slots(0, s, d))
    dist.destroy_process_group()
    ctx.close()
    return bad


def test_groups_host():
    out = iris.spawn(rank_groups, 4, args=([torch.float32, torch.bfloat16, torch.int32], 1))
    for r, bad in enumerate(out):
        assert not bad, f"rank {r}: {bad[:10]}"


# -- GPUs: 4 ranks (on however many GPUs there are), larger sizes, eager repeats and a CUDA graph ----------
def check_group_graph(ctx, heap, group, ranks, n, replays):
    """A group all_reduce captured (three calls, each result copied back into inp at once) and replayed
    with new data; then eager repeats of the same tensors (iris replays those from its own graph)."""
    r, dev = ctx.rank, ctx.device
    x, out = heap((n,), torch.bfloat16), torch.empty(n, dtype=torch.bfloat16, device=dev)
    ctx.ccl.all_reduce(out, x, group=group)  # builds the plan outside capture
    wrong = graph_wrong(lambda: ctx.ccl.all_reduce(out, x, group=group), x, out, ranks, r, 3, replays)
    bad = [("graph", tuple(ranks), wrong)] if wrong else []
    for rep in range(12):
        xs = [_data((n,), torch.bfloat16, q, rep, dev) for q in ranks]
        x.copy_(xs[ranks.index(r)])
        out.fill_(POISON)
        ctx.ccl.all_reduce(out, x, group=group)
        if not _same(out, _reduce(xs, ReduceOp.SUM)):
            bad.append(("eager repeat", tuple(ranks), rep))
    return bad


def rank_groups_gpu(replays):
    ctx = iris.iris(heap_size=1 << 28)
    dist = _dist(ctx)
    bad, a, _ = run_groups(ctx, dist, [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64], 3,
                        ((((3 << 16) + 5,), (1000, 129)),))
    slots = Slots(ctx, 2, 2 << 20)
    for group, ranks, slot in ((a, [0, 2], 0), ([1, 2, 3], [1, 2, 3], 1)):
        if ctx.rank in ranks:
            bad += check_group_graph(ctx, lambda s, d: slots(slot, s, d), group, ranks, (1 << 20) - 3, replays)
    dist.destroy_process_group()
    ctx.close()
    return bad


@pytest.mark.gpu
def test_groups_gpu():
    out = iris.spawn(rank_groups_gpu, 4, args=(int(os.environ.get("IRIS_CCL_REPLAYS", 50)),))
    for r, bad in enumerate(out):
        assert not bad, f"rank {r}: {bad[:10]}"
