"""Every variant a Config names (Iris's and iris's own) on 2 to 4 host ranks, kernels in the interpreter:
each name runs its own kernel (checked on the plan), outputs poisoned, every element compared. Inputs
are small integers (also for floats), so every summation order gives exact results: atomic and
spinlock add in arrival order on a GPU. The GPU half runs the same checks with 2 ranks on one GPU.
Config itself (fields, defaults, mutation, validation) is tested without ranks at the end."""
import pytest
import torch

import iris
from iris.ccl import CollectiveError, Config, ConfigError, GluonUnavailable, ReduceOp
from test_ccl import PIPELINED, check_pipelined

POISON = -77
AR = ("one_shot", "two_shot", "one_shot_push", "two_shot_push", "atomic", "spinlock", "ring")
# the kernel each all_reduce_variant must launch, and the constexprs that tell its algorithm
KERNEL = {"one_shot": ("pull_kernel", {"MODE": "ar"}), "two_shot": ("two_shot_kernel", {}),
          "one_shot_push": ("push_kernel", {"TWO_SHOT": False}), "two_shot_push": ("push_kernel", {"TWO_SHOT": True}),
          "atomic": ("accumulate_kernel", {"LOCK": False}), "spinlock": ("accumulate_kernel", {"LOCK": True}),
          "ring": ("ring_kernel", {})}
AG = ("pull", "persistent", "partitioned", "ring")
# the kernel each all_gather_variant and reduce_scatter_variant must launch
MOVES = {"pull": "pull_kernel", "persistent": "gather_push_kernel", "partitioned": "gather_push_kernel",
         "ring": "ring_gather_kernel", "two_shot": "tile_reduce_scatter_kernel",
         "ring_chunked": "ring_reduce_scatter_kernel"}


def _data(shape, dtype, rank, rep, device):
    """Small integers, different per rank and repetition: exact in every dtype and summation order."""
    g = torch.Generator().manual_seed(100 * rep + rank)
    return torch.randint(-30, 31, shape, generator=g).to(dtype).to(device)


def _sum(xs):
    return sum(x.to(torch.float64) for x in xs).to(xs[0].dtype)


def _runs(ctx, variant, plan):
    name, consts = KERNEL[variant]
    return plan.fn.__name__ == name and all(plan.args[plan.at[k]] == v for k, v in consts.items())


def check_all_reduce(ctx, variant, shape, dtype, cfg, rep=0, heap=False):
    """Out of place (checking that inp is untouched), then in place; and the kernel that ran."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    tag = (variant, tuple(shape), str(dtype), cfg.all_reduce_distribution, "heap" * heap)
    xs = [_data(shape, dtype, q, rep, dev) for q in range(w)]
    want = _sum(xs)
    own = (lambda t: ctx.empty(t.shape, dtype=t.dtype).copy_(t)) if heap else torch.clone
    out, x = own(torch.full(shape, POISON, dtype=dtype, device=dev)), own(xs[r])
    ctx.ccl.all_reduce(out, x, config=cfg)
    bad = [] if torch.equal(out, want) and torch.equal(x, xs[r]) else [tag + ("out", out.flatten()[:6].tolist())]
    if not _runs(ctx, variant, ctx.ccl.recent["all_reduce"].plan):
        bad.append(tag + ("ran", ctx.ccl.recent["all_reduce"].plan.fn.__name__))
    ctx.ccl.all_reduce(x, x, config=cfg)
    return bad + ([] if torch.equal(x, want) else [tag + ("in place", x.flatten()[:6].tolist())])


def _ran(ctx, mode, out, x, cfg, variant):
    """Whether the plan of this whole-job call runs the kernel of its variant (MOVES), or the put kernel
    where the job has indirect peers (ctx.ccl.puts: every call runs it there)."""
    plan = ctx.ccl.plans[(mode, ReduceOp.SUM, x.shape, out.shape, x.dtype, cfg.key(), 0)]
    want = "put_kernel" if ctx.ccl.puts else MOVES[variant]
    return [] if plan.fn.__name__ == want else [(mode, variant, "ran", plan.fn.__name__)]


def check_all_gather(ctx, variant, rows, dtype, cfg, heap=False, reps=1):
    """reps: back to back calls with new data into the same poisoned out (the workspace is reused)."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    shape = (w * rows[0],) + tuple(rows[1:])
    out = ctx.empty(shape, dtype=dtype) if heap else torch.empty(shape, dtype=dtype, device=dev)
    bad = []
    for rep in range(reps):
        xs = [_data(rows, dtype, q, 5 + rep, dev) for q in range(w)]
        out.fill_(POISON)
        ctx.ccl.all_gather(out, xs[r], config=cfg)
        if not torch.equal(out, torch.cat(xs)):
            bad.append(("all_gather", variant, tuple(rows), str(dtype), "heap" * heap, rep))
    return bad + _ran(ctx, "ag", out, xs[r], cfg, variant)


