"""ctx.ccl over subset groups (group=) against torch references: real ranks on the host driver (kernels
in the interpreter) and on GPUs. Outputs are poisoned before every call and checked element by element;
every call overwrites the inp its peers just read, so a missing "done" signal shows as wrong data.
Every Config variant runs over consecutive, strided and arbitrary groups (check_variants), each with
only the tensors its kernel needs on the heap."""
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch

import iris
from iris.ccl import CollectiveError, Config, ConfigError, ReduceOp
from test_ccl import POISON, _data, _dist, _poisoned, _progress, _reduce, _same, graph_wrong, wrong_errors
from test_ccl_variants import owned

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
        (lambda: ctx.ccl.all_reduce(torch.ones(10, device=dev), h, group=pair, config=Config(
            all_reduce_variant="two_shot")), CollectiveError, "stores into the members' out"),
        (lambda: ctx.ccl.all_reduce(torch.ones(10, device=dev), torch.ones(10, device=dev), group=pair, config=Config(
            all_reduce_variant="spinlock")), CollectiveError, "stores into the members' out"),
        (lambda: ctx.ccl.all_gather(torch.ones(20, device=dev), h, group=pair, config=Config(
            all_gather_variant="persistent")), CollectiveError, "stores into the members' out"),
        (lambda: ctx.ccl.all_reduce(heap((11,), torch.float32)[1:], h, group=pair, config=Config(
            all_reduce_variant="two_shot")), CollectiveError, "in-place form"),
        (lambda: ctx.ccl.all_gather(heap((20,), torch.float32), h, group=pair, config=Config(use_gluon=True)),
         ConfigError, "Gluon kernels run over every rank only"),
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


# -- every variant over consecutive, strided and arbitrary groups --------------------------------------------
# what each group call's kernel needs on the heap (i: inp, o: out: the same allocation on every member);
# the other tensors are plain ones, which must work
NEEDS = {("ar", "one_shot"): "i", ("ar", "two_shot"): "io", ("ar", "atomic"): "o", ("ar", "spinlock"): "o",
         ("ar", "ring"): "", ("ag", "pull"): "i", ("ag", "persistent"): "o", ("ag", "partitioned"): "o",
         ("ag", "ring"): "", ("rs", "two_shot"): "i", ("rs", "ring_chunked"): "", ("rst", "two_shot"): "i",
         ("rst", "ring_chunked"): "", ("a2a", "default"): "i"}
FIELD = {"ar": "all_reduce_variant", "ag": "all_gather_variant", "rs": "reduce_scatter_variant",
         "rst": "reduce_scatter_variant", "a2a": "all_to_all_variant"}
ORDERLESS = ("atomic", "spinlock")  # sums in arrival order: their inputs are small integers, exact in any order


def _small(shape, dtype, rank, rep, device):
    g = torch.Generator().manual_seed(100 * rep + rank)
    return torch.randint(-30, 31, shape, generator=g).to(dtype).to(device)


def _cyclic(xs, first, op):
    """xs combined by op from position `first` on, around the group: a ring's order."""
    return _reduce([xs[(first + i) % len(xs)] for i in range(len(xs))], op)


def _ring_reduced(xs, slice_, op):
    """The ring all_reduce's result: element e lies in slice s = (e mod slice_*g) // slice_ of its tile,
    which is combined from position s on."""
    g, flat = len(xs), xs[0].reshape(-1)
    s = (torch.arange(flat.numel(), device=flat.device) % (slice_ * g)) // slice_
    want = torch.empty_like(flat)
    for first in range(g):
        want[s == first] = _cyclic(xs, first, op).reshape(-1)[s == first]
    return want.view(xs[0].shape)


def _plan(ctx, mode, group, op, inp, out, cfg):
    ranks = ctx.ccl.groups.of(group, "test")[0]
    return ctx.ccl.plans[("group", mode, ranks, op, inp.shape, out.shape, inp.dtype, cfg.key(), 0)]


