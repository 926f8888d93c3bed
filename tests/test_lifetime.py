"""Lifetimes: tensors that free themselves by agreement, use after close, and the bad-input bugs
of free and trim. Real ranks on the host driver (and on GPUs where present)."""
import gc
import os
import random
import threading
import time

import pytest
import torch
import triton
import triton.language as tl

import iris

# host memory: shared-memory imports and /proc/self/maps; the gpu tests below cover GPUs
host_only = pytest.mark.skipif(torch.cuda.is_available(), reason="host memory (the gpu variants cover GPUs)")

ALLOCATORS = ["torch", "vmem"]


def _skip_without(allocator):
    if allocator == "nvshmem":
        try:
            import nvshmem.core  # noqa: F401
        except Exception as e:  # the reason goes into the skip
            pytest.skip(f"allocator='nvshmem' needs nvshmem4py ({type(e).__name__}: {e}); pip install 'iris[nvshmem]'")


def _usage():
    with open("/proc/self/maps") as f:
        lines = f.readlines()
    heap = sum(1 for line in lines if "memfd:iris" in line or "/dev/shm/torch" in line)
    return len(os.listdir("/proc/self/fd")), len(lines), heap


def rank_random_gc(allocator, seed):
    """One program on every rank (the same allocations and collective points, from a shared
    seed); each rank drops its references at its own random later moment, in its own order,
    sometimes keeping a slice alive longer. Every live tensor carries a value that names it,
    checked at the end: a block released while a rank still used it would be overwritten."""
    ctx = iris.iris(heap_size=1 << 24, allocator=allocator)
    program, timing = random.Random(seed), random.Random(seed * 1000 + ctx.get_rank())
    held, dying, offsets, k = {}, [], [], 0
    for step in range(160):
        op = program.random()
        if op < 0.55:
            k += 1
            t = ctx.full((program.randint(1, 3000),), float(k), dtype=torch.float32)
            held[k] = t
            offsets.append(ctx.heap.offset_of(t))
        elif op < 0.8 and held:
            victim = program.choice(sorted(held))  # the program is done with it on every rank...
            t = held.pop(victim)
            keep = t[1:] if timing.random() < 0.3 else t  # ...but a slice may outlive it
            del t
            dying.append([keep, step + timing.randint(0, 12)])  # ...and each rank lets go later
            del keep
        elif op < 0.88:
            ctx.collect()
        elif op < 0.93:
            ctx.barrier()
        timing.shuffle(dying)  # those due go in this rank's own order
        while any(d[1] <= step for d in dying):
            del dying[next(i for i, d in enumerate(dying) if d[1] <= step)]
    dying.clear()
    ok = all(bool((t == float(i)).all()) for i, t in held.items())
    collected_before = ctx.heap.stats["collected"]
    ctx.collect()
    reused = len(ctx.heap.alloc.offsets.live) == len(held) + 1  # the held ones and the barrier flags
    state = (sorted(ctx.heap.alloc.offsets.live.items()), ctx.heap.alloc.offsets.free_blocks())
    ctx.close()
    return offsets, ok, state, collected_before, reused


def rank_each_allocator(fn, *args):
    """fn on both allocators in one job: half the processes to start."""
    return [fn(allocator, *args) for allocator in ALLOCATORS]


def test_random_gc_timing_keeps_offsets_symmetric():
    job = iris.spawn(rank_each_allocator, 3, args=(rank_random_gc, 4))
    for out in ([rank[i] for rank in job] for i in range(len(ALLOCATORS))):
        for r, (offsets, ok, state, collected, reused) in enumerate(out):
            assert ok, f"rank {r}: a live tensor was overwritten"
            assert offsets == out[0][0], f"rank {r} handed out different offsets than rank 0"
            assert state == out[0][2], f"rank {r}'s heap state differs from rank 0's"
            assert collected > 0 and reused, f"rank {r}: dropped blocks were not all released ({collected} collected)"


def rank_agreement(allocator):
    ctx = iris.iris(heap_size=1 << 22, allocator=allocator)
    r = ctx.get_rank()
    x = ctx.full((1000,), 3.0)
    where = ctx.heap.offset_of(x)
    if r == 0:
        del x  # only rank 0 is done with it: the block must wait for the others
    first = ctx.collect()
    y = ctx.full((1000,), 4.0)
    if r != 0:
        del x
    early = ctx.heap.offset_of(y)  # not yet released anywhere, so not reused
    ctx.barrier()  # a collective point: now every rank has queued x's block
    z = ctx.full((1000,), 5.0)
    after = ctx.heap.offset_of(z)
    ok = bool((y == 4.0).all()) and bool((z == 5.0).all())
    ctx.close()
    return first, early != where, after == where, ok


def test_block_waits_until_every_rank_dropped_it():
    out = iris.spawn(rank_each_allocator, 2, args=(rank_agreement,))
    for r, (first, not_early, reused, ok) in enumerate(res for rank in out for res in rank):
        assert first == 0, f"rank {r}: a block queued on one rank only was released"
        assert not_early and reused and ok, f"rank {r}: reuse did not wait for the collective point"


