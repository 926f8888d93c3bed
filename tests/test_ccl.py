"""Collectives (ctx.ccl) against torch references: real ranks on the host driver (kernels in the
interpreter) and on GPUs. Outputs are poisoned before every call and checked element by element."""
import dataclasses
import os
import socket
import time

import pytest
import torch

import iris
from iris.ccl import CollectiveError, Config, ReduceOp

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]
POISON = -77


def _data(shape, dtype, rank, rep, device):
    """Rank `rank`'s input of repetition `rep`: the same on every process, different per rank and rep."""
    g = torch.Generator().manual_seed(1000 * rep + rank)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g).to(dtype)
    else:
        x = torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)
    return x.to(device)


INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _reduce(xs, op):
    """The kernels' order: rank 0 first, floats in fp32, then back to the dtype (the Triton interpreter
    rounds fp32 to bf16 by truncation, the GPU to nearest even: the reference does the same)."""
    acc = xs[0].float() if xs[0].dtype.is_floating_point else xs[0].clone()
    for x in xs[1:]:
        x = x.float() if x.dtype.is_floating_point else x
        acc = acc + x if op == ReduceOp.SUM else torch.maximum(acc, x) if op == ReduceOp.MAX else torch.minimum(acc, x)
    if xs[0].dtype == torch.bfloat16 and INTERPRETED:
        acc = (acc.view(torch.int32) & -65536).view(torch.float32)
    return acc.to(xs[0].dtype)


def _poisoned(shape, dtype, device):
    return torch.full(shape, POISON, dtype=dtype, device=device)


def _spawn_clean(fn, world, *args):
    """fn(*args) on world ranks; every rank's list of failures must be empty."""
    for r, bad in enumerate(iris.spawn(fn, world, args=args)):
        assert not bad, f"rank {r} of {world}: {bad[:10]}"


def _same(got, want):
    return got.shape == want.shape and bool(torch.equal(got, want))


def check_all_reduce(ctx, shape, dtype, cfg, op=ReduceOp.SUM, rep=0, heap=False):
    """all_reduce out of place, then in place; returns failures."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    tag = ("all_reduce", tuple(shape), str(dtype), cfg and cfg.all_reduce_variant, op.value, "heap" * heap)
    xs = [_data(shape, dtype, q, rep, dev) for q in range(w)]
    want = _reduce(xs, op)
    own = (lambda t: ctx.empty(t.shape, dtype=t.dtype).copy_(t)) if heap else torch.clone
    out, x = own(_poisoned(shape, dtype, dev)), own(xs[r])
    ctx.ccl.all_reduce(out, x, op=op, config=cfg)
    bad = [] if _same(out, want) and _same(x, xs[r]) else [tag]
    ctx.ccl.all_reduce(x, x, op=op, config=cfg)
    return bad + ([] if _same(x, want) else [tag + ("in place",)])


def check_moves(ctx, rows, dtype, cfg=None, rep=0):
    """all_gather, reduce_scatter, all_to_all and broadcast (in place) of (rows...) blocks; returns failures."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    tag, bad = (tuple(rows), str(dtype)), []
    xs = [_data(rows, dtype, q, rep, dev) for q in range(w)]
    out = _poisoned((w * rows[0],) + tuple(rows[1:]), dtype, dev)
    ctx.ccl.all_gather(out, xs[r], config=cfg)
    bad += [] if _same(out, torch.cat(xs)) else [("all_gather",) + tag]
    xs = [_data((w * rows[0],) + tuple(rows[1:]), dtype, q, rep + 1, dev) for q in range(w)]
    out = _poisoned(rows, dtype, dev)
    ctx.ccl.reduce_scatter(out, xs[r], config=cfg)
    bad += [] if _same(out, _reduce(xs, ReduceOp.SUM)[r * rows[0]:(r + 1) * rows[0]]) else [("reduce_scatter",) + tag]
    m, ncol = rows[0], rows[1]
    xs = [_data((m, ncol * w), dtype, q, rep + 2, dev) for q in range(w)]
    out = _poisoned((m, ncol * w), dtype, dev)
    ctx.ccl.all_to_all(out, xs[r], config=cfg)
    want = torch.cat([xs[q][:, r * ncol:(r + 1) * ncol] for q in range(w)], 1)
    bad += [] if _same(out, want) else [("all_to_all",) + tag]
    src = (rep + 1) % w
    xs = [_data(rows, dtype, q, rep + 3, dev) for q in range(w)]
    x = xs[r].clone()
    ctx.ccl.broadcast(x, x, src=src, config=cfg)
    bad += [] if _same(x, xs[src]) else [("broadcast", src) + tag]
    return bad


