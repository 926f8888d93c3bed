"""Fused GEMM + communication (ctx.ops) on real ranks, checked element by element against torch's
matmul plus the collective done by hand (every rank builds every rank's inputs from one seed)."""
import dataclasses
import os

import pytest
import torch

import iris
from iris.ops import OP_NAMES, FusedConfig, matmul
from iris.ops.owned_tiles import owned_range

TINY = FusedConfig(block_size_m=16, block_size_n=16, block_size_k=16)
TOL = {torch.bfloat16: dict(rtol=2e-2, atol=6e-2), torch.float16: dict(rtol=4e-3, atol=1e-2)}
EPS = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}  # one ulp, relative


def _inputs(world, shapes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(*s, generator=g).to(dtype) for s in shapes] for _ in range(world)]


def _close(name, got, want, dtype, partial_scale=0.0):
    """got within one ulp of want (plus one ulp of each rank's partial where partials were rounded
    to dtype and summed, as NCCL's all_reduce of matmul outputs does: their rounding may differ)."""
    got = got.float().cpu()
    if torch.isnan(got).any():
        return f"{name}: {int(torch.isnan(got).sum())} elements never written (still NaN)"
    bad = (got - want).abs() > EPS[dtype] * (want.abs() + partial_scale) + TOL[dtype]["atol"] / 4
    if bad.any():
        i = bad.nonzero()[0].tolist()
        return (f"{name}: {int(bad.sum())} elements off, max error {(got - want).abs().max().item():.4g}; "
                f"at {i}: {got[tuple(i)].item()} vs {want[tuple(i)].item()}")
    return None


