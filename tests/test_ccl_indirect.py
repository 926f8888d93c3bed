"""ctx.ccl in a job with indirect peers: every collective through the put-based kernel (iris/ccl/kernels/put.py).

On the host, IRIS_CCL_PUTS=1 runs that path over direct peers (the kernel reaches every peer through
iris.put and iris's atomics, so the same kernel runs with NVSHMEM where peers are indirect); on a GPU,
allocator="nvshmem" with IRIS_INDIRECT_PEERS makes peers indirect for real, all of them or some. The
checks are the load/store path's own (test_ccl, test_ccl_groups, test_ccl_rooted, test_ccl_variants):
outputs poisoned, every element compared, whole job and subsets (strided, reordered, single rank)."""
import dataclasses
import os
import time
import warnings

import pytest
import torch

import iris
from iris.ccl import Config, ReduceOp
from iris.heap import reserve as heap_reserve
from iris.errors import IrisError
from test_ccl import POISON, _data, _progress, _reduce, _same, check_all_reduce, check_moves, check_repeats
from test_ccl_groups import Slots, check_calls, check_variant
from test_ccl_rooted import check_barrier_waits, check_mailbox, check_p2p, check_rooted
from test_ccl_variants import check_tile_reduce_scatter


def subsets(world, rank):
    """(group, its global ranks in order) holding this rank: this rank alone and every rank reversed or, on
    4 ranks, [0, 2] (strided) and (3, 1) (a tuple in its own order)."""
    out = [([rank], [rank])]
    out += [([0, 2], [0, 2]), ((3, 1), [3, 1])] if world == 4 else [(list(range(world))[::-1],) * 2]
    return [(g, ranks) for g, ranks in out if rank in ranks]


def check_variants(ctx, shape, cfg):
    """Variants that reach peers by load and store run the put algorithm, with one warning each."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    xs = [_data(shape, torch.float32, q, 7, dev) for q in range(w)]
    bad = []
    for field, value, call, want in (
            ("all_reduce_variant", "ring", lambda c: ctx.ccl.all_reduce(out, xs[r], config=c),
             _reduce(xs, ReduceOp.SUM)),
            ("all_gather_variant", "persistent", lambda c: ctx.ccl.all_gather(out, xs[r], config=c), torch.cat(xs))):
        out = torch.full(want.shape, POISON, dtype=torch.float32, device=dev)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(2):
                call(dataclasses.replace(cfg, **{field: value}))
        named = [s for s in seen if f"{field}={value!r}" in str(s.message)]
        if len(named) != 1 or not _same(out, want):
            bad.append((field, value, len(named), _same(out, want)))
    return bad


def check_preamble_async(ctx, n, cfg):
    """all_reduce_preamble builds the put plan the next call runs; async_op=True changes nothing."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    xs = [_data((n,), torch.float32, q, 9, dev) for q in range(w)]
    out = torch.full((n,), POISON, dtype=torch.float32, device=dev)
    plan = ctx.ccl.all_reduce_preamble(out, xs[r], config=cfg)
    ctx.ccl.all_reduce(out, xs[r], config=cfg, async_op=True)
    bad = [] if _same(out, _reduce(xs, ReduceOp.SUM)) else ["all_reduce after its preamble"]
    if plan.fn.__name__ != "put_kernel" or ctx.ccl.recent["all_reduce"].plan is not plan:
        bad.append(("preamble built", plan.fn.__name__))
    out = torch.full((w * n,), POISON, dtype=torch.float32, device=dev)
    ctx.ccl.all_gather(out, xs[r], config=cfg, async_op=True)
    return bad + ([] if _same(out, torch.cat(xs)) else ["all_gather with async_op=True"])