def check_split_broadcast(ctx, cfg):
    """The scatter + all_gather broadcast (GPUs take it from 1 MiB over 3 or more ranks) at every size here:
    every src, a size whose last piece is short, out of place and in place, back to back over both copies
    of its stage."""
    from iris.ccl import builders
    keep, builders.SPLIT_BROADCAST = builders.SPLIT_BROADCAST, 0
    r, w, bad = ctx.rank, ctx.world, []
    try:
        for rep in range(2 * w):
            src = rep % w
            xs = [_data((67,), torch.float32, q, rep, ctx.device) for q in range(w)]
            out = _poisoned((67,), torch.float32, ctx.device)
            x = xs[r].clone()
            ctx.ccl.broadcast(out, x, src=src, config=cfg)
            ctx.ccl.broadcast(x, x, src=src, config=cfg)
            if w > 2 and ctx.ccl.plans and not any(getattr(p, "variant", "") == "scatter_all_gather"
                                                   for p in ctx.ccl.plans.values()):
                bad.append("the split broadcast did not run")
            bad += [] if _same(out, xs[src]) and _same(x, xs[src]) else [("split broadcast", src, rep)]
    finally:
        builders.SPLIT_BROADCAST = keep
    return bad


def check_pipelined(ctx, reps, cfgs, rows=(13, 11), dtype=torch.float32, one=True, lag=0.02):
    """all_gather and all_to_all staged in segments that the peers read while the next is staged, and
    reduce_scatter reducing a segment while it stores the next, all_reduce two_shot_push storing each
    reduced segment into the peers while it reduces the next (GPUs take them from
    builders.PIPELINE_BYTES of inp), forced at every size here; all_reduce on plain and heap tensors (the
    reduced segments land in a gather buffer, or in the peers' out), out of place and in place, over
    a number of elements the ranks do not divide. reps back to back calls per Config
    of cfgs, new data each, outputs poisoned, over both copies of the stage, one rank `lag` seconds late in
    turn (a read that runs ahead of its peer's staging finds stale data); the pipelined plan must be what
    ran. one: also pull_segments=1, which must keep one exchange."""
    from iris.ccl import builders
    r, w, dev = ctx.rank, ctx.world, ctx.device
    m, c = rows
    keep, builders.PIPELINE_BYTES = builders.PIPELINE_BYTES, dict.fromkeys(builders.PIPELINE_BYTES, 0)
    bad = []
    try:
        for cfg in cfgs + [Config(block_size=16, comm_sms=2, pull_segments=1)] * one:
            single = cfg.pull_segments == 1
            for rep in range(1 if single else reps):
                tag = (tuple(rows), cfg.pull_segments, rep)
                if rep % w == r and lag:
                    time.sleep(lag)
                xs = [_data(rows, dtype, q, rep, dev) for q in range(w)]
                out = _poisoned((w * m, c), dtype, dev)
                ctx.ccl.all_gather(out, xs[r], config=cfg)
                bad += [] if _same(out, torch.cat(xs)) else [("pipelined all_gather",) + tag]
                xs = [_data((m, c * w), dtype, q, rep + 50, dev) for q in range(w)]
                out = _poisoned((m, c * w), dtype, dev)
                ctx.ccl.all_to_all(out, xs[r], config=cfg)
                want = torch.cat([x[:, r * c:(r + 1) * c] for x in xs], 1)
                bad += [] if _same(out, want) else [("pipelined all_to_all",) + tag]
                xs = [_data((w * m, c), dtype, q, rep + 70, dev) for q in range(w)]
                out = _poisoned((m, c), dtype, dev)
                ctx.ccl.reduce_scatter(out, xs[r], config=cfg)
                bad += [] if _same(out, _reduce(xs, ReduceOp.SUM)[r * m:(r + 1) * m]) else [("pipelined rs",) + tag]
                two = dataclasses.replace(cfg, all_reduce_variant="two_shot_push")
                for heap in (False, True):
                    own = (lambda t: ctx.empty(t.shape, dtype=t.dtype).copy_(t)) if heap else torch.clone
                    xs = [_data((w * m + 3, c), dtype, q, rep + 90, dev) for q in range(w)]
                    out, x, want = own(_poisoned(xs[0].shape, dtype, dev)), own(xs[r]), _reduce(xs, ReduceOp.SUM)
                    ctx.ccl.all_reduce(out, x, config=two)
                    ran = ctx.ccl.recent["all_reduce"].plan.variant
                    bad += [] if _same(out, want) and _same(x, xs[r]) else [("pipelined all_reduce", heap) + tag]
                    bad += [] if ran == ("two_shot_push" if single else "pipelined") else [("ar ran", ran) + tag]
                    ctx.ccl.all_reduce(x, x, config=two)
                    bad += [] if _same(x, want) else [("pipelined all_reduce in place", heap) + tag]
            for mode, shape, got in (("ag", (m, c), (w * m, c)), ("a2a", (m, c * w), (m, c * w)),
                                     ("rs", (w * m, c), (m, c))):
                plan = ctx.ccl.plans.get((mode, ReduceOp.SUM, torch.Size(shape), torch.Size(got), dtype, cfg.key(), 0))
                ran = getattr(plan, "variant", None)
                if ran != ("pipelined" if not single else "one_shot" if mode != "rs" else "two_shot"):
                    bad.append((mode, "ran", ran, cfg.pull_segments))
        ctx.ccl.free()
    finally:
        builders.PIPELINE_BYTES = keep
    return bad


