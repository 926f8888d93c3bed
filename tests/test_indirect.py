"""Indirect peers: iris's device functions reaching peers through NVSHMEM's device API.

IRIS_INDIRECT_PEERS makes reachable peers indirect, so the NVSHMEM path runs with several ranks on
one GPU: the device-function checks of test_device (put, get, load, store, copy on every dtype, the
nine atomics on 32- and 64-bit types, raced counters, a lock, signal/wait, the device barrier, a
CUDA-graph-captured barrier) run with every peer indirect and with direct and indirect peers mixed.
NVSHMEM then moves data over its peer-to-peer path; its network path needs two nodes. GPU tests need
nvshmem4py and NVSHMEM's device bitcode.
"""
import os
import re
import time

import pytest

import iris
from iris.errors import IrisError
from iris.heap import reach

import test_device

# test_device's checks but "positional" (16-bit atomics: NVSHMEM has none, refused at compile time for
# indirect peers) and "translate" (host-side peer views, which indirect peers have not); its atomics
# check on the 32- and 64-bit types only.
CHECKS = ("rma", "atomics_32_64", "counter", "lock", "message", "device_barrier", "graph_barrier")
CASE_TIMEOUT = 150  # seconds for one case's ranks: their NVSHMEM start, compiles and checks


def test_setting_names_ranks():
    assert reach.forced(4, "") == frozenset() and reach.forced(4, "none") == frozenset()
    assert reach.forced(4, "all") == frozenset(range(4)) and reach.forced(4, " 1,3 ") == frozenset({1, 3})
    for bad in ("4", "x", "1;2", "-1"):
        with pytest.raises(IrisError, match="IRIS_INDIRECT_PEERS"):
            reach.forced(4, bad)


def test_narrow_keeps_own_rank(monkeypatch):
    monkeypatch.setenv("IRIS_INDIRECT_PEERS", "0,2")
    assert reach.narrow({0: 10, 1: 11, 2: 12}, 2, 3) == {0: 0, 1: 11, 2: 12}


def _refused(allocator):
    try:
        iris.iris(heap_size=1 << 20, allocator=allocator)
    except IrisError as e:
        return str(e)
    return None


def test_one_host_allocators_refuse_indirect_peers(monkeypatch):
    monkeypatch.setenv("IRIS_INDIRECT_PEERS", "all")
    for message in iris.spawn(_refused, 2, args=("torch",)):
        assert message and "only allocator='nvshmem' reaches" in message, message


def _nvshmem_usable():
    try:
        from iris.device import nvshmem
        nvshmem.bitcode_path()
        import nvshmem.bindings  # noqa: F401
    except Exception as e:  # the reason goes into the skip
        return f"{type(e).__name__}: {e}"
    return None


def check_atomics_32_64(ctx, big):
    """test_device's atomics check (all nine, sem and scope cycled) on the 32- and 64-bit types."""
    return test_device.check_atomics(ctx, big, [(op, dt) for op, dts in test_device.ATOMIC_DTYPES.items()
                                                for dt in dts if dt.itemsize >= 4])


def _progress(what):
    print(f"{time.strftime('%H:%M:%S')} {what}", flush=True)


def _rank(names, setting):
    t = time.monotonic()
    ctx = iris.iris(heap_size=1 << 22, allocator="nvshmem")
    try:
        me, w = ctx.get_rank(), ctx.get_num_ranks()
        tag = f"IRIS_INDIRECT_PEERS={setting} rank {me} of {w}"
        named = reach.forced(w, setting)
        indirect = [r for r, b in enumerate(ctx.heap.bases) if b == 0]
        if indirect != sorted(named - {me}):
            return {"setup": [f"{tag}: indirect peers {indirect}, expected {sorted(named - {me})}"]}
        _progress(f"{tag}: heap ready in {time.monotonic() - t:.1f} s, indirect peers {indirect}")
        out = {"setup": []}
        for name in names:
            t = time.monotonic()
            out[name] = {**test_device.CHECKS, "atomics_32_64": check_atomics_32_64}[name](ctx, False)
            _progress(f"{tag}: {name} done in {time.monotonic() - t:.1f} s, {len(out[name])} failures")
        return out
    finally:
        ctx.close()


@pytest.mark.gpu
@pytest.mark.parametrize("setting, world", [("all", 2), ("all", 4), ("1", 3), ("0,3", 4)])
def test_device_functions_over_indirect_peers(setting, world, monkeypatch):
    """The first case compiles test_device's kernels with NVSHMEM linked (Triton's cache keeps them for the
    others: test_device's kernels do not specialise on ranks); each case is bounded by CASE_TIMEOUT."""
    why = _nvshmem_usable()
    if why:
        pytest.skip(f"NVSHMEM's device API is not usable here ({why}); pip install 'iris-shmem[nvshmem]'")
    monkeypatch.setenv("IRIS_INDIRECT_PEERS", setting)
    per_rank = iris.spawn(_rank, world, args=(CHECKS, setting), timeout=CASE_TIMEOUT)
    failures = [f for r in per_rank for fs in r.values() for f in fs]
    assert not failures, "\n".join(failures[:20])


def _stand_in_library(path):
    """An LLVM IR file defining every NVSHMEM function iris's helpers declare (each returning 0), and
    one function nobody calls."""
    from iris.device import nvshmem
    with open(nvshmem._HELPERS) as f:
        decls = re.findall(r"^declare (\S+) @(nvshmem\w+)\(([^)]*)\)", f.read(), re.M)
    body = ['target triple = "nvptx64-nvidia-cuda"']
    for ret, name, args in decls:
        params = ", ".join(f"{t.strip()} %a{i}" for i, t in enumerate(args.split(",")) if t.strip())
        body.append(f"define {ret} @{name}({params}) {{\n  ret {'void' if ret == 'void' else ret + ' 0'}\n}}")
    body.append("define i32 @nvshmem_never_called(i32 %a) {\n  ret i32 %a\n}")
    path.write_text("\n".join(body) + "\n")
    return [name for _, name, _ in decls]


def test_nvshmem_slice_holds_what_the_helpers_call(tmp_path, monkeypatch):
    """The library iris links into kernels of a job with indirect peers: its helpers, callable from a
    kernel, with the NVSHMEM functions they call and nothing else; built once, then found in the cache."""
    from iris.device import nvshmem
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    called = _stand_in_library(tmp_path / "nvshmem.ll")
    path = nvshmem._slice(str(tmp_path / "nvshmem.ll"), "0" * 64)
    text = open(path).read()
    with open(nvshmem._HELPERS) as f:
        helpers = re.findall(r"^define \S+ @(iris_\w+)\(", f.read(), re.M)
    assert {"iris_putmem_block", "iris_p32", "iris_g64", "iris_amo64", "iris_quiet"} <= set(helpers)
    for name in helpers:
        assert re.search(rf"^define \S+ @{name}\(", text, re.M), f"{name} is not an external definition"
    for name in called:
        assert re.search(rf"^define internal .*@{name}\(", text, re.M), f"{name} is not in the slice"
    assert "nvshmem_never_called" not in text
    os.utime(path, (1, 1))
    assert nvshmem._slice(str(tmp_path / "nvshmem.ll"), "0" * 64) == path and os.stat(path).st_mtime == 1