def check_reduce_scatter_rows(ctx, rows, dtype, cfg, reps=1):
    """torch's layout: out (rows) on rank r = rows [r*rows, (r+1)*rows) of the sum of every rank's inp."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    out, bad = torch.empty(rows, dtype=dtype, device=dev), []
    for rep in range(reps):
        xs = [_data((w * rows[0],) + tuple(rows[1:]), dtype, q, 7 + rep, dev) for q in range(w)]
        out.fill_(POISON)
        ctx.ccl.reduce_scatter(out, xs[r], config=cfg)
        if not torch.equal(out, _sum(xs)[r * rows[0]:(r + 1) * rows[0]]):
            bad.append(("reduce_scatter rows", cfg.reduce_scatter_variant, tuple(rows), str(dtype), rep))
    return bad + _ran(ctx, "rs", out, xs[r], cfg, cfg.reduce_scatter_variant)


def owned(m, n, cfg, rank, world):
    """Which elements of an (m, n) tensor lie in rank's tiles in Iris's reduce_scatter layout: tiles of
    block_size_m x block_size_n in Iris's swizzled order (swizzle_size tile rows per group), dealt by
    Config.all_reduce_distribution (0: round robin; 1: contiguous runs)."""
    bm, bn, group = cfg.block_size_m, cfg.block_size_n, cfg.swizzle_size
    grid_m, grid_n = -(-m // bm), -(-n // bn)
    tiles = grid_m * grid_n
    mine = torch.zeros((m, n), dtype=torch.bool)
    for t in range(tiles):
        if (t % world == rank) if cfg.all_reduce_distribution == 0 else (t // -(-tiles // world) == rank):
            first = (t // (group * grid_n)) * group
            rows = min(grid_m - first, group)
            pm, pn = first + (t % (group * grid_n)) % rows, (t % (group * grid_n)) // rows
            mine[pm * bm:(pm + 1) * bm, pn * bn:(pn + 1) * bn] = True
    return mine


def check_tile_reduce_scatter(ctx, m, n, cfg, dtype=torch.float32, rep=0, reps=1):
    """reduce_scatter in Iris's layout (out shaped as inp): this rank's tiles, in Iris's swizzled order,
    hold the sum; every other element of out keeps its poison. reps: back to back calls, new data."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    out, bad = torch.empty((m, n), dtype=dtype, device=dev), []
    mine = owned(m, n, cfg, r, w).to(dev)
    for rep in range(rep, rep + reps):
        xs = [_data((m, n), dtype, q, rep, dev) for q in range(w)]
        out.fill_(POISON)
        ctx.ccl.reduce_scatter(out, xs[r], config=cfg)
        want = torch.where(mine, _sum(xs), torch.full((m, n), POISON, dtype=dtype, device=dev))
        if not torch.equal(out, want):
            bad.append(("reduce_scatter tiles", cfg.reduce_scatter_variant, (m, n),
                        (cfg.block_size_m, cfg.block_size_n, cfg.swizzle_size), cfg.all_reduce_distribution,
                        str(dtype), rep))
    return bad + _ran(ctx, "rst", out, xs[r], cfg, cfg.reduce_scatter_variant)