# the pipelined all_gather and all_to_all on the host, 143 elements a chunk, 16 a block, two programs of 80
# and 63: 3 segments (2, 2 and 1 blocks; the second program's 2 blocks, then 31 elements, then none), and
# the default count (a block each, as a range is at most 5 blocks)
PIPELINED = (Config(block_size=16, comm_sms=2, pull_segments=3), Config(block_size=16, comm_sms=2))


def check_repeats(ctx, n, cfg, reps, dtype=torch.float32):
    """Back to back calls with new data each time and poisoned outputs; the workspace is reused."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    bad = []
    for rep in range(reps):
        xs = [_data((n,), dtype, q, rep, dev) for q in range(w)]
        out = _poisoned((n,), dtype, dev)
        ctx.ccl.all_reduce(out, xs[r], config=cfg)
        if not _same(out, _reduce(xs, ReduceOp.SUM)):
            bad.append(("repeat", cfg and cfg.all_reduce_variant, rep))
    return bad


def wrong_errors(cases):
    """Each (call, kind, words) must raise kind with words in its message; returns the cases that did not."""
    bad = []
    for i, (call, kind, words) in enumerate(cases):
        try:
            call()
            bad.append((i, "no error"))
        except kind as e:
            if words not in str(e):
                bad.append((i, str(e)))
    return bad


def check_errors(ctx):
    """Bad arguments raise before anything is allocated: the heap's live blocks stay as they were."""
    live = set(ctx.heap.alloc.offsets.live)
    dev, w = ctx.device, ctx.world
    x = torch.ones(10, device=dev)
    cases = [
        (lambda: ctx.ccl.all_reduce(torch.ones(11, device=dev), x), CollectiveError, "shape"),
        (lambda: ctx.ccl.all_reduce(torch.ones(10, dtype=torch.float64, device=dev),
                                    torch.ones(10, dtype=torch.float64, device=dev)), CollectiveError, "not supported"),
        (lambda: ctx.ccl.all_reduce(torch.ones(10, dtype=torch.int32, device=dev), x), CollectiveError, "must match"),
        (lambda: ctx.ccl.all_gather(torch.ones(10, device=dev), x), CollectiveError, "expected"),
        (lambda: ctx.ccl.reduce_scatter(torch.ones(1, device=dev), torch.ones(w * 2 + 1, device=dev)),
         CollectiveError, "multiple"),
        (lambda: ctx.ccl.all_to_all(torch.ones(4, w + 1, device=dev), torch.ones(4, w + 1, device=dev)),
         CollectiveError, "N*world"),
        (lambda: ctx.ccl.all_reduce(torch.ones(10, 2, device=dev).t(), torch.ones(2, 10, device=dev)),
         CollectiveError, "contiguous"),
        (lambda: ctx.ccl.broadcast(x, x, src=w), CollectiveError, "src"),
        (lambda: ctx.ccl.all_gather(torch.ones(w, device=dev), torch.ones((), device=dev)), CollectiveError, "0-d"),
        (lambda: ctx.ccl.all_reduce(x, x, op="prod"), ValueError, "prod"),
        (lambda: Config(block_size=100), ValueError, "power of two"),
        (lambda: Config(all_reduce_variant="ring_fast"), ValueError, "all_reduce_variant must be one of"),
    ]
    other = "cpu" if dev.type == "cuda" else "meta"
    cases.append((lambda: ctx.ccl.all_reduce(x, torch.ones(10, device=other)), CollectiveError, f"is on {other}"))
    bad = wrong_errors(cases)
    if set(ctx.heap.alloc.offsets.live) != live:
        bad.append("the heap changed")
    return bad