def check_variant(ctx, place, group, ranks, mode, variant, cfg, op, dtype, rep, in_place=True, m=5, ncol=7, n=37):
    """One variant over group, out of place (inp unchanged, out poisoned first), then in place; place(which,
    shape) gives inp's ("i") or out's ("o") tensor, on the heap where the kernel needs it ("": in place's).
    Returns failures."""
    r, dev, g, ccl = ctx.rank, ctx.device, len(ranks), ctx.ccl
    me, bad, tag = ranks.index(r), [], (mode, variant, tuple(ranks), str(dtype), op.value)
    data = _small if variant in ORDERLESS else _data
    ring = variant in ("ring", "ring_chunked")

    def check(what, got, want):
        if not _same(got, want):
            bad.append(tag + (what, got.flatten()[:4].tolist(), want.flatten()[:4].tolist()))

    if mode == "ar":
        xs = [data((n,), dtype, q, rep, dev) for q in ranks]
        x, out = place("i", (n,)).copy_(xs[me]), place("o", (n,)).fill_(POISON)
        ccl.all_reduce(out, x, op=op, group=group, config=cfg)
        plan = _plan(ctx, mode, group, op, x, out, cfg)
        want = _ring_reduced(xs, plan.args[plan.at["SLICE"]], op) if ring else _reduce(xs, op)
        check("out", out, want)
        check("inp", x, xs[me])
        if not in_place:
            return bad
        y = place("", (n,)).copy_(xs[me])
        ccl.all_reduce(y, y, op=op, group=group, config=cfg)
        check("in place", y, want)
    elif mode == "ag":
        xs = [data((m, ncol), dtype, q, rep, dev) for q in ranks]
        x, out = place("i", (m, ncol)).copy_(xs[me]), place("o", (g * m, ncol)).fill_(POISON)
        ccl.all_gather(out, x, group=group, config=cfg)
        check("out", out, torch.cat(xs))
        check("inp", x, xs[me])
        if in_place and variant != "pull":  # pull's peers read inp at their own offset: refused in place (check_group_errors)
            y = place("o", (g * m, ncol)).fill_(POISON)
            y[me * m:(me + 1) * m].copy_(xs[me])
            ccl.all_gather(y, y[me * m:(me + 1) * m], group=group, config=cfg)
            check("in place", y, torch.cat(xs))
    elif mode in ("rs", "rst"):
        rows = g * m if mode == "rs" else m
        xs = [data((rows, ncol), dtype, q, rep, dev) for q in ranks]
        red = _cyclic(xs, me + 1, op) if ring else _reduce(xs, op)  # ring: a part starts after its owner
        poison = _poisoned((m, ncol), dtype, dev)
        mine = owned(m, ncol, cfg, me, g).to(dev) if mode == "rst" else None
        want = red[me * m:(me + 1) * m] if mode == "rs" else torch.where(mine, red, poison)
        x, out = place("i", (rows, ncol)).copy_(xs[me]), place("o", (m, ncol)).copy_(poison)
        ccl.reduce_scatter(out, x, op=op, group=group, config=cfg)
        check("out", out, want)
        check("inp", x, xs[me])
        if not in_place:
            return bad
        y = place("", (rows, ncol)).copy_(xs[me])
        part = y[me * m:(me + 1) * m] if mode == "rs" else y
        ccl.reduce_scatter(part, y, op=op, group=group, config=cfg)
        check("in place", part, want if mode == "rs" else torch.where(mine, red, xs[me]))
    else:
        xs = [data((m, ncol * g), dtype, q, rep, dev) for q in ranks]
        want = torch.cat([xs[q][:, me * ncol:(me + 1) * ncol] for q in range(g)], 1)
        x, out = place("i", (m, ncol * g)).copy_(xs[me]), place("o", (m, ncol * g)).fill_(POISON)
        ccl.all_to_all(out, x, group=group, config=cfg)
        check("out", out, want)
        check("inp", x, xs[me])
        if not in_place:
            return bad
        y = place("", (m, ncol * g)).copy_(xs[me])
        ccl.all_to_all(y, y, group=group, config=cfg)
        check("in place", y, want)
    return bad


def check_variants(ctx, slots, slot, group, ranks, dtypes, rep, sizes=None, every_in_place=False, **knobs):
    """Every variant of every collective (NEEDS) over group once, dtypes, reductions and which variants also
    run in place turning with rep (0, 1, 2: each variant in place once over three groups). Small blocks and
    tiles (several programs and steps, a partial last block or tile); knobs: Config fields over those;
    sizes: check_variant's m, ncol, n. slots: two heap areas per slot (inp's, out's), `slot` this group's."""
    g, bad = len(ranks), []
    for i, ((mode, variant), needs) in enumerate(NEEDS.items()):
        base = dict(block_size=16, comm_sms=2 * g if variant == "partitioned" else 2, block_size_m=2,
                    block_size_n=4, swizzle_size=2, all_reduce_distribution=rep % 2)
        base.update(knobs)
        if mode == "rst" and g == 1:  # one rank: out shaped as inp is torch's layout
            continue
        dtype = dtypes[(i + rep) % len(dtypes)]
        op = ReduceOp.SUM if variant in ORDERLESS or mode == "a2a" else OPS[(i + rep) % 3]

        def place(which, shape, needs=needs, dtype=dtype):
            if which and which not in needs or not which and not needs:
                return torch.empty(shape, dtype=dtype, device=ctx.device)
            return slots(2 * slot + (which == "o"), shape, dtype)

        bad += check_variant(ctx, place, group, ranks, mode, variant, Config(**base, **{FIELD[mode]: variant}), op,
                             dtype, rep, every_in_place or (i + rep) % 3 == 0, **(sizes or {}))
    return bad