def check_rounds(ctx, group, ranks, heap):
    """Calls larger than iris's receive area per program (PUT_SLOT): several rounds per call, slots reused
    after their acknowledgement (a group all_reduce, then sendrecv around the group)."""
    r, dev, g = ctx.rank, ctx.device, len(ranks)
    me, n, bad = ranks.index(r), 3 * 4096 + 4, []  # a partial last block, 16-byte aligned halves
    cfg = Config(comm_sms=1)
    for rep in range(2):
        xs = [_data((n,), torch.float32, q, rep, dev) for q in ranks]
        x, out = heap((n,), torch.float32).copy_(xs[me]), torch.full((n,), POISON, dtype=torch.float32, device=dev)
        ctx.ccl.all_reduce(out, x, group=group, config=cfg)
        recv = torch.full((n,), POISON, dtype=torch.float32, device=dev)
        inbox = heap((2 * n,), torch.float32)[n:].fill_(POISON)
        ctx.ccl.sendrecv(xs[me], inbox, dst=(me + 1) % g, src=(me - 1) % g, group=group, config=cfg)
        recv.copy_(inbox)
        if not (_same(out, _reduce(xs, ReduceOp.SUM)) and _same(recv, xs[(me - 1) % g])):
            bad.append(("rounds", tuple(ranks), rep))
    return bad


def check_spin_limit(ctx):
    """Config.spin_limit: rank 0 calls over [1, 0] (a group: it allocates nothing) while rank 1 never does;
    rank 0's program gives up and marks its own received count. Leaves the pair's counts out of step: the
    last call of the job."""
    x = ctx.empty(16, dtype=torch.float32)  # collective: every rank allocates it
    if ctx.rank != 0:
        return []
    ctx.ccl.all_reduce(torch.empty(16), x, group=[1, 0], config=Config(comm_sms=1, spin_limit=20))
    return [] if ctx.ccl.put_state[0, 1, 0].item() < 0 else ["a program whose peer never came did not mark"]


def run_checks(ctx, cfg, dtypes, shapes, more=True, progress=lambda what: None):
    """Every collective over the whole job and over subsets (roots and reductions turn with the group);
    returns failures. shapes: a 1-D and a 2-D shape; more: also repeats, Iris's reduce_scatter layout and
    the variants that stand in."""
    r, w, ccl, bad = ctx.rank, ctx.world, ctx.ccl, []
    if not ccl.puts:
        return ["ctx.ccl does not take the put path"]
    for i, dtype in enumerate(dtypes):
        bad += check_all_reduce(ctx, shapes[0], dtype, dataclasses.replace(cfg, all_reduce_variant="one_shot"))
        bad += check_all_reduce(ctx, shapes[1], dtype, dataclasses.replace(cfg, all_reduce_variant="two_shot"),
                                (ReduceOp.MAX, ReduceOp.MIN)[i % 2], heap=True)
        progress(f"all_reduce {dtype} checked")
    if ccl.recent["all_reduce"].plan.fn.__name__ != "put_kernel":
        bad.append(("all_reduce ran", ccl.recent["all_reduce"].plan.fn.__name__))
    bad += check_moves(ctx, shapes[1], dtypes[-1], cfg)
    if more:
        bad += check_repeats(ctx, shapes[0][0], dataclasses.replace(cfg, all_reduce_variant="two_shot"), 4)
        for dist in (0, 1):
            bad += check_tile_reduce_scatter(ctx, 10, 12, Config(block_size_m=4, block_size_n=4, swizzle_size=2,
                                                                 comm_sms=cfg.comm_sms, all_reduce_distribution=dist))
        bad += check_variants(ctx, shapes[0], cfg)
        bad += check_preamble_async(ctx, shapes[0][0], cfg)
        bad += check_mailbox(ctx, cfg, 0)  # send/recv(p2p_state=): puts and signals through iris's device functions
    progress("whole job checked")
    slots = Slots(ctx, 1, 8 * max(w * shapes[0][0], w * shapes[1][0] * shapes[1][1], 2 * (3 * 4096 + 4)))
    heap = lambda s, d: slots(0, s, d)  # noqa: E731
    for rep, (group, ranks) in enumerate([(None, list(range(w)))] + subsets(w, r)):
        dtype = dtypes[rep % len(dtypes)]
        if group is not None:
            bad += check_calls(ctx, heap, group, ranks, dtype, cfg, rep, shapes)
        if group is not None and more and len(ranks) > 1:  # Iris's reduce_scatter layout over the group
            place = lambda which, shape: (torch.empty(shape, dtype=dtype, device=ctx.device)  # noqa: E731
                                          if which == "o" else heap(shape, dtype))
            bad += check_variant(ctx, place, group, ranks, "rst", "two_shot", Config(
                block_size=cfg.block_size, comm_sms=cfg.comm_sms, block_size_m=2, block_size_n=4, swizzle_size=2),
                ReduceOp.SUM, dtype, rep)
        bad += check_rooted(ctx, heap, group, ranks, dtype, cfg, rep, shapes)
        bad += check_p2p(ctx, heap, group, ranks, dtype, cfg, rep, shapes)
        progress(f"group {ranks} checked")
    group, ranks = subsets(w, r)[-1]
    bad += check_rounds(ctx, group, ranks, heap)
    return bad