def _gave_up_at_barrier(ctx, want, look=lambda: None):
    """The host's report of a device wait that gave up: the next ctx.barrier() (then look()) raises one
    WaitTimeout starting with want on rank 0, naming the call, the peer and the epoch, and nothing on the
    other ranks; returns what differs."""
    try:
        ctx.barrier()
        look()
        raised = ""
    except iris.WaitTimeout as e:
        raised = str(e)
    want = want if ctx.rank == 0 else ""
    same = raised.startswith(want) and (want == "") == (raised == "")
    return [] if same else [f"WaitTimeout at the barrier: {raised!r}"]


def check_spin_limit(ctx):
    """Config.spin_limit: a program whose peer never joins gives up and marks its flag row with -1 (the
    peer only builds the plan, which is collective, and does not call)."""
    cfg = Config(block_size=16, comm_sms=1, all_reduce_variant="one_shot", spin_limit=20)
    x, out = torch.ones(40, device=ctx.device), _poisoned((40,), torch.float32, ctx.device)
    plan = ctx.ccl.all_reduce_preamble(out, x, config=cfg)
    flags = plan.workspace[-2]
    bad = [] if not (flags < 0).any() else ["flags marked before any call"]
    if ctx.rank == 0:
        ctx.ccl.all_reduce(out, x, config=cfg)
        if not (flags < 0).any():
            bad.append("a program whose peer never came did not mark its flags")
    bad += _gave_up_at_barrier(ctx, "rank 0: ctx.ccl.all_reduce (one_shot) gave up waiting for rank 1: flag row 0 "
                                    "(program 0, wait 1 of the call) never reached epoch 1")
    ctx.barrier()  # raised once: the next barrier passes
    ctx.ccl.free()
    return bad


def check_pipelined_gives_up(ctx):
    """A pipelined all_gather whose peer signals its first segment and no more (rank 1 never calls; rank 0's
    flags of segment 0 are set as rank 1's signals would set them): every later segment's wait of every
    program gives up and marks its own flag row (j * programs + p), and the host names the first, program
    0's wait of its second segment, as iris/ccl/waits.py reads rows."""
    from iris.ccl import builders, waits
    cfg = Config(block_size=16, comm_sms=2, pull_segments=3, spin_limit=20)
    x, out = torch.ones(13, 11, device=ctx.device), _poisoned((ctx.world * 13, 11), torch.float32, ctx.device)
    keep, builders.PIPELINE_BYTES = builders.PIPELINE_BYTES, dict.fromkeys(builders.PIPELINE_BYTES, 0)
    try:
        plan = ctx.ccl.all_gather_preamble(out, x, config=cfg)
    finally:
        builders.PIPELINE_BYTES = keep
    flags = plan.workspace[1].view(-1, ctx.world)
    bad = [] if plan.variant == "pipelined" and flags.shape[0] == 3 * 2 else [("plan", plan.variant, flags.shape)]
    if ctx.rank == 0:
        flags[:2, 1] = 1  # segment 0's rows of both programs: rank 1's signal of epoch 1
        ctx.ccl.all_gather(out, x, config=cfg)
        if not bool((flags[2:, 0] < 0).all()) or bool((flags[:2, 0] != 0).any()):
            bad.append(("rows marked", flags[:, 0].tolist()))
    # a context raises once (check_spin_limit may have had it): look directly after the barrier
    bad += _gave_up_at_barrier(ctx, "rank 0: ctx.ccl.all_gather (pipelined) gave up waiting for rank 1: flag row 2 "
                                    "(program 0, wait 2 of the call) never reached epoch 1",
                               lambda: waits.raise_gave_up(ctx.ccl))
    ctx.barrier()
    ctx.ccl.free()
    return bad