def check_wide_pieces(ctx, slots, slot, group, ranks):
    """The rings at blocks and tiles wider than a slot of iris's reserve (RING_SLOT): they move in pieces."""
    heap = lambda which, shape, dtype=torch.float32: slots(2 * slot + (which == "o"), shape, dtype)  # noqa: E731
    bad = []
    for mode, variant, knobs, shape in (("ar", "ring", dict(block_size=1 << 14), dict(n=9001)),
                                        ("ag", "ring", dict(block_size=1 << 13), dict(m=71, ncol=70)),
                                        ("rs", "ring_chunked", dict(block_size=1 << 13), dict(m=71, ncol=70)),
                                        ("rst", "ring_chunked", dict(block_size_m=128, block_size_n=64),
                                         dict(m=140, ncol=70))):
        if mode == "rst" and len(ranks) == 1:
            continue
        cfg = Config(comm_sms=3, spin_limit=1 << 24, **knobs, **{FIELD[mode]: variant})
        bad += check_variant(ctx, lambda w, s: heap(w or "i", s), group, ranks, mode, variant, cfg, ReduceOp.SUM,
                             torch.float32, 7, **shape)
    return bad


def check_stand_in(ctx, slots, slot, group, ranks):
    """one_shot_push over a group runs one_shot, warning once."""
    x = slots(2 * slot, (37,), torch.float32)
    xs = [_data((37,), torch.float32, q, 3, ctx.device) for q in ranks]
    x.copy_(xs[ranks.index(ctx.rank)])
    out = _poisoned((37,), torch.float32, ctx.device)
    cfg = Config(all_reduce_variant="one_shot_push", block_size=16, comm_sms=2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ctx.ccl.all_reduce(out, x, group=group, config=cfg)
        ctx.ccl.all_reduce(out, x, group=group, config=cfg)
    said = [str(w.message) for w in seen if "runs 'one_shot' there" in str(w.message)]
    return ([] if _same(out, _reduce(xs, ReduceOp.SUM)) else ["one_shot_push stand-in: wrong out"]) + (
        [] if len(said) == 1 else [("one_shot_push stand-in warned", len(said))])


def variant_groups(ctx, dist):
    """(kind, group, ranks) of this rank: consecutive, strided (a torch group) and an arbitrary subset in its
    own order; at 4 ranks [0, 1] [2, 3] / [0, 2] [1, 3] / (3, 0, 2) [1]; at 3, [0, 1] [2] / [0, 2] [1] /
    (2, 0, 1) (every rank, out of order: still the group kernels); at 2, each rank alone twice, then (1, 0)."""
    r, w = ctx.rank, ctx.world
    half = w // 2
    consecutive = [list(range(half)), list(range(half, w))] if w % 2 == 0 else [[0, 1], [2]]
    strided = [list(range(0, w, 2)), list(range(1, w, 2))]
    torch_strided = [dist.new_group(s) for s in strided]  # collective: every rank makes every group
    arbitrary = {4: [[3, 0, 2], [1]], 3: [[2, 0, 1]], 2: [[1, 0]]}[w]
    out = []
    for kind, sets in enumerate((consecutive, strided, arbitrary)):
        ranks = next(s for s in sets if r in s)
        group = torch_strided[sets.index(ranks)] if kind == 1 else (tuple(ranks) if kind == 2 else ranks)
        out.append((kind, group, ranks))
    return out


def rank_variants(dtypes, wide, kinds=(0, 1, 2)):
    """kinds: the kinds of variant_groups that run every variant; wide: the kind that runs the wide pieces."""
    ctx = iris.iris(heap_size=1 << 24)
    dist = _dist(ctx)
    slots = Slots(ctx, 6, 8 * 140 * 70 * ctx.world)
    bad = []
    for kind, group, ranks in variant_groups(ctx, dist):
        if kind in kinds:
            bad += check_variants(ctx, slots, kind, group, ranks, dtypes, kind)
        if kind == 2:
            bad += check_stand_in(ctx, slots, kind, group, ranks)
        if kind == wide:
            bad += check_wide_pieces(ctx, slots, kind, group, ranks)
    dist.destroy_process_group()
    ctx.close()
    return bad


# At 4 ranks every variant runs over every kind of group (pairs consecutive and strided, three ranks out of
# order, one rank alone), in place over one of the three kinds and in each dtype over them. At 3 ranks the
# consecutive and strided groups are the pair and the lone rank of 4 again: the variants run there only
# over every rank out of order (still the group kernels); the wide pieces keep the pair and the lone rank.
@pytest.mark.parametrize("world, kinds", [(3, (2,)), (4, (0, 1, 2))])
def test_group_variants_host(world, kinds):
    out = iris.spawn(rank_variants, world, args=([torch.float32, torch.bfloat16, torch.int32], world - 3, kinds))
    for r, bad in enumerate(out):
        assert not bad, f"rank {r} of {world}: {bad[:10]}"


COMPILE = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from iris.ccl.kernels.group import group_tile_kernel
from iris.ccl.kernels.group_accumulate import group_accumulate_kernel
from iris.ccl.kernels.group_push import group_gather_push_kernel, group_two_shot_kernel
from iris.ccl.kernels.group_ring import group_ring_gather_kernel, group_ring_kernel, group_ring_reduce_scatter_kernel

def build(fn, data, consts, acc):
    sig = {a: "constexpr" if a in consts else "*i64" if a in ("members", "counters", "seen", "locks", "flags") else
           "*" + data if a in ("inp", "out", "snap") else "*" + acc if a == "slots" else "i32" for a in fn.arg_names}
    src = triton.compiler.ASTSource(fn, sig, constexprs=consts)
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    print(fn.__name__, data, flush=True)

G = dict(GROUP=3, PEERS=4, SPIN=0)
for data, acc in (("bf16", "fp32"), ("i64", "i64")):
    slot = 16384 // (8 if acc == "i64" else 4)
    build(group_two_shot_kernel, data, dict(G, OP="sum", IS_FLOAT=acc != data, BLOCK=1024, STRIDED=True), acc)
    for lock in (False, True):
        build(group_accumulate_kernel, data, dict(G, BLOCK=2048, LOCK=lock, TURNS=False, SNAP=True), acc)
    build(group_gather_push_kernel, data, dict(G, BLOCK=1024, PARTITIONED=True), acc)
    build(group_tile_kernel, data, dict(G, BM=32, BN=64, GROUP_M=4, DIST=1, OP="max", IS_FLOAT=acc != data), acc)
    build(group_ring_kernel, data, dict(G, OP="sum", SLICE=512, RINGS=1, ELEMS=slot), acc)
    build(group_ring_gather_kernel, data, dict(G, PIECE=2048, ELEMS=16384 // (2 if data == "bf16" else 8)), data)
    for tiled in (False, True):
        build(group_ring_reduce_scatter_kernel, data, dict(G, BM=32, BN=64, SBM=32 if tiled else 1,
              SBN=64 if tiled else 2048, GROUP_M=4, DIST=0, TILED=tiled, OP="sum", ELEMS=slot), acc)
"""


def test_group_kernels_compile_for_sm90(tmp_path):
    """The group kernels compile for sm_90 on the host (Triton ships ptxas; no GPU needed), so what only a
    GPU compiles (scalar atomics, a static if's branches, bf16 and int64 atomics) fails here first. In a
    fresh process: kernels run under the interpreter earlier in this one leave triton.language patched."""
    import triton
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")):
        pytest.skip("Triton's ptxas is not here")
    script = tmp_path / "compile_groups.py"
    script.write_text(COMPILE)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="0", IRIS_PLATFORM="host", TRITON_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("\n") == 18, proc.stdout


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


def rank_variants_gpu(reps):
    """check_variants at GPU sizes with the default tiles and blocks (many programs, 16-byte vectors), every
    variant in place too, reps rounds over each group (a call repeated on the same tensors replays iris's
    graph of it); a lost signal gives up after spin_limit polls and shows as wrong data, not a hang."""
    ctx = iris.iris(heap_size=1 << 28)
    dist = _dist(ctx)
    sizes = dict(m=1000, ncol=129, n=(3 << 16) + 5)
    slots = Slots(ctx, 6, 8 * 1000 * 129 * ctx.world)
    knobs = dict(block_size=0, comm_sms=48, block_size_m=32, block_size_n=64, swizzle_size=4, spin_limit=1 << 24)
    dtypes = [torch.bfloat16, torch.float32, torch.float16, torch.int32, torch.int64]
    bad = []
    for kind, group, ranks in variant_groups(ctx, dist):
        for rep in range(reps):
            bad += check_variants(ctx, slots, kind, group, ranks, dtypes, kind + 3 * rep, sizes, True, **knobs)
        bad += check_wide_pieces(ctx, slots, kind, group, ranks)
        _progress(ctx, f"variants over {ranks} checked")
    dist.destroy_process_group()
    ctx.close()
    return bad


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_group_variants_gpu(world):
    """Every variant over consecutive, strided and arbitrary groups, one GPU per rank (or ranks sharing GPUs,
    slower); IRIS_CCL_TIMEOUT bounds the run (default 500 s)."""
    out = iris.spawn(rank_variants_gpu, world, args=(int(os.environ.get("IRIS_CCL_REPS", 3)),),
                     timeout=float(os.environ.get("IRIS_CCL_TIMEOUT", 500)))
    for r, bad in enumerate(out):
        assert not bad, f"rank {r} of {world}: {bad[:10]}"
