"""The fault record (iris/device/faults.py): a device function given a rank outside [0, world) touches no
memory and the host raises DeviceCheckError once at ctx.barrier(); a device wait that nobody ends gives
up after the spin limit, the kernel returns, and the host raises WaitTimeout naming the flag.

Real ranks (iris.spawn) run every case of a world in one job, each rank returning its failures; on the
host the kernels run in Triton's interpreter, on GPUs compiled (marker gpu, 2 and 4 ranks). Without
IRIS_DEBUG: the rank check is on by default.
"""
import functools
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import iris

ROOT = Path(__file__).resolve().parents[1]
N = 16
POISON_F, POISON_I, OTHER = -7.0, 77, -2.0
# polls before a wait gives up: the limit bounds every wait of the job, the ones that end too, and a GPU
# polls in about a microsecond while the ranks' launches drift by milliseconds (an interpreted poll takes
# about that long itself)
SPIN = 1 << 20 if torch.cuda.is_available() else 200
# (case, the device function the error names): every device function that takes a rank
RANK_CASES = [("store", "store"), ("load", "load"), ("load_other", "load"), ("get", "get"), ("put", "put"),
              ("copy_from", "copy"), ("copy_to", "copy"), ("atomic_add", "atomic_add"), ("atomic_sub", "atomic_sub"),
              ("atomic_cas", "atomic_cas"), ("atomic_xchg", "atomic_xchg"), ("atomic_and", "atomic_and"),
              ("atomic_or", "atomic_or"), ("atomic_xor", "atomic_xor"), ("atomic_min", "atomic_min"),
              ("atomic_max", "atomic_max"), ("signal", "signal"), ("wait", "wait"), ("context_store", "store"),
              ("block_ranks", "store")]


@triton.jit
def _bad_rank(x, out, iout, flag, me, to, heap_bases, context, OP: tl.constexpr, RANK: tl.constexpr,
              WORLD: tl.constexpr, N: tl.constexpr):
    """One device function from `me` with the other rank `to` (out of range here); what it returns goes
    into out (floats) or iout (ints), this rank's own memory."""
    o = tl.arange(0, N)
    v = o + 1
    if OP == "store":
        iris.store(x + o, v.to(tl.float32), me, to, heap_bases)
    elif OP == "load":
        tl.store(out + o, iris.load(x + o, me, to, heap_bases))
    elif OP == "load_other":
        tl.store(out + o, iris.load(x + o, me, to, heap_bases, mask=o < N - 1, other=-2.0))
    elif OP == "get":
        iris.get(x + o, out + o, me, to, heap_bases, other=-2.0)
    elif OP == "put":
        iris.put(out + o, x + o, me, to, heap_bases)
    elif OP == "copy_from":
        iris.copy(x + o, out + o, to, me, me, heap_bases)
    elif OP == "copy_to":
        iris.copy(out + o, x + o, me, to, me, heap_bases)
    elif OP == "atomic_add":
        tl.store(iout + o, iris.atomic_add(flag + o, v, me, to, heap_bases))
    elif OP == "atomic_sub":
        tl.store(iout + o, iris.atomic_sub(flag + o, v, me, to, heap_bases, sem="relaxed", scope="sys"))
    elif OP == "atomic_cas":  # cmp is what every flag holds: a swap anywhere would show
        tl.store(iout + o, iris.atomic_cas(flag + o, tl.full([N], 77, tl.int32), v, me, to, heap_bases))
    elif OP == "atomic_xchg":
        tl.store(iout + o, iris.atomic_xchg(flag + o, v, me, to, heap_bases))
    elif OP == "atomic_and":
        tl.store(iout + o, iris.atomic_and(flag + o, v, me, to, heap_bases))
    elif OP == "atomic_or":
        tl.store(iout + o, iris.atomic_or(flag + o, v, me, to, heap_bases))
    elif OP == "atomic_xor":
        tl.store(iout + o, iris.atomic_xor(flag + o, v, me, to, heap_bases))
    elif OP == "atomic_min":
        tl.store(iout + o, iris.atomic_min(flag + o, v, me, to, heap_bases))
    elif OP == "atomic_max":
        tl.store(iout + o, iris.atomic_max(flag + o, v + 1000, me, to, heap_bases))
    elif OP == "signal":
        tl.store(iout, iris.signal(flag, 5, me, to, heap_bases))
    elif OP == "wait":  # refused: no poll, no wait
        tl.store(iout, iris.wait(flag, 12345, me, to, heap_bases))
    elif OP == "context_store":
        iris.DeviceContext.initialize(context, RANK, WORLD).store(x + o, v.to(tl.float32), to)
    else:  # a block of ranks, one per lane: this rank's own lanes are stored, the others refused
        iris.store(x + o, v.to(tl.float32), me, tl.where(o % 2 == 0, me, to), heap_bases)