def check_pipelined_no_room(ctx):
    """A pipelined all_reduce or all_gather picked by size whose stage does not fit in the heap runs its
    one-exchange form instead (half the stage or less), right; asked for by Config.pull_segments it raises
    HeapOutOfMemory, the heap as it was."""
    from iris.ccl import builders
    from iris.errors import HeapOutOfMemory
    r, w, dev, bad = ctx.rank, ctx.world, ctx.device, []
    n = 4096  # float32; stages: all_reduce pipelined about 4 n, one exchange 2 n; all_gather 2 w n and 2 n
    xs = [_data((n,), torch.float32, q, 3, dev) for q in range(w)]
    keep = dict(builders.PIPELINE_BYTES)
    ctx.ccl.free()
    hole, fill, size = ctx.empty((3 * n,), dtype=torch.float32), [], 1 << 40  # the only room left, in the end
    while size >= 256:
        try:
            fill.append(ctx.empty((size,), dtype=torch.uint8))
        except HeapOutOfMemory:
            size //= 2
    ctx.free(hole)
    push, gathered = Config(all_reduce_variant="two_shot_push"), _poisoned((w * n,), torch.float32, dev)
    out, want = _poisoned((n,), torch.float32, dev), (_reduce(xs, ReduceOp.SUM), torch.cat(xs))
    try:
        builders.PIPELINE_BYTES.update(ar=0, ag=0)
        for name, got, form, call in (("all_reduce", out, "two_shot_push",
                                       lambda c: ctx.ccl.all_reduce(out, xs[r], config=c or push)),
                                      ("all_gather", gathered, "one_shot",
                                       lambda c: ctx.ccl.all_gather(gathered, xs[r], config=c))):
            try:
                call(dataclasses.replace(push, pull_segments=2))
                bad.append(f"{name} asked to pipeline with no room for its stage did not raise")
            except HeapOutOfMemory:
                pass
            ctx.free(ctx.empty((3 * n,), dtype=torch.float32))  # the room is whole again
            call(None)
            if not _same(got, want[name == "all_gather"]):
                bad.append(f"{name} with no room for its pipelined stage: wrong result")
            if [p.variant for p in ctx.ccl.plans.values()] != [form]:
                bad.append(f"{name} with no room for its pipelined stage planned "
                           f"{[p.variant for p in ctx.ccl.plans.values()]}, not {form}")
            ctx.ccl.free()
    except HeapOutOfMemory as e:
        bad.append(f"no room: {e}")
    finally:
        builders.PIPELINE_BYTES.update(keep)
        ctx.ccl.free()
        for t in fill:
            ctx.free(t)
    return bad


def rank_host(dtypes, reps):
    ctx = iris.iris(heap_size=1 << 24)
    # small blocks: several programs, each with several steps, and a partial last block
    one, two, one_push, two_push = (Config(block_size=16, comm_sms=3, all_reduce_variant=v)
                                    for v in ("one_shot", "two_shot", "one_shot_push", "two_shot_push"))
    bad = check_errors(ctx)
    for dtype in dtypes:
        for cfg in (one, two, one_push, two_push):
            bad += check_all_reduce(ctx, (37,), dtype, cfg)
    for cfg in (one_push, two_push):
        bad += check_all_reduce(ctx, (5, 13), torch.float16, cfg, ReduceOp.MIN)
        bad += check_all_reduce(ctx, (90,), torch.bfloat16, Config(block_size=32, comm_sms=3,
                                all_reduce_variant=cfg.all_reduce_variant), heap=True)
    for dtype, op in ((torch.float32, ReduceOp.MAX), (torch.int32, ReduceOp.MIN)):
        bad += check_all_reduce(ctx, (5, 13), dtype, one, op)
    bad += check_all_reduce(ctx, (5, 13), torch.bfloat16, two, ReduceOp.MAX)
    bad += check_all_reduce(ctx, (5, 13), torch.bfloat16, two, heap=True)
    # chunks (48) not a multiple of the block (32): the last block of a chunk must stop at its end
    bad += check_all_reduce(ctx, (90,), torch.float32, Config(block_size=32, comm_sms=3, all_reduce_variant="two_shot"),
                            heap=True)
    for dtype in dtypes[1::2]:
        bad += check_moves(ctx, (5, 7), dtype, one)
    bad += check_split_broadcast(ctx, one)
    # 4 ranks: test_ccl_variants.py's rank_host
    bad += check_pipelined(ctx, 4, list(PIPELINED)) if ctx.world == 2 else check_pipelined(ctx, 2, [PIPELINED[0]])
    single = Config(block_size=16, comm_sms=1)
    bad += check_repeats(ctx, 45, single, reps)
    for v in ("two_shot", "one_shot_push", "two_shot_push"):
        bad += check_repeats(ctx, 45, Config(block_size=16, comm_sms=1, all_reduce_variant=v), reps // 3)
    bad += check_group(ctx)
    bad += check_spin_limit(ctx)
    bad += check_pipelined_gives_up(ctx) if ctx.world == 2 else []
    bad += check_pipelined_no_room(ctx)
    ctx.close()
    return bad


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dist(ctx):
    """gloo beside the heap, on a port rank 0 found free: jobs of tests running side by side (pytest
    workers) must not meet on one port."""
    import torch.distributed as dist
    port = ctx.broadcast(_free_port() if ctx.rank == 0 else None)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.world)
    return dist