def check_repeats(ctx, variant, n, cfg, reps):
    """Back to back calls with new data: the workspace (flags, locks, ring slots) is reused."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    bad = []
    out = torch.empty(n, dtype=torch.float32, device=dev)
    for rep in range(reps):
        xs = [_data((n,), torch.float32, q, rep, dev) for q in range(w)]
        out.fill_(POISON)
        ctx.ccl.all_reduce(out, xs[r], config=cfg)
        if not torch.equal(out, _sum(xs)):
            bad.append(("repeat", variant, rep))
    return bad


def check_mutation(ctx):
    """Config is mutable as Iris's: a field set after construction takes effect at the next call, and a bad
    one is refused there, naming the field and the values it may take."""
    dev, bad = ctx.device, []
    cfg = Config(block_size_m=4, block_size_n=4, comm_sms=2, all_reduce_variant="two_shot")
    x, out = _data((40,), torch.float32, ctx.rank, 1, dev), torch.empty(40, device=dev)
    ctx.ccl.all_reduce(out, x, config=cfg)
    first = ctx.ccl.recent["all_reduce"].plan
    cfg.all_reduce_distribution = 0
    ctx.ccl.all_reduce(out, x, config=cfg)
    plan = ctx.ccl.recent["all_reduce"].plan
    if plan is first or plan.args[plan.at["STRIDED"]] is not True:
        bad.append("all_reduce_distribution = 0 after construction did not reach the kernel")
    cfg.all_reduce_variant = "ring"
    out.fill_(POISON)
    ctx.ccl.all_reduce(out, x, config=cfg)
    if ctx.ccl.recent["all_reduce"].plan.fn.__name__ != "ring_kernel":
        bad.append("all_reduce_variant = 'ring' after construction did not run the ring")
    for field, value, words in (("all_reduce_distribution", 2, "all_reduce_distribution must be 0"),
                                ("all_reduce_variant", "bogus", "'atomic', 'ring'"),
                                ("comm_sms", 0, "comm_sms must be an int >= 1"),
                                ("block_size_n", 48, "block_size_n must be a power of two")):
        c = Config(comm_sms=2)
        setattr(c, field, value)
        try:
            ctx.ccl.all_reduce(out, x, config=c)
            bad.append(f"{field}={value!r} was accepted")
        except ConfigError as e:
            if words not in str(e):
                bad.append(str(e))
    return bad


def check_refusals(ctx):
    """Variant-specific refusals, raised before anything is allocated."""
    live = set(ctx.heap.alloc.offsets.live)
    dev, w, bad = ctx.device, ctx.world, []
    x = torch.ones(8, device=dev)
    out = torch.empty(w * 8, device=dev)
    cases = [
        (lambda: ctx.ccl.all_reduce(x, x, op=ReduceOp.MAX, config=Config(all_reduce_variant="atomic")),
         CollectiveError, "sum only"),
        (lambda: ctx.ccl.all_reduce(x, x, config=Config(all_reduce_variant="ring", all_reduce_num_rings=3,
                                                        comm_sms=2)), ConfigError, "all_reduce_num_rings"),
        (lambda: ctx.ccl.all_gather(out, x, config=Config(all_gather_variant="partitioned", comm_sms=w + 1)),
         ConfigError, f"multiple of the {w} ranks"),
        (lambda: Config(all_gather_variant="tdm"), ConfigError, "use_gluon=True"),
        (lambda: ctx.ccl.all_reduce(x, x, config=Config(use_gluon=True)), ConfigError, "no Gluon kernel"),
        (lambda: ctx.ccl.all_reduce(x, x, group=[0], config=Config(all_reduce_variant="ring")),
         CollectiveError, "not in group") if ctx.rank else
        (lambda: ctx.ccl.all_reduce(x, x, group=[0], config=Config(all_reduce_variant="atomic")),
         CollectiveError, "stores into the members' out"),
    ]
    if dev.type != "cuda":
        cases.append((lambda: ctx.ccl.all_gather(out, x, config=Config(use_gluon=True)), GluonUnavailable,
                      "Gluon kernels need a GPU"))
    for i, (call, kind, words) in enumerate(cases):
        try:
            call()
            bad.append((i, "no error"))
        except kind as e:
            if words not in str(e):
                bad.append((i, str(e)))
    if set(ctx.heap.alloc.offsets.live) != live:
        bad.append("a refused call changed the heap")
    return bad


def rank_host(dtypes, reps, full):
    """full: also heap tensors, both distributions, two rings, max, mutation (2 ranks; 3 and 4 run each
    variant once: the machine is small)."""
    ctx = iris.iris(heap_size=1 << 24)
    # tiny blocks and tiles: several programs, several steps each, a partial last block or tile
    tiled = dict(block_size_m=4, block_size_n=4, comm_sms=3)
    bad = check_refusals(ctx) if full else []
    for v in AR:
        flat = dict(block_size=16) if v not in ("atomic", "spinlock", "ring") else {}
        for dtype in dtypes:
            bad += check_all_reduce(ctx, v, (37,), dtype, Config(all_reduce_variant=v, all_reduce_distribution=0,
                                                                 **tiled, **flat))
    for v in AG:
        cfg = Config(all_gather_variant=v, block_size=16, comm_sms=2 * ctx.world)
        bad += check_all_gather(ctx, v, (5, 7), dtypes[0], cfg, reps=2 if v == "ring" else 1)
        bad += check_all_gather(ctx, v, (3, 11), torch.float32, cfg, heap=True)
    ring_rs = Config(reduce_scatter_variant="ring_chunked", block_size=16, comm_sms=2)
    bad += check_reduce_scatter_rows(ctx, (3, 13), dtypes[-1], ring_rs, reps=2)
    for v in ("atomic", "spinlock", "ring", "two_shot"):
        bad += check_repeats(ctx, v, 45, Config(all_reduce_variant=v, block_size=16, comm_sms=1,
                                                all_reduce_distribution=0), reps)
    for dist in (0, 1):
        for v in ("two_shot", "ring_chunked"):
            bad += check_tile_reduce_scatter(ctx, 13, 21, Config(block_size_m=4, block_size_n=8, swizzle_size=2,
                                                                 all_reduce_distribution=dist, comm_sms=2,
                                                                 reduce_scatter_variant=v),
                                             reps=2 if v == "ring_chunked" and dist else 1)
    if full:
        for v in ("two_shot", "ring_chunked"):
            bad += check_tile_reduce_scatter(ctx, 9, 16, Config(block_size_m=4, block_size_n=4, comm_sms=3,
                                                                reduce_scatter_variant=v), torch.bfloat16, rep=1)
        cfg = Config(all_reduce_variant="two_shot", block_size=16, comm_sms=2)
        bad += check_all_reduce(ctx, "two_shot", (5, 19), torch.float32, cfg)
        bad += check_all_reduce(ctx, "two_shot", (5, 19), torch.bfloat16, cfg, heap=True)
        for v in ("atomic", "spinlock", "ring"):
            bad += check_all_reduce(ctx, v, (3, 13), torch.float16, Config(all_reduce_variant=v, **tiled), heap=True)
        ring2 = Config(all_reduce_variant="ring", all_reduce_num_rings=2, **tiled)
        bad += check_all_reduce(ctx, "ring", (70,), torch.int32, ring2)
        x, out = _data((5, 7), torch.int32, ctx.rank, 9, ctx.device), torch.full((5, 7), POISON, dtype=torch.int32)
        ctx.ccl.all_reduce(out, x, op=ReduceOp.MAX, config=Config(all_reduce_variant="ring", **tiled))
        want = torch.stack([_data((5, 7), torch.int32, q, 9, ctx.device) for q in range(ctx.world)]).amax(0)
        bad += [] if torch.equal(out, want) else [("ring max", out.flatten()[:6].tolist())]
        bad += check_all_gather(ctx, "partitioned", (5, 7), torch.int64, Config(all_gather_variant="partitioned",
                                                                                 block_size=16, comm_sms=2))
        bad += check_mutation(ctx)
    if ctx.world == 4:  # test_ccl.py's test_collectives_host runs it at 2 and 3 ranks
        bad += check_pipelined(ctx, 2, [PIPELINED[0]], one=False)
    ctx.close()
    return bad


@pytest.mark.parametrize("world", [2, 3, 4])
def test_variants_host(world):
    full = world == 2
    dtypes = [torch.float32, torch.bfloat16, torch.int64] if full else [torch.float32]
    out = iris.spawn(rank_host, world, args=(dtypes, 4 if full else 2, full))
    for r, bad in enumerate(out):
        assert not bad, f"rank {r} of {world}: {bad[:10]}"


def rank_gpu():
    """GPU sizes, few repeats: with 2 ranks on one GPU the ranks' kernels time-slice, and every ring hop
    or flag exchange waits for the other rank's turn."""
    ctx = iris.iris(heap_size=1 << 30)
    bad = check_refusals(ctx)
    spin = dict(spin_limit=1 << 24)  # a wait that never ends shows as wrong data, not a hung test
    for v in AR:
        for shape, dtype in (((1000,), torch.float32), ((4097, 33), torch.bfloat16), ((999, 17), torch.int32)):
            bad += check_all_reduce(ctx, v, shape, dtype, Config(all_reduce_variant=v, **spin))
        bad += check_all_reduce(ctx, v, (999, 17), torch.bfloat16, Config(all_reduce_variant=v, **spin), heap=True)
        bad += check_repeats(ctx, v, 1 << 16, Config(all_reduce_variant=v, **spin), 20)
    bad += check_all_reduce(ctx, "two_shot", (1 << 20,), torch.float32,
                            Config(all_reduce_variant="two_shot", all_reduce_distribution=0, **spin))
    bad += check_all_reduce(ctx, "ring", (1 << 18,), torch.float32, Config(all_reduce_variant="ring",
                                                                           all_reduce_num_rings=4, **spin))
    for v in ("pull", "persistent", "partitioned"):  # ring: rank_gpu_rings
        for rows in ((5, 7), (1000, 129)):
            bad += check_all_gather(ctx, v, rows, torch.bfloat16, Config(all_gather_variant=v, comm_sms=64, **spin))
        bad += check_all_gather(ctx, v, (1000, 129), torch.float32, Config(all_gather_variant=v, **spin), heap=True)
    for dist in (0, 1):
        bad += check_tile_reduce_scatter(ctx, 1000, 129, Config(all_reduce_distribution=dist, **spin))
    bad += check_mutation(ctx)
    ctx.close()
    bad += rank_gpu_rings()
    return bad


