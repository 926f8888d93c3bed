"""The tile API (iris.Tile, TileView, make_tensor_view, DeviceContext's tile collectives) on real
ranks, called from a persistent kernel's loop over edge-masked tiles of non-contiguous views, and
checked element by element against the collective done by hand in torch.

Inputs are small integers (exact in every dtype, sums too), so every element is compared exactly;
outputs are padded views of larger tensors poisoned beforehand, so a write outside a view or a tile
left unwritten shows. Spawning ranks costs seconds: on the host each world runs once (memoized), the
tile cases and the fused op's together, and every case returns its failures to the parent, where one
test per case asserts on them.
"""
import functools
import os
import traceback

import pytest
import torch
import triton
import triton.language as tl

import iris

POISON = 99
M, N, BM, BN = 12, 20, 8, 16              # edge tiles in both dimensions: 2 x 2 tiles, all partial but one
PROGRAMS = 2                              # programs of the persistent grid: each walks several tiles
PAD_M, PAD_N = 3, 5                       # outputs are views into tensors this much larger
REDUCING = ("atomic", "spinlock", "one_shot", "two_shot", "ring", "reduce_scatter")
MOVING = ("all_gather0", "all_gather1", "gather", "all_to_all")
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _tiles_kernel(inp, ism, isn, pub, out, osm, osn, locks, context, M, N, RANK: tl.constexpr, WORLD: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, OP: tl.constexpr):
    """Each program walks tiles pid, pid + programs, ...; per tile it loads the input tile, publishes it
    where the variant reads peers' tiles (pub and locks[tile] = 1), and calls the tile collective."""
    ctx = iris.DeviceContext.initialize(context, RANK, WORLD)
    num_n = tl.cdiv(N, BN)
    for t in range(tl.program_id(0), tl.cdiv(M, BM) * num_n, tl.num_programs(0)):
        pid_m = t // num_n
        pid_n = t % num_n
        src = iris.make_tensor_view(inp, M, N, ism, isn)
        p, mask = src.tile_ptr(iris.TileView(pid_m, pid_n, BM, BN))
        tile = iris.Tile(pid_m, pid_n, BM, BN, tl.load(p, mask=mask, other=0))
        dst = iris.make_tensor_view(out, M, N, osm, osn)
        published = iris.make_tensor_view(pub, M, N, N, 1)
        if OP == "one_shot" or OP == "two_shot" or OP == "reduce_scatter":
            q, qmask = published.tile_ptr(tile)
            tl.store(q, tile.data, mask=qmask)
            tl.debug_barrier()
            ctx.signal(locks + t, 1, RANK)  # release at sys scope: the tile before the flag
        if OP == "atomic":
            ctx.all_reduce_atomic(tile, dst)
        elif OP == "spinlock":
            ctx.all_reduce_spinlock(tile, dst, locks)
        elif OP == "one_shot":
            ctx.all_reduce_one_shot(tile, published, dst, locks)
        elif OP == "two_shot":
            ctx.all_reduce_two_shot(tile, published, dst, locks)
        elif OP == "reduce_scatter":
            ctx.reduce_scatter(tile, published, dst, locks)
        elif OP == "ring":
            ctx.all_reduce_ring(iris.TileView(pid_m, pid_n, BM, BN), src, dst)
        elif OP == "all_gather0":
            ctx.all_gather(tile, iris.make_tensor_view(out, M * WORLD, N, osm, osn), 0)
        elif OP == "all_gather1":
            ctx.all_gather(tile, iris.make_tensor_view(out, M, N * WORLD, osm, osn), 1)
        elif OP == "gather":
            d, dmask = dst.tile_ptr(tile)
            tl.store(d, ctx.gather(iris.TileView(pid_m, pid_n, BM, BN), src, (RANK + 1) % WORLD), mask=dmask)
        else:  # all_to_all: M x (WORLD * n) on both sides, n = N // WORLD
            ctx.all_to_all(iris.TileView(pid_m, pid_n, BM, BN), src, dst, N // WORLD)


def _values(rank, rows, cols, dtype, salt):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    return torch.randint(-8, 9, (rows, cols), generator=g).to(dtype)


def _transposed(ctx, x):
    """x as a heap tensor stored column-major (strides (1, rows)): a non-contiguous view."""
    t = ctx.empty(x.shape[1], x.shape[0], dtype=x.dtype)
    t.copy_(x.t().to(t.device))
    return t.t()


def _padded(ctx, rows, cols, dtype, inside):
    """A heap tensor PAD larger than rows x cols, all POISON, whose top-left rows x cols view is returned
    (strides (cols + PAD_N, 1)) with `inside` written into it (None: left POISON)."""
    full = ctx.full((rows + PAD_M, cols + PAD_N), POISON, dtype=dtype)
    if inside is not None:
        full[:rows, :cols] = inside
    return full, full[:rows, :cols]


def _owned(rank, world, rows, cols):
    """Mask of the elements whose tiles reduce_scatter gives this rank (contiguous runs of tile ids)."""
    nm, nn = triton.cdiv(rows, BM), triton.cdiv(cols, BN)
    per = nm * nn // world
    ids = torch.arange(nm * nn).reshape(nm, nn).repeat_interleave(BM, 0).repeat_interleave(BN, 1)[:rows, :cols]
    last = nm * nn if rank == world - 1 else (rank + 1) * per
    return (ids >= rank * per) & (ids < last)


def _launch_triton(ctx, inp, pub, out, locks, cols, op):
    _tiles_kernel[(PROGRAMS,)](inp, inp.stride(0), inp.stride(1), pub, out, out.stride(0), out.stride(1), locks,
                               ctx.get_device_context(), M, cols, ctx.get_rank(), ctx.get_num_ranks(), BM, BN, op)


def _case(ctx, op, dtype, salt, launch=_launch_triton):
    """Runs one tile collective through launch (the kernel that calls it); returns failures."""
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    cols = N if op != "all_to_all" else (N // w) * w
    ins = [_values(q, M, cols, dtype, salt) for q in range(w)]
    inp = _transposed(ctx, ins[r])  # strides (1, M)
    pub = ctx.full((M, cols), POISON, dtype=dtype)
    locks = ctx.zeros(triton.cdiv(M, BM) * triton.cdiv(cols, BN), dtype=torch.int32)
    total = sum(x.to(torch.float64) for x in ins).to(dtype)
    if op in ("atomic", "spinlock"):
        full, out = _padded(ctx, M, cols, dtype, torch.zeros(M, cols, dtype=dtype))
        want = total
    elif op in ("one_shot", "two_shot", "ring"):
        full, out = _padded(ctx, M, cols, dtype, None)
        want = total
    elif op == "reduce_scatter":
        full, out = _padded(ctx, M, cols, dtype, None)
        want = torch.where(_owned(r, w, M, cols), total, torch.full_like(total, POISON))
    elif op == "all_gather0":
        full, out = _padded(ctx, w * M, cols, dtype, None)
        want = torch.cat(ins, 0)
    elif op == "all_gather1":
        full, out = _padded(ctx, M, w * cols, dtype, None)
        want = torch.cat(ins, 1)
    elif op == "gather":
        full, out = _padded(ctx, M, cols, dtype, None)
        want = ins[(r + 1) % w]
    else:
        n = cols // w
        full, out = _padded(ctx, M, cols, dtype, None)
        want = torch.cat([ins[s][:, r * n:(r + 1) * n] for s in range(w)], 1)
    ctx.barrier()
    # The interpreter's float16 atomic add is atomic within a process only: there the ranks take turns.
    turns = range(w) if op == "atomic" and dtype == torch.float16 and _interpreted() else [None]
    for turn in turns:
        if turn is None or turn == r:
            launch(ctx, inp, pub, out, locks, cols, op)
        ctx.barrier()
    expect = torch.full(full.shape, POISON, dtype=dtype)
    expect[:want.shape[0], :want.shape[1]] = want
    bad = []
    if not torch.equal(full.cpu(), expect):
        diff = (full.cpu() != expect).nonzero()
        bad.append(f"{op} {dtype} world {w} rank {r}: {len(diff)} elements wrong, first at {diff[0].tolist()}: "
                   f"{full.cpu()[tuple(diff[0])].item()} vs {expect[tuple(diff[0])].item()}")
    if op == "spinlock" and bool(locks.cpu().any()):
        bad.append(f"spinlock {dtype} world {w} rank {r}: locks left held: {locks.cpu().tolist()}")
    ctx.barrier()
    return bad


# The interpreter has no bfloat16 atomic add ("Unsupported data type"): that case runs on GPUs.
# On the host each function runs in one dtype at 2 ranks and another at 4: a float and an integer
# for each function across the two, every dtype in several functions (float32 atomic adds: the fused
# op's atomic case); the interpreter's seconds add up.
HOST_DTYPES = {"atomic": (torch.float16, torch.int64), "spinlock": (torch.bfloat16, torch.int32),
               "one_shot": (torch.int64, torch.bfloat16), "two_shot": (torch.float32, torch.int32),
               "ring": (torch.float16, torch.int64), "reduce_scatter": (torch.int32, torch.bfloat16),
               "all_gather0": (torch.bfloat16, torch.int32), "all_gather1": (torch.float32, torch.float16),
               "gather": (torch.int64, torch.bfloat16), "all_to_all": (torch.float16, torch.int32)}


def _cases(gpu, world):
    if gpu:
        return [(op, dt) for op in REDUCING + MOVING for dt in DTYPES]
    return [(op, dts[0] if world == 2 else dts[1]) for op, dts in HOST_DTYPES.items()]


def _indirect_cases():
    """Through NVSHMEM every function in 32/64-bit types, and bfloat16 where no atomic add carries the
    data (NVSHMEM has no 16-bit atomics: all_reduce_atomic in bfloat16 is refused when it compiles)."""
    return [(op, dt) for op in REDUCING + MOVING for dt in (torch.float32, torch.int64, torch.bfloat16)
            if not (op == "atomic" and dt == torch.bfloat16)]


def rank_main(gpu, allocator=None, indirect=False, with_ops=False):
    """The tile cases (with_ops: then the fused op's, as ("ops", "") -> failures); {(op, dtype): failures}."""
    ctx = iris.iris(heap_size=1 << 22, allocator=allocator)
    out = {}
    try:
        cases = _indirect_cases() if indirect else _cases(gpu, ctx.get_num_ranks())
        for salt, (op, dt) in enumerate(cases):
            try:
                out[(op, str(dt))] = _case(ctx, op, dt, salt)
            except Exception:  # report it; the other ranks may wait in this case, so stop here
                out[(op, str(dt))] = [f"rank {ctx.get_rank()} raised:\n{traceback.format_exc()}"]
                raise RuntimeError(out[(op, str(dt))][0])
        if with_ops:
            w = ctx.get_num_ranks()
            out[("ops", "")] = _ops_cases(ctx, False, 16 * w, OPS_N, OPS_K, 16)
        return out
    finally:
        ctx.close()


@functools.lru_cache(maxsize=None)
def _run(world, gpu=False):
    per_rank = iris.spawn(rank_main, world, args=(gpu, None, False, not gpu), timeout=600)
    return {key: [f for r in per_rank for f in r[key]] for key in per_rank[0]}


@pytest.mark.gpu
@pytest.mark.parametrize("setting, world", [("all", 2), ("1", 3)])
def test_tiles_over_indirect_peers(setting, world, monkeypatch):
    """The same calls where peers are indirect (every one, or one of three: direct and indirect mixed):
    iris's device functions take them through NVSHMEM with no change to the tile code."""
    from test_indirect import _nvshmem_usable
    why = _nvshmem_usable()
    if why:
        pytest.skip(f"NVSHMEM's device API is not usable here ({why}); pip install 'iris-shmem[nvshmem]'")
    monkeypatch.setenv("IRIS_INDIRECT_PEERS", setting)
    per_rank = iris.spawn(rank_main, world, args=(True, "nvshmem", True), timeout=600)
    failures = [f for r in per_rank for fs in r.values() for f in fs]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("world", [2, 4])
def test_tiles_host(world):
    """Every tile function (HOST_DTYPES) and the fused op's variants (_op_cases) on one set of ranks per
    world: one test per world, so pytest-xdist's workers do not each
    start the same ranks for tests of one world."""
    results = _run(world)
    assert set(o for o, _ in results) == set(REDUCING + MOVING) | {"ops"}, sorted(results)
    failures = [f"{op} {dt}: {f}" for (op, dt), fs in results.items() for f in fs]
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_tiles_gpu(world):
    """Every tile collective in every dtype (bfloat16 atomic adds included), 2 and 4 ranks (several
    ranks share a GPU where there are fewer GPUs: their waits then cost time slices)."""
    failures = [f for fs in _run(world, gpu=True).values() for f in fs]
    assert not failures, "\n".join(failures[:20])


def test_tile_names_exported():
    """Iris's spellings resolve from the package: a kernel written for Iris finds them."""
    for name in ("Tile", "TileView", "TensorView", "make_tensor_view"):
        assert getattr(iris, name) is not None and name in iris.__all__
    for method in ("all_reduce_atomic", "all_reduce_spinlock", "all_reduce_one_shot", "all_reduce_two_shot",
                   "all_reduce_ring", "reduce_scatter", "all_gather", "gather", "all_to_all"):
        assert hasattr(iris.DeviceContext, method), method


# -- the fused GEMM op through the tile API (ctx.ops with FusedConfig(variant="tiles")) -------------
OPS_N, OPS_K = 24, 16  # per rank A (16 * world) x 16, B 16 x 24 on the host: edge tiles in N, rows that split


def _op_inputs(world, dtype, seed, M, N, K):
    """Small integers: every product and sum is exact in float32 and bfloat16, so results compare exactly."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(-1, 2, (M, K), generator=g).to(dtype), torch.randint(-1, 2, (K, N), generator=g).to(dtype))
            for _ in range(world)]


def _op_cases(gpu, world):
    """ctx.ops.matmul_all_reduce (atomic, spinlock, one_shot, two_shot, ring) and matmul_reduce_scatter (this
    rank's rows: rs_rows, and the tile layout: rs_tiles) with FusedConfig(variant="tiles"), as (case,
    dtype, calls): calls 2 where the second call reuses the workspace's locks and flags."""
    if not gpu and world > 2:  # the interpreter's seconds: at 4 ranks the paths that differ most
        return [("two_shot", torch.bfloat16, 1), ("rs_rows", torch.bfloat16, 1)]
    cases = [(v, torch.bfloat16, 2 if gpu or v in ("one_shot", "two_shot", "rs_tiles") else 1)
             for v in ("one_shot", "two_shot", "spinlock", "ring", "rs_rows", "rs_tiles")]
    if gpu:  # each dtype the ops take, through one variant (the tile functions' dtypes: test_tiles_gpu)
        return cases + [("one_shot", torch.float16, 2), ("one_shot", torch.float32, 2)] + [
            ("atomic", dt, 2) for dt in (torch.bfloat16, torch.float16, torch.float32)]
    # the interpreter's atomic adds are atomic across processes for float32 only
    return cases + [("atomic", torch.float32, 1)]


def rank_ops(gpu, M, N, K, block):
    ctx = iris.iris(heap_size=1 << 26 if gpu else 1 << 22)
    try:
        bad = _ops_cases(ctx, gpu, M, N, K, block)
        if gpu:
            from iris.ops import FusedConfig
            bad += _graph_replays(ctx, FusedConfig(block_size_m=block, block_size_n=block, block_size_k=block,
                                                   variant="tiles"), M, N, K)
        return bad
    finally:
        ctx.close()


def _ops_cases(ctx, gpu, M, N, K, block):
    from iris.ops import FusedConfig
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    bad = []
    for case, dtype, calls in _op_cases(gpu, w):
        variant = "two_shot" if case.startswith("rs") else case
        cfg = FusedConfig(block_size_m=block, block_size_n=block, block_size_k=block, variant="tiles",
                          all_reduce_variant=variant)
        for call in range(calls):  # a second call reuses the workspace: its locks and output are reset
            ins = _op_inputs(w, dtype, 10 * call + len(case), M, N, K)
            total = sum((a.float() @ b.float()) for a, b in ins).to(dtype)
            rows = M // w if case == "rs_rows" else M
            out = torch.full((rows, N), POISON, dtype=dtype, device=dev)
            A, B = ins[r][0].to(dev), ins[r][1].to(dev)
            if case.startswith("rs"):
                ctx.ops.matmul_reduce_scatter(out, A, B, config=cfg)
                if case == "rs_rows":
                    want = total[r * rows:(r + 1) * rows]
                else:  # tile layout: this rank's contiguous run of tile ids, the rest untouched
                    mine = _owned_tiles(r, w, M, N, block)
                    want = torch.where(mine, total, torch.full_like(total, POISON))
            else:
                ctx.ops.matmul_all_reduce(out, A, B, config=cfg)
                want = total
            if not torch.equal(out.cpu(), want):
                diff = (out.cpu() != want).nonzero()
                bad.append(f"ops {case} {dtype} call {call} world {w} rank {r}: {len(diff)} wrong, first "
                           f"{diff[0].tolist()}: {out.cpu()[tuple(diff[0])].item()} vs "
                           f"{want[tuple(diff[0])].item()}")
    return bad


def _owned_tiles(rank, world, rows, cols, block):
    nm, nn = triton.cdiv(rows, block), triton.cdiv(cols, block)
    per = nm * nn // world
    ids = torch.arange(nm * nn).reshape(nm, nn).repeat_interleave(block, 0).repeat_interleave(block, 1)
    ids = ids[:rows, :cols]
    return (ids >= rank * per) & (ids < (nm * nn if rank == world - 1 else (rank + 1) * per))


def _graph_replays(ctx, cfg, M, N, K):
    """matmul_all_reduce (two-shot through the tile API) captured in a CUDA graph, replayed with new data."""
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    A = torch.empty(M, K, dtype=torch.bfloat16, device=dev)
    B = torch.empty(K, N, dtype=torch.bfloat16, device=dev)
    out = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
    ws = ctx.ops.matmul_all_reduce_preamble(out, A, B, config=cfg)
    ctx.ops.matmul_all_reduce(out, A, B, config=cfg, workspace=ws)  # compiles and plans outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ctx.ops.matmul_all_reduce(out, A, B, config=cfg, workspace=ws)
    bad = []
    for rep in range(3):
        ins = _op_inputs(w, torch.bfloat16, 100 + rep, M, N, K)
        A.copy_(ins[r][0])
        B.copy_(ins[r][1])
        out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        if not torch.equal(out.cpu(), sum((a.float() @ b.float()) for a, b in ins).to(torch.bfloat16)):
            bad.append(f"ops graph replay {rep} world {w} rank {r}: wrong")
    return bad


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_matmul_tile_reduce_gpu(world):
    """The same at GPU tiles (every variant in bf16; fp16 and fp32 through one-shot and atomic), plus
    CUDA-graph replays with new data."""
    bad = [f for fs in iris.spawn(rank_ops, world, args=(True, 1024, 520, 64, 64), timeout=600) for f in fs]
    assert not bad, "\n".join(bad[:10])


def test_matmul_tile_reduce_refuses_bad_input():
    """Shapes a tile-API op cannot take raise ValueError naming the fix, before anything is allocated."""
    from iris.ops import FusedConfig
    with pytest.raises(ValueError, match="all_reduce_variant"):
        FusedConfig(variant="tiles", all_reduce_variant="fastest")
    with pytest.raises(ValueError, match="variant must be"):
        FusedConfig(variant="tile")