@triton.jit
def _wait_kernel(flag, out, me, to, heap_bases, VALUE: tl.constexpr):
    """Waits for a flag nobody sets, then writes what it read and a mark: the kernel runs to its end."""
    tl.store(out, iris.wait(flag, VALUE, me, to, heap_bases, cmp="ge"))
    tl.store(out + 1, 4242)


@triton.jit
def _spinlock_kernel(context, dst, locks, RANK: tl.constexpr, WORLD: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr):
    """The tile API's locked add of one tile whose lock is held by nobody who will let it go."""
    ctx = iris.DeviceContext.initialize(context, RANK, WORLD)
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BN)
    data = (rows[:, None] * BN + cols[None, :]).to(tl.float32)
    pid = tl.program_id(0)
    ctx.all_reduce_spinlock(iris.Tile(pid, pid, BM, BN, data), iris.make_tensor_view(dst, BM, BN, BN, 1), locks)


def _raised(ctx, kind):
    """The error ctx.barrier() raises (its message), or a failure line if it raised none or another."""
    try:
        ctx.barrier()
    except kind as e:
        return str(e)
    return None


def _rank_cases(ctx, failures):
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    x, flag = ctx.full((N,), POISON_F), ctx.full((N,), POISON_I, dtype=torch.int32)
    out, iout = ctx.full((N,), -9.0), ctx.full((N,), -11, dtype=torch.int32)
    others = [ctx.full((64,), 3.5), ctx.full((8, 8), -1, dtype=torch.int64), ctx.full((32,), 9, dtype=torch.int16)]
    held = [(t, t.clone()) for t in (x, flag, *others)]
    for bad in (world, -1):
        for case, name in RANK_CASES:
            out.fill_(-9.0)
            iout.fill_(-11)
            ctx.barrier()
            _bad_rank[(1,)](x, out, iout, flag, rank, bad, ctx.get_heap_bases(), ctx.get_device_context(), case,
                            rank, world, N)
            what = f"{case} to rank {bad}"
            message = _raised(ctx, iris.DeviceCheckError)
            shown = f"from_rank {rank}, to_rank {bad}"  # translate's order: the caller's view, then the rank reached
            if message is None:
                failures.append(f"rank {rank}: {what}: ctx.barrier() raised no DeviceCheckError")
            elif (f"iris debug: a rank outside [0, world): {shown}, world {world}" not in message
                  or f"iris.{name}" not in message):
                failures.append(f"rank {rank}: {what}: {message}")
            if _raised(ctx, iris.IrisError) is not None:
                failures.append(f"rank {rank}: {what}: the fault was raised twice")
            if case == "block_ranks":  # the lanes that named this rank went through, the others were refused
                lanes = torch.arange(N, device=x.device)
                want = torch.where(lanes % 2 == 0, (lanes + 1).float(), torch.full_like(x, POISON_F))
                if not torch.equal(x, want):
                    failures.append(f"rank {rank}: {what}: x is {x.tolist()[:8]}, expected {want.tolist()[:8]}")
                x.copy_(held[0][1])
            for t, want in held:  # every heap tensor of every rank (each checks its own)
                if not torch.equal(t, want):
                    failures.append(f"rank {rank}: {what} changed a heap tensor: {t.flatten()[:8].tolist()}")
            want_out = {"load": 0.0, "load_other": OTHER}.get(case, -9.0)
            if not torch.equal(out, torch.full_like(out, want_out)):
                failures.append(f"rank {rank}: {what}: out {out.tolist()[:8]}, expected all {want_out}")
            if case.startswith("atomic") or case in ("signal", "wait"):
                got = iout.tolist()
                want_i = [0] * N if case.startswith("atomic") else [0] + [-11] * (N - 1)
                if got != want_i:
                    failures.append(f"rank {rank}: {what}: returned {got[:8]}, expected {want_i[:8]}")
            elif not torch.equal(iout, torch.full_like(iout, -11)):
                failures.append(f"rank {rank}: {what}: iout changed")
    # the heap still works: a put to the next rank, read back there after a barrier
    peer = (rank + 1) % world
    src = ctx.arange(N, dtype=torch.float32) + 100 * rank
    ctx.barrier()  # the next rank has checked its x above before this put lands there
    _bad_rank[(1,)](x, src, iout, flag, rank, peer, ctx.get_heap_bases(), ctx.get_device_context(), "put", rank,
                    world, N)
    ctx.barrier()
    prev = (rank - 1) % world
    if not torch.equal(x, torch.arange(N, dtype=torch.float32, device=x.device) + 100 * prev):
        failures.append(f"rank {rank}: after the refusals a put from rank {prev} left {x.tolist()[:8]}")


