"""as_symmetric, the safetensors loader and module_to_heap on real ranks."""
import os
import warnings

import pytest
import torch

import iris


def _pattern(n, r=0):
    return torch.arange(n, dtype=torch.float32) * 3 + 1000 * (r + 1)


def _device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _vmm_backed(t):
    """t in memory that can be imported without a copy: shared memory on the host, expandable
    segments (set before CUDA starts, in the rank function) on GPUs."""
    return t.share_memory_() if t.device.type == "cpu" else t


def _zero_copy_env():
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # before this process touches CUDA


def rank_zero_copy():
    _zero_copy_env()
    ctx = iris.iris(heap_size=1 << 26, allocator="vmem")
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    dev = ctx.get_device()
    t = _vmm_backed(_pattern(3 << 18, r).to(dev))
    h = ctx.as_symmetric(t)
    res = {"zero_copy": ctx.is_zero_copy(h), "distinct": h.data_ptr() != t.data_ptr(),
           "same_again": ctx.as_symmetric(t) is h, "offset": ctx.heap.offset_of(h)}
    t[5] = -1.0
    h[7] = -2.0
    res["alias"] = float(h[5]) == -1.0 and float(t[7]) == -2.0
    ctx.barrier()
    expect = _pattern(3 << 18, (r + 1) % w).to(dev)
    expect[5], expect[7] = -1.0, -2.0
    res["peer"] = torch.equal(ctx.peer_view(h, (r + 1) % w), expect)
    # a tensor that spans two physical segments of another heap
    other = iris.iris(heap_size=1 << 26, allocator="vmem")
    other.empty(1 << 20, dtype=torch.uint8)
    span = other.full((3 << 18,), 5.0 + r)
    res["other_segments"] = len(other.heap.alloc.segments)
    s = ctx.as_symmetric(span)
    res["span_zero_copy"] = ctx.is_zero_copy(s)
    ctx.barrier()
    res["span_peer"] = bool((ctx.peer_view(s, (r + 1) % w) == 5.0 + (r + 1) % w).all())
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        pair = ctx.as_symmetric([_vmm_backed(_pattern(512, r).to(dev)), _pattern(256, r).to(dev)])
    private = dev.type == "cpu"  # with expandable segments every CUDA tensor is VMM-backed
    res["batch"] = (ctx.is_zero_copy(pair[0]) and ctx.is_zero_copy(pair[1]) != private and len(rec) == int(private)
                    and torch.equal(pair[1], _pattern(256, r).to(dev)) and torch.equal(pair[0], _pattern(512, r).to(dev)))
    ctx.free(h)
    res["freed_view_gone"] = not ctx.is_zero_copy(h) if ctx.heap.contains(h) else True
    ctx.close()
    res["original_after_close"] = float(t[5]) == -1.0 and float(t[100]) == float(_pattern(101, r)[100])
    res["other_after_close"] = bool((span == 5.0 + r).all())
    other.close()
    return res


def test_zero_copy_aliases_and_peers_see_it():
    out = iris.spawn(rank_zero_copy, 2)
    for r, res in enumerate(out):
        assert res["zero_copy"] and res["distinct"] and res["same_again"], res
        assert res["alias"], "writes through the heap view and the original did not meet"
        assert res["peer"], f"rank {r} did not read its peer's imported tensor"
        assert res["other_segments"] >= 2 and res["span_zero_copy"] and res["span_peer"], res
        assert res["original_after_close"] and res["other_after_close"]
        assert res["batch"], "a batched import did not zero-copy the shared tensor and copy the private one"
    assert out[0]["offset"] == out[1]["offset"], "imported tensors must sit at the same offset on every rank"


def _pages(driver, ptr, nbytes):
    """Distinct physical pages (VMM allocations, or host files) behind [ptr, ptr + nbytes)."""
    bases, at = [], ptr
    while at < ptr + nbytes:
        handle, base, size = driver.retain(at)
        driver.release(handle)
        bases.append(base)
        at = base + size
    return bases


def _foreign(ctx):
    return sum(s.foreign for s in ctx.heap.alloc.segments)