def rank_explicit_and_gc_mix():
    ctx = iris.iris(heap_size=1 << 22, allocator="vmem")
    r = ctx.get_rank()
    with ctx.scope():
        a = ctx.full((500,), 1.0)
        escaped = ctx.full((500,), 2.0)
        if r == 0:
            del a  # queued on rank 0 only; the scope then frees it explicitly on every rank
    frees = ctx.heap.stats["frees"]
    del escaped  # freed by the scope already: its death must not free it again
    gc.collect()
    ctx.collect()
    again = ctx.full((500,), 3.0)
    b = ctx.full((500,), 4.0)
    state = sorted(ctx.heap.alloc.offsets.live.items())
    ok = bool((again == 3.0).all()) and bool((b == 4.0).all())
    queued = dict(ctx.heap._queued)
    after = ctx.heap.stats["frees"]
    ctx.close()
    return frees, after, state, ok, len(queued)


def test_explicit_free_and_scope_mix_with_gc():
    out = iris.spawn(rank_explicit_and_gc_mix, 2)
    for r, (frees, frees_end, state, ok, queued) in enumerate(out):
        assert frees == frees_end == 2 and ok and queued == 0, out[r]
        assert state == out[0][2]


def _second_context(allocator):
    """(a context that stays open, this process's fds and mappings with it alone, a second context):
    what the second one leaves behind after its close is measured against the first's usage."""
    ctx = iris.iris(heap_size=1 << 22, allocator=allocator)
    ctx.barrier()
    gc.collect()
    return ctx, _usage(), iris.iris(heap_size=1 << 22, allocator=allocator)


def rank_use_after_close(allocator):
    ctx, base, ctx2 = _second_context(allocator)
    r, w = ctx2.get_rank(), ctx2.get_num_ranks()
    x = ctx2.full((1 << 16,), float(r + 1))
    row = x.view(256, 256)[3]
    pv = ctx2.peer_view(x, (r + 1) % w)
    ctx2.barrier()
    ctx2.close()
    del ctx2, x
    gc.collect()
    row.fill_(7.0)  # own memory, after close
    seen = float(pv[5])  # the next rank's memory, after close (it wrote r + 2 there, or 7 in row 3)
    held = _usage()
    del row, pv
    gc.collect()
    end = _usage()
    ctx.close()
    return base, held, end, seen


@host_only
def test_tensors_stay_valid_after_close_and_then_go():
    out = iris.spawn(rank_each_allocator, 2, args=(rank_use_after_close,))
    for r, (base, held, end, seen) in ((r, res) for r, rank in enumerate(out) for res in rank):
        assert seen == float((r + 1) % 2 + 1), f"rank {r} read {seen} through a peer view after close"
        assert held[2] > base[2], "the heap's mappings went while tensors still covered them"
        assert end[0] == base[0], f"rank {r}: fds {base[0]} -> {end[0]} after the last tensor went"
        assert end[2] == base[2], f"rank {r}: heap mappings {base[2]} -> {end[2]}"


@host_only
def test_double_free_of_an_import_raises_and_keeps_user_memory():
    with iris.iris(heap_size=1 << 26, allocator="vmem") as ctx:
        store = torch.empty(2 << 20, dtype=torch.float32).share_memory_()
        a, b = store[:1 << 20], store[1 << 20:]
        a.fill_(3.0)
        b.fill_(5.0)
        h = ctx.as_symmetric([a, b])
        assert ctx.is_zero_copy(h[0]) and ctx.is_zero_copy(h[1])
        ctx.free(h[0])
        with pytest.raises(ValueError, match="freed already"):
            ctx.free(h[0])
        fresh = [ctx.full((1 << 20,), -1.0) for _ in range(4)]  # best fit: the region first, were it freed
        assert bool((a == 3.0).all()) and bool((b == 5.0).all()), "an allocation overwrote the user's memory"
        assert all(bool((f == -1.0).all()) for f in fresh)
        ctx.free(h[1])


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_free_of_a_slice_raises_and_frees_nothing(allocator):
    with iris.iris(heap_size=1 << 22, allocator=allocator) as ctx:
        b = ctx.full((1000,), 2.0)
        with pytest.raises(ValueError, match="covers its whole block"):
            ctx.free(b[:10])
        with pytest.raises(ValueError, match="covers its whole block"):
            ctx.free(b[10:])
        c = ctx.full((1000,), 9.0)  # must not alias b
        assert bool((b == 2.0).all()) and bool((c == 9.0).all())
        ctx.free(b.view(torch.int32))  # a view of all of it is the whole block
        with pytest.raises(ValueError, match="freed already"):
            ctx.free(b)