def rank_host(dtypes, cfg, more):
    ctx = iris.iris(heap_size=1 << 22)
    bad = run_checks(ctx, cfg, dtypes, ((37,), (5, 7)), more)
    for group, ranks in subsets(ctx.world, ctx.rank)[-1:]:
        bad += check_barrier_waits(ctx, group, ranks)
    if more:
        ctx.barrier()
        bad += check_spin_limit(ctx)
    ctx.close()
    return bad


@pytest.mark.parametrize("world, dtypes, cfg", [
    (2, [torch.float32, torch.bfloat16, torch.int32], Config(block_size=16, comm_sms=2)),  # partial last blocks
    (4, [torch.float32], Config(block_size=32, comm_sms=1))])
def test_every_collective_by_puts_host(world, dtypes, cfg, monkeypatch):
    monkeypatch.setenv("IRIS_CCL_PUTS", "1")
    out = iris.spawn(rank_host, world, args=(dtypes, cfg, world == 2))
    for r, bad in enumerate(out):
        assert not bad, f"rank {r} of {world}: {bad[:10]}"


def rank_path():
    """The kernels each collective runs, and the reserve's size (IRIS_CCL_PUTS as the caller set it)."""
    ctx = iris.iris(heap_size=1 << 20)
    x, out = ctx.zeros(32, dtype=torch.float32), torch.empty(64, dtype=torch.float32)
    ctx.ccl.all_reduce(out[:32], x)
    ran = [ctx.ccl.recent["all_reduce"].plan.fn.__name__]
    ctx.ccl.all_gather(out, x)
    ctx.ccl.all_reduce(out[:32], x, group=[ctx.rank])
    ctx.ccl.reduce(out[:32], x)
    ran += sorted({p.fn.__name__ for p in ctx.ccl.plans.values()} - set(ran))
    puts = ctx.ccl.puts
    reserve = ctx.reserve.nbytes == heap_reserve.size(ctx.world, puts)
    ctx.close()
    return puts, ran, reserve


def test_path_choice(monkeypatch):
    """No indirect peer (and no IRIS_CCL_PUTS): the load/store kernels and the reserve as they were."""
    monkeypatch.delenv("IRIS_CCL_PUTS", raising=False)
    for puts, ran, reserve in iris.spawn(rank_path, 2):
        assert not puts and reserve
        assert ran == ["pull_kernel", "group_kernel", "rooted_kernel"], ran
    monkeypatch.setenv("IRIS_CCL_PUTS", "1")
    for puts, ran, reserve in iris.spawn(rank_path, 2):
        assert puts and reserve and ran == ["put_kernel"], ran