def _wait_cases(ctx, failures):
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    flag = ctx.zeros((4,), dtype=torch.int64)
    out = ctx.full((2,), -1, dtype=torch.int64)
    offset = flag.data_ptr() - ctx.get_heap_bases()[rank].item()
    for to in (rank, (rank + 1) % world):  # its own flag, and a peer's polled remotely
        out.fill_(-1)
        ctx.barrier()
        _wait_kernel[(1,)](flag[2:], out, rank, to, ctx.get_heap_bases(), 9)
        message = _raised(ctx, iris.WaitTimeout)
        if message is None:
            failures.append(f"rank {rank}: iris.wait on rank {to}'s flag nobody sets: no WaitTimeout")
            continue
        for part in (f"rank {rank}: iris.wait gave up", f"heap byte offset {offset + 16} (byte 16 of the heap tensor "
                     f"of {flag.nbytes} bytes at offset {offset})", f"on rank {to}", "a value ge 9 and last read 0",
                     f"IRIS_SPIN_LIMIT={SPIN}"):
            if part not in message:
                failures.append(f"rank {rank}: wait on rank {to}: {part!r} not in {message!r}")
        if out.tolist() != [0, 4242]:
            failures.append(f"rank {rank}: the kernel after the wait wrote {out.tolist()}, expected [0, 4242]")
    # a device barrier that rank world - 1 never joins
    ctx.barrier()
    if rank != world - 1:
        ctx.device_barrier()
    message = _raised(ctx, iris.WaitTimeout)
    if rank == world - 1:
        if message is not None:
            failures.append(f"rank {rank}: raised although it made no device barrier: {message}")
    elif message is None or not all(p in message for p in (
            f"rank {rank}: ctx.device_barrier gave up", f"iris's device barrier flags[{world - 1}]",
            f"which rank {world - 1} should have set")):
        failures.append(f"rank {rank}: device barrier without rank {world - 1}: {message}")
    # the tile API's lock, held (1) on this rank by nobody who will let it go: the add is skipped
    locks = ctx.full((1,), 1, dtype=torch.int32)
    dst = ctx.full((4, 8), POISON_F)
    ctx.barrier()
    _spinlock_kernel[(1,)](ctx.get_device_context(), dst, locks, rank, world, 4, 8)
    message = _raised(ctx, iris.WaitTimeout)
    if message is None or "the tile API's lock (all_reduce_spinlock) gave up" not in message or \
            "a value eq 0 and last read 1" not in message:
        failures.append(f"rank {rank}: tile lock held for ever: {message}")
    if not torch.equal(dst, torch.full_like(dst, POISON_F)) or locks.tolist() != [1]:
        failures.append(f"rank {rank}: the skipped locked add wrote {dst.flatten()[:8].tolist()}, locks "
                        f"{locks.tolist()}")
    # ctx.ccl's spinlock all_reduce with the last rank's locks held: every rank's adds there give up
    cfg = iris.ccl.Config(all_reduce_variant="spinlock", spin_limit=SPIN, comm_sms=1)
    inp, out = ctx.full((64,), 1.0), ctx.full((64,), POISON_F)
    ctx.ccl.all_reduce(out, inp, config=cfg)
    plan = next(p for p in ctx.ccl.plans.values() if p.variant == "spinlock")
    ctx.barrier()
    if rank == world - 1:
        plan.args[plan.at["locks"]].fill_(1)
    ctx.barrier()
    ctx.ccl.all_reduce(out, inp, config=cfg)
    message = _raised(ctx, iris.WaitTimeout)
    if message is None or not all(p in message for p in (
            f"rank {rank}: ctx.ccl.all_reduce (spinlock)'s lock gave up", f"on rank {world - 1}",
            "a value eq 0 and last read 1", "Config.spin_limit")):
        failures.append(f"rank {rank}: ccl spinlock held for ever: {message}")
    # the waits that gave up after the lock (a peer's flag, late because it gave up on the lock) are the same
    # error: not raised again
    if (again := _raised(ctx, iris.IrisError)) is not None:
        failures.append(f"rank {rank}: ccl spinlock held for ever: raised again: {again}")