def check_group(ctx):
    """group=: every rank in order (a torch group or a list) takes the whole-job path; over a subset (see
    test_ccl_groups.py) a plain inp is refused naming the fix, and a rank outside the group is refused."""
    dist = _dist(ctx)
    everyone, first = dist.new_group(list(range(ctx.world))), dist.new_group([0])
    bad = []
    x = torch.full((5,), ctx.rank + 1.0, device=ctx.get_device())  # a plain tensor, on the heap's device
    for group in (everyone, list(range(ctx.world))):
        x.fill_(ctx.rank + 1.0)
        ctx.ccl.all_reduce(x, x, group=group)
        if not _same(x, torch.full((5,), ctx.world * (ctx.world + 1) / 2, device=x.device)):
            bad.append(("group of all", x.tolist()))
    words = "ctx.as_symmetric" if ctx.rank == 0 else "not in group"
    try:
        ctx.ccl.all_reduce(x, x, group=first)
        bad.append("a plain inp over a subset group was accepted")
    except CollectiveError as e:
        if words not in str(e):
            bad.append(str(e))
    dist.destroy_process_group()
    return bad


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_host(world):
    # reps: back-to-back calls over one workspace, whose stages alternate by epoch parity: 40 are twenty
    # rounds of both copies here, where ranks meet at every call; races get thousands on GPUs
    dtypes, reps = (DTYPES, 40) if world == 2 else ([torch.float32, torch.bfloat16], 12)
    _spawn_clean(rank_host, world, dtypes, reps)


# -- GPUs: a rank per GPU, large sizes, thousands of calls, CUDA graphs --------------------------------
def _progress(ctx, what):
    import time
    print(f"{time.strftime('%H:%M:%S')} rank {ctx.rank}: {what}", flush=True)


