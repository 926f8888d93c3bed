"""VMemAllocator for memory-constrained jobs: reuse, trim, oversubscription, symmetry checks."""
import os
import random

import pytest
import torch

import iris


def _heap_maps():
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "memfd:iris" in line)


def rank_random_reuse(n, seed):
    """The same seeded stream of allocate/free on every rank; returns offsets seen and overlap failures."""
    rng = random.Random(seed)
    ctx = iris.iris(heap_size=1 << 26, allocator="vmem")
    live, trace, overlaps = {}, [], 0
    for i in range(n):
        if live and rng.random() < 0.45:
            key = rng.choice(sorted(live))
            ctx.free(live.pop(key))
        else:
            t = ctx.empty(rng.randint(1, 1 << 15), dtype=torch.uint8)
            off = ctx.heap.offset_of(t)
            trace.append(off)
            live[i] = t
        if i % 1000 == 999:
            spans = sorted((ctx.heap.offset_of(t), t.numel()) for t in live.values())
            overlaps += sum(a + sa > b for (a, sa), (b, _) in zip(spans, spans[1:]))
            ctx.barrier()  # a collective point: the symmetry check compares digests here
    with ctx.scope():
        inside = [ctx.zeros(100) for _ in range(10)]
        marks = [ctx.heap.offset_of(t) for t in inside]
    ctx.barrier()  # the scope's blocks go back to the pool at a collective point
    reused = ctx.heap.offset_of(ctx.zeros(100)) == marks[0]
    stats = dict(ctx.heap.stats)
    ctx.close()
    return trace, overlaps, reused, stats


def test_ten_thousand_random_allocations_stay_symmetric_and_disjoint():
    out = iris.spawn(rank_random_reuse, 3, args=(10_000, 1234))
    for r, (trace, overlaps, reused, stats) in enumerate(out):
        assert trace == out[0][0], f"rank {r} got different offsets than rank 0"
        assert overlaps == 0, f"rank {r}: {overlaps} live blocks overlapped"
        assert reused, "a scope's freed block was not reused"
        assert stats["frees"] > 4000 and stats["growths"] <= stats["allocations"]
    assert len(set(out[0][0])) < len(out[0][0]), "freed offsets were never reused"


def rank_trim():
    ctx = iris.iris(heap_size=1 << 30, allocator="vmem")
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    keep = ctx.full((1000,), float(r + 1))
    big = [ctx.empty(3 << 20, dtype=torch.uint8) for _ in range(8)]
    before = _heap_maps()
    committed_before = ctx.heap.alloc.committed
    for t in big:
        ctx.free(t)
    del t, big  # trim keeps memory that a live tensor covers, freed or not
    released = ctx.trim()
    after = _heap_maps()
    ctx.barrier()
    peer = ctx.peer_view(keep, (r + 1) % w)
    peer_ok = bool((peer == float((r + 1) % w + 1)).all())
    again = ctx.ones(3 << 20, dtype=torch.uint8)  # grows again after the trim
    ctx.barrier()
    again_ok = bool((ctx.peer_view(again, (r + 1) % w) == 1).all())
    committed_after = ctx.heap.alloc.committed
    keep_ok = bool((keep == r + 1).all())
    ctx.close()
    return before, after, released, committed_before, committed_after, peer_ok, again_ok, keep_ok


def test_trim_gives_segments_back_and_keeps_live_data():
    for before, after, released, cb, ca, peer_ok, again_ok, keep_ok in iris.spawn(rank_trim, 2):
        assert released >= 8 * (3 << 20) - (2 << 20), f"trim released only {released} bytes"
        if not torch.cuda.is_available():  # host: the memfd mappings themselves (GPUs: test_gpu_trim_...)
            assert after < before, f"heap mappings did not drop: {before} -> {after}"
        assert cb - released < cb and peer_ok and keep_ok and again_ok
        assert ca >= 3 << 20


def rank_oversubscribed(heap_size):
    ctx = iris.iris(heap_size=heap_size, allocator="vmem")
    t = ctx.arange(1 << 20, dtype=torch.float32)
    ok = torch.equal(t.cpu(), torch.arange(1 << 20, dtype=torch.float32))
    committed = ctx.heap.alloc.committed
    ctx.close()
    return ok, committed


def test_heap_larger_than_memory_costs_only_what_is_allocated():
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    heap = 1 << 40 if total < 1 << 40 else 4 * total
    for ok, committed in iris.spawn(rank_oversubscribed, 2, args=(heap,)):
        assert ok and committed <= 8 << 20


def rank_diverge(mode, how):
    os.environ["IRIS_CHECK_SYMMETRY"] = mode
    ctx = iris.iris(heap_size=1 << 24, allocator="vmem", timeout=20)
    r = ctx.get_rank()
    keep = ctx.full((256,), 5.0)
    ctx.barrier()
    try:
        if how == "size":
            ctx.empty(100 + 100 * r, dtype=torch.uint8)
        else:  # order: same two sizes, swapped on rank 1
            sizes = [64, 1 << 10] if r == 0 else [1 << 10, 64]
            for s in sizes:
                ctx.empty(s, dtype=torch.uint8)
        ctx.barrier()
        result = "no error"
    except iris.SymmetryError as e:
        result = "SymmetryError: " + str(e)
    intact = bool((keep == 5.0).all())
    if mode == "full":
        ctx.barrier()  # in full mode nothing diverged, so the heap goes on
        more = ctx.ones(10)
        intact = intact and bool((more == 1).all())
    ctx.close()
    return result, intact