def rank_main(cases):
    if torch.cuda.is_available():  # the device barrier compiled first, its waits unbounded: ranks compile at
        with iris.iris(heap_size=1 << 20) as warm:  # different speeds (the limit is the context's, not the kernel's)
            warm.device_barrier()
            warm.barrier()
    os.environ["IRIS_SPIN_LIMIT"] = str(SPIN)  # read when the context is made
    ctx = iris.iris(heap_size=1 << 22)
    failures = []
    try:
        for case in cases:
            try:
                {"ranks": _rank_cases, "waits": _wait_cases}[case](ctx, failures)
            except Exception:  # noqa: BLE001 - returned to the parent
                failures.append(f"rank {ctx.get_rank()} raised in {case}:\n{traceback.format_exc()}")
                print(failures[-1], file=sys.stderr, flush=True)  # shown even where the peers then diverge
                break
    finally:
        ctx.close()
    return failures


@functools.lru_cache(maxsize=None)
def _run(world, cases):
    return [f for r in iris.spawn(rank_main, world, args=(cases,), timeout=300) for f in r]


def _assert_ok(failures):
    assert not failures, "\n".join(failures[:20])


def test_refused_ranks_touch_nothing_and_the_barrier_names_them():
    """to_rank == world and -1 through every device function: no heap tensor on any rank changes, loads
    read `other` (or 0), atomics return 0, a wait returns at once; ctx.barrier() raises DeviceCheckError
    with IRIS_DEBUG's message and the function, once; the heap works after."""
    _assert_ok(_run(2, ("ranks",)))


