"""The Gluon tile API (iris.gluon's Tile, TileView, make_tensor_view and IrisDeviceCtx's tile
collectives) on real ranks: the cases and checks of test_tiles.py (a persistent kernel's loop over
edge-masked tiles of a transposed input into padded, poisoned outputs, every element compared), run
by a @gluon.jit kernel in two layouts (one that covers a tile exactly, one that wraps around it).

Triton's interpreter cannot run Gluon (a Gluon launch goes to a GPU driver even under
TRITON_INTERPRET=1), so the ranks run on GPUs only; on the host the names and signatures are checked
against the Triton forms, and every collective is compiled for sm_90 with the Triton installed here.
"""
import ast
import functools
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

gluon = pytest.importorskip("triton.experimental.gluon", reason="this Triton has no triton.experimental.gluon")
import triton.language as tl  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

import iris  # noqa: E402
import iris.gluon as ig  # noqa: E402
from test_gluon import compiling_child  # noqa: E402
from test_tiles import BM, BN, DTYPES, M, MOVING, PROGRAMS, REDUCING, _case  # noqa: E402

# (layout, num_warps): one thread per 1 x 4 elements covering the 8 x 16 tile exactly, row-major; and
# one element per thread over 8 x 8, column-major, wrapping twice along the columns
LAYOUTS = [(gl.BlockedLayout([1, 4], [8, 4], [1, 1], [1, 0]), 1), (gl.BlockedLayout([1, 1], [8, 4], [1, 2], [0, 1]), 2)]