# -- GPU: allocator="nvshmem", peers made indirect by IRIS_INDIRECT_PEERS, several ranks on one GPU ---------------
def check_graph(ctx, n, replays):
    """A whole-job and a group all_reduce captured in one CUDA graph, replayed with new data."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    pair = [r, (r + 1) % w] if r % 2 == 0 else [(r - 1) % w, r]
    pair = pair if w % 2 == 0 else list(range(w))
    x, y = ctx.empty(n, dtype=torch.float32), ctx.empty(n, dtype=torch.float32)
    out, out2 = torch.empty(n, device=dev), torch.empty(n, device=dev)
    ctx.ccl.all_reduce(out, x)  # builds the plans outside capture
    ctx.ccl.all_reduce(out2, y, group=pair)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ctx.ccl.all_reduce(out, x)
        ctx.ccl.all_reduce(out2, y, group=pair)
    wrong = 0
    for rep in range(replays):
        xs = [_data((n,), torch.float32, q, rep, dev) for q in range(w)]
        x.copy_(xs[r])
        y.copy_(xs[r] * 2)
        out.fill_(POISON)
        out2.fill_(POISON)
        g.replay()
        wrong += not (_same(out, _reduce(xs, ReduceOp.SUM)) and _same(out2, _reduce([xs[q] * 2 for q in pair],
                                                                                      ReduceOp.SUM)))
    return [("graph replays wrong", wrong)] if wrong else []


def check_ops_refused(ctx):
    """iris.ops' fused GEMMs load peers directly: refused before launching, naming why."""
    a = torch.ones(8, 8, device=ctx.device)
    try:
        ctx.ops.matmul_all_reduce(torch.empty(8, 8, device=ctx.device), a, a)
    except IrisError as e:
        return [] if "indirect" in str(e) else [("ops error", str(e))]
    return ["matmul_all_reduce ran in a job with indirect peers"]


def rank_gpu(setting, replays):
    ctx = iris.iris(heap_size=1 << 26, allocator="nvshmem")
    r, w = ctx.rank, ctx.world
    progress = lambda what: _progress(ctx, what)  # noqa: E731
    progress(f"IRIS_INDIRECT_PEERS={setting}: indirect peers {[q for q, b in enumerate(ctx.heap.bases) if b == 0]}")
    bad = check_ops_refused(ctx)
    bad += run_checks(ctx, Config(comm_sms=2), [torch.float32], ((36,), (4, 8)), True, progress)
    bad += check_graph(ctx, (1 << 16) + 4, replays)
    progress("graph checked")
    bad += check_all_reduce(ctx, (3 << 18,), torch.float32, Config(comm_sms=8))  # two shots, large
    progress("large all_reduce checked")
    ctx.close()
    return bad


@pytest.mark.gpu
@pytest.mark.parametrize("setting, world", [
    pytest.param("all", 2, id="all-of-2"), pytest.param("1", 3, id="1-of-3"), pytest.param("all", 4, id="all-of-4"),
    pytest.param("0,3", 4, id="0,3-of-4")])
def test_every_collective_over_indirect_peers_gpu(setting, world, monkeypatch):
    from test_indirect import _nvshmem_usable
    why = _nvshmem_usable()
    if why:
        pytest.skip(f"NVSHMEM's device API is not usable here ({why}); pip install 'iris-shmem[nvshmem]'")
    monkeypatch.setenv("IRIS_INDIRECT_PEERS", setting)
    monkeypatch.delenv("IRIS_CCL_PUTS", raising=False)
    start = time.monotonic()
    out = iris.spawn(rank_gpu, world, args=(setting, int(os.environ.get("IRIS_CCL_REPLAYS", 20))),
                     timeout=float(os.environ.get("IRIS_CCL_TIMEOUT", 500)))
    print(f"{setting} on {world} ranks: {time.monotonic() - start:.0f} s", flush=True)
    for r, bad in enumerate(out):
        assert not bad, f"rank {r} of {world} ({setting}): {bad[:10]}"