def rank_trim_under_a_tensor():
    ctx = iris.iris(heap_size=1 << 26, allocator="vmem")
    x = ctx.full((3 << 20,), 1.0)  # 12 MiB: several chunks of their own
    y = x[:]  # a view made before the free still reaches the block (x itself no longer does)
    ctx.free(x)  # freed, but y is still referenced
    first = ctx.trim()
    y.fill_(2.0)  # were the chunks unmapped, this would segfault
    ok = bool((y == 2.0).all())
    del x, y
    gc.collect()
    second = ctx.trim()  # now nothing covers them
    ctx.close()
    return first, second, ok


def test_trim_never_unmaps_memory_under_a_live_tensor():
    for first, second, ok in iris.spawn(rank_trim_under_a_tensor, 2):
        assert ok and first < (12 << 20) <= second, (first, second)


@pytest.mark.parametrize("maker", ["host_tensor_at", "device_tensor_at"])
def test_owner_lives_exactly_as_long_as_the_last_view(maker):
    """The owner of a tensor views.py made survives every tensor, slice, dtype view and
    untyped_storage() handle over the memory, and dies with the last; data stays right through the
    survivors. The GPUs' way runs where there is a GPU."""
    from iris.heap import views
    tensor_at = getattr(views, maker)
    dev = torch.device("cuda" if maker == "device_tensor_at" else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    store = torch.arange(64 * 64, dtype=torch.float32, device=dev) * 7 + 3
    died = []

    class Owner:
        def __del__(self):
            died.append(True)

    t = tensor_at(store.data_ptr(), torch.Size((64, 64)), torch.float32, dev, Owner())
    handles = [t[5:9], t.view(torch.int32), t.untyped_storage(), t.view(-1)[100:], t.t(), t[3], t.view(torch.bfloat16)]
    last = t.view(torch.int32)[10:12]  # rows 10 and 11, as int32: outlives everything else
    poison = torch.full((64,), -9.5, device=dev)
    t[10] = poison  # through the tensor, read back later through the survivor
    del t
    for i in range(len(handles)):
        handles[i] = None
        gc.collect()
        assert not died, f"the owner died while handle {i + 1} of {len(handles)} and a slice were alive"
    assert torch.equal(last.view(torch.float32)[0], poison) and torch.equal(store[10 * 64:11 * 64], poison)
    expect = torch.arange(11 * 64, 12 * 64, dtype=torch.float32, device=dev) * 7 + 3
    assert torch.equal(last.view(torch.float32)[1], expect)  # every element of the other row
    last[1] = torch.full((64,), 5, dtype=torch.int32, device=dev)  # and writes through it land in the memory
    assert torch.equal(store[11 * 64:12 * 64].view(torch.int32), torch.full((64,), 5, dtype=torch.int32, device=dev))
    del last
    gc.collect()
    assert died == [True], "the owner outlived the last view (or died twice)"


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_heap_block_queued_only_after_its_last_view(allocator):
    with iris.iris(heap_size=1 << 22, allocator=allocator) as ctx:
        x = ctx.full((32, 32), 4.0)
        block = ctx.heap.block_of(x)[0]
        views = [x[3], x.view(torch.int16), x.untyped_storage(), x.t()[1:], ctx.peer_view(x, 0)]
        del x
        for i in range(len(views)):
            assert block.tensors > 0 and not ctx.heap._queued, f"queued with {len(views) - i} handles left"
            views[i] = None
            gc.collect()
        assert block.tensors == 0 and list(ctx.heap._queued) == [block.serial]
        assert ctx.collect() == block.nbytes


def _foreign(ctx):
    return sum(s.foreign for s in ctx.heap.alloc.segments)


def rank_free_import_under_views():
    """ctx.free of zero-copy imports while views of them live: the views stay valid (no unmap under
    them), and the region goes, on every rank at one collective point, once the last view is gone."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # GPUs: importable memory
    ctx = iris.iris(heap_size=1 << 26, allocator="vmem")
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    q = (r + 1) % w
    n = 1 << 20
    store = torch.empty(2 * n, dtype=torch.float32, device=dev)
    store = store.share_memory_() if dev.type == "cpu" else store
    store.copy_(torch.arange(2 * n, dtype=torch.float32) + 10.0 * (r + 1))
    a, b = store[:n], store[n:]
    ctx.barrier()
    gc.collect()
    base = _usage()
    h = ctx.as_symmetric([a, b])
    res = {"zero_copy": all(ctx.is_zero_copy(t) for t in h)}
    region = [ctx.heap.offset_of(t) for t in h]
    v = h[0][:10]
    pv = ctx.peer_view(h[1], q)
    h = [h[0], h[1], h[1][:]]  # the last: a view of h[1] made before its free, which still reaches it
    ctx.barrier()
    ctx.free(h[0])
    ctx.free(h[1])
    ctx.barrier()  # a collective point: views still live on every rank, so nothing may go
    v.fill_(-3.0)  # unmapped at free, this crashed (a segfault on the host, an illegal address on a GPU)
    res["alias"] = bool((a[:10] == -3.0).all()) and torch.equal(a[10:].cpu(), torch.arange(10, n) + 10.0 * (r + 1))
    res["peer"] = torch.equal(pv.cpu(), torch.arange(n, 2 * n, dtype=torch.float32) + 10.0 * (q + 1))
    res["whole"] = torch.equal(h[2], b)
    fresh = [ctx.full((n,), -1.0) for _ in range(4)]  # must land outside the imported region
    res["fresh"] = all(bool((f == -1.0).all()) for f in fresh) and torch.equal(h[2], b)
    res["mapped"] = _foreign(ctx)
    if r == 0:
        del v, h, pv  # rank 0 lets go before the next collective point, the others after it
    gc.collect()
    ctx.barrier()
    res["kept_until_all"] = _foreign(ctx)
    if r != 0:
        v.add_(1.0)  # still mapped here, though rank 0 has let go
        res["alias"] = res["alias"] and bool((a[:10] == -2.0).all())
        del v, h, pv
    gc.collect()
    ctx.barrier()  # now every rank has let go: the region goes everywhere, at this point
    res["released"] = _foreign(ctx)
    del fresh
    gc.collect()
    ctx.trim()  # collects, and gives the chunks fresh used back: the heap's own mappings to baseline
    res["state"] = (sorted(ctx.heap.alloc.offsets.live.items()), ctx.heap.alloc.offsets.free_blocks())
    res["usage"] = (base, _usage())
    res["region"] = region
    first = -3.0 if r == 0 else -2.0
    res["user"] = (torch.equal(store[1:10].cpu(), torch.full((9,), first))
                   and torch.equal(b.cpu(), torch.arange(n, 2 * n) + 10.0 * (r + 1)))
    ctx.close()
    return res


def _check_free_import(out, host):
    for r, res in enumerate(out):
        assert res["zero_copy"], res
        assert res["alias"] and res["peer"] and res["whole"] and res["fresh"] and res["user"], res
        assert res["mapped"] > 0 and res["kept_until_all"] == res["mapped"], res
        assert res["released"] == 0, f"rank {r}: the region outlived its last view ({res['released']} segments)"
        assert res["state"] == out[0]["state"] and res["region"] == out[0]["region"], "ranks diverged"
        base, end = res["usage"]
        if host:  # fds and mappings: the host's handles are files
            assert end[0] == base[0] and end[2] == base[2], f"rank {r}: fds/mappings {base} -> {end}"


@host_only
def test_free_of_an_import_keeps_it_mapped_under_live_views():
    _check_free_import(iris.spawn(rank_free_import_under_views, 2), host=True)  # a segfault fails the spawn


@pytest.mark.gpu
def test_gpu_free_of_an_import_keeps_it_mapped_under_live_views():
    _check_free_import(iris.spawn(rank_free_import_under_views, 2), host=False)


# -- reuse waits, in stream order, for the work every rank queued before the free ------------------
LATE_BLOCK = 1024


@triton.jit
def _late_store(flags, dst, n, value, cur, remote, heap_bases, BLOCK: tl.constexpr):
    """Work queued before a free that runs late: waits until cur's flags[0] is set, stores value into
    dst[:n] on remote, then sets remote's flags[1] (done)."""
    iris.wait(flags, 1, cur, cur, heap_bases)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    iris.store(dst + offs, tl.full((BLOCK,), value, tl.float32), cur, remote, heap_bases, mask=offs < n)
    iris.atomic_xchg(flags + 1, 1, cur, remote, heap_bases, sem="release", scope="sys")


@triton.jit
def _wait_flag(flags, cur, heap_bases):
    """Waits until cur's flags[1] is set (done)."""
    iris.wait(flags + 1, 1, cur, cur, heap_bases)


def _set_later(ctx, flag, seconds):
    """flag[0] = 1 after seconds, from a thread. On GPUs by a stream-ordered write of the driver on a
    stream of its own, made before the kernel that spins on the flag: the write needs no SM (the
    kernel may hold all of them) and no host allocation (pinning memory while the kernel spins may
    wait for it)."""
    if flag.device.type == "cuda":
        side = torch.cuda.Stream(flag.device)
        driver, address = ctx.heap.driver, flag.data_ptr()

        def go():
            time.sleep(seconds)
            driver.stream_write(side.cuda_stream, address, 1)  # flag[0] = 1 and flag[1] = 0 (not set yet)
            side.synchronize()
    else:
        def go():
            time.sleep(seconds)
            flag[:1].fill_(1)
    t = threading.Thread(target=go)
    t.start()
    return t


def rank_reuse_after_late_peer(allocator, n, how):
    """Rank 0 queues a kernel, before the free, that writes rank 1's copy of block b late (a second
    after); every rank frees b (how: "free" or "scope") and at once allocates its size again, which
    takes b's block, and fills it. The new tensor must keep its fill: rank 1's allocation waits for
    rank 0's work before its free. Without the wait the late store lands on it."""
    ctx = iris.iris(heap_size=1 << 24, allocator=allocator)
    r, dev = ctx.get_rank(), ctx.get_device()
    flags = ctx.zeros(2, dtype=torch.int32)  # [0]: go (rank 0's), [1]: done (rank 1's)
    scope = ctx.scope()
    if how == "scope":
        scope.__enter__()
    b = ctx.full((n,), 1.0)
    where = ctx.heap.offset_of(b)
    ctx.barrier()
    setter = None
    if r == 0:
        setter = _set_later(ctx, flags, 1.0)
        _late_store[(triton.cdiv(n, LATE_BLOCK),)](flags, b, n, -7.0, 0, 1, ctx.get_heap_bases(), BLOCK=LATE_BLOCK)
    if how == "scope":
        scope.__exit__(None, None, None)
    else:
        ctx.free(b)
    before = ctx.heap.stats
    c = ctx.full((n,), 5.0)
    after = ctx.heap.stats
    if r == 1:
        _wait_flag[(1,)](flags, 1, ctx.get_heap_bases())  # after the free, waiting for work before it: allowed
    if setter is not None:
        setter.join()
    ctx.barrier()
    res = {"reused": ctx.heap.offset_of(c) == where, "c": torch.equal(c.cpu(), torch.full((n,), 5.0)),
           "no_point": after["exchanges"] == before["exchanges"] and after["growths"] == before["growths"]}
    ctx.close()
    return res


@pytest.mark.parametrize("how", ["free", "scope"])
def test_reuse_waits_for_a_late_peer_write_queued_before_the_free(how):
    out = iris.spawn(rank_each_allocator, 2, args=(rank_reuse_after_late_peer, 3000, how))
    for r, rank in enumerate(out):
        for allocator, res in zip(ALLOCATORS, rank):
            assert res["reused"] and res["no_point"], f"{allocator}, rank {r}: the block was not reused at once: {res}"
            assert res["c"], f"{allocator}, rank {r}: a peer's late write landed on the tensor that reused its block"


@pytest.mark.gpu
@pytest.mark.parametrize("allocator", ALLOCATORS + ["nvshmem"])
def test_gpu_reuse_waits_for_a_late_peer_write_queued_before_the_free(allocator):
    _skip_without(allocator)
    for r, res in enumerate(iris.spawn(rank_reuse_after_late_peer, 2, args=(allocator, 1 << 16, "free"))):
        assert res["reused"] and res["no_point"] and res["c"], f"rank {r}: {res}"


def rank_reuse_violation(allocator, n):
    """The broken rule: rank 0's work before its free of b waits for rank 1's work after its free (a
    flag rank 1 sets only after reusing b's block). Rank 1's reuse must time out with an error
    naming the block and rank 0, not hang."""
    os.environ["IRIS_REUSE_TIMEOUT"] = "2"
    ctx = iris.iris(heap_size=1 << 24, allocator=allocator)
    r, dev = ctx.get_rank(), ctx.get_device()
    flags = ctx.zeros(2, dtype=torch.int32)  # [0]: rank 0's go flag
    b = ctx.full((n,), 1.0)
    where = ctx.heap.offset_of(b)
    ctx.barrier()
    if r == 0:  # on the host the kernel runs inside the launch: rank 0 stops here until rank 1 sets the flag
        _late_store[(triton.cdiv(n, LATE_BLOCK),)](flags, b, n, -7.0, 0, 1, ctx.get_heap_bases(), BLOCK=LATE_BLOCK)
    ctx.free(b)
    error, started = "", time.monotonic()
    try:
        ctx.full((n,), 5.0)  # rank 1: reuses b's block, so waits for rank 0's free
    except iris.ReuseTimeout as e:
        error = str(e)
    if r == 1:
        ctx.peer_view(flags, 0)[:1].fill_(1)  # what rank 0's kernel waited for
        if dev.type == "cuda":
            torch.cuda.synchronize()  # returns once the watchdog has let the stream go on
            try:
                ctx.barrier()
            except iris.ReuseTimeout as e:
                error = str(e)
    ctx.barrier()
    ctx.close()
    return error, where, time.monotonic() - started


def _check_violation(out):
    error, where, took = out[1]
    assert f"offset {where}" in error and "rank(s) 0" in error and "IRIS_REUSE_TIMEOUT" in error, error
    assert took < 30, took
    assert out[0][0] == "", out[0]


@host_only
def test_reuse_that_breaks_the_ordering_rule_times_out_naming_block_and_ranks():
    _check_violation(iris.spawn(rank_reuse_violation, 2, args=("vmem", 3000)))


@pytest.mark.gpu
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_gpu_reuse_that_breaks_the_ordering_rule_times_out(allocator):
    _check_violation(iris.spawn(rank_reuse_violation, 2, args=(allocator, 1 << 16)))


# -- GPUs ---------------------------------------------------------------------------------------
def rank_gpu_after_close(allocator):
    torch.cuda.init()
    ctx = iris.iris(heap_size=1 << 30, allocator=allocator)
    r = ctx.get_rank()
    x = ctx.full((1 << 20,), float(r + 1))
    pv = ctx.peer_view(x, (r + 1) % ctx.get_num_ranks())
    heap = ctx.heap
    ctx.barrier()
    ctx.close()
    x.mul_(3.0)
    torch.cuda.synchronize()
    got = (float(x.sum()), float(pv[7]))
    held = (heap.alloc.committed, heap.heap_bases is not None, len(heap.peer_maps.va))
    del x, pv
    gc.collect()
    torch.cuda.synchronize()
    gone = (heap.alloc.committed, heap.heap_bases is not None)
    return got, held, gone


@pytest.mark.gpu
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_gpu_tensors_stay_valid_after_close(allocator):
    """After close, the heap's tensors (and peer views) stay usable; once the last goes, this rank's heap
    releases its memory and its peer views. Device free memory is not the measure: on a GPU shared by
    both ranks, the peer's import keeps the chunk alive until the peer lets go too."""
    for r, ((total, peer), held, gone) in enumerate(iris.spawn(rank_gpu_after_close, 2, args=(allocator,))):
        assert total == 3.0 * (r + 1) * (1 << 20) and peer in (1.0, 2.0, 3.0, 6.0), (total, peer)
        assert held[1] and (allocator != "vmem" or held[0] > 0), f"rank {r}: the heap went while tensors lived: {held}"
        assert not gone[1], f"rank {r}: the heap's mappings did not go with its last tensor: {gone}"
        if allocator == "vmem":
            assert gone[0] == 0, f"rank {r}: {gone[0]} bytes of chunks still held after the last tensor went"


@pytest.mark.gpu
@pytest.mark.parametrize("allocator", ALLOCATORS + ["nvshmem"])
def test_gpu_loops_reuse_one_block_without_collectives(allocator):
    _skip_without(allocator)
    out = iris.spawn(rank_reuse_loops, 2, args=(allocator, 20, 2))
    for r, (loops, bad) in enumerate(out):
        assert not bad, f"rank {r}: wrong values at {bad}"
        assert loops.pop("counted") == 1, "the group's count missed a barrier"
        for loop, (offsets, collectives, growths, exchanges) in loops.items():
            assert len(set(offsets[2:])) == 1 and offsets == out[0][0][loop][0], (loop, offsets)
            assert collectives == growths == exchanges == 0, (loop, collectives, growths, exchanges)


def _capture_error(e):
    """The CaptureError e is or was raised over (torch's capture may end with an error of its own)."""
    while e is not None and not isinstance(e, iris.CaptureError):
        e = e.__context__
    return e if e is not None else ""


def rank_gpu_capture(allocator, barrier_first):
    ctx = iris.iris(heap_size=1 << 34 if allocator == "vmem" else 1 << 28, allocator=allocator)
    warm = ctx.empty(64 << 20, dtype=torch.uint8)  # backs the memory the captured allocations use
    ctx.free(warm)
    spare = ctx.empty(1 << 20, dtype=torch.float32)  # a freed block of y's size: y takes it from the cache
    spare_at = ctx.heap.offset_of(spare)
    spare.fill_(3.0)
    ctx.free(spare)
    if barrier_first:
        ctx.barrier()  # every rank's work before it is done: the captured reuse needs no wait
    src = torch.arange(1 << 20, device=ctx.get_device(), dtype=torch.float32)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture, as torch asks
        (src * 2).sum()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    exchanges = ctx.heap.stats["exchanges"]
    error = ""
    try:
        with torch.cuda.graph(g):
            y = ctx.empty(1 << 20, dtype=torch.float32)
            z = ctx.zeros(1 << 20, dtype=torch.float32)
            y.copy_(src * 2)
            z.add_(y)
    except Exception as e:  # a driver that cannot capture the peers' wait names the fix; CUDA's can
        error = str(_capture_error(e)) or repr(e)
        ok = "ctx.barrier()" in error and not barrier_first and torch.version.hip is not None
    else:
        assert ctx.heap.stats["exchanges"] == exchanges
        reused = ctx.heap.offset_of(y) == spare_at
        y.fill_(-1.0)  # poison; replay must overwrite it
        z.fill_(-1.0)
        g.replay()
        torch.cuda.synchronize()
        ok = torch.equal(y, src * 2) and torch.equal(z, src * 2) and reused
    freed_in_capture = ""
    t = ctx.empty(1 << 10, dtype=torch.float32)
    g3 = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g3):
            ctx.free(t)
    except Exception as e:
        freed_in_capture = str(_capture_error(e)) or repr(e)
    grow_error = ""
    if allocator == "vmem":
        g2 = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g2):
                ctx.empty(1 << 33, dtype=torch.uint8)  # 8 GiB: beyond what is backed
        except iris.IrisError as e:
            grow_error = str(e)
    ctx.barrier()
    ctx.close()
    return ok, error, freed_in_capture, grow_error