def test_waits_nobody_ends_give_up():
    """iris.wait on a flag nobody sets (its own, and a peer's), ctx.device_barrier without one rank, the tile
    API's lock and ctx.ccl's spinlock all_reduce's lock held for ever: each kernel returns and ctx.barrier()
    raises WaitTimeout naming the flag."""
    _assert_ok(_run(2, ("waits",)))


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_device_faults_gpu(world):
    """The same cases compiled, one rank per GPU."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    _assert_ok(_run(world, ("ranks", "waits")))


def test_rank_check_off_compiles_no_check(tmp_path):
    """IRIS_RANK_CHECK=0: a valid access works, a refused rank is not looked at (nothing noted)."""
    script = tmp_path / "off.py"
    script.write_text(
        "import iris, torch, triton, triton.language as tl\n"
        "from iris.device.translate import RANK_CHECK\n"
        "@triton.jit\n"
        "def k(x, to, hb):\n"
        "    o = tl.arange(0, 16)\n"
        "    iris.store(x + o, o.to(tl.float32) + 1, 0, to, hb)\n"
        "ctx = iris.iris(heap_size=1 << 20)\n"
        "x = ctx.full((16,), -7.0)\n"
        "k[(1,)](x, 0, ctx.get_heap_bases())\n"
        "ctx.barrier()\n"
        "print('CHECK', bool(RANK_CHECK), 'STORED', torch.equal(x, torch.arange(16.0) + 1), 'NOTED',\n"
        "      ctx.heap.faults.tolist()[0])\n")
    env = dict(os.environ, IRIS_PLATFORM="host", IRIS_RANK_CHECK="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "CHECK False STORED True NOTED 0" in proc.stdout, proc.stdout + proc.stderr


COMPILE = r'''
import sys
import iris
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from iris.ccl.kernels.accumulate import accumulate_kernel
from iris.device.sync import barrier_kernel
from iris.ops.matmul_reduce import _matmul_reduce_kernel
from iris.ops.matmul_tile_reduce import _matmul_tile_reduce_kernel

@triton.jit
def rma(x, y, f, hb, me, peer, OP: tl.constexpr, BLOCK: tl.constexpr, HINT: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if OP == "put":
        iris.put(x + o, y + o, me, peer, hb, hint=HINT)
    elif OP == "block":
        iris.store(y + o, tl.load(x + o), me, tl.where(o % 2 == 0, me, peer), hb)
    elif OP == "load":
        tl.store(y + o, iris.load(x + o, me, peer, hb, mask=o < 100, other=1.0))
    elif OP == "get":
        iris.get(x + o, y + o, me, peer, hb, mask=o < 100)
    elif OP == "copy":
        iris.copy(x + o, y + o, peer, peer, me, hb)
    elif OP == "cas":
        tl.store(f + o, iris.atomic_cas(f + o, o, o + 1, me, peer, hb))
    elif OP == "sync":
        iris.signal(f, 1, me, peer, hb)
        tl.store(f + 1, iris.wait(f, 1, me, peer, hb, cmp="ge"))
    else:
        for op in tl.static_range(8):
            v = o + op
            if op == 0:
                v = iris.atomic_add(f + o, v, me, peer, hb)
            elif op == 1:
                v = iris.atomic_sub(f + o, v, me, peer, hb, mask=o < 100)
            elif op == 2:
                v = iris.atomic_xchg(f + o, v, me, peer, hb)
            elif op == 3:
                v = iris.atomic_and(f + o, v, me, peer, hb)
            elif op == 4:
                v = iris.atomic_or(f + o, v, me, peer, hb)
            elif op == 5:
                v = iris.atomic_xor(f + o, v, me, peer, hb)
            elif op == 6:
                v = iris.atomic_min(f + o, v, me, peer, hb)
            else:
                v = iris.atomic_max(f + o, v, me, peer, hb)
            tl.store(f + o + 1024, v)

def build(fn, consts, ptrs=()):
    sig = {a: "constexpr" if a in consts else ptrs.get(a, "i32") for a in fn.arg_names}
    src = triton.compiler.ASTSource(fn, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]

P = {"x": "*fp32", "y": "*fp32", "f": "*i32", "hb": "*i64"}
for op in ("put", "block", "load", "get", "copy", "cas", "sync", "atomics")[:None if sys.argv[1] == "all" else 1]:
    ptx = build(rma, {"OP": op, "BLOCK": 256, "HINT": 256 if op == "put" else None}, P)
    if op == "put":
        print("put", ptx.count("st.global.v"), ptx.count("atom.global"), ptx.count("setp."), ptx.count("bra"),
              flush=True)
    print("compiled", op, flush=True)
if sys.argv[1] != "all":
    sys.exit(0)
build(barrier_kernel, {"BLOCK": 4}, {"flags": "*i64", "heap_bases": "*i64"})
print("compiled barrier_kernel", flush=True)
build(accumulate_kernel, dict(WORLD=2, PEERS=2, BLOCK=1024, SPIN=100, LOCK=True, TURNS=False),
      {"inp": "*bf16", "out": "*bf16", "acc": "*fp32", "locks": "*i64", "flags": "*i64", "counters": "*i64",
       "heap_bases": "*i64"})
print("compiled accumulate_kernel", flush=True)
G = dict(BM=64, BN=64, BK=32, GROUP_M=4, NUM_SMS=4, TMA=False, A_T=False, B_T=False, STAGES=2)
GP = {"a": "*fp16", "b": "*fp16", "c": "*fp16", "part": "*fp16", "slots": "*fp16", "locks": "*i32",
      "flags": "*i64", "ctl": "*i64", "heap_bases": "*i64"}
for op in ("spinlock", "one_shot"):  # the tile API's lock, and its waits (two-shot's and reduce_scatter's too)
    build(_matmul_tile_reduce_kernel, dict(G, RANK=0, WORLD=2, OP=op), GP)
    print("compiled tile", op, flush=True)
build(_matmul_reduce_kernel, dict(G, SCATTER=True), GP)  # a fused op's waits (iris.wait)
print("compiled matmul_reduce", flush=True)
'''


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Every kernel the fault record touches compiled for sm_90 with the rank check on, and the put kernel
    with it off (Triton ships ptxas: no GPU needed); what each run printed."""
    script = tmp_path_factory.mktemp("faults") / "compile_faults.py"
    script.write_text(COMPILE)
    out = {}
    for check in ("1", "0"):
        env = dict(os.environ, TRITON_INTERPRET="0", IRIS_PLATFORM="host", IRIS_INDIRECT_PEERS="",
                   IRIS_RANK_CHECK=check,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        proc = subprocess.run([sys.executable, str(script), "all" if check == "1" else "put"], env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[check] = proc.stdout
    return out


@pytest.mark.xdist_group("test_device_faults_compile")
def test_kernels_compile_for_sm90(compiled):
    for name in ("put", "block", "load", "get", "copy", "cas", "sync", "atomics", "barrier_kernel",
                 "accumulate_kernel", "tile spinlock", "tile one_shot", "matmul_reduce"):
        assert f"compiled {name}\n" in compiled["1"], (name, compiled["1"])


@pytest.mark.xdist_group("test_device_faults_compile")
def test_rank_check_costs_a_compare_and_a_cold_branch(compiled):
    """A put's PTX with the check: the same vector stores, one atomic (the cold path's claim of the
    record), a few more compares and branches; without it, none of them."""
    on, off = ([int(v) for v in next(line for line in compiled[c].splitlines() if line.startswith("put "))[4:].split()]
               for c in ("1", "0"))
    assert on[0] == off[0] > 0, (on, off)  # vector stores kept
    assert on[1] == 1 and off[1] == 0, (on, off)  # the claim, in the cold branch only
    assert 0 < on[2] - off[2] <= 6 and 0 < on[3] - off[3] <= 6, (on, off)