def rank_gpu_rings():
    """all_gather ring and reduce_scatter ring_chunked (both layouts, both distributions) at GPU sizes:
    plain and heap tensors, several calls in a row with new data, a partial last block or tile."""
    ctx = iris.iris(heap_size=1 << 30)
    spin = dict(spin_limit=1 << 24)
    bad = []
    for rows, dtype in (((5, 7), torch.bfloat16), ((1000, 129), torch.bfloat16), ((3, 100003), torch.float32)):
        bad += check_all_gather(ctx, "ring", rows, dtype, Config(all_gather_variant="ring", comm_sms=64, **spin),
                                reps=3)
    bad += check_all_gather(ctx, "ring", (1000, 129), torch.float32, Config(all_gather_variant="ring", **spin),
                            heap=True, reps=5)
    for dist in (0, 1):
        bad += check_tile_reduce_scatter(ctx, 1000, 129, Config(all_reduce_distribution=dist, **spin,
                                                                reduce_scatter_variant="ring_chunked"), reps=3)
    for rows, dtype in (((999, 17), torch.bfloat16), ((4099,), torch.int32), ((5, 3), torch.float32)):
        bad += check_reduce_scatter_rows(ctx, rows, dtype, Config(reduce_scatter_variant="ring_chunked", **spin),
                                         reps=5)
    ctx.close()
    return bad


