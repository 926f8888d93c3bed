"""The heap end to end: real ranks on the host driver (and on GPUs where present)."""
import os
import warnings

import pytest
import torch

import iris

ALLOCATORS = ["torch", "vmem"]


def _memfd_maps():
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "memfd:iris" in line or "/dev/shm/torch" in line)


def _usage():
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return len(os.listdir("/proc/self/fd")), maps, _memfd_maps()


def rank_basics(allocator):
    """Allocate, check offsets and bases, write into the next rank's copy, read what the previous wrote.
    "torch+expandable": the torch allocator over VMM-backed memory, which peers open by its handles."""
    if allocator == "torch+expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # before this rank touches CUDA
        allocator = "torch"
    ctx = iris.iris(heap_size=1 << 22, allocator=allocator)
    opened_by = ctx.heap.stats.get("peers_opened_by")
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    bases = ctx.get_heap_bases()
    assert bases.dtype == torch.int64 and bases.device == ctx.get_device() and bases.shape == (w,)
    bases = bases.tolist()
    ts = [ctx.zeros(1000), ctx.ones(7, 3, dtype=torch.int32), ctx.empty((5, 5), dtype=torch.float16),
          ctx.full((3,), 2.5), ctx.arange(10), ctx.randn(4, 4), ctx.empty(0)]
    assert all(ctx.is_symmetric(t) for t in ts)
    assert not ctx.is_symmetric(torch.zeros(4, device=ctx.get_device()))
    offsets = [ctx.heap.offset_of(t) for t in ts]
    a = ts[0]
    ctx.barrier()
    nxt, prv = (r + 1) % w, (r - 1) % w
    ctx.peer_view(a, nxt).copy_(torch.arange(1000, dtype=torch.float32, device=a.device) + 1000 * (r + 1))
    ctx.peer_view(ts[1], nxt)[2:4] = -(r + 1)
    ctx.barrier()
    expect = torch.arange(1000, dtype=torch.float32, device=a.device) + 1000 * (prv + 1)
    ok_a = torch.equal(a, expect)
    expect_b = torch.ones(7, 3, dtype=torch.int32, device=a.device)
    expect_b[2:4] = -(prv + 1)
    ok_b = torch.equal(ts[1], expect_b)
    more = [ctx.zeros(1 << 16) for _ in range(8)]  # growth on vmem
    offsets += [t.data_ptr() - bases[r] for t in more]
    stable = ctx.get_heap_bases().tolist() == bases
    ctx.barrier()
    ctx.close()
    ctx.close()  # idempotent
    return {"bases": bases, "offsets": offsets, "ok_a": ok_a, "ok_b": ok_b, "stable": stable, "opened_by": opened_by}


