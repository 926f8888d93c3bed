"""The host and device surface Iris programs use: attributes, broadcast, logging, barriers with
group=, the device context (iris.DeviceContext in a kernel, every method), factory keywords, the
heap's capacity, do_bench. Real ranks on the host driver; the compiled DeviceContext is checked by
compiling it for sm_90 (no GPU needed) and, on GPUs, by replaying it from a CUDA graph.
"""
import functools
import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import iris
from iris import DeviceContext
from test_device import _simulate, _vals

# One pytest-xdist worker runs this module: its ranks (one spawn for every check) start once.
pytestmark = pytest.mark.xdist_group("test_iris_surface")

ROOT = Path(__file__).resolve().parents[1]
CAP, N, BLOCK, POISON, OTHER = 64, 50, 32, 100, 101
ATOMICS = ["add", "sub", "xchg", "and", "or", "xor", "min", "max", "cas"]


@triton.jit
def _context_kernel(context, src, local, outs, dsts, acc, vals, cmps, olds, flag, got, n, other,
                    rank: tl.constexpr, world_size: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    nxt = (rank + 1) % world_size
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = (o < n) & (o % 3 != 1)
    tl.store(outs + o, ctx.load(src + o, nxt, m, other))                       # next's src
    ctx.store(dsts + o, tl.load(local + o), nxt, m)                            # into next's dsts[0]
    ctx.get(src + o, outs + CAP + o, nxt, m)                                   # next's src, locally
    ctx.put(local + o, dsts + CAP + o, nxt, mask=m)                            # into next's dsts[1]
    ctx.copy(src + o, dsts + 2 * CAP + o, nxt, rank, m)                        # next's src into my dsts[2]
    ctx.copy(src + o, dsts + 3 * CAP + o, rank, nxt, mask=m)                   # my src into next's dsts[3]
    v = vals + o
    tl.store(olds + o, ctx.atomic_add(acc + o, tl.load(v), nxt, m, "relaxed", "sys"), mask=m)
    tl.store(olds + CAP + o, ctx.atomic_sub(acc + CAP + o, tl.load(v + CAP), nxt, m), mask=m)
    tl.store(olds + 2 * CAP + o, ctx.atomic_xchg(acc + 2 * CAP + o, tl.load(v + 2 * CAP), nxt, m), mask=m)
    tl.store(olds + 3 * CAP + o, ctx.atomic_and(acc + 3 * CAP + o, tl.load(v + 3 * CAP), nxt, m), mask=m)
    tl.store(olds + 4 * CAP + o, ctx.atomic_or(acc + 4 * CAP + o, tl.load(v + 4 * CAP), nxt, m), mask=m)
    tl.store(olds + 5 * CAP + o, ctx.atomic_xor(acc + 5 * CAP + o, tl.load(v + 5 * CAP), nxt, m), mask=m)
    tl.store(olds + 6 * CAP + o, ctx.atomic_min(acc + 6 * CAP + o, tl.load(v + 6 * CAP), nxt, m), mask=m)
    tl.store(olds + 7 * CAP + o, ctx.atomic_max(acc + 7 * CAP + o, tl.load(v + 7 * CAP), nxt, m, sem="acq_rel",
                                                 scope="sys"), mask=m)
    tl.store(olds + 8 * CAP + o, ctx.atomic_cas(acc + 8 * CAP + o, tl.load(cmps + o), tl.load(v + 8 * CAP), nxt,
                                                "acq_rel", "sys"))
    if tl.program_id(0) == 0:
        ctx.signal(flag, 7 + rank, nxt, "add")
        tl.store(got, ctx.wait(flag, 1, "ge"))


def _expect(failures, what, got, exp):
    got = got.detach().cpu()
    if got.dtype != exp.dtype or not torch.equal(got, exp):
        failures.append(f"{what}: got {got.flatten()[:8].tolist()} expected {exp.flatten()[:8].tolist()}")


def _run_context_kernel(ctx, graph=False):
    """Every DeviceContext method once; returns failures. graph: capture the launch and replay it."""
    me, w, dev = ctx.cur_rank, ctx.num_ranks, ctx.get_device()
    nxt, prv = (me + 1) % w, (me - 1) % w
    dt, failures = torch.int32, []
    m = (torch.arange(CAP) < N) & (torch.arange(CAP) % 3 != 1)
    src_of, local_of = (lambda r: _vals(CAP, r, dt)), (lambda r: _vals(CAP, r + 5, dt))
    init = [torch.stack([_vals(CAP, 3 * r + i, dt) for i in range(9)]) for r in range(w)]
    val = [torch.stack([_vals(CAP, 5 * r + 2 * i + 1, dt) for i in range(9)]) for r in range(w)]
    cmp = [torch.where(torch.arange(CAP) % 2 == 0, init[r][8], init[r][8] + 1) for r in range(w)]
    src = ctx.empty(CAP, dtype=dt)
    src.copy_(src_of(me).to(dev))
    dsts, acc, flag = ctx.full((4, CAP), POISON, dtype=dt), ctx.empty(9, CAP, dtype=dt), ctx.zeros(1, dtype=dt)
    acc.copy_(init[me].to(dev))
    outs = torch.full((2, CAP), POISON, dtype=dt, device=dev)
    olds = torch.full((9, CAP), POISON, dtype=dt, device=dev)
    got = torch.full((1,), POISON, dtype=dt, device=dev)
    local, vals, cmps = local_of(me).to(dev), val[me].to(dev), cmp[nxt].to(dev)
    context = ctx.get_device_context()

    def launch():
        _context_kernel[(CAP // BLOCK,)](context, src, local, outs, dsts, acc, vals, cmps, olds, flag, got, N, OTHER,
                                         rank=me, world_size=w, CAP=CAP, BLOCK=BLOCK)

    ctx.barrier()
    if graph:
        _context_kernel.warmup(context, src, local, outs, dsts, acc, vals, cmps, olds, flag, got, N, OTHER,
                               rank=me, world_size=w, CAP=CAP, BLOCK=BLOCK, grid=(CAP // BLOCK,))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            launch()
        ctx.barrier()
        g.replay()
    else:
        launch()
    ctx.barrier()
    poison = torch.full((CAP,), POISON, dtype=dt)
    tag = f"DeviceContext w={w} rank {me}{' (graph)' if graph else ''}"
    _expect(failures, f"{tag} load", outs[0], torch.where(m, src_of(nxt), torch.full((CAP,), OTHER, dtype=dt)))
    _expect(failures, f"{tag} get", outs[1], torch.where(m, src_of(nxt), poison))
    _expect(failures, f"{tag} store", dsts[0], torch.where(m, local_of(prv), poison))
    _expect(failures, f"{tag} put", dsts[1], torch.where(m, local_of(prv), poison))
    _expect(failures, f"{tag} copy pull", dsts[2], torch.where(m, src_of(nxt), poison))
    _expect(failures, f"{tag} copy push", dsts[3], torch.where(m, src_of(prv), poison))
    for i, op in enumerate(ATOMICS):
        cmp_mine = cmp[me] if op == "cas" else None
        _expect(failures, f"{tag} atomic_{op} value", acc[i], _simulate(op, init[me][i], val[prv][i], cmp_mine, m))
        exp_old = init[nxt][i] if op == "cas" else torch.where(m, init[nxt][i], poison)
        _expect(failures, f"{tag} atomic_{op} old", olds[i], exp_old)
    _expect(failures, f"{tag} signal", flag, torch.tensor([7 + prv], dtype=dt))
    _expect(failures, f"{tag} wait", got, torch.tensor([7 + prv], dtype=dt))
    return failures


def check_surface(ctx):
    me, w, dev = ctx.cur_rank, ctx.num_ranks, ctx.get_device()
    failures = []

    def want(ok, what):
        if not ok:
            failures.append(f"rank {me}: {what}")

    want((me, w) == (ctx.get_rank(), ctx.get_num_ranks()), "cur_rank/num_ranks")
    want(ctx.heap_bases is ctx.get_heap_bases(), "heap_bases attribute")
    want(ctx.gpu_id == ctx.get_device_id() == (dev.index or 0), f"gpu_id {ctx.gpu_id}")
    want(isinstance(ctx.get_cu_count(), int) and ctx.get_cu_count() >= 1, f"get_cu_count {ctx.get_cu_count()}")
    # broadcast: every kind of value, from every rank
    for src in range(w):
        mine = {"rank": me, "list": [me, me * 2]}
        want(ctx.broadcast(mine if me == src else None, src) == {"rank": src, "list": [src, src * 2]}, "object")
        want(ctx.broadcast(3.5 + src if me == src else None, src) == 3.5 + src, "number")
        arr = ctx.broadcast(np.arange(6, dtype=np.int16).reshape(2, 3) * (src + 1) if me == src else None, src)
        want(isinstance(arr, np.ndarray) and arr.dtype == np.int16
             and (arr == np.arange(6).reshape(2, 3) * (src + 1)).all(), f"ndarray {arr!r}")
        t = ctx.broadcast(torch.arange(5, dtype=torch.float64) * (src + 2) if me == src else None, src)
        want(isinstance(t, np.ndarray) and t.dtype == np.float64 and (t == np.arange(5.) * (src + 2)).all(),
             f"tensor, as a numpy array (Iris's return) {t!r}")
    want(ctx.broadcast(me + 40, source_rank=w - 1) == 40 + w - 1, "broadcast source_rank=")
    # logging: records tagged with the rank, filtered by iris.set_logger_level
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("iris")
    logger.addHandler(handler)
    try:
        iris.set_logger_level(iris.INFO)
        ctx.debug("hidden")
        ctx.info("shown info")
        ctx.warning("shown warning")
        ctx.error("shown error")
        iris.set_logger_level(iris.DEBUG)
        ctx.debug("shown debug")
    finally:
        logger.removeHandler(handler)
        iris.set_logger_level(iris.WARNING)
    want([(r.getMessage(), r.levelno, r.iris_rank, r.iris_num_ranks) for r in records]
         == [("shown info", iris.INFO, me, w), ("shown warning", iris.WARNING, me, w),
             ("shown error", iris.ERROR, me, w), ("shown debug", iris.DEBUG, me, w)], f"log records {records}")
    # barriers: None, every rank (list, range), a stream; subsets refused before anything happens
    ctx.barrier(group=None)
    ctx.barrier(group=list(range(w)))
    ctx.barrier(stream=torch.cuda.current_stream() if dev.type == "cuda" else None, group=range(w))
    ctx.device_barrier()
    ctx.device_barrier(group=list(reversed(range(w))))
    for call in (ctx.barrier, ctx.device_barrier):
        try:
            call(group=[0])
            failures.append(f"{call.__name__}(group=[0]) did not raise")
        except NotImplementedError as e:
            want("[0]" in str(e) and "group=None" in str(e), f"subset message: {e}")
    # device context: cached, and what it encodes
    c = ctx.get_device_context()
    want(c is ctx.get_device_context(), "get_device_context is cached")
    want(c.dtype == torch.int64 and c.device == dev
         and c.cpu().tolist() == [me, w] + ctx.heap_bases.cpu().tolist() + [0, 0, 0],  # trace slots: not enabled
         f"device context {c}")
    failures += _run_context_kernel(ctx)
    # factories with torch's keywords
    x = ctx.zeros((2, 3), dtype=torch.float32, layout=torch.strided, device=dev)
    want(x.shape == (2, 3) and ctx.zeros(((2, 3),)).shape == (2, 3), "nested size tuple")
    out = ctx.full((6,), 9.0)
    y = ctx.ones(2, 3, out=out)
    want(y.shape == (2, 3) and y.data_ptr() == out.data_ptr() and bool((out == 1).all()), "out= of equal numel")
    cl = ctx.empty(2, 3, 4, 5, memory_format=torch.channels_last)
    want(cl.is_contiguous(memory_format=torch.channels_last) and ctx.is_symmetric(cl), "memory_format")
    z = ctx.zeros_like(cl, device=dev)
    want(z.stride() == cl.stride() and bool((z == 0).all()), "zeros_like preserves the format")
    want(ctx.full_like(x, 4, memory_format=torch.contiguous_format).is_contiguous(), "full_like contiguous_format")
    want(ctx.rand(3, pin_memory=False).shape == (3,) and ctx.arange(5, out=ctx.zeros(5, dtype=torch.int64))
         .tolist() == list(range(5)), "rand pin_memory=False, arange out=")
    for bad, err in ((lambda: ctx.zeros(4, out=ctx.zeros(5)), "5 elements"),
                     (lambda: ctx.zeros(4, layout=torch.sparse_coo), "strided")):
        try:
            bad()
            failures.append(f"no error for {err}")
        except ValueError as e:
            want(err in str(e), f"message {e}")
    # do_bench, with a barrier around every run
    ms = iris.do_bench(lambda: x.add_(1), ctx.barrier, n_warmup=2, n_repeat=5)
    want(isinstance(ms, float) and ms > 0, f"do_bench {ms}")
    want(len(iris.do_bench(lambda: None, n_warmup=1, n_repeat=4, return_mode="all")) == 4, "return_mode all")
    q = iris.do_bench(lambda: None, n_warmup=1, n_repeat=4, quantiles=[0.2, 0.5, 0.8])
    want(len(q) == 3 and q[0] <= q[1] <= q[2], f"quantiles {q}")
    return failures


def check_capacity(ctx):
    """heap_size bytes hold user tensors of heap_size bytes; one byte more is out of memory."""
    failures, size = [], ctx.heap_size
    a, b = ctx.empty(size // 2, dtype=torch.uint8), ctx.empty(size // 2, dtype=torch.uint8)
    a.fill_(1)
    b.fill_(2)
    try:
        ctx.empty(1, dtype=torch.uint8)
        failures.append(f"rank {ctx.cur_rank}: a heap of {size} bytes took {size + 1} bytes of tensors")
    except iris.HeapOutOfMemory:
        pass
    ctx.device_barrier()  # iris's own flags still work beside a full heap
    if not (bool((a == 1).all()) and bool((b == 2).all())):
        failures.append(f"rank {ctx.cur_rank}: the device barrier wrote into the user's tensors")
    return failures


def _checked(heap_size, allocator, check):
    ctx = iris.iris(heap_size, allocator_type=allocator)
    try:
        return check(ctx)
    except Exception:
        return [f"rank {ctx.get_rank()} raised:\n{traceback.format_exc()}"]
    finally:
        ctx.close()


def _capacity(allocator, heap_size):
    def check(ctx):
        # the torch allocator holds exactly what was asked; vmem rounds up to whole chunks
        asked = ctx.heap_size == heap_size if allocator == "torch" else ctx.heap_size >= heap_size
        wrong = [] if asked else [f"{allocator}: heap_size {ctx.heap_size} for {heap_size} asked"]
        return wrong + check_capacity(ctx)
    return _checked(heap_size, allocator, check)


def rank_main():
    """One spawn for all: ranks cost seconds to start."""
    return {"surface": _checked(1 << 22, "torch", check_surface),
            "capacity torch": _capacity("torch", 1 << 22), "capacity vmem": _capacity("vmem", 1 << 22)}


@functools.lru_cache(maxsize=None)
def _run():
    per_rank = iris.spawn(rank_main, 2, timeout=300)
    return {name: [f for r in per_rank for f in r[name]] for name in per_rank[0]}


def test_surface_two_ranks():
    failures = _run()["surface"]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("allocator", ["torch", "vmem"])
def test_capacity(allocator):
    failures = _run()[f"capacity {allocator}"]
    assert not failures, "\n".join(failures[:20])


def test_iris_keywords_before_allocation():
    with pytest.raises(ValueError, match="disagree"):
        iris.iris(1 << 20, allocator="torch", allocator_type="vmem")


COMPILE = r'''
import triton
from triton.backends.compiler import GPUTarget
sys_path = __import__("sys").path
sys_path.insert(0, __import__("sys").argv[1])
import test_iris_surface as t
sig = {n: "*i32" for n in ("src", "local", "outs", "dsts", "acc", "vals", "cmps", "olds", "flag", "got")}
sig.update(context="*i64", n="i32", other="i32", rank="constexpr", world_size="constexpr", CAP="constexpr",
           BLOCK="constexpr")
sig = {k: sig[k] for k in t._context_kernel.arg_names}
src = triton.compiler.ASTSource(t._context_kernel, sig,
                                constexprs={"rank": 1, "world_size": 3, "CAP": 64, "BLOCK": 32})
print("COMPILED", len(triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]))
'''


def test_device_context_compiles_for_sm90(tmp_path):
    """DeviceContext is a Triton aggregate when kernels compile: every method compiles for sm_90."""
    script = tmp_path / "compile_context.py"
    script.write_text(COMPILE)
    env = dict(os.environ, TRITON_INTERPRET="0", IRIS_PLATFORM="host",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script), str(ROOT / "tests")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "COMPILED" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


def _graph_main():
    ctx = iris.iris(1 << 22)
    try:
        return _run_context_kernel(ctx, graph=True)
    finally:
        ctx.close()


@pytest.mark.gpu
def test_device_context_in_cuda_graph():
    """A kernel over DeviceContext captured in a CUDA graph and replayed: every method's result checked."""
    failures = [f for r in iris.spawn(_graph_main, 2, timeout=300) for f in r]
    assert not failures, "\n".join(failures[:20])
