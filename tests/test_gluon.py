"""iris.gluon.IrisDeviceCtx in @gluon.jit kernels and the Gluon all_gather / all_to_all of
iris.ccl.gluon. Gluon has no interpreter: the kernels run on GPUs only (marker gpu, skipped on the
host); on the host they are compiled for sm_90 with the tools Triton ships, which catches API misuse."""
import os
import subprocess
import sys
import types

import pytest
import torch

gluon = pytest.importorskip("triton.experimental.gluon", reason="this Triton has no triton.experimental.gluon")
from triton.experimental.gluon import language as gl  # noqa: E402

import iris  # noqa: E402
from iris.ccl import Config, GluonUnavailable  # noqa: E402
from iris.gluon import IrisDeviceCtx  # noqa: E402

BLOCK, N = 256, 1000  # four programs, the last one partly masked
POISON = -7
OTHER = gl.constexpr(POISON)  # what a masked-out lane of a load reads
INIT = {"add": 100, "sub": 100, "xchg": 5, "and": 0b1111, "or": 0b0001, "xor": 0b1010, "min": 50, "max": 0}
ATOMICS = tuple(INIT)


@gluon.jit
def _rma_kernel(IrisDeviceCtx: gl.constexpr, context, src, seg, olds, flags, cas, me, n, BLOCK: gl.constexpr):
    ctx = IrisDeviceCtx.initialize(context)
    layout: gl.constexpr = gl.BlockedLayout([BLOCK // 128], [32], [4], [0])
    o = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    m = o < n
    peer = (me + 1) % ctx.num_ranks
    stride = n + BLOCK
    gl.store(seg + o, ctx.load(src + o, peer, mask=m, other=OTHER), mask=m)  # peer's src, stored here
    ctx.store(seg + stride + o, gl.load(src + o, mask=m), peer, mask=m)        # my src into peer's seg 1
    ctx.get(src + o, seg + 2 * stride + o, peer, mask=m)                        # peer's src into my seg 2
    ctx.put(src + o, seg + 3 * stride + o, peer, mask=m)                        # my src into peer's seg 3
    ctx.copy(src + o, seg + 4 * stride + o, peer, me, mask=m)                   # peer's src into my seg 4
    v = gl.full([BLOCK], 1, gl.int32, layout) * (me + 1)
    gl.store(olds + 0 * stride + o, ctx.atomic_add(flags + 0 * stride + o, v, peer, mask=m, sem="acq_rel",
                                                   scope="sys"), mask=m)
    gl.store(olds + 1 * stride + o, ctx.atomic_sub(flags + 1 * stride + o, v, peer, mask=m), mask=m)
    gl.store(olds + 2 * stride + o, ctx.atomic_xchg(flags + 2 * stride + o, v, peer, mask=m), mask=m)
    gl.store(olds + 3 * stride + o, ctx.atomic_and(flags + 3 * stride + o, v, peer, mask=m), mask=m)
    gl.store(olds + 4 * stride + o, ctx.atomic_or(flags + 4 * stride + o, v, peer, mask=m), mask=m)
    gl.store(olds + 5 * stride + o, ctx.atomic_xor(flags + 5 * stride + o, v, peer, mask=m), mask=m)
    gl.store(olds + 6 * stride + o, ctx.atomic_min(flags + 6 * stride + o, v, peer, mask=m), mask=m)
    gl.store(olds + 7 * stride + o, ctx.atomic_max(flags + 7 * stride + o, v, peer, mask=m, sem="relaxed",
                                                   scope="gpu"), mask=m)
    if gl.program_id(0) == 0:
        gl.store(olds + 8 * stride, ctx.atomic_cas(cas, 0, me + 1, peer, sem="acq_rel", scope="sys"))


def _rma_rank():
    ctx = iris.iris(heap_size=1 << 24)
    try:
        r, w = ctx.get_rank(), ctx.get_num_ranks()
        peer, prev = (r + 1) % w, (r - 1) % w
        stride = N + BLOCK
        src = ctx.arange(r * 10_000, r * 10_000 + stride, dtype=torch.int32)
        seg = ctx.full((5 * stride,), POISON, dtype=torch.int32)
        flags = ctx.zeros((8 * stride,), dtype=torch.int32)
        for i, name in enumerate(ATOMICS):
            flags[i * stride:(i + 1) * stride] = INIT[name]
        cas = ctx.zeros((1,), dtype=torch.int32)
        olds = torch.full((8 * stride + 1,), POISON, dtype=torch.int32, device=ctx.get_device())
        ctx.barrier()
        _rma_kernel[(triton_cdiv(N, BLOCK),)](IrisDeviceCtx, ctx.get_device_context(), src, seg, olds, flags, cas,
                                             r, N, BLOCK, num_warps=4)
        ctx.barrier()
        fails = []
        seg, flags, olds = seg.cpu().view(5, stride), flags.cpu().view(8, stride), olds.cpu()
        want_src = {q: torch.arange(q * 10_000, q * 10_000 + N, dtype=torch.int32) for q in range(w)}
        tail = torch.full((BLOCK,), POISON, dtype=torch.int32)
        for i, who in enumerate((peer, prev, peer, prev, peer)):  # load, store, get, put, copy
            if not torch.equal(seg[i], torch.cat([want_src[who], tail])):
                fails.append(f"rank {r} segment {i}: {seg[i][:4].tolist()}... want rank {who}'s src")
        v = prev + 1  # what prev's atomics applied to this rank's flags
        after = {"add": 100 + v, "sub": 100 - v, "xchg": v, "and": 0b1111 & v, "or": 1 | v, "xor": 0b1010 ^ v,
                 "min": min(50, v), "max": v}
        for i, name in enumerate(ATOMICS):
            want = torch.tensor([after[name]] * N + [INIT[name]] * BLOCK, dtype=torch.int32)
            if not torch.equal(flags[i], want):
                fails.append(f"rank {r} atomic_{name}: {flags[i][:3].tolist()} want {after[name]} (tail untouched)")
            if not torch.equal(olds[i * stride:i * stride + N], torch.full((N,), INIT[name], dtype=torch.int32)):
                fails.append(f"rank {r} atomic_{name} returned {olds[i * stride:i * stride + 3].tolist()}")
        if int(cas.item()) != v or int(olds[8 * stride]) != 0:
            fails.append(f"rank {r} atomic_cas: {int(cas.item())} (want {v}), returned {int(olds[8 * stride])}")
        return fails
    finally:
        ctx.close()


BAD_OPS = ("load", "store", "get", "put", "copy_from", "copy_to", *(f"atomic_{a}" for a in ATOMICS), "atomic_cas")


@gluon.jit
def _bad_rank_kernel(IrisDeviceCtx: gl.constexpr, context, x, out, flag, bad, OP: gl.constexpr, BLOCK: gl.constexpr):
    """One IrisDeviceCtx method given the rank `bad` (outside [0, world)): the rank check must refuse it."""
    ctx = IrisDeviceCtx.initialize(context)
    layout: gl.constexpr = gl.BlockedLayout([BLOCK // 128], [32], [4], [0])
    o = gl.arange(0, BLOCK, layout=layout)
    v = gl.full([BLOCK], 5, gl.int32, layout)
    if OP == "load":
        gl.store(out + o, ctx.load(x + o, bad, other=OTHER))
    elif OP == "store":
        ctx.store(x + o, v, bad)
    elif OP == "get":
        ctx.get(x + o, out + o, bad)
    elif OP == "put":
        ctx.put(x + o, x + BLOCK + o, bad)
    elif OP == "copy_from":
        ctx.copy(x + o, x + BLOCK + o, bad, ctx.cur_rank)
    elif OP == "copy_to":
        ctx.copy(x + o, x + BLOCK + o, ctx.cur_rank, bad)
    elif OP == "atomic_add":
        gl.store(out + o, ctx.atomic_add(flag + o, v, bad))
    elif OP == "atomic_sub":
        gl.store(out + o, ctx.atomic_sub(flag + o, v, bad))
    elif OP == "atomic_xchg":
        gl.store(out + o, ctx.atomic_xchg(flag + o, v, bad))
    elif OP == "atomic_and":
        gl.store(out + o, ctx.atomic_and(flag + o, v, bad))
    elif OP == "atomic_or":
        gl.store(out + o, ctx.atomic_or(flag + o, v, bad))
    elif OP == "atomic_xor":
        gl.store(out + o, ctx.atomic_xor(flag + o, v, bad))
    elif OP == "atomic_min":
        gl.store(out + o, ctx.atomic_min(flag + o, v, bad))
    elif OP == "atomic_max":
        gl.store(out + o, ctx.atomic_max(flag + o, v + 1000, bad, sem="relaxed", scope="sys"))
    else:  # atomic_cas: cmp is what every flag holds, so a swap anywhere would show
        gl.store(out + o, ctx.atomic_cas(flag + o, gl.full([BLOCK], 77, gl.int32, layout), v, bad))


def _bad_rank_rank():
    """Every IrisDeviceCtx method that takes a rank, given world and -1: ctx.barrier() raises one
    DeviceCheckError naming the call and the ranks, nothing on any rank's heap changed, a load reads
    `other`, a refused atomic returns 0."""
    ctx = iris.iris(heap_size=1 << 22)
    try:
        r, w = ctx.get_rank(), ctx.get_num_ranks()
        x = ctx.arange(r * 1000, r * 1000 + 2 * BLOCK, dtype=torch.int32)
        flag = ctx.full((BLOCK,), 77, dtype=torch.int32)
        held = [(t, t.clone()) for t in (x, flag)]
        out = torch.empty(BLOCK, dtype=torch.int32, device=ctx.get_device())
        fails = []
        for bad in (w, -1):
            for op in BAD_OPS:
                out.fill_(-11)
                ctx.barrier()
                _bad_rank_kernel[(1,)](IrisDeviceCtx, ctx.get_device_context(), x, out, flag, bad, op, BLOCK,
                                       num_warps=4)
                try:
                    ctx.barrier()
                    fails.append(f"rank {r} {op} to rank {bad}: ctx.barrier() raised nothing")
                except iris.DeviceCheckError as e:
                    name = "copy" if op.startswith("copy") else op
                    shown = f"from_rank {r}, to_rank {bad}, world {w}"
                    if shown not in str(e) or f"iris.{name}" not in str(e):
                        fails.append(f"rank {r} {op} to rank {bad}: {e}")
                for t, want in held:
                    if not torch.equal(t, want):
                        fails.append(f"rank {r} {op} to rank {bad} changed a heap tensor: {t[:4].tolist()}")
                want_out = {"load": POISON}.get(op, 0 if op.startswith("atomic") else -11)
                if not torch.equal(out, torch.full_like(out, want_out)):
                    fails.append(f"rank {r} {op} to rank {bad}: out {out[:4].tolist()}, want all {want_out}")
        return fails
    finally:
        ctx.close()


def triton_cdiv(a, b):
    return -(-a // b)


CASES = [("all_gather", (37, 100), torch.float32, (8, 256)), ("all_gather", (64, 512), torch.bfloat16, (32, 64)),
         ("all_to_all", (37, 96), torch.float32, (8, 256)), ("all_to_all", (64, 512), torch.int32, (32, 64))]


def _collective_rank(through_ccl=False):
    """CASES into poisoned heap outputs, twice, every element checked: iris.ccl.gluon's functions with an
    Iris-style config object, or (through_ccl) ctx.ccl.all_gather / all_to_all with Config(use_gluon=True)."""
    from iris.ccl import gluon as ccl_gluon
    ctx = iris.iris(heap_size=1 << 26)
    fails = []
    try:
        r, w = ctx.get_rank(), ctx.get_num_ranks()
        for call, (M, cols), dtype, (block_m, block_n) in CASES:
            if through_ccl:
                config = Config(use_gluon=True, block_size_m=block_m, block_size_n=block_n, num_warps=4)
            else:
                config = types.SimpleNamespace(block_size_m=block_m, block_size_n=block_n, num_warps=4,
                                               threads_per_warp=None, comm_sms=None)
            def base(q):
                return (torch.arange(M * cols, dtype=torch.float64).view(M, cols) + 1000 * q + 1).to(dtype)
            inp = ctx.empty((M, cols), dtype=dtype)
            inp.copy_(base(r))
            if call == "all_gather":
                out = ctx.full((w * M, cols), POISON, dtype=dtype)
                want = torch.cat([base(q) for q in range(w)])
            else:
                out = ctx.full((M, cols), POISON, dtype=dtype)
                n = cols // w
                want = torch.cat([base(q)[:, r * n:(r + 1) * n] for q in range(w)], dim=1)
            ctx.barrier()
            for _ in range(2):  # the second call overwrites the first's output in place
                if through_ccl:
                    getattr(ctx.ccl, call)(out, inp, config=config)
                else:
                    getattr(ccl_gluon, call)(ctx, out, inp, config)
            torch.cuda.synchronize()
            if not torch.equal(out.cpu(), want):
                fails.append(f"rank {r} {call} {(M, cols)} {dtype}: {(out.cpu() != want).sum().item()} wrong elements")
        return fails
    finally:
        ctx.close()


@pytest.mark.gpu
def test_gluon_device_context_rma_and_atomics():
    """Every IrisDeviceCtx method across 2 ranks; poisoned outputs, every element checked."""
    fails = [f for r in iris.spawn(_rma_rank, 2, timeout=300) for f in r]
    assert not fails, "\n".join(fails)


@pytest.mark.gpu
def test_gluon_rank_check():
    """IrisDeviceCtx refuses a rank outside [0, world) as the Triton device functions do (IRIS_RANK_CHECK)."""
    from iris.device.translate import RANK_CHECK
    if not RANK_CHECK:
        pytest.skip("IRIS_RANK_CHECK=0: the rank check is compiled out")
    fails = [f for r in iris.spawn(_bad_rank_rank, 2, timeout=300) for f in r]
    assert not fails, "\n".join(fails)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_gluon_collectives(world):
    """all_gather and all_to_all in fp32, bf16 and int32, tiles with masked tails, called twice into
    the same poisoned output; every element checked on every rank."""
    fails = [f for r in iris.spawn(_collective_rank, world, timeout=300) for f in r]
    assert not fails, "\n".join(fails)


@pytest.mark.gpu
def test_gluon_collectives_through_ccl():
    """Config(use_gluon=True) end to end: ctx.ccl.all_gather and all_to_all dispatch to the Gluon kernels
    (2 ranks, on one GPU where there is one); the same cases and checks as above."""
    fails = [f for r in iris.spawn(_collective_rank, 2, args=(True,), timeout=300) for f in r]
    assert not fails, "\n".join(fails)


def _use_gluon_rank():
    ctx = iris.iris(heap_size=1 << 22)
    try:
        x, out = ctx.zeros(8), ctx.zeros(8 * ctx.get_num_ranks())
        said = []
        for call, o in (("all_gather", out), ("all_to_all", x)):
            try:
                getattr(ctx.ccl, call)(o, x, config=Config(use_gluon=True))
                said.append(f"{call}: no error")
            except GluonUnavailable as e:
                said.append(str(e))
        return said
    finally:
        ctx.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without a GPU")
def test_use_gluon_without_gpu_raises():
    """Config(use_gluon=True) on the host: ctx.ccl refuses with GluonUnavailable naming why and the fix."""
    for said in iris.spawn(_use_gluon_rank, 1, timeout=120)[0]:
        assert "Gluon kernels need a GPU" in said and "set use_gluon=False" in said, said


def compiling_child(test_file, test_name, tmp_path):
    """Where the host compiles Gluon kernels for sm_90: here, runs test_name again in a fresh process
    (a kernel run earlier in this one under the interpreter leaves triton.language patched), asserts it
    passed or skips as it did, and returns None; in that process (TRITON_INTERPRET=0) returns Gluon's
    GluonASTSource, or skips where this Triton cannot compile for sm_90 without a GPU."""
    if os.environ.get("IRIS_GLUON_COMPILE_CHILD") != "1":
        env = dict(os.environ, IRIS_GLUON_COMPILE_CHILD="1", TRITON_INTERPRET="0")
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"{test_file}::{test_name}"], env=env, capture_output=True, text=True, timeout=600)
        # the summary line: a failure's traceback quotes the test's source, which may say "skipped"
        last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        if proc.returncode == 0 and "skipped" in last and "passed" not in last:
            pytest.skip(last)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return None
    import triton
    try:
        from triton.experimental.gluon._runtime import GluonASTSource
    except ImportError:
        pytest.skip("this Triton's Gluon has no GluonASTSource to compile without a launch")
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not os.path.exists(os.path.join(bindir, "ptxas")):
        pytest.skip(f"Triton's ptxas is not in {bindir}")
    os.environ.setdefault("TRITON_CACHE_DIR", str(tmp_path))
    return GluonASTSource


def test_gluon_kernels_compile_for_sm90(tmp_path):
    """The Gluon kernels (IrisDeviceCtx's every method, both collectives) compile for sm_90 with the
    Triton installed here: Gluon's API differs between Triton versions. It compiles in a fresh process:
    a kernel run earlier in this one under the interpreter leaves triton.language patched."""
    GluonASTSource = compiling_child(__file__, "test_gluon_kernels_compile_for_sm90", tmp_path)
    if GluonASTSource is None:
        return
    import triton
    from triton.backends.compiler import GPUTarget
    from iris.ccl.gluon import _push_kernel
    target = GPUTarget("cuda", 90, 32)
    rma = GluonASTSource(_rma_kernel, {"IrisDeviceCtx": "constexpr", "context": "*i64", "src": "*i32", "seg": "*i32",
                                      "olds": "*i32", "flags": "*i32", "cas": "*i32", "me": "i32", "n": "i32",
                                      "BLOCK": "constexpr"}, {"IrisDeviceCtx": IrisDeviceCtx, "BLOCK": BLOCK})
    assert "ld.global" in triton.compile(rma, target=target, options={"num_warps": 4}).asm["ptx"]
    for op in ("copy_to", "atomic_cas", "atomic_max"):
        bad = GluonASTSource(_bad_rank_kernel, {"IrisDeviceCtx": "constexpr", "context": "*i64", "x": "*i32",
                                                "out": "*i32", "flag": "*i32", "bad": "i32", "OP": "constexpr",
                                                "BLOCK": "constexpr"}, {"IrisDeviceCtx": IrisDeviceCtx, "OP": op,
                                                                       "BLOCK": BLOCK})
        assert "st.global" in triton.compile(bad, target=target, options={"num_warps": 4}).asm["ptx"]
    sig = {"IrisDeviceCtx": "constexpr", "context": "*i64", "inp": "*bf16", "out": "*bf16", "M": "i32", "N": "i32",
           "s_im": "i32", "s_in": "i32", "s_om": "i32", "s_on": "i32", "peer_in": "i32", "me_out": "i32",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "WARP": "constexpr", "WARPS": "constexpr",
           "PROGRAMS": "constexpr"}
    src = GluonASTSource(_push_kernel, sig, {"IrisDeviceCtx": IrisDeviceCtx, "BLOCK_M": 8, "BLOCK_N": 256, "WARP": 32,
                                             "WARPS": 4, "PROGRAMS": 132})
    assert "st.global" in triton.compile(src, target=target, options={"num_warps": 4}).asm["ptx"]