def pipelined_wrong(ctx, rows, cfg, reps):
    """reps back to back all_gathers, all_to_alls, reduce_scatters of (rows) bf16 blocks a rank and
    all_reduces (two_shot_push) of twice that, or of builders.PIPELINE_BYTES["ar"] where cfg is None (the
    pipelined form must be what runs), new data each call from three sets, outputs poisoned, every
    element checked on the device (no host sync between calls); returns the wrong calls and the plans'
    variants."""
    from iris.ccl import builders
    r, w, dev = ctx.rank, ctx.world, ctx.device
    m, c = rows
    wrong = torch.zeros((), dtype=torch.int32, device=dev)
    ran = set()
    for i, mode in enumerate(("ag", "a2a", "rs", "ar")):
        # all_reduce: twice a block where cfg forces the form, else what the default pipelines from
        ar = (2 * m if cfg else -(-builders.PIPELINE_BYTES["ar"] // (2 * c)), c)
        shape = {"ag": (m, c), "a2a": (m, c * w), "rs": (w * m, c), "ar": ar}[mode]
        sets = [[_data(shape, torch.bfloat16, q, 20 * k + i, dev) for q in range(w)] for k in range(3)]
        if mode == "ag":
            call, wants = ctx.ccl.all_gather, [torch.cat(xs) for xs in sets]
        elif mode == "rs":
            call, wants = ctx.ccl.reduce_scatter, [_reduce(xs, ReduceOp.SUM)[r * m:(r + 1) * m] for xs in sets]
        elif mode == "ar":
            two = cfg and dataclasses.replace(cfg, all_reduce_variant="two_shot_push")
            call, wants = (lambda o, x, config: ctx.ccl.all_reduce(o, x, config=two)), [_reduce(xs, ReduceOp.SUM)
                                                                                        for xs in sets]
        else:
            call, wants = ctx.ccl.all_to_all, [torch.cat([x[:, r * c:(r + 1) * c] for x in xs], 1) for xs in sets]
        out = torch.empty_like(wants[0])
        for rep in range(reps):
            out.fill_(POISON)
            call(out, sets[rep % 3][r], config=cfg)
            wrong += (out != wants[rep % 3]).any()
        ran |= {p.variant for k, p in ctx.ccl.plans.items() if k[0] == mode and k[2] == torch.Size(shape)}
    return wrong.item(), ran


def graph_wrong(call, x, out, ranks, rank, times, replays):
    """Captures `times` all_reduce calls (call(), then its out copied back into x) in a CUDA graph and
    replays it with new bf16 data (ranks: the ranks reduced over); returns the number of wrong replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(times):
            call()
            x.copy_(out)
    wrong = 0
    for rep in range(replays):
        xs = [_data(x.shape, torch.bfloat16, q, rep % 5, x.device) for q in ranks]
        x.copy_(xs[ranks.index(rank)])
        out.fill_(POISON)
        g.replay()
        want = xs
        for _ in range(times):
            want = [_reduce(want, ReduceOp.SUM)] * len(ranks)
        wrong += not _same(x, want[0])
    return wrong


def rank_gpu(reps, replays):
    ctx = iris.iris(heap_size=3 << 30)
    r, w, dev = ctx.rank, ctx.world, ctx.device
    bad = check_errors(ctx)
    configs = [Config(all_reduce_variant=v) for v in ("one_shot", "two_shot")] + [None]
    for shape, dtypes in (((1000,), DTYPES), ((4097, 33), DTYPES[:2]), ((3 << 20,), DTYPES[::2])):
        for dtype in dtypes:
            for cfg in configs:
                bad += check_all_reduce(ctx, shape, dtype, cfg)
        _progress(ctx, f"all_reduce {shape} checked")
    for dtype in (torch.float32, torch.int64):
        for cfg in configs[:2]:
            for op in (ReduceOp.MAX, ReduceOp.MIN):
                bad += check_all_reduce(ctx, (1000,), dtype, cfg, op)
    _progress(ctx, "all_reduce checked")
    for shape in ((3 << 20,), (999, 17)):
        for cfg in configs:
            bad += check_all_reduce(ctx, shape, torch.bfloat16, cfg, heap=True, rep=1)
    for rows in ((5, 7), (1000, 129), (4096, 1024)):
        for dtype in (torch.bfloat16, torch.int32):
            bad += check_moves(ctx, rows, dtype)
    _progress(ctx, "heap tensors and moves checked")
    for v in ("one_shot_push", "two_shot_push"):  # not picked by auto yet: a few shapes, plain and heap
        cfg = Config(all_reduce_variant=v)
        bad += check_all_reduce(ctx, (4097, 33), torch.bfloat16, cfg)
        bad += check_all_reduce(ctx, (3 << 20,), torch.float32, cfg)
        bad += check_all_reduce(ctx, (999, 17), torch.bfloat16, cfg, heap=True, rep=1)
    _progress(ctx, "push variants checked")
    # thousands back to back, every result checked on the device (no host sync between calls)
    for n, cfg in ((4096, configs[0]), (1 << 16, configs[1]), (5 << 20, None)):
        xs_all = [[_data((n,), torch.bfloat16, q, rep, dev) for q in range(w)] for rep in range(7)]
        wants = [_reduce(xs, ReduceOp.SUM) for xs in xs_all]
        out, wrong = torch.empty(n, dtype=torch.bfloat16, device=dev), torch.zeros((), dtype=torch.int32, device=dev)
        for rep in range(reps):
            out.fill_(POISON)
            ctx.ccl.all_reduce(out, xs_all[rep % 7][r], config=cfg)
            wrong += (out != wants[rep % 7]).any()
        if wrong.item():
            bad.append(("repeat", n, wrong.item()))
    _progress(ctx, "repeats checked")
    # the pipelined all_gather, all_to_all, reduce_scatter and all_reduce (from builders.PIPELINE_BYTES, or forced):
    # several segments per program, the last program's last one short (a partial block) then empty, 32 MiB and 64 MiB
    # a rank by default (all_reduce 256 MiB)
    ctx.ccl.free()
    for rows, cfg in (((1000, 129), Config(pull_segments=4, block_size=1024, comm_sms=16)), ((16384, 1024), None),
                      ((8192, 4096), None)):
        wrong, ran = pipelined_wrong(ctx, rows, cfg, max(20, reps // 6))
        if wrong or ran != {"pipelined"}:
            bad.append(("pipelined", rows, wrong, ran))
        ctx.ccl.free()
    _progress(ctx, "pipelined all_gather, all_to_all, reduce_scatter and all_reduce checked")
    # CUDA graph: captured once, replayed many times with new data copied into the captured input
    for n, cfg in ((8192, configs[0]), (1 << 20, configs[1]), (3 << 20, None),
                   (3 << 20, Config(all_reduce_variant="two_shot_push", pull_segments=4))):
        x = torch.empty(n, dtype=torch.bfloat16, device=dev)
        out = torch.empty_like(x)
        ctx.ccl.all_reduce_preamble(out, x, config=cfg)
        wrong = graph_wrong(lambda: ctx.ccl.all_reduce(out, x, config=cfg), x, out, list(range(w)), r, 4, replays)
        if wrong:
            bad.append(("graph", n, wrong))
    bad += check_pipelined_no_room(ctx)
    ctx.close()
    return bad


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_collectives_gpu(world):
    # more ranks than GPUs time-slice their spinning kernels: every call waits for the others' turns,
    # so the repeats and replays shrink there (the checks stay the same)
    reps, replays = (3000, 200) if world <= max(2, torch.cuda.device_count()) else (100, 10)
    _spawn_clean(rank_gpu, world, int(os.environ.get("IRIS_CCL_REPS", reps)), replays)


def rank_two_streams(reps):
    """FSDP2's pattern: all-gathers on one stream and reduce-scatters on another, queued without a host
    sync in between, fresh data every call; the context's stream order must keep them apart."""
    ctx = iris.iris(heap_size=1 << 30)
    r, w, dev = ctx.rank, ctx.world, ctx.device
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    bad, rows = [], 4097
    for rep in range(reps):
        ys = [_data((rows, 33), torch.float32, q, rep, dev) for q in range(w)]
        xs = [_data((w * rows, 33), torch.float32, q, rep + 7, dev) for q in range(w)]
        ag = _poisoned((w * rows, 33), torch.float32, dev)
        rs = _poisoned((rows, 33), torch.float32, dev)
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(streams[0]):
            ctx.ccl.all_gather(ag, ys[r])
        with torch.cuda.stream(streams[1]):
            ctx.ccl.reduce_scatter(rs, xs[r])
        for s in streams:
            torch.cuda.current_stream().wait_stream(s)
        if not _same(ag, torch.cat(ys)):
            bad.append(("all_gather", rep))
        if not _same(rs, _reduce(xs, ReduceOp.SUM)[r * rows:(r + 1) * rows]):
            bad.append(("reduce_scatter", rep))
    if ctx.ccl.order.switches < reps:
        bad.append(("stream switches waited for", ctx.ccl.order.switches))
    ctx.close()
    return bad


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_calls_from_two_streams_gpu(world):
    _spawn_clean(rank_two_streams, world, 200)


def rank_captures(replays):
    """Graphs captured on streams of their own between eager calls from two others (iris/ccl/order.py):
    a capture takes no wait on another capture's stream (that invalidated the second capture), two calls
    of one capture from two of its streams wait inside it, the eager chain runs on through the captures,
    and every result and replay is checked."""
    ctx = iris.iris(heap_size=1 << 30)
    r, w, dev, ccl, order = ctx.rank, ctx.world, ctx.device, ctx.ccl, ctx.ccl.order
    main, (s0, s1, s2, s3) = torch.cuda.current_stream(), [torch.cuda.Stream() for _ in range(4)]
    n, bad = 4097 * 33, []
    x, y = torch.empty(n, device=dev), _data((n,), torch.float32, r, 99, dev)
    outs = [_poisoned((n,), torch.float32, dev) for _ in range(6)]
    for out in outs:
        ccl.all_reduce_preamble(out, x)
    for s in (s0, s1, s2, s3):
        s.wait_stream(main)
    with torch.cuda.stream(s0):  # the eager chain: s0, then the captures, then s1
        ccl.all_reduce(outs[4], y)
    graphs = [torch.cuda.CUDAGraph() for _ in range(3)]
    for g, s, out in zip(graphs, (s2, s3), outs):
        with torch.cuda.graph(g, stream=s):
            ccl.all_reduce(out, x)
    before = order.switches
    with torch.cuda.graph(graphs[2], stream=s2):
        s3.wait_stream(s2)  # s3 joins the capture before either call: only the order puts them in sequence
        ccl.all_reduce(outs[2], x)
        with torch.cuda.stream(s3):
            ccl.all_reduce(outs[3], outs[2])
        s2.wait_stream(s3)
    if order.switches != before + 1:
        bad.append(("waits inside the two-stream capture", order.switches - before))
    with torch.cuda.stream(s1):
        ccl.all_reduce(outs[5], outs[4])
    if order.switches != before + 2:
        bad.append(("the eager call after the captures waited for the one before", order.switches - before - 1))
    main.wait_stream(s1)
    want = _reduce([_data((n,), torch.float32, q, 99, dev) for q in range(w)], ReduceOp.SUM)
    if not _same(outs[4], want) or not _same(outs[5], _reduce([want] * w, ReduceOp.SUM)):
        bad.append(("eager results around the captures",))
    for rep in range(replays):
        xs = [_data((n,), torch.float32, q, rep, dev) for q in range(w)]
        x.copy_(xs[r])
        for out in outs[:4]:
            out.fill_(POISON)
        for g in graphs:
            g.replay()
        want = _reduce(xs, ReduceOp.SUM)
        got = [_same(outs[0], want), _same(outs[1], want), _same(outs[2], want),
               _same(outs[3], _reduce([want] * w, ReduceOp.SUM))]
        if not all(got):
            bad.append(("replay", rep, got))
    ctx.close()
    return bad


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_captures_between_streams_gpu(world):
    _spawn_clean(rank_captures, world, 50)