@pytest.mark.parametrize("allocator", ALLOCATORS + ["torch+expandable"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_share_offsets_and_write_peers(world, allocator):
    out = iris.spawn(rank_basics, world, args=(allocator,))
    gpu = torch.cuda.is_available()
    want = {"vmem": None, "torch": "ipc" if gpu else "vmm handles", "torch+expandable": "vmm handles"}[allocator]
    for r, res in enumerate(out):
        assert res["opened_by"] == want, f"rank {r}: peers opened by {res['opened_by']}, expected {want}"
        assert res["ok_a"] and res["ok_b"], f"rank {r} did not see what rank {(r - 1) % world} wrote"
        assert len(set(res["bases"])) == world, f"rank {r}: heap bases not distinct: {res['bases']}"
        assert res["stable"], f"rank {r}: heap bases moved"
        assert res["offsets"] == out[0]["offsets"], f"rank {r} offsets differ from rank 0"


def rank_oom(allocator):
    ctx = iris.iris(heap_size=1 << 20, allocator=allocator)
    keep = ctx.full((1000,), 7.0)
    try:
        ctx.empty(1 << 20, dtype=torch.float32)
        return "no error"
    except iris.HeapOutOfMemory as e:
        msg = str(e)
        assert isinstance(e, MemoryError) and e.requested == 4 << 20 and e.heap_size >= 1 << 20, msg
        assert str(4 << 20) in msg and "heap_size" in msg, msg
    after = ctx.arange(100, dtype=torch.float32)
    ctx.barrier()
    ok = bool((keep == 7.0).all()) and torch.equal(after.cpu(), torch.arange(100, dtype=torch.float32))
    ctx.close()
    return ok


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_out_of_memory_leaves_heap_usable(allocator):
    assert iris.spawn(rank_oom, 2, args=(allocator,)) == [True, True]


def rank_leaks(n):
    def once(i):
        with iris.iris(heap_size=1 << 22, allocator=ALLOCATORS[i % 2]) as ctx:
            x = ctx.zeros(1 << 16)
            ctx.peer_view(x, (ctx.get_rank() + 1) % ctx.get_num_ranks())[0] = 1
            ctx.barrier()
            del x

    once(0)
    once(1)  # warm torch's and the allocators' first-use state
    base = _usage()
    for i in range(n):
        once(i)
    return base, _usage()


def test_fifty_heaps_leave_no_fds_or_mappings():
    for base, end in iris.spawn(rank_leaks, 2, args=(50,)):
        assert end[0] == base[0], f"open fds grew from {base[0]} to {end[0]}"
        assert end[2] == 0, f"{end[2]} heap mappings left behind"
        assert end[1] <= base[1] + 4, f"mappings grew from {base[1]} to {end[1]}"


def rank_absent(absent, timeout):
    import time as _t
    if int(os.environ["IRIS_RANK"]) == absent:
        _t.sleep(timeout + 3)
        return "absent"
    t0 = _t.monotonic()
    try:
        iris.iris(heap_size=1 << 20, timeout=timeout)
        return "no error"
    except iris.BootstrapError as e:
        return (str(e), e.missing, _t.monotonic() - t0)


@pytest.mark.parametrize("absent", [2, 0])
def test_bootstrap_times_out_naming_the_absent_rank(absent):
    out = iris.spawn(rank_absent, 3, args=(absent, 3.0))
    for r, res in enumerate(out):
        if r == absent:
            continue
        msg, missing, waited = res
        assert absent in missing, msg
        assert f"{absent}" in msg and "did not arrive" in msg, msg
        assert waited < 3.0 + 5, f"rank {r} waited {waited:.1f} s"


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="heap_size must be positive"):
        iris.iris(heap_size=0)
    with pytest.raises(TypeError, match="heap_size must be an int"):
        iris.iris(heap_size=1.5e9)
    with pytest.raises(ValueError, match="unknown allocator 'slab'"):
        iris.iris(heap_size=1 << 20, allocator="slab")
    with pytest.raises(ValueError, match="unknown platform 'tpu'"):
        iris.iris(heap_size=1 << 20, platform="tpu")
    with iris.iris(heap_size=1 << 20, allocator="vmem") as ctx:
        keep = ctx.arange(10, dtype=torch.int64)
        with pytest.raises(ValueError, match="negative dimension"):
            ctx.zeros(-1)
        with pytest.raises(TypeError, match="sizes must be ints"):
            ctx.zeros(2.5)
        with pytest.raises(ValueError, match="not on this rank's symmetric heap"):
            ctx.free(torch.zeros(3))
        assert torch.equal(keep.cpu(), torch.arange(10))


def test_env_overrides_allocator_and_platform(monkeypatch):
    monkeypatch.setenv("IRIS_ALLOCATOR", "vmem")
    with pytest.warns(UserWarning, match="IRIS_ALLOCATOR=vmem overrides allocator='torch': this heap uses the vmem "
                                         "allocator"):
        with iris.iris(heap_size=1 << 20, allocator="torch") as ctx:
            assert ctx.allocator_name == "vmem"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the argument and the environment agree: nothing to say
        iris.iris(heap_size=1 << 21, allocator="vmem").close()
    monkeypatch.setenv("IRIS_PLATFORM", "nonsense")
    with pytest.raises(ValueError, match="IRIS_PLATFORM"):
        iris.iris(heap_size=1 << 20)


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_factories_behave_like_torch(allocator):
    with iris.iris(heap_size=1 << 22, allocator=allocator) as ctx:
        d = ctx.get_device()
        g = torch.Generator(device=d).manual_seed(0)
        cases = [
            (ctx.zeros(2, 3), torch.zeros(2, 3)), (ctx.zeros((2, 3), dtype=torch.int16), torch.zeros((2, 3), dtype=torch.int16)),
            (ctx.ones([4]), torch.ones([4])), (ctx.full((2, 2), 7), torch.full((2, 2), 7)),
            (ctx.full((2,), True), torch.full((2,), True)), (ctx.full(3, 1.5, dtype=torch.float64), torch.full((3,), 1.5, dtype=torch.float64)),
            (ctx.arange(5), torch.arange(5)), (ctx.arange(1, 4, 0.5), torch.arange(1, 4, 0.5)),
            (ctx.linspace(0, 1, 5), torch.linspace(0, 1, 5)),
        ]
        for got, ref in cases:
            assert ctx.is_symmetric(got) and got.dtype == ref.dtype and torch.equal(got.cpu(), ref), (got, ref)
        src = torch.randn(3, 4, dtype=torch.float64)
        for fn, val in ((ctx.zeros_like, 0), (ctx.ones_like, 1)):
            t = fn(src)
            assert t.shape == src.shape and t.dtype == src.dtype and bool((t == val).all())
        assert torch.equal(ctx.full_like(src, 3).cpu(), torch.full_like(src, 3))
        assert ctx.empty_like(src, dtype=torch.int8).dtype == torch.int8
        r = ctx.rand(1000, generator=g)
        assert 0 <= float(r.min()) and float(r.max()) < 1 and float(r.std()) > 0.2
        n = ctx.randn(2000, dtype=torch.float64)
        assert abs(float(n.mean())) < 0.2 and 0.8 < float(n.std()) < 1.2
        i = ctx.randint(3, 9, (500,))
        assert i.dtype == torch.int64 and int(i.min()) >= 3 and int(i.max()) < 9 and len(i.unique()) == 6
        assert ctx.randint(5, size=(10,)).max() < 5
        u = ctx.uniform(100, low=-2.0, high=-1.0)
        assert float(u.min()) >= -2 and float(u.max()) < -1
        w = ctx.ones(3, requires_grad=True)
        (w * 2).sum().backward()
        assert w.requires_grad and torch.equal(w.grad.cpu(), torch.full((3,), 2.0))
        out = ctx.empty(4)
        assert ctx.zeros(4, out=out) is out and bool((out == 0).all())
        assert ctx.arange(4, out=out) is out and torch.equal(out.cpu(), torch.arange(4.0))
        with pytest.raises(ValueError, match="The output tensor is not on the symmetric heap"):
            ctx.zeros(4, out=torch.empty(4))
        with pytest.raises(ValueError, match="leave it out"):
            ctx.zeros(4, device="meta")
        assert d.type in ("cpu", "cuda")
        # the usual call takes the default dtype at each call, as torch does
        try:
            for default in (torch.float64, torch.float32):
                torch.set_default_dtype(default)
                assert ctx.empty(3).dtype == default and ctx.empty(3, dtype=torch.int16).dtype == torch.int16
        finally:
            torch.set_default_dtype(torch.float32)
        assert ctx.empty(2, 3).shape == (2, 3) and ctx.empty((2, 3)).shape == (2, 3) == ctx.empty([2, 3]).shape


# -- the host heap commits only what it uses ------------------------------------------------------
def _committed(ctx) -> int:
    """Bytes the torch allocator's host block has committed (the memfd's allocated pages)."""
    return os.fstat(ctx.heap.alloc._mapped[2]).st_blocks * 512


def rank_sparse_host_heap():
    with iris.iris(heap_size=8 << 30, allocator="torch") as ctx:  # a third of this machine's memory, per rank
        empty = _committed(ctx)
        x = ctx.full((1 << 18,), float(ctx.get_rank() + 1))  # 1 MiB
        peer = ctx.peer_view(x, (ctx.get_rank() + 1) % ctx.get_num_ranks())
        ctx.barrier()
        ok = bool((peer == float((ctx.get_rank() + 1) % ctx.get_num_ranks() + 1)).all())
        used = _committed(ctx)
        del x, peer
    return empty, used, ok


@pytest.mark.skipif(torch.cuda.is_available(), reason="the host heap")
def test_host_torch_heap_commits_only_what_it_uses():
    for empty, used, ok in iris.spawn(rank_sparse_host_heap, 2):
        assert ok, "a peer's copy did not hold its values"
        assert empty < (1 << 20) and (1 << 20) <= used < (8 << 20), (empty, used)


def _shm():
    """/dev/shm's files but multiprocessing's semaphores (other programs on this machine make those)."""
    return sorted(n for n in os.listdir("/dev/shm") if not n.startswith("sem."))


def rank_heap_larger_than_memory():
    before = (_shm(), _usage())
    try:
        iris.iris(heap_size=1 << 50, allocator="torch")
        message = ""
    except iris.HeapOutOfMemory as e:
        message = str(e)
    return message, before, (_shm(), _usage())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the host heap")
def test_host_heap_larger_than_memory_raises_first_and_leaves_nothing():
    for message, before, after in iris.spawn(rank_heap_larger_than_memory, 2):
        assert message.startswith(f"cannot create a heap of {1 << 50} bytes (heap_size): "), message
        free = message.split(": ")[1].split(". ")[0]
        assert free.endswith(" bytes free here") and 0 < int(free.split()[0]) < 1 << 50, message
        assert "allocator='vmem'" in message and "in a heap of" not in message, message
        assert after[0] == before[0], f"/dev/shm: {before[0]} -> {after[0]}"
        assert after[1][2] == 0, "a heap mapping was left behind"


def rank_killed_after_heap():
    ctx = iris.iris(heap_size=64 << 20, allocator="torch")
    ctx.zeros(1 << 16)
    ctx.barrier()
    if ctx.get_rank() == 1:
        os._exit(3)  # killed with its heap mapped: no file may outlive it
    return True


@pytest.mark.skipif(torch.cuda.is_available(), reason="the host heap")
def test_killed_rank_leaves_nothing_in_dev_shm():
    before = _shm()
    with pytest.raises(Exception):
        iris.spawn(rank_killed_after_heap, 2, timeout=60)
    assert _shm() == before, f"/dev/shm: {before} -> {_shm()}"