@gluon.jit
def _gluon_tiles_kernel(IrisDeviceCtx: gl.constexpr, inp, ism, isn, pub, out, osm, osn, locks, context, M, N,
                        BM: gl.constexpr, BN: gl.constexpr, OP: gl.constexpr, LAYOUT: gl.constexpr):
    """test_tiles.py's _tiles_kernel in Gluon: each program walks tiles pid, pid + programs, ...; per tile
    it loads the input tile in LAYOUT, publishes it where the variant reads peers' tiles, and calls the
    tile collective."""
    ctx = IrisDeviceCtx.initialize(context)
    num_n = gl.cdiv(N, BN)
    for t in range(gl.program_id(0), gl.cdiv(M, BM) * num_n, gl.num_programs(0)):
        pid_m = t // num_n
        pid_n = t % num_n
        src = ig.make_tensor_view(inp, M, N, ism, isn)
        p, mask = src.tile_ptr(ig.TileView(pid_m, pid_n, BM, BN, LAYOUT))
        tile = ig.Tile(pid_m, pid_n, BM, BN, gl.load(p, mask=mask, other=0))
        dst = ig.make_tensor_view(out, M, N, osm, osn)
        published = ig.make_tensor_view(pub, M, N, N, 1)
        if OP == "one_shot" or OP == "two_shot" or OP == "reduce_scatter":
            q, qmask = published.tile_ptr(tile)
            gl.store(q, tile.data, mask=qmask)
            tl.debug_barrier()  # every thread's stores before the flag (Gluon's own barrier is named per version)
            ctx.atomic_xchg(locks + t, 1, ctx.cur_rank, sem="release", scope="sys")
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
            ctx.all_reduce_ring(ig.TileView(pid_m, pid_n, BM, BN, LAYOUT), src, dst)
        elif OP == "all_gather0":
            ctx.all_gather(tile, ig.make_tensor_view(out, M * ctx.num_ranks, N, osm, osn), 0)
        elif OP == "all_gather1":
            ctx.all_gather(tile, ig.make_tensor_view(out, M, N * ctx.num_ranks, osm, osn), 1)
        elif OP == "gather":
            d, dmask = dst.tile_ptr(tile)
            view = ig.TileView(pid_m, pid_n, BM, BN, LAYOUT)
            gl.store(d, ctx.gather(view, src, (ctx.cur_rank + 1) % ctx.num_ranks), mask=dmask)
        else:  # all_to_all: M x (world * n) on both sides, n = N // world
            ctx.all_to_all(ig.TileView(pid_m, pid_n, BM, BN, LAYOUT), src, dst, N // ctx.num_ranks)


def _launch_gluon(ctx, inp, pub, out, locks, cols, op, layout, warps):
    _gluon_tiles_kernel[(PROGRAMS,)](ig.IrisDeviceCtx, inp, inp.stride(0), inp.stride(1), pub, out, out.stride(0),
                                     out.stride(1), locks, ctx.get_device_context(), M, cols, BM, BN, op, layout,
                                     num_warps=warps)


def rank_gluon():
    """Every tile collective in every dtype, the two layouts in turn; returns the failures."""
    ctx = iris.iris(heap_size=1 << 22)
    try:
        bad = []
        for salt, (op, dtype) in enumerate((op, dt) for op in REDUCING + MOVING for dt in DTYPES):
            layout, warps = LAYOUTS[salt % len(LAYOUTS)]
            bad += _case(ctx, op, dtype, salt, functools.partial(_launch_gluon, layout=layout, warps=warps))
        return bad
    finally:
        ctx.close()


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_gluon_tiles_gpu(world):
    """Every IrisDeviceCtx tile collective in every dtype at 2 and 4 ranks (several ranks share a GPU
    where there are fewer GPUs); one compiled kernel serves every rank."""
    bad = [f for fs in iris.spawn(rank_gluon, world, timeout=600) for f in fs]
    assert not bad, "\n".join(bad[:20])


COLLECTIVES = ("all_reduce_atomic", "all_reduce_spinlock", "all_reduce_one_shot", "all_reduce_two_shot",
               "all_reduce_ring", "reduce_scatter", "all_gather", "gather", "all_to_all")


def _params(fn):
    fn = getattr(fn, "fn", fn)
    if getattr(fn, "__closure__", None):  # interpreted, iris's aggregates are plain classes calling the jit functions
        fn = fn.__closure__[0].cell_contents
    return list(inspect.signature(getattr(fn, "fn", fn)).parameters)


def _init_params(cls):
    # from the source: an aggregate keeps its constructor out of reach, differently in each Triton version
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return [a.arg for a in init.args.args]


def test_gluon_tile_names_match_triton():
    """IrisDeviceCtx has DeviceContext's tile collectives with the same parameters in the same order;
    iris.gluon's Tile and make_tensor_view take iris's parameters, TileView iris's plus the layout
    Gluon needs."""
    for name in COLLECTIVES:
        assert _params(getattr(ig.IrisDeviceCtx, name)) == _params(getattr(iris.DeviceContext, name)), name
    assert _init_params(ig.Tile) == _init_params(iris.Tile)
    assert _init_params(ig.TileView) == _init_params(iris.TileView) + ["layout"]
    assert _params(ig.make_tensor_view) == _params(iris.make_tensor_view)
    for method in ("indices", "layout"):
        assert hasattr(ig.Tile, method) and hasattr(ig.TileView, method), method


@gluon.jit
def _every_collective_kernel(IrisDeviceCtx: gl.constexpr, inp, pub, out, locks, context, M, N, BM: gl.constexpr,
                             BN: gl.constexpr, LAYOUT: gl.constexpr):
    """Every tile collective and tile method in one kernel: what the host compiles (a launch per
    collective, as _gluon_tiles_kernel's, costs a compile each)."""
    ctx = IrisDeviceCtx.initialize(context)
    for t in range(gl.program_id(0), gl.cdiv(M, BM) * gl.cdiv(N, BN), gl.num_programs(0)):
        view = ig.TileView(t // gl.cdiv(N, BN), t % gl.cdiv(N, BN), BM, BN, LAYOUT)
        src = ig.make_tensor_view(inp, M, N, 1, M)
        dst = ig.make_tensor_view(out, M, N, N, 1)
        published = ig.make_tensor_view(pub, M, N, N, 1)
        p, mask = src.tile_ptr(view)
        tile = ig.Tile(view.pid_m, view.pid_n, BM, BN, gl.load(p, mask=mask, other=0))
        rows, cols, inside = tile.layout(M, N)
        q, qmask = published.offset_tile_ptr(view, 0, 0, inside & (rows[:, None] >= 0) & (cols[None, :] >= 0))
        gl.store(q, tile.data, mask=qmask)
        ctx.all_reduce_atomic(tile, dst)
        ctx.all_reduce_spinlock(tile, dst, locks)
        ctx.all_reduce_one_shot(tile, published, dst, locks)
        ctx.all_reduce_two_shot(tile, published, dst, locks)
        ctx.all_reduce_ring(view, published, dst)
        ctx.reduce_scatter(tile, published, dst, locks)
        ctx.all_gather(tile, ig.make_tensor_view(out, M * ctx.num_ranks, N, N, 1), 0)
        ctx.all_gather(tile, ig.make_tensor_view(out, M, N * ctx.num_ranks, N * ctx.num_ranks, 1), 1)
        ctx.all_to_all(view, src, dst, N // ctx.num_ranks)
        d, dmask = dst.tile_ptr(view)
        gl.store(d, ctx.gather(view, src, (ctx.cur_rank + 1) % ctx.num_ranks, hint=(1, 1)), mask=dmask)


def test_gluon_tiles_compile_for_sm90(tmp_path):
    """Every collective compiles for sm_90 with the Triton installed here, in a 16-bit float (widened
    sums) and a 64-bit integer, in both layouts: Gluon's API differs between Triton versions."""
    GluonASTSource = compiling_child(__file__, "test_gluon_tiles_compile_for_sm90", tmp_path)
    if GluonASTSource is None:
        return
    import triton
    from triton.backends.compiler import GPUTarget
    for dt, (layout, warps) in zip(("bf16", "i64"), LAYOUTS):
        sig = {"IrisDeviceCtx": "constexpr", "inp": f"*{dt}", "pub": f"*{dt}", "out": f"*{dt}", "locks": "*i32",
               "context": "*i64", "M": "i32", "N": "i32", "BM": "constexpr", "BN": "constexpr", "LAYOUT": "constexpr"}
        src = GluonASTSource(_every_collective_kernel, sig, {"IrisDeviceCtx": ig.IrisDeviceCtx, "BM": BM, "BN": BN,
                                                              "LAYOUT": layout})
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
        assert "atom.global" in ptx and "ld.global" in ptx and "st.global" in ptx, dt


def test_gluon_tiles_refuse_indirect_peers(tmp_path):
    """A job with an indirect peer (IRIS_INDIRECT_PEERS=all) gets a compile-time error naming why and
    the fix, not a kernel that loads through a mapping the peer does not have: for a tile collective,
    and for IrisDeviceCtx's loads, stores and atomics (test_gluon.py's kernel)."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "import triton\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.experimental.gluon._runtime import GluonASTSource\n"
        "import test_gluon, test_tiles_gluon as t\n"
        "sig = {'IrisDeviceCtx': 'constexpr', 'inp': '*fp32', 'ism': 'i32', 'isn': 'i32', 'pub': '*fp32', "
        "'out': '*fp32', 'osm': 'i32', 'osn': 'i32', 'locks': '*i32', 'context': '*i64', 'M': 'i32', 'N': 'i32', "
        "'BM': 'constexpr', 'BN': 'constexpr', 'OP': 'constexpr', 'LAYOUT': 'constexpr'}\n"
        "rma = {'IrisDeviceCtx': 'constexpr', 'context': '*i64', 'src': '*i32', 'seg': '*i32', 'olds': '*i32', "
        "'flags': '*i32', 'cas': '*i32', 'me': 'i32', 'n': 'i32', 'BLOCK': 'constexpr'}\n"
        "for src in (GluonASTSource(t._gluon_tiles_kernel, sig, {'IrisDeviceCtx': t.ig.IrisDeviceCtx, 'BM': 8, "
        "'BN': 16, 'OP': 'gather', 'LAYOUT': t.LAYOUTS[0][0]}), GluonASTSource(test_gluon._rma_kernel, rma, "
        "{'IrisDeviceCtx': t.ig.IrisDeviceCtx, 'BLOCK': 256})):\n"
        "    try:\n"
        "        triton.compile(src, target=GPUTarget('cuda', 90, 32), options={'num_warps': 1})\n"
        "        print('COMPILED')\n"
        "    except Exception as e:\n"
        "        c = e\n"
        "        while c.__cause__ is not None or c.__context__ is not None:\n"
        "            c = c.__cause__ or c.__context__\n"
        "        print('REFUSED', str(c).replace(chr(10), ' '))\n")
    env = dict(os.environ, TRITON_INTERPRET="0", IRIS_INDIRECT_PEERS="all", TRITON_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    said = [line for line in proc.stdout.splitlines() if line.startswith(("REFUSED", "COMPILED"))]
    assert len(said) == 2, proc.stdout + proc.stderr
    for line in said:
        assert line.startswith("REFUSED") and "indirect peer" in line and "iris.DeviceContext" in line, line