def rank_ops(dtype, M, N, K, config, heap_size, bad_shapes=False):
    ctx = iris.iris(heap_size=heap_size)
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    dev = ctx.get_device()
    errors = _bad_shapes(ctx) if bad_shapes else []
    streamed = FusedConfig(variant="streamed", chunks=3)  # cuBLAS by chunks + copy-engine transfers
    via_ccl = FusedConfig(variant="streamed", chunks=2, comm_sms=2)  # chunks reduced by ctx.ccl.all_reduce
    unfused = FusedConfig(variant="ccl")  # the GEMM, then ctx.ccl's collective
    for call, seed in enumerate((1, 2)):  # twice: the second call reuses the workspace, next epoch
        m = M // w
        for cfg in (config, streamed, unfused):
            # all_gather_matmul: A row-sharded (m x K per rank), B replicated
            ins = _inputs(w, [(m, K)], dtype, seed)
            Bg = torch.randn(K, N, generator=torch.Generator().manual_seed(seed + 99)).to(dtype)
            want = torch.cat([x[0].float() for x in ins]) @ Bg.float()
            out = torch.full((w * m, N), float("nan"), dtype=dtype, device=dev)
            Bt = Bg.t().contiguous().to(dev).t() if call else Bg.to(dev)  # second call: B column-major
            ctx.ops.all_gather_matmul(out, ins[r][0].to(dev), Bt, config=cfg)
            errors.append(_close(f"all_gather_matmul {cfg} call {call}", out, want, dtype))
            # matmul_all_reduce / matmul_reduce_scatter: row-parallel, A (M x k), B (k x N) per rank
            k = K // w
            ins = _inputs(w, [(M, k), (k, N)], dtype, seed + 7)
            parts = [x[0].float() @ x[1].float() for x in ins]
            want = sum(p.to(dtype).float() for p in parts)  # the collective by hand: rounded partials, summed
            scale = w * max(p.abs().max().item() for p in parts)
            out = torch.full((M, N), float("nan"), dtype=dtype, device=dev)
            A = ins[r][0].t().contiguous().to(dev).t() if call else ins[r][0].to(dev)  # second call: A column-major
            one_shot = dataclasses.replace(cfg, all_reduce_variant="one_shot") if cfg is not None else None
            for c in (cfg, via_ccl) if cfg is streamed else (cfg,) if cfg is None else (cfg, one_shot):
                out.fill_(float("nan"))
                ctx.ops.matmul_all_reduce(out, A, ins[r][1].to(dev), config=c)
                errors.append(_close(f"matmul_all_reduce {c} call {call}", out, want, dtype, scale))
            out = torch.full((m, N), float("nan"), dtype=dtype, device=dev)
            ctx.ops.matmul_reduce_scatter(out, A, ins[r][1].to(dev), config=cfg)
            errors.append(_close(f"matmul_reduce_scatter {cfg} call {call}", out, want[r * m:(r + 1) * m], dtype,
                                 scale))
            if cfg is not streamed and cfg is not unfused:  # Iris's layout: output M x N, this rank's tiles
                out = torch.full((M, N), float("nan"), dtype=dtype, device=dev)
                ctx.ops.matmul_reduce_scatter(out, A, ins[r][1].to(dev), config=cfg)
                bm, bn = (cfg.block_size_m, cfg.block_size_n) if cfg is not None else (256, 64)
                first, count = owned_range(M, N, bm, bn, r, w)
                mine = torch.zeros(M, N, dtype=torch.bool)
                for t in range(first, first + count):
                    pm, pn = divmod(t, -(-N // bn))
                    mine[pm * bm:(pm + 1) * bm, pn * bn:(pn + 1) * bn] = True
                got = torch.where(mine, out.float().cpu(), want)
                errors.append(_close(f"matmul_reduce_scatter (tiles) {cfg} call {call}", got, want, dtype, scale))
        # matmul_all_gather: A row-sharded, output on the heap; then with each rank's own bias (m values)
        ins = _inputs(w, [(m, K), (m,)], dtype, seed + 13)
        want = torch.cat([x[0].float() for x in ins]) @ Bg.float()
        out = ctx.full((w * m, N), float("nan"), dtype=dtype)
        biased = want + torch.cat([x[1].float() for x in ins])[:, None]
        for cfg in (config, streamed, unfused):
            out.fill_(float("nan"))
            ctx.ops.matmul_all_gather(out, ins[r][0].to(dev), Bg.to(dev), config=cfg)
            errors.append(_close(f"matmul_all_gather {cfg} call {call}", out, want, dtype))
            out.fill_(float("nan"))
            iris.ops.matmul_all_gather(ctx, out, ins[r][0].to(dev), Bg.to(dev), bias=ins[r][1].to(dev), config=cfg)
            errors.append(_close(f"matmul_all_gather bias {cfg} call {call}", out, biased, dtype))
    ctx.barrier()
    if dev.type == "cpu":  # every flag a streamed call set was consumed (a flag left set would let a wait pass early)
        left = [ws["kind"] for ws in ctx.ops._workspaces.values() if ws.get("op") == "streamed"
                and bool(ws["flags"].ne(0).any())]
        if left:
            errors.append(f"streamed workspaces with flags still set after their calls: {left}")
    ctx.close()
    return [e for e in errors if e]


def _bad_shapes(ctx):
    """Each bad call must raise naming the problem, before it allocates anything on the heap."""
    w, dev = ctx.get_num_ranks(), ctx.get_device()
    heap_out = ctx.empty((8 * w, 5), dtype=torch.float16)
    A, B = torch.randn(8, 6, device=dev).half(), torch.randn(6, 5, device=dev).half()
    other_ws = ctx.ops.matmul_all_reduce_preamble(torch.empty(8, 4, device=dev).half(), A, B[:, :4])
    A2, B2, C2 = torch.randn(40, 16, device=dev).half(), torch.randn(16, 40, device=dev).half(), torch.empty(
        40, 40, device=dev).half()
    tiles = dict(block_size_k=16, all_reduce_variant="one_shot")
    big, small = FusedConfig(block_size_m=32, block_size_n=32, **tiles), FusedConfig(block_size_m=16, block_size_n=16,
                                                                                     **tiles)
    big_ws = ctx.ops.matmul_all_reduce_preamble(C2, A2, B2, config=big)
    # matmul_reduce_scatter's workspaces of 32-tiles: Iris's layout (40 x 40: 4 tiles, 9 of 16), this rank's rows
    # (40/w x 40), and the tile API's
    rs_ws = ctx.ops.matmul_reduce_scatter_preamble(C2, A2, B2, config=big)
    m = 40 // w
    rows = torch.empty(m, 40, device=dev).half()
    rs_rows = ctx.ops.matmul_reduce_scatter_preamble(rows, A2, B2, config=big)
    api, api_small = (dataclasses.replace(c, variant="tiles") for c in (big, small))
    rs_api = ctx.ops.matmul_reduce_scatter_preamble(C2, A2, B2, config=api)
    rs_small = ctx.ops.matmul_reduce_scatter_preamble(C2, A2, B2, config=small)
    live = set(ctx.heap.alloc.offsets.live)
    cases = [
        ("B needs 6 rows", ctx.ops.all_gather_matmul, torch.empty(8 * w, 5, device=dev).half(), A, B[:5]),
        ("output must be", ctx.ops.all_gather_matmul, torch.empty(8, 5, device=dev).half(), A, B),
        ("torch.float16 or torch.float32", ctx.ops.matmul_all_reduce, torch.empty(8, 5, device=dev).double(),
         A.double(), B.double()),
        ("Lock array too small: have 4 but need 9", lambda o, a, b: ctx.ops.matmul_all_reduce(
            o, a, b, config=small, workspace=big_ws), C2, A2, B2),
        ("matmul_reduce_scatter: Lock array too small: have 4 but need 9 for block_size_m=16, block_size_n=16",
         lambda o, a, b: ctx.ops.matmul_reduce_scatter_preamble(o, a, b, config=small, workspace=rs_ws), C2, A2, B2),
        ("Lock array too small: have 4 but need 9", lambda o, a, b: iris.ops.matmul_reduce_scatter(
            ctx, o, a, b, config=small, workspace=rs_ws), C2, A2, B2),
        (f"Lock array too small: have {-(-m // 32) * 2} but need {-(-m // 16) * 3}",
         lambda o, a, b: ctx.ops.matmul_reduce_scatter_preamble(o, a, b, config=small, workspace=rs_rows), rows, A2,
         B2),
        ("Lock array too small: have 4 but need 9", lambda o, a, b: ctx.ops.matmul_reduce_scatter_preamble(
            o, a, b, config=api_small, workspace=rs_api), C2, A2, B2),
        ("workspace was built for matmul_all_reduce", lambda o, a, b: ctx.ops.matmul_reduce_scatter(
            o, a, b, config=big, workspace=big_ws), C2, A2, B2),
        ("workspace was built for", lambda o, a, b: ctx.ops.matmul_all_reduce(o, a, b, workspace=other_ws),
         torch.empty(8, 5, device=dev).half(), A, B),
        ("bias must be a 1-D float tensor of A_local's 8 rows", lambda o, a, b: ctx.ops.matmul_all_gather(
            o, a, b, bias=torch.zeros(8 * w, device=dev)), heap_out, A, B),
        (f"do not split over {w}", ctx.ops.matmul_reduce_scatter, torch.empty(3, 5, device=dev).half(), A[:7], B),
        ("heap tensor", ctx.ops.matmul_all_gather, torch.empty(8 * w, 5, device=dev).half(), A, B),
        ("share a dtype", ctx.ops.matmul_all_reduce, torch.empty(8, 5, device=dev).half(), A, B.bfloat16()),
    ]
    errors = []
    for want, fn, o, a, b in cases:
        try:
            fn(o, a, b)
            errors.append(f"no error where {want!r} was expected")
        except (ValueError, TypeError) as e:
            if want not in str(e):
                errors.append(f"expected {want!r} in {str(e)!r}")
    if set(ctx.heap.alloc.offsets.live) != live:
        errors.append("a rejected call allocated on the heap")
    # as Iris's, a preamble passed a workspace of another config returns its own config's where it does not raise:
    # matmul_all_reduce's always, matmul_reduce_scatter's where the locks cover that config's tiles
    if ctx.ops.matmul_all_reduce_preamble(C2, A2, B2, config=small, workspace=big_ws) is big_ws:
        errors.append("matmul_all_reduce_preamble returned a workspace of 32-tiles for 16-tiles")
    if ctx.ops.matmul_reduce_scatter_preamble(C2, A2, B2, config=big, workspace=rs_small) is not rs_ws:
        errors.append("matmul_reduce_scatter_preamble did not return the workspace of its config")
    empty = iris.ops.FusedWorkspace()
    if ctx.ops.matmul_reduce_scatter_preamble(C2, A2, B2, config=big, workspace=empty) is not empty or not empty:
        errors.append("matmul_reduce_scatter_preamble did not fill the empty FusedWorkspace it was passed")
    return errors


@pytest.mark.parametrize("world,dtype", [(2, torch.bfloat16), (3, torch.float16)])
def test_fused_ops_match_torch(world, dtype):
    # 48 x 40 x 24 in 16-tiles: no dimension divides (per-rank rows 24 or 16, K shards 12 or 8); world 2
    # also checks that bad shapes raise before allocating
    out = iris.spawn(rank_ops, world, args=(dtype, 48, 40, 24, TINY, 1 << 24, world == 2))
    for r, errs in enumerate(out):
        assert not errs, f"rank {r}: {errs}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,M", [(torch.bfloat16, 1040), (torch.float16, 1032)])
def test_fused_ops_gpu_default_tiles(dtype, M):
    """The GPU tiles (TMA where the strides allow, pointers where a K shard of 388 or 194 does not), odd
    sizes. A rank's M / world rows of matmul_reduce_scatter: 520 (2 ranks) and 260 (4) of 1040, 516 and 258
    of 1032; a column-major A is read by TMA only where they are a 16-byte step."""
    out = iris.spawn(rank_ops, min(torch.cuda.device_count(), 4) if torch.cuda.device_count() > 1 else 2,
                     args=(dtype, M, 1000, 776, None, 1 << 27))
    for r, errs in enumerate(out):
        assert not errs, f"rank {r}: {errs}"


def rank_gather_k_repeats(dtype):
    """all_gather_matmul in Iris's layout (A sharded by columns) called again and again: new data in the same
    tensors (its GEMM's launch is remembered), then another output tensor (built anew); every call right."""
    ctx = iris.iris(heap_size=1 << 24)
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    m, kl, n = 24, 16, 40
    A, B = torch.empty(m, kl, dtype=dtype, device=dev), torch.empty(w * kl, n, dtype=dtype, device=dev)
    outs, errors = [torch.empty(m, n, dtype=dtype, device=dev) for _ in range(2)], []
    for rep, out in enumerate([outs[0]] * 3 + [outs[1]]):
        ins = _inputs(w, [(m, kl)], dtype, 50 + rep)
        Bg = torch.randn(w * kl, n, generator=torch.Generator().manual_seed(60 + rep)).to(dtype)
        A.copy_(ins[r][0]), B.copy_(Bg)
        out.fill_(float("nan"))
        ctx.ops.all_gather_matmul(out, A, B)
        want = torch.cat([x[0].float() for x in ins], dim=1) @ Bg.float()
        errors.append(_close(f"all_gather_matmul (A by columns) call {rep}", out, want, dtype))
    ctx.close()
    return [e for e in errors if e]


def test_gather_k_repeated_calls():
    for r, errs in enumerate(iris.spawn(rank_gather_k_repeats, 2, args=(torch.float16,))):
        assert not errs, f"rank {r}: {errs}"


def test_matmul_world_one_transposed_and_odd():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for dtype in (torch.bfloat16, torch.float16):
        A = torch.randn(33, 50, device=dev).to(dtype)
        B = torch.randn(50, 17, device=dev).to(dtype)
        for a, b in ((A, B), (A.t().contiguous().t(), B), (A, B.t().contiguous().t())):
            out = torch.full((33, 17), float("nan"), dtype=dtype, device=dev)
            matmul(a, b, out=out, config=TINY)
            assert _close("matmul", out, (a.float() @ b.float()).cpu(), dtype) is None
    with pytest.raises(ValueError, match="B needs 50 rows"):
        matmul(A, B[:49])
    with pytest.raises(ValueError, match="'streamed' or 'ccl'"):
        FusedConfig(variant="stream")
    cfg = FusedConfig()  # Iris's defaults, mutable; validate() checks what was set since
    assert (cfg.block_size_m, cfg.block_size_n, cfg.block_size_k, cfg.all_reduce_variant) == (256, 64, 64, "two_shot")
    cfg.all_reduce_variant = "spin"
    with pytest.raises(ValueError, match="all_reduce_variant"):
        cfg.validate(world_size=2)


def rank_ops_repeat(dtype, M, N, K, reps, config=None):
    """The same tensors called again and again with new data: from the third call on, ops replay a
    captured graph (iris/ccl/launch.py; the streamed and ccl variants' whole sequence, iris/ops/streamed.py),
    which must read the new data and advance its epochs. Then the caller captures the same calls in a graph
    of its own, on another stream than the ops' captures (iris/ccl/order.py), and replays it."""
    ctx = iris.iris(heap_size=1 << 28)
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    m, k = M // w, K // w
    a_rows, b_full = torch.empty(m, K, dtype=dtype, device=dev), torch.empty(K, N, dtype=dtype, device=dev)
    a_cols, b_rows = torch.empty(M, k, dtype=dtype, device=dev), torch.empty(k, N, dtype=dtype, device=dev)
    outs = {"ag": torch.empty(w * m, N, dtype=dtype, device=dev), "ar": torch.empty(M, N, dtype=dtype, device=dev),
            "rs": torch.empty(m, N, dtype=dtype, device=dev), "mag": ctx.empty((w * m, N), dtype=dtype)}
    bias = torch.empty(m, dtype=dtype, device=dev)  # matmul_all_gather's, this rank's rows

    def load(rep):
        """New inputs of repetition rep in place, NaN in the outputs; returns what each output must hold."""
        ins = _inputs(w, [(m, K), (m,)], dtype, 100 + rep)
        Bg = torch.randn(K, N, generator=torch.Generator().manual_seed(200 + rep)).to(dtype)
        a_rows.copy_(ins[r][0]), b_full.copy_(Bg), bias.copy_(ins[r][1])
        ag = torch.cat([x[0].float() for x in ins]) @ Bg.float()
        mag = ag + torch.cat([x[1].float() for x in ins])[:, None]
        ins = _inputs(w, [(M, k), (k, N)], dtype, 300 + rep)
        a_cols.copy_(ins[r][0]), b_rows.copy_(ins[r][1])
        parts = [x[0].float() @ x[1].float() for x in ins]
        ar, scale = sum(p.to(dtype).float() for p in parts), w * max(p.abs().max().item() for p in parts)
        for o in outs.values():
            o.fill_(float("nan"))
        return {"ag": (ag, 0.0), "mag": (mag, 0.0), "ar": (ar, scale), "rs": (ar[r * m:(r + 1) * m], scale)}

    def call():
        ctx.ops.all_gather_matmul(outs["ag"], a_rows, b_full, config=config)
        ctx.ops.matmul_all_gather(outs["mag"], a_rows, b_full, bias=bias)
        ctx.ops.matmul_all_reduce(outs["ar"], a_cols, b_rows, config=config)
        ctx.ops.matmul_reduce_scatter(outs["rs"], a_cols, b_rows, config=config)

    errors, graph = [], None
    for rep in range(reps + 2):
        wants = load(rep)
        if rep < reps:
            call()
        else:  # the caller's own graph, captured once and replayed with new data
            if graph is None:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    call()
            graph.replay()
        for op, (want, scale) in wants.items():
            errors.append(_close(f"{OP_NAMES[op]} rep {rep}", outs[op], want, dtype, scale))
    ctx.barrier()
    ctx.close()
    return [e for e in errors if e]


def rank_mag_bias(dtype, M, N, K, reps):
    """matmul_all_gather with and without each rank's bias at GPU tiles, the same tensors called again
    and again with new data (eager calls replay a captured graph from the third on)."""
    ctx = iris.iris(heap_size=1 << 28)
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    m = M // w
    a, b, bias = (torch.empty(s, dtype=dtype, device=dev) for s in ((m, K), (K, N), (m,)))
    out, errors = ctx.empty((w * m, N), dtype=dtype), []
    for rep in range(reps):
        ins = _inputs(w, [(m, K), (m,)], dtype, 500 + rep)
        Bg = torch.randn(K, N, generator=torch.Generator().manual_seed(600 + rep)).to(dtype)
        a.copy_(ins[r][0]), b.copy_(Bg), bias.copy_(ins[r][1])
        want = torch.cat([x[0].float() for x in ins]) @ Bg.float()
        for with_bias in (False, True):
            out.fill_(float("nan"))
            ctx.ops.matmul_all_gather(out, a, b, bias=bias if with_bias else None)
            if with_bias:
                want += torch.cat([x[1].float() for x in ins])[:, None]
            errors.append(_close(f"matmul_all_gather bias={with_bias} rep {rep}", out, want, dtype))
    ctx.barrier()
    ctx.close()
    return [e for e in errors if e]


@pytest.mark.gpu
def test_matmul_all_gather_bias_gpu():
    """Iris's bias in matmul_all_gather on the GPU tiles (TMA), odd sizes, 2 ranks, repeated calls."""
    out = iris.spawn(rank_mag_bias, 2, args=(torch.bfloat16, 2 * 300, 1000, 776, 4))
    for r, errs in enumerate(out):
        assert not errs, f"rank {r}: {errs}"


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fused", "streamed", "streamed_ccl", "ccl"])
def test_fused_ops_gpu_repeated_calls_replay(variant):
    world = 4 if torch.cuda.device_count() >= 4 else 2
    # streamed_ccl: matmul_all_reduce's chunks reduced by ctx.ccl on 8 programs beside cuBLASLt's carveout
    cfg = FusedConfig(variant="streamed", chunks=2, comm_sms=8) if variant == "streamed_ccl" else FusedConfig(
        variant=variant, chunks=2)
    out = iris.spawn(rank_ops_repeat, world, args=(torch.bfloat16, 2 * 200, 520, 2 * 264, 6, cfg))
    for r, errs in enumerate(out):
        assert not errs, f"rank {r}: {errs}"


def rank_signatures():
    """Each call signature (shapes, dtypes, devices, the config's values) is checked once, at its first
    call; what it does not tell (the bias, a heap output, a workspace passed back, the context open) is
    checked at every call, and raises before anything is allocated."""
    ctx = iris.iris(heap_size=1 << 24)
    w, dev, dt = ctx.get_num_ranks(), ctx.get_device(), torch.float16
    ops, errors, checked = ctx.ops, [], []
    kind = ops._kind
    ops._kind = lambda *a: checked.append(a[0]) or kind(*a)
    cfg = FusedConfig(variant="ccl")
    A, B, out = torch.randn(16, 8, device=dev).to(dt), torch.randn(8, 16, device=dev).to(dt), torch.empty(
        16, 16, dtype=dt, device=dev)
    for _ in range(3):  # other strides, the same signature
        for a in (A, A.t().contiguous().t()):
            ws = ops.matmul_all_reduce(out, a, B, config=cfg)
    if checked != ["ar"] or len(ops._calls) != 1:
        errors.append(f"6 calls of one signature checked {checked} and keep {len(ops._calls)} signatures")
    tiles = FusedConfig(block_size_m=16, block_size_n=16, block_size_k=16)
    first = ops.matmul_all_reduce(out, A, B, config=tiles)
    tiles.block_size_m = 32  # the same object, another value: another workspace
    if ops.matmul_all_reduce(out, A, B, config=tiles)["tiles"].bm != 32 or first["tiles"].bm != 16:
        errors.append("a FusedConfig changed after a call kept the workspace of its old values")
    Am, Bm, heap_out = torch.randn(8, 8, device=dev).to(dt), torch.randn(8, 16, device=dev).to(dt), ctx.empty(
        (8 * w, 16), dtype=dt)
    ops.matmul_all_gather(heap_out, Am, Bm, bias=torch.zeros(8, device=dev), config=cfg)
    other = ops.matmul_all_reduce_preamble(torch.empty(16, 8, dtype=dt, device=dev), A, B[:, :8])
    small = FusedConfig(block_size_m=16, block_size_n=16, block_size_k=16, all_reduce_variant="one_shot")
    A2, B2, C2 = torch.randn(40, 16, device=dev).to(dt), torch.randn(16, 40, device=dev).to(dt), torch.empty(
        40, 40, dtype=dt, device=dev)  # 4 tiles of 32, 9 of 16
    big_ws = ops.matmul_all_reduce_preamble(C2, A2, B2, config=dataclasses.replace(small, block_size_m=32,
                                                                                     block_size_n=32))
    ops.matmul_all_reduce_preamble(C2, A2, B2, config=small)  # the signature known, before the call below
    live, calls = set(ctx.heap.alloc.offsets.live), len(ops._calls)
    bad = FusedConfig(variant="ccl")

    def bad_field(value):
        bad.block_size_m = value
        return ops.matmul_all_reduce(out, A, B, config=bad)

    cases = [
        ("bias must be a 1-D tensor of the output's 16 rows",
         lambda: ops.matmul_all_reduce(out, A, B, bias=torch.zeros(15, device=dev), config=cfg)),
        ("bias must be a 1-D float tensor of A_local's 8 rows",
         lambda: ops.matmul_all_gather(heap_out, Am, Bm, bias=torch.zeros(9, device=dev), config=cfg)),
        ("heap tensor", lambda: ops.matmul_all_gather(torch.empty(8 * w, 16, dtype=dt, device=dev), Am, Bm,
                                                      config=cfg)),
        ("workspace was built for", lambda: ops.matmul_all_reduce(out, A, B, config=cfg, workspace=other)),
        ("Lock array too small: have 4 but need 9",
         lambda: ops.matmul_all_reduce(C2, A2, B2, config=small, workspace=big_ws)),
        ("FusedConfig.block_size_m must be a power of two", lambda: bad_field(24)),
        ("FusedConfig.block_size_m must be a power of two", lambda: bad_field([64])),  # unhashable: still named
    ]
    for want, fn in cases:
        try:
            fn()
            errors.append(f"no error where {want!r} was expected")
        except (ValueError, TypeError) as e:
            if want not in str(e):
                errors.append(f"expected {want!r} in {str(e)!r}")
    if set(ctx.heap.alloc.offsets.live) != live or len(ops._calls) != calls:
        errors.append("a rejected call allocated on the heap or kept its signature")
    ctx.barrier()
    ctx.close()
    for how, fn in (("a known signature", lambda: ops.matmul_all_reduce(out, A, B, config=cfg)),
                    ("its workspace", lambda: ops.matmul_all_reduce(out, A, B, config=cfg, workspace=ws)),
                    ("ctx.ops", lambda: ctx.ops.matmul_all_reduce(out, A, B, config=cfg))):
        try:
            fn()
            errors.append(f"a call with {how} after close did not raise")
        except iris.ContextClosed:
            pass
    return errors


def test_call_signature_checked_once():
    out = iris.spawn(rank_signatures, 2)
    for r, errs in enumerate(out):
        assert not errs, f"rank {r}: {errs}"


def test_streamed_gemm_leaves_comm_sms():
    """The streamed matmul_all_reduce with comm_sms runs its GEMM chunks under torch's SM carveout of comm_sms,
    and gives back the carveout it found, also when the GEMM raises."""
    from iris.ops.streamed import _carved
    torch._C._set_sm_carveout_experimental(None)
    with _carved(32):
        assert torch._C._get_sm_carveout_experimental() == 32
    assert torch._C._get_sm_carveout_experimental() is None
    torch._C._set_sm_carveout_experimental(4)
    with pytest.raises(RuntimeError):
        with _carved(16):
            assert torch._C._get_sm_carveout_experimental() == 16
            raise RuntimeError("the GEMM failed")
    assert torch._C._get_sm_carveout_experimental() == 4
    torch._C._set_sm_carveout_experimental(None)


def test_default_variant_rules():
    """What config=None runs on GPUs, by shape and ranks (K = N = 8192, M output rows; gemm_comm.py)."""
    from iris.ops import default_variant
    K = N = 8192
    for w, M, want in ((2, 128, "ccl"), (2, 1024, "ccl"), (2, 2048, "streamed"), (2, 8192, "streamed"), (4, 2048, "ccl"),
                       (4, 4096, "streamed"), (3, 2048, "ccl"), (3, 3072, "streamed")):
        assert default_variant("ar", w, M, N, M, K // w) == want, ("ar", w, M)
    for w, M, want in ((2, 512, "ccl"), (2, 1024, "streamed"), (4, 512, "ccl"), (4, 1024, "fused"), (4, 2048, "fused"),
                       (4, 4096, "streamed")):
        assert default_variant("rs", w, M // w, N, M, K // w) == want, ("rs", w, M)
    for w, M, want in ((2, 512, "ccl"), (2, 1024, "ccl"), (2, 2048, "streamed"), (4, 512, "ccl"), (4, 2048, "ccl"),
                       (4, 4096, "streamed"), (3, 2048, "ccl"), (3, 3072, "streamed")):
        assert default_variant("mag", w, M, N, M // w, K) == want, ("mag", w, M)
    for w, M, want in ((2, 512, "ccl"), (2, 1024, "streamed"), (2, 2048, "streamed"), (2, 4096, "fused"),
                       (4, 512, "ccl"), (4, 1024, "streamed"), (4, 4096, "streamed"), (4, 8192, "fused")):
        assert default_variant("ag", w, M, N, M // w, K) == want, ("ag", w, M)
    from iris.ops import streamed_chunks
    for kind, owner, w, want in (("rs", 1024, 2, 2), ("rs", 2048, 2, 2), ("rs", 4096, 2, 2), ("rs", 8192, 2, 4),
                                 ("rs", 2048, 4, 2),
                                 ("ar", 1024, 2, 2), ("ar", 2048, 2, 4), ("ar", 2048, 4, 2), ("mag", 1024, 2, 2),
                                 ("mag", 4096, 2, 4), ("mag", 1024, 4, 2), ("mag", 2048, 4, 4),
                                 ("ag", 4096, 2, 1)):
        assert streamed_chunks(kind, owner, w) == want, (kind, owner, w)


def _streamed_mag(dtype):
    """A context and a streamed matmul_all_gather's tensors and workspace (16 rows a rank), built collectively:
    (ctx, rank, config, a, b, out, workspace)."""
    ctx = iris.iris(heap_size=1 << 24)
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    cfg = FusedConfig(variant="streamed", chunks=2)
    a, b = torch.randn(16, 32, device=dev).to(dtype), torch.randn(32, 24, device=dev).to(dtype)
    out = ctx.empty((w * 16, 24), dtype=dtype)
    return ctx, r, cfg, a, b, out, ctx.ops.matmul_all_gather_preamble(out, a, b, config=cfg)


def _raised_at_barrier(ctx) -> str:
    """What the next ctx.barrier() raised (WaitTimeout), "" if nothing; the barrier after it must pass."""
    try:
        ctx.barrier()
        raised = ""
    except iris.WaitTimeout as e:
        raised = str(e)
    ctx.barrier()  # raised once: the next barrier passes
    return raised


def rank_streamed_absent(dtype):
    """A streamed matmul_all_gather whose peer never calls (it builds the workspace, which is collective):
    the opening handshake gives up at the spin limit and leaves the call's flags set, so the call ends
    (on a GPU its stream waits would otherwise hold the streams for ever) and the next barrier raises
    WaitTimeout on the rank that called, naming the peer, once."""
    os.environ["IRIS_SPIN_LIMIT"] = "20000"
    ctx, r, cfg, a, b, out, ws = _streamed_mag(dtype)
    if r == 0:
        ctx.ops.matmul_all_gather(out, a, b, config=cfg, workspace=ws)
        if ctx.get_device().type == "cuda":
            torch.cuda.synchronize()
    raised = _raised_at_barrier(ctx)
    ctx.close()
    return raised


@pytest.mark.parametrize("where", ["host", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_streamed_peer_never_calls(where):
    if where == "gpu" and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    raised = iris.spawn(rank_streamed_absent, 2, args=(torch.bfloat16 if where == "gpu" else torch.float32,),
                        timeout=300)
    assert raised[1] == "", raised
    # one fault: the handshake's; the chunks' waits found their flags set and passed
    assert raised[0].startswith("rank 0:") and "which rank 1 should have set" in raised[0], raised
    assert "more faults" not in raised[0], raised


def rank_streamed_stops(dtype, timeout):
    """Rank 1 opens a streamed matmul_all_gather (its start kernel meets rank 0's) and then sends nothing,
    as a process that died there would: rank 0's stream waits for its chunks have no spin limit, so the
    watch releases them `timeout` seconds after the call began, and rank 0's next barrier raises
    WaitTimeout naming rank 1, once. Returns (what the barrier raised, seconds until the call ended)."""
    import time
    from iris.ops import streamed
    ctx, r, cfg, a, b, out, ws = _streamed_mag(dtype)
    ctx.ops._watch.timeout = timeout
    keep = streamed._SEQUENCES["mag"]
    if r == 1:
        streamed._SEQUENCES["mag"] = lambda *args, **kwargs: None
    t0 = time.monotonic()
    try:
        ctx.ops.matmul_all_gather(out, a, b, config=cfg, workspace=ws)
        torch.cuda.synchronize()
    finally:
        streamed._SEQUENCES["mag"] = keep
    took = time.monotonic() - t0
    if r == 1:
        time.sleep(timeout)  # meet rank 0 at the barrier once its call has been released
    raised = _raised_at_barrier(ctx)
    if r == 0:  # the released call's workspace is not used again: its flags were left set
        try:
            ctx.ops.matmul_all_gather(out, a, b, config=cfg, workspace=ws)
            raised += " | reused"
        except iris.WaitTimeout as e:
            raised += " | " + str(e)
    ctx.close()
    return raised, took


@pytest.mark.gpu
def test_streamed_peer_stops_after_opening():
    (raised0, took0), (raised1, _) = iris.spawn(rank_streamed_stops, 2, args=(torch.bfloat16, 5.0), timeout=300)
    assert raised1 == "", raised1
    assert raised0.startswith("rank 0: a streamed fused op (mag)") and "rank(s) 1 stopped" in raised0, raised0
    assert raised0.endswith("once every rank is back") and "this workspace belongs to a streamed call" in raised0, \
        raised0
    assert 5.0 <= took0 < 60, took0