@pytest.mark.parametrize("how", ["size", "order"])
@pytest.mark.parametrize("mode", ["cheap", "full"])
def test_divergent_ranks_get_a_symmetry_error(mode, how):
    for r, (result, intact) in enumerate(iris.spawn(rank_diverge, 2, args=(mode, how))):
        assert result.startswith("SymmetryError"), f"rank {r}: {result}"
        assert "same sizes in the same order" in result or "diverged" in result, result
        assert intact, f"rank {r}: data allocated before the divergence changed"


def test_symmetry_check_off_does_not_compare():
    out = iris.spawn(rank_diverge, 2, args=("off", "size"))
    assert [res for res, _ in out] == ["no error", "no error"]


def test_bad_symmetry_mode_is_refused(monkeypatch):
    monkeypatch.setenv("IRIS_CHECK_SYMMETRY", "sometimes")
    with pytest.raises(ValueError, match="IRIS_CHECK_SYMMETRY"):
        iris.iris(heap_size=1 << 20)


# -- on GPUs: device memory really comes back, and running out is survivable ----------------

def rank_gpu_trim():
    ctx = iris.iris(heap_size=1 << 40, allocator="vmem")
    torch.cuda.synchronize()
    ctx.barrier()
    free0 = torch.cuda.mem_get_info()[0]
    ts = [ctx.empty(1 << 30, dtype=torch.uint8) for _ in range(4)]
    ctx.barrier()
    free1 = torch.cuda.mem_get_info()[0]
    for t in ts:
        ctx.free(t)
    del ts, t  # trim keeps memory that a live tensor covers, freed or not
    released = ctx.trim()
    ctx.barrier()
    free2 = torch.cuda.mem_get_info()[0]
    ctx.close()
    return free0, free1, free2, released


@pytest.mark.gpu
def test_gpu_trim_returns_device_memory():
    for free0, free1, free2, released in iris.spawn(rank_gpu_trim, 2):
        assert released >= 4 << 30
        assert free0 - free1 >= 4 << 30, "allocations did not consume device memory"
        assert free2 - free1 >= 4 << 30, f"trim did not give memory back: {free1} -> {free2}"


def rank_gpu_exhaust():
    ctx = iris.iris(heap_size=1 << 40, allocator="vmem")
    r = ctx.get_rank()
    step = 16 << 30
    held, error = [], None
    while error is None and len(held) < 64:
        try:
            held.append(ctx.full((step // 4,), float(len(held) + 1)))
        except iris.HeapOutOfMemory as e:
            error = str(e)
    ok = all(bool((t == i + 1).all()) for i, t in enumerate(held))
    ctx.free(held.pop())
    ctx.trim()
    again = ctx.full((step // 4,), -1.0)  # room again after a free and trim
    ctx.barrier()
    ok = ok and bool((again == -1).all()) and bool((ctx.peer_view(held[0], 1 - r) == 1).all())
    n = len(held)
    ctx.close()
    return n, error, ok


@pytest.mark.gpu
def test_gpu_exhaustion_raises_and_heap_survives():
    out = iris.spawn(rank_gpu_exhaust, 2)
    (n0, e0, ok0), (n1, e1, ok1) = out
    assert n0 == n1, "ranks disagreed on when memory ran out"
    assert e0 and e1 and "committed" in (e0 + e1) and ok0 and ok1, out


def test_reuse_hands_out_only_backed_memory():
    """The same-size cache (reuse) skips the backing check, so a block whose memory may be gone
    must never enter it: a request refused during capture, undone growth, an unmapped region."""
    from iris.allocators.vmem import VMemAllocator
    from iris.platform.host import HostDriver
    a = VMemAllocator(HostDriver(), 64 << 20)
    try:
        chunk = a.chunk
        assert a.allocate(chunk, 256, lambda: False) == (None, ()), "growth was not asked, or not refused"
        assert a.reuse(chunk) is None, "a block refused for want of growth was cached"
        off, new = a.allocate(chunk, 256)
        assert new and a.reuse(chunk) is None
        a.undo(off, new)  # a peer could not grow: the segment is unmapped
        assert a.reuse(chunk) is None and not a.segments, "an undone block was cached"
        off, new = a.allocate(chunk, 256)
        a.free(off)  # the usual free: the memory stays backed, so the block is cached
        assert a.reuse(chunk) == off and a.segments
        a.free(off)
        assert a.trimmable() == a.segments, "trim did not see the cached block's segment as free"
        a.release(a.trimmable())
        assert a.reuse(chunk) is None, "a block in a released segment stayed cached"
    finally:
        a.close()