@pytest.mark.gpu
def test_variants_gpu():
    """2 ranks on the first GPU (or one each where there are two): every variant at GPU sizes, races for real."""
    out = iris.spawn(rank_gpu, 2)
    for r, bad in enumerate(out):
        assert not bad, f"rank {r} of 2: {bad[:10]}"


@pytest.mark.gpu
def test_ring_variants_gpu():
    """Only the ring all_gather and ring_chunked reduce_scatter of test_variants_gpu, 2 ranks."""
    out = iris.spawn(rank_gpu_rings, 2)
    for r, bad in enumerate(out):
        assert not bad, f"rank {r} of 2: {bad[:10]}"


# -- Config without ranks ---------------------------------------------------------------------------
def test_config_fields_and_defaults():
    c = Config()
    for name, value in (("block_size_m", 32), ("block_size_n", 64), ("swizzle_size", 4), ("num_xcds", 1),
                        ("use_gluon", False), ("all_gather_variant", "pull"), ("all_to_all_variant", "default"),
                        ("all_reduce_variant", "auto"), ("all_reduce_distribution", 1), ("all_reduce_num_rings", 1),
                        ("all_reduce_ring_slice_n", 64), ("reduce_scatter_variant", "two_shot"), ("num_stages", 1),
                        ("threads_per_warp", 32), ("waves_per_eu", 0), ("block_size", 0), ("pull_segments", 0),
                        ("spin_limit", 1 << 28)):
        assert getattr(c, name) == value, (name, getattr(c, name))
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 4
    assert c.comm_sms == sms and c.chunk_size == min(16, sms)
    assert Config(comm_sms=64, swizzle_size=6).chunk_size == 36
    assert min(2, c.comm_sms) == 2  # as Iris's tests use it for all_reduce_num_rings