@pytest.mark.gpu
@pytest.mark.parametrize("barrier_first", [True, False])
@pytest.mark.parametrize("allocator", ALLOCATORS + ["nvshmem"])
def test_gpu_allocation_inside_graph_capture(allocator, barrier_first):
    _skip_without(allocator)
    for ok, error, freed_in_capture, grow_error in iris.spawn(rank_gpu_capture, 2, args=(allocator, barrier_first)):
        assert ok, f"captured allocations did not replay correctly, or did not reuse the freed block ({error})"
        assert "after capture" in freed_in_capture, freed_in_capture
        if allocator == "vmem":
            assert "capture" in grow_error and "before capture" in grow_error, grow_error


# -- loops of allocate and free: the same blocks, no growth, no host collective ------------------
def rank_reuse_loops(allocator, steps, warm):
    """The three loops of a memory-constrained program, each run steps times: allocate, fill, (all_reduce,)
    free; and a scope around the allocation. Returns, per loop, the offsets handed out, and the
    growths, exchanges and host collectives after the first warm steps; every value is checked."""
    ctx = iris.iris(heap_size=1 << 24, allocator=allocator)
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    n = 1000
    before = ctx.group.collectives
    ctx.barrier()
    out, bad = {"counted": ctx.group.collectives - before}, []  # the count sees a collective
    for loop in ("local", "tp_step", "scope"):
        offsets = []
        for i in range(steps):
            if i == warm:
                base = (ctx.group.collectives, ctx.heap.stats["growths"], ctx.heap.stats["exchanges"])
            if loop == "scope":
                with ctx.scope():
                    x = ctx.empty(n)
                    x.fill_(float(i + r))
                    offsets.append(ctx.heap.offset_of(x))
                    if not bool((x == float(i + r)).all()):
                        bad.append((loop, i))
                del x
                continue
            x = ctx.empty(n)
            x.fill_(float(i + r))
            offsets.append(ctx.heap.offset_of(x))
            want = float(i + r)
            if loop == "tp_step":
                ctx.ccl.all_reduce(x, x)
                want = float(w * i + w * (w - 1) // 2)
            if not bool((x == want).all()):
                bad.append((loop, i))
            ctx.free(x)
        out[loop] = (offsets, ctx.group.collectives - base[0], ctx.heap.stats["growths"] - base[1],
                     ctx.heap.stats["exchanges"] - base[2])
    ctx.barrier()
    ctx.close()
    return out, bad


@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("world", [2, 3])
def test_loops_of_free_scope_and_all_reduce_reuse_one_block_without_collectives(allocator, world):
    out = iris.spawn(rank_reuse_loops, world, args=(allocator, 8, 2))
    for r, (loops, bad) in enumerate(out):
        assert not bad, f"rank {r}: wrong values at {bad}"
        assert loops.pop("counted") == 1, "the group's count missed a barrier"
        for loop, (offsets, collectives, growths, exchanges) in loops.items():
            assert len(set(offsets)) <= 2 and len(set(offsets[2:])) == 1, f"rank {r}, {loop}: offsets {offsets}"
            assert offsets == out[0][0][loop][0], f"{loop}: rank {r} handed out other offsets than rank 0"
            assert collectives == growths == exchanges == 0, (loop, collectives, growths, exchanges)


def rank_debug_free_names_views():
    os.environ["IRIS_DEBUG"] = "1"
    ctx = iris.iris(heap_size=1 << 22)
    x = ctx.full((1000,), 1.0)
    v = x[10:20]
    error = ""
    try:
        ctx.free(x)
    except iris.IrisError as e:
        error = str(e)
    still = bool((x == 1.0).all())  # the failed free changed nothing
    del v
    ctx.free(x)  # no other view now
    try:
        x.add_(1.0)
        used = "no error"
    except iris.IrisError as e:
        used = str(e)
    ctx.close()
    return error, still, used


def test_debug_free_of_a_block_other_tensors_view_raises_naming_them():
    for error, still, used in iris.spawn(rank_debug_free_names_views, 2):
        assert "(10,) torch.float32 at byte 40" in error and "offset" in error and "del" in error, error
        assert still, "the refused free changed the tensor"
        assert "ctx.free gave back" in used, used


def test_a_freed_tensor_reaches_no_memory_and_any_use_raises():
    with iris.iris(heap_size=1 << 22) as ctx:
        x = ctx.full((1000,), 1.0)
        ctx.free(x)
        y = ctx.full((1000,), 2.0)  # takes x's block
        for use in (lambda: x.fill_(3.0), lambda: x + 1, lambda: x.data_ptr(), lambda: x[3], lambda: x.cpu(),
                    lambda: ctx.heap.offset_of(x)):
            with pytest.raises(iris.IrisError, match="ctx.free gave back"):
                use()
        with pytest.raises(ValueError, match="freed already"):
            ctx.free(x)
        assert bool((y == 2.0).all())


# -- the tensor ctx.free keeps with its block ---------------------------------------------------
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_a_freed_block_comes_back_with_a_fresh_tensor_of_the_asked_shape(allocator):
    """ctx.free keeps a tensor over the block for the next request of the same shape and dtype; any
    other request of its size gets a new view; an in-place transposed tensor is never handed out as
    is; a handed-out kept tensor that is simply dropped is still collected."""
    with iris.iris(heap_size=1 << 22, allocator=allocator) as ctx:
        x = ctx.full((64, 16), 1.0)
        at = x.data_ptr()
        ctx.free(x)
        y = ctx.empty(64, 16)
        assert y is not x and y.data_ptr() == at and y.shape == (64, 16) and y.dtype == torch.float32
        assert y.is_contiguous() and type(y) is torch.Tensor
        y.fill_(5.0)
        with pytest.raises(iris.IrisError, match="ctx.free gave back"):
            x.sum()
        ctx.free(y)
        z = ctx.empty(1024)  # the same bytes, another shape: a new view over the block
        assert z.data_ptr() == at and z.shape == (1024,) and z.stride() == (1,)
        z.fill_(7.0)
        ctx.free(z)
        w = ctx.empty(1024, dtype=torch.int32)  # the same bytes, another dtype
        assert w.data_ptr() == at and w.dtype == torch.int32 and w.shape == (1024,)
        ctx.free(w)
        u = ctx.empty(32, 32)
        u.t_()  # still the whole block, no longer contiguous
        ctx.free(u)
        v = ctx.empty(32, 32)
        assert v.data_ptr() == at and v.stride() == (32, 1), v.stride()
        v.fill_(3.0)
        assert bool((v == 3.0).all()) and bool((v.view(-1)[32:64] == 3.0).all())
        collected = ctx.heap.stats["collected"]
        del v  # dropped, not freed: the kept tensor carries the block's owner, so it is queued
        gc.collect()
        ctx.collect()
        assert ctx.heap.stats["collected"] == collected + 1
        again = ctx.empty(32, 32)
        assert again.data_ptr() == at


def rank_close_with_kept_tensors(allocator):
    ctx, base, ctx2 = _second_context(allocator)
    for n in (1000, 2000, 3000):
        ctx2.free(ctx2.full((n,), 1.0))  # each block keeps a tensor for its next request
    ctx2.close()
    del ctx2
    gc.collect()
    end = _usage()
    ctx.close()
    return base, end


@host_only
def test_close_lets_go_of_the_tensors_kept_for_reuse():
    for base, end in (res for rank in iris.spawn(rank_each_allocator, 2, args=(rank_close_with_kept_tensors,))
                      for res in rank):
        assert end == base, f"fds, mappings, heap mappings {base} -> {end}: a kept tensor held the heap"


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_scope_exit_detaches_the_tensors_it_frees(allocator):
    with iris.iris(heap_size=1 << 22, allocator=allocator) as ctx:
        with ctx.scope():
            a = ctx.full((1000,), 1.0)
            b = ctx.zeros(500, dtype=torch.int32)
            b_view = b[10:]  # a view made inside still reaches the block, as after ctx.free
            with ctx.scope():
                c = ctx.ones(10)
            with pytest.raises(iris.IrisError, match="ctx.free gave back"):
                c.sum()
            assert float(a.sum()) == 1000.0  # the inner scope freed only its own
            dropped = ctx.empty(300).data_ptr()
        for t in (a, b):
            with pytest.raises(iris.IrisError, match="ctx.free gave back"):
                t.add_(1)
        assert int(b_view.sum()) == 0
        again = ctx.empty(1000)
        assert ctx.heap.offset_of(again) in ctx.heap.offsets_since(0)
        assert dropped - ctx.heap.bases[ctx.get_rank()] not in ctx.heap.offsets_since(0)


def rank_gpu_indirect_reuse_after_a_barrier():
    ctx = iris.iris(heap_size=1 << 26, allocator="nvshmem")
    x = ctx.full((1 << 18,), 1.0)
    first = ctx.heap.offset_of(x)
    ctx.free(x)
    y = ctx.full((1 << 18,), 2.0)  # an indirect peer may still write x's block: not handed out yet
    second = ctx.heap.offset_of(y)
    ctx.free(y)
    ctx.barrier()  # every rank's device work done: both blocks come back
    z = ctx.full((1 << 18,), 3.0)
    third = ctx.heap.offset_of(z)
    ok = bool((z == 3.0).all())
    ctx.barrier()
    ctx.close()
    return first, second, third, ok


@pytest.mark.gpu
def test_gpu_indirect_peers_get_freed_blocks_back_at_a_barrier(monkeypatch):
    _skip_without("nvshmem")
    monkeypatch.setenv("IRIS_INDIRECT_PEERS", "all")  # NVSHMEM reaches every peer: no counter of theirs is readable
    out = iris.spawn(rank_gpu_indirect_reuse_after_a_barrier, 2)
    for first, second, third, ok in out:
        assert second != first, "a block freed with indirect peers was handed out before any barrier"
        assert third == min(first, second) and ok, (first, second, third, ok)
        assert (first, second, third) == out[0][:3], out
