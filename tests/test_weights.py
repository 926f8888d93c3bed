"""The checkpoint loader: the byte plan of slices, the reading pipeline, and load_safetensors on
real ranks checked element by element against safetensors' own load_file."""
import itertools
import os
import struct

import pytest
import torch

import iris
from iris.weights.checkpoint import CheckpointError, checkpoint_files, read_entries
from iris.weights.loading import read_into
from iris.weights.read_plan import normalize, plan, slice_runs


def _random_bytes(shape, dtype, seed):
    """Random bit patterns of every kind (NaNs included): compared as bytes, never as values."""
    g = torch.Generator().manual_seed(seed)
    n = torch.Size(shape).numel() * dtype.itemsize
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw &= 1
    return raw.view(dtype).reshape(shape)


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).cpu()


INDEXES = [(slice(None),), (slice(1, 3),), (slice(None), slice(2, 5)), (slice(None, None, 2), slice(1, 7, 3)),
           (slice(2, 3), slice(None), slice(1, 2)), (slice(0, 4), slice(0, 0)), (slice(-3, None),),
           (slice(None), slice(None), slice(None, None, 2))]


@pytest.mark.parametrize("shape", [(5, 8, 3), (7, 9, 4)])
def test_plan_reads_exactly_the_slice(tmp_path, shape):
    """Every slice, several chunk sizes and gap limits, read from a file through the pipeline:
    the bytes equal torch's indexing, and a zero gap limit reads only kept bytes."""
    src = _random_bytes(shape, torch.int16, 1)
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 24 + _bytes(src).numpy().tobytes())
    for index, chunk, gap, readers in itertools.product(INDEXES, (2, 6, 1 << 20), (0, 4, 1 << 20), (1, 3)):
        full = normalize(index, shape, "t")
        want = src[full]
        out_shape, starts, run = slice_runs(shape, 2, full)
        assert out_shape == tuple(want.shape)
        reads = plan(0, 24, starts, run, 0, chunk, gap)
        assert all(r.kept <= chunk and (r.nbytes <= chunk or r.count == 1) for r in reads)
        dst = torch.full(out_shape, -12345, dtype=torch.int16)  # poison
        stats = read_into([str(path)], reads, [dst.reshape(-1).view(torch.uint8)], readers, chunk, 2)
        assert torch.equal(dst, want), (index, chunk, gap)
        assert stats["bytes_kept"] == want.numel() * 2
        if gap == 0:
            assert stats["bytes_read"] == stats["bytes_kept"]


def test_plan_column_slice_bytes():
    """A column slice: per-row ranges when gaps are large, one covering range when small."""
    shape, item = (64, 1024), 2
    _, starts, run = slice_runs(shape, item, normalize((slice(None), slice(0, 256)), shape, "w"))
    assert len(starts) == 64 and run == 512
    per_row = plan(0, 0, starts, run, 0, 1 << 20, 0)
    covering = plan(0, 0, starts, run, 0, 1 << 20, 1 << 20)
    assert sum(r.nbytes for r in per_row) == 64 * 512 and len(per_row) == 64
    assert len(covering) == 1 and covering[0].nbytes == 63 * 2048 + 512 and covering[0].stride == 2048
    assert [r.count for r in plan(0, 0, starts, run, 0, 8192, 1 << 20)] == [4] * 16  # 4 rows fit 8 KiB
    _, starts, run = slice_runs(shape, item, normalize((slice(16, 32),), shape, "w"))
    assert starts.tolist() == [16 * 2048] and run == 16 * 2048  # a row slice is one range


def test_bad_slices():
    with pytest.raises(TypeError, match="tuple of slices"):
        normalize((3,), (4, 4), "w")
    with pytest.raises(ValueError, match="positive steps"):
        normalize((slice(None, None, -1),), (4, 4), "w")
    with pytest.raises(ValueError, match="3 slices for a 2-d"):
        normalize((slice(None),) * 3, (4, 4), "w")


DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool] + [getattr(torch, n) for n in (
              "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


def _write_checkpoint(folder):
    """Three files of tensors of every dtype and several shapes (scalars and empties too)."""
    from safetensors.torch import save_file
    shapes = [(12, 10), (10,), (), (6, 0), (4, 6, 5), (34, 8)]
    tensors = {}
    for i, dtype in enumerate(DTYPES):
        for j, shape in enumerate(shapes):
            tensors[f"layer{i}.{j}.{str(dtype)[6:]}"] = _random_bytes(shape, dtype, 100 * i + j)
    names = sorted(tensors)
    folder.mkdir()
    files = []
    for k in range(3):
        files.append(str(folder / f"model-{k + 1:05d}-of-00003.safetensors"))
        save_file({n: tensors[n] for n in names[k::3]}, files[-1])
    return files


def _poisoned(ctx):
    """Fill then free a block, so the loader's tensors start on poison, not on fresh zeros."""
    p = ctx.full((1 << 20,), 0x5A, dtype=torch.uint8)
    ctx.free(p)


def _same(loaded, ref, index_of=lambda name, t: t):
    bad = [n for n in ref if not torch.equal(_bytes(loaded[n]), _bytes(index_of(n, ref[n])))]
    return not bad and sorted(loaded) == sorted(ref), bad


def rank_load(folder, files):
    from safetensors.torch import load_file
    ctx = iris.iris(heap_size=1 << 24, allocator="vmem")
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    ref = {}
    for f in files:
        ref.update(load_file(f))
    res = {}
    _poisoned(ctx)
    full = ctx.load_safetensors(folder)  # a directory of shards
    res["dir"] = _same(full, ref)
    res["on_heap"] = all(ctx.is_symmetric(t) for t in full.values())
    _poisoned(ctx)
    res["list"] = _same(ctx.load_safetensors(list(reversed(files)), readers=3, chunk_bytes=64), ref)
    res["one_file"] = _same(ctx.load_safetensors(files[1]), load_file(files[1]))

    def rows(name, shape):
        return (slice(r * shape[0] // w, (r + 1) * shape[0] // w),) if shape else None

    def cols(name, shape):
        return (slice(None), slice(r * shape[1] // w, (r + 1) * shape[1] // w)) if len(shape) > 1 else None

    def strided(name, shape):
        return (slice(r, None, w), slice(1, None, 2)) if len(shape) > 1 else None

    for label, fn in (("rows", rows), ("cols", cols), ("strided", strided)):
        _poisoned(ctx)
        got = ctx.load_safetensors(folder, shard=fn, max_gap=0)
        res[label] = _same(got, ref, lambda n, t: t[fn(n, tuple(t.shape))] if fn(n, tuple(t.shape)) else t)
        res[label + "_read"] = (got.stats["bytes_read"], got.stats["bytes_kept"])
        if label == "rows":
            ctx.barrier()
            q = (r + 1) % w
            name = "layer0.0.bfloat16"
            peer_rows = ref[name][q * 12 // w:(q + 1) * 12 // w]
            res["peer"] = torch.equal(_bytes(ctx.peer_view(got[name], q)), _bytes(peer_rows))
    covering = ctx.load_safetensors(files, shard=cols, names=["layer2.5.float32"])
    res["covering_read"] = covering.stats["bytes_read"]
    want = ref["layer2.5.float32"][cols("", (34, 8))]
    res["covering"] = torch.equal(_bytes(covering["layer2.5.float32"]), _bytes(want))

    # bad input: each raises on every rank before anything is allocated
    before = (dict(ctx.heap.stats), sorted(ctx.heap.alloc.offsets.live))
    errors = {}
    truncated = os.path.join(os.path.dirname(files[0]), f"truncated{r}.bin")
    with open(files[0], "rb") as f, open(truncated, "wb") as g:
        g.write(f.read()[:-10])
    garbage = os.path.join(os.path.dirname(files[0]), f"garbage{r}.bin")
    with open(garbage, "wb") as g:
        g.write(struct.pack("<Q", 5) + b"{oops")
    cases = {"missing": dict(path=files + [files[0] + ".nope"]),
             "name": dict(path=files, names=["layer0.0.bfloat16", "layer0.0.bfloat61"]),
             "truncated": dict(path=truncated), "garbage": dict(path=garbage),
             "bad_shard": dict(path=files, shard=lambda n, s: 3),
             "one_rank_missing": dict(path=files if r == 0 else [files[0] + ".nope"]),
             "diverged": dict(path=files, names=["layer0.0.bfloat16"], shard=lambda n, s: (slice(0, 1 + r),))}
    for case, kw in cases.items():
        try:
            ctx.load_safetensors(**kw)
            errors[case] = None
        except Exception as e:  # noqa: BLE001
            errors[case] = f"{type(e).__name__}: {e}"
    res["errors"] = errors
    res["untouched"] = (dict(ctx.heap.stats), sorted(ctx.heap.alloc.offsets.live)) == before
    ctx.close()
    return res


def test_load_safetensors_on_ranks(tmp_path):
    files = _write_checkpoint(tmp_path / "ckpt")
    entries = read_entries(checkpoint_files(str(tmp_path / "ckpt")))
    assert len(entries) == len(DTYPES) * 6
    for res in iris.spawn(rank_load, 2, args=(str(tmp_path / "ckpt"), files)):
        for key in ("dir", "list", "one_file", "rows", "cols", "strided"):
            assert res[key][0], (key, res[key][1])
        assert res["on_heap"] and res["peer"] and res["covering"], res
        assert res["rows_read"][0] == res["rows_read"][1] and res["cols_read"][0] == res["cols_read"][1]
        assert res["covering_read"] > 34 * 8 * 4 // 2, res["covering_read"]  # the range covering its rows
        e = res["errors"]
        assert e["missing"].startswith("FileNotFoundError") and ".nope does not exist" in e["missing"], e
        assert e["name"].startswith("ValueError") and "'layer0.0.bfloat61'" in e["name"] and "did you mean" in e["name"]
        assert e["truncated"].startswith("CheckpointError") and "truncated" in e["truncated"], e
        assert e["garbage"].startswith("CheckpointError") and "not valid JSON" in e["garbage"], e
        assert e["bad_shard"].startswith("TypeError") and "tuple of slices" in e["bad_shard"], e
        assert e["one_rank_missing"] and "does not exist" in e["one_rank_missing"], e  # rank 0 names rank 1's error
        assert e["diverged"].startswith("SymmetryError"), e
        assert res["untouched"], res


def test_checkpoint_errors_without_ranks(tmp_path):
    with pytest.raises(FileNotFoundError):
        checkpoint_files(str(tmp_path / "none.safetensors"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        checkpoint_files(str(tmp_path / "empty"))
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"abc")
    with pytest.raises(CheckpointError, match="too short"):
        read_entries([str(short)])