def test_config_mutation_changes_key():
    c = Config(comm_sms=8)
    k = c.key()
    assert c.key() is k  # cached while nothing changes
    c.all_reduce_distribution = 0
    assert c.key() != k
    c.block_size_n = 16  # smaller than the slice set at construction: Iris accepts it, so does iris
    c.key()
    c.all_reduce_variant = "nope"
    with pytest.raises(ConfigError, match="all_reduce_variant must be one of"):
        c.key()


@pytest.mark.parametrize("kwargs, words", [
    (dict(all_reduce_variant="fast"), "all_reduce_variant must be one of 'auto', 'atomic', 'ring'"),
    (dict(all_gather_variant="chain"), "all_gather_variant must be one of 'pull', 'persistent', 'partitioned', "
                                       "'ring'"),
    (dict(all_to_all_variant="tdm"), "use_gluon=True"),
    (dict(reduce_scatter_variant="ring"), "reduce_scatter_variant must be one of 'two_shot', 'ring_chunked'"),
    (dict(all_reduce_distribution=2), "0 (blocks strided across ranks) or 1"),
    (dict(block_size_n=64, all_reduce_ring_slice_n=128), "power of two dividing block_size_n"),
    (dict(all_reduce_ring_slice_n=24), "power of two dividing block_size_n"),
    (dict(threads_per_warp=16), "threads_per_warp must be 32"),
    (dict(block_size_m=0), "block_size_m must be an int >= 1"),
    (dict(num_warps=3), "num_warps must be a power of two"),
    (dict(block_size=100), "power of two"),
    (dict(use_gluon=1), "use_gluon must be True or False"),
    (dict(pull_segments=-1), "pull_segments must be an int >= 0"),
])
def test_config_refuses(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Config(**kwargs)


def test_config_accepts_iris_only_fields():
    c = Config(num_xcds=8, waves_per_eu=2, threads_per_warp=64, use_gluon=True, all_gather_variant="tdm",
               all_to_all_variant="tdm", chunk_size=3, swizzle_size=8, num_stages=2, num_warps=4)
    assert (c.num_xcds, c.waves_per_eu, c.chunk_size) == (8, 2, 3)