def rank_neighbours():
    """Slices of one allocation, imported in one batch, share a region: each page is mapped once."""
    _zero_copy_env()
    ctx = iris.iris(heap_size=1 << 30, allocator="vmem")
    r, w, dev, d = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device(), ctx.driver
    q = (r + 1) % w
    n = (48 << 20) // 4  # on a GPU 48 MiB spans three expandable-segment pages
    big = _vmm_backed(_pattern(n, r).to(dev))
    cuts = [0, 1000, 1001, n // 3 + 7, n // 2, n - 5000, n]
    parts = [big[a:b] for a, b in zip(cuts, cuts[1:])]
    res = {}
    before, fds0 = _foreign(ctx), len(os.listdir("/proc/self/fd"))
    views = ctx.as_symmetric(parts + [parts[2], big[10:2000]])  # a repeat, and a view overlapping two parts
    res["zero_copy"] = all(ctx.is_zero_copy(v) for v in views)
    res["repeat_same"] = views[len(parts)] is views[2]
    res["segments"] = (_foreign(ctx) - before, len(_pages(d, big.data_ptr(), big.nbytes)))
    res["offsets"] = [ctx.heap.offset_of(v) for v in views]
    res["equal"] = all(torch.equal(v, p) for v, p in zip(views, parts)) and torch.equal(views[-1], big[10:2000])
    ctx.barrier()
    peer_big = _pattern(n, q).to(dev)
    res["peer"] = all(torch.equal(ctx.peer_view(v, q), peer_big[a:b]) for v, a, b in zip(views, cuts, cuts[1:]))
    ctx.barrier()  # every rank has read its peer before any writes
    poison = torch.full_like(parts[3], -7.0 - r)
    views[3].copy_(poison)
    res["write_through"] = torch.equal(parts[3], poison) and torch.equal(big[cuts[3]:cuts[4]], poison)
    ctx.barrier()
    res["peer_write"] = torch.equal(ctx.peer_view(views[3], q), torch.full_like(poison, -7.0 - q))
    # rank 1's second piece sits one chunk further along: distances differ, so the batch splits in two
    # regions (a shift that is not a whole chunk would leave no common offset, and b would be copied)
    chunk = ctx.heap.alloc.chunk // 4
    shift = chunk * r
    a, b = big[:n // 4], big[n // 2 + shift:n // 2 + shift + n // 8]
    split = ctx.as_symmetric([a, b])
    res["split_zero_copy"] = all(ctx.is_zero_copy(v) for v in split)
    res["split_equal"] = torch.equal(split[0], a) and torch.equal(split[1], b)
    ctx.barrier()
    peer_b = peer_big[n // 2 + chunk * q:n // 2 + chunk * q + n // 8]
    res["split_peer"] = torch.equal(ctx.peer_view(split[1], q), peer_b)
    held = [v[:] for v in views]  # views made before the frees: they keep the region mapped
    for v in split:
        ctx.free(v)
    del split, v  # its region goes at the next collective point, once its views are gone
    # freeing all but one part keeps the region; the last one gives it back once no view covers it
    for v in views[:len(parts)]:
        ctx.free(v)
    ctx.barrier()
    res["kept"] = (_foreign(ctx) - before, torch.equal(views[-1], big[10:2000]))
    res["kept_peer"] = torch.equal(ctx.peer_view(views[-1], q), peer_big[10:2000])
    ctx.free(views[-1])
    ctx.barrier()
    res["under_views"] = _foreign(ctx) - before  # freed, but the views still cover it
    del views, v, held
    ctx.collect()
    res["released"] = _foreign(ctx) - before
    res["fds"] = len(os.listdir("/proc/self/fd")) - fds0  # the host's handles are fds: none may leak
    res["reimport"] = ctx.is_zero_copy(ctx.as_symmetric(parts[0]))
    ctx.close()
    res["original_after_close"] = torch.equal(big[cuts[3]:cuts[4]], poison)
    return res


def test_neighbouring_tensors_share_pages():
    out = iris.spawn(rank_neighbours, 2)
    for r, res in enumerate(out):
        assert res["zero_copy"] and res["repeat_same"] and res["equal"], res
        got, pages = res["segments"]
        assert got == pages, f"rank {r}: the batch mapped {got} segments for {pages} pages; each page once"
        assert res["peer"] and res["write_through"] and res["peer_write"], res
        assert res["split_zero_copy"] and res["split_equal"] and res["split_peer"], res
        assert res["kept"] == (pages, True) and res["kept_peer"], res
        assert res["under_views"] == pages and res["released"] == 0 and res["reimport"], res
        assert res["fds"] == 0, f"rank {r} leaked {res['fds']} fds"
        assert res["original_after_close"]
    assert out[0]["offsets"] == out[1]["offsets"]


def rank_copy_paths(allocator):
    ctx = iris.iris(heap_size=1 << 24, allocator=allocator)
    dev = ctx.get_device()
    plain = _pattern(1000, ctx.get_rank()).to(dev)  # private host memory, or plain cudaMalloc
    res = {}
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        c = ctx.as_symmetric(plain)
    res["warned"] = [str(w.message) for w in rec]
    res["copied"] = torch.equal(c, plain) and not ctx.is_zero_copy(c) and c.data_ptr() != plain.data_ptr()
    plain[0] = -5
    res["independent"] = float(c[0]) != -5
    try:
        ctx.as_symmetric(_vmm_backed(_pattern(10).to(dev)) if allocator == "torch" else torch.ones(10, device=dev),
                         copy=False)
        res["copy_false"] = "no error"
    except ValueError as e:
        res["copy_false"] = str(e)
    shared = _vmm_backed(_pattern(64).to(dev))
    forced = ctx.as_symmetric(shared, copy=True)
    res["forced_copy"] = not ctx.is_zero_copy(forced) and torch.equal(forced, shared)
    with pytest.raises(ValueError, match="contiguous"):
        ctx.as_symmetric(torch.ones(4, 4, device=dev).t())
    with pytest.raises(ValueError, match="is on meta"):
        ctx.as_symmetric(torch.ones(4, device="meta"))
    with pytest.raises(TypeError):
        ctx.as_symmetric([1, 2])
    res["heap_tensor_is_itself"] = ctx.as_symmetric(c) is c
    ctx.close()
    return res


@pytest.mark.parametrize("allocator", ["torch", "vmem"])
def test_copy_paths_and_bad_input(allocator):
    for res in iris.spawn(rank_copy_paths, 2, args=(allocator,)):
        assert len(res["warned"]) == 1 and "copied 4000 bytes" in res["warned"][0], res["warned"]
        hint = "allocator='vmem'" if allocator == "torch" else "expandable_segments:True"
        assert hint in res["warned"][0]
        assert res["copied"] and res["independent"] and res["forced_copy"] and res["heap_tensor_is_itself"]
        assert "zero copy is impossible" in res["copy_false"], res["copy_false"]


class TinyBlock(torch.nn.Module):
    def __init__(self, dim=32, hidden=64):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)
        self.register_buffer("scale", torch.full((dim,), 0.5))

    def forward(self, x):
        return x + self.scale * self.down(torch.relu(self.up(self.norm(x))))


def rank_weights(path):
    _zero_copy_env()
    ctx = iris.iris(heap_size=1 << 24, allocator="vmem")
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    dev = ctx.get_device()
    torch.manual_seed(0)
    ref = TinyBlock().to(dev)
    x = torch.randn(4, 32).to(dev)
    expect = ref(x)
    full = ctx.load_safetensors(path)
    res = {"names": sorted(full), "all_heap": all(ctx.is_symmetric(t) for t in full.values())}
    res["equal"] = all(torch.equal(full[k], v) for k, v in ref.state_dict().items())
    half = ctx.load_safetensors(path, shard=lambda name, shape: (slice(r * shape[0] // w, (r + 1) * shape[0] // w),),
                                names=["up.weight"])
    ctx.barrier()
    peer_half = ctx.peer_view(half["up.weight"], (r + 1) % w)
    q = (r + 1) % w
    res["shard_peer"] = torch.equal(peer_half, ref.up.weight.detach()[q * 32:(q + 1) * 32])
    shared = TinyBlock().to(dev)
    shared.load_state_dict(ref.state_dict())
    if dev.type == "cpu":
        shared.share_memory()
    ctx.module_to_heap(shared)
    tensors = list(shared.parameters()) + list(shared.buffers())
    res["module_zero_copy"] = all(ctx.is_zero_copy(t) for t in tensors)
    res["module_forward"] = torch.allclose(shared(x), expect)
    plain = TinyBlock().to(dev)
    plain.load_state_dict(ref.state_dict())
    ctx.module_to_heap(plain, copy=True)
    res["plain_on_heap"] = all(ctx.is_symmetric(t) for t in list(plain.parameters()) + list(plain.buffers()))
    res["plain_forward"] = torch.allclose(plain(x), expect)
    ctx.close()
    return res


def test_safetensors_loader_and_module_to_heap(tmp_path):
    from safetensors.torch import save_file
    torch.manual_seed(0)
    path = str(tmp_path / "block.safetensors")
    save_file(TinyBlock().state_dict(), path)
    for res in iris.spawn(rank_weights, 2, args=(path,)):
        assert res["names"] == ["down.bias", "down.weight", "norm.bias", "norm.weight", "scale", "up.bias", "up.weight"]
        assert res["all_heap"] and res["equal"] and res["shard_peer"], res
        assert res["module_zero_copy"] and res["module_forward"], res
        assert res["plain_on_heap"] and res["plain_forward"], res


def _file_fds():
    """This process's open fds that are not sockets (the host's handles are memfds)."""
    return sum(not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") for fd in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{fd}"))


def rank_streamed(out_dir):
    """Pages travel in several background steps; a rank whose export fails, and one that dies,
    are named on every rank, and nothing stays mapped or open."""
    import json
    _zero_copy_env()
    ctx = iris.iris(heap_size=1 << 28, allocator="vmem", timeout=30)
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    ctx.heap.imports.IMPORT_STEP = 2
    q, res = (r + 1) % w, {}
    sizes = [1000 + 517 * i for i in range(9)]
    xs = [_vmm_backed((_pattern(n, r) + i).to(dev)) for i, n in enumerate(sizes)]
    fds0, exchanges = _file_fds(), ctx.heap.stats["exchanges"]
    views = ctx.as_symmetric(xs)
    res["steps"] = ctx.heap.stats["exchanges"] - exchanges
    res["phases"] = sorted(ctx.heap.stats["as_symmetric_ms"])
    res["zero_copy"] = all(ctx.is_zero_copy(v) and torch.equal(v, x) for v, x in zip(views, xs))
    res["offsets"] = [ctx.heap.offset_of(v) for v in views]
    ctx.barrier()
    res["peer"] = all(torch.equal(ctx.peer_view(v, q), (_pattern(n, q) + i).to(dev))
                      for i, (v, n) in enumerate(zip(views, sizes)))
    ctx.barrier()
    for v in views:
        ctx.free(v)
    del views, v
    ctx.collect()  # a freed import goes at the collective point after its last view
    res["fds_after_free"] = _file_fds() - fds0
    # rank 1's third export fails: every rank raises naming it, and the heap stays as it was
    ys = [_vmm_backed((_pattern(n, r) - i).to(dev)) for i, n in enumerate(sizes)]
    foreign, fds0, export = _foreign(ctx), _file_fds(), ctx.heap.driver.export
    if r == 1:
        calls = [0]

        def failing_export(handle):
            calls[0] += 1
            if calls[0] == 3:
                raise iris.errors.DriverError("export", 999, "injected")
            return export(handle)
        ctx.heap.driver.export = failing_export
    try:
        ctx.as_symmetric(ys)
        res["failed"] = "no error"
    except iris.IrisError as e:
        res["failed"] = f"{type(e).__name__}: {e}"
    if r == 1:
        del ctx.heap.driver.export
    res["after_failure"] = (_foreign(ctx) - foreign, _file_fds() - fds0)
    again = ctx.as_symmetric(ys)
    ctx.barrier()
    res["again_peer"] = all(torch.equal(ctx.peer_view(v, q), (_pattern(n, q) - i).to(dev))
                            for i, (v, n) in enumerate(zip(again, sizes)))
    ctx.barrier()
    for v in again:
        ctx.free(v)  # freed tensors reach no memory: the region goes at the next collective point
    del v
    ctx.collect()
    # the last rank dies after its second export, part way through the exchange
    zs = [_vmm_backed((_pattern(n, r) * 2).to(dev)) for n in sizes]
    foreign, fds0 = _foreign(ctx), _file_fds()
    if r == w - 1:
        calls = [0]

        def dying_export(handle):
            calls[0] += 1
            if calls[0] == 3:
                os._exit(9)
            return export(handle)
        ctx.heap.driver.export = dying_export
    try:
        ctx.as_symmetric(zs)
        res["died"] = ["no error"]
    except iris.BootstrapError as e:
        res["died"] = [list(e.missing), str(e)]
    res["after_death"] = (_foreign(ctx) - foreign, _file_fds() - fds0)
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(res, f)
    ctx.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts pages: on the host each small tensor is its own page; "
                    "a GPU's expandable segments pack all nine into one, so the step and death counts do not apply")
def test_pages_stream_in_steps_and_failures_name_the_rank(tmp_path):
    import json
    with pytest.raises(RuntimeError, match="rank 2 failed: exited with code 9"):
        iris.spawn(rank_streamed, 3, args=(str(tmp_path),), timeout=240)
    out = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, res in enumerate(out):
        assert res["steps"] == 1 + 5, f"rank {r}: 9 pages in steps of 2 take 5 steps after the plan, got {res['steps']}"
        assert {"export", "map own", "import peers", "set access peers"} <= set(res["phases"]), res["phases"]
        assert res["zero_copy"] and res["peer"] and res["fds_after_free"] == 0, res
        said = "DriverError: export failed" if r == 1 else "IrisError: as_symmetric: ranks [1] failed"
        assert res["failed"].startswith(said) and "injected" in res["failed"], res["failed"]
        assert res["after_failure"] == [0, 0] and res["again_peer"], res
        assert 2 in res["died"][0] and "rank 2" in res["died"][1], res["died"]
        assert res["after_death"][0] == 0 and res["after_death"][1] <= 0, res
    assert out[0]["offsets"] == out[1]["offsets"]
