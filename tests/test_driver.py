"""Driver conformance: the same checks for every platform, each in real processes.

host runs everywhere; cuda runs where an NVIDIA GPU and cuda-bindings are; hip where ROCm and
hip-python are (never on the machines this project has: it skips there).
"""
import importlib.util
import os

import pytest
import torch

import iris
from iris.distributed import connect
from iris.errors import DriverError
from iris.heap import bytes_at
from iris.platform import IpcHandle, get_driver


def _available(platform):
    if platform == "host":
        return True, ""
    gpu = torch.cuda.is_available() and (bool(torch.version.hip) == (platform == "hip"))
    module = {"cuda": "cuda.bindings", "hip": "hip"}[platform]
    try:
        has = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        has = False
    return gpu and has, f"needs a {platform} GPU and {module}"


PLATFORMS = [pytest.param(p, marks=[] if p == "host" else [pytest.mark.gpu]) for p in ("host", "cuda", "hip")]


def _device(driver):
    return torch.device("cpu") if driver.torch_device == "cpu" else torch.device("cuda", torch.cuda.current_device())


def rank_conformance(platform):
    """Rank 0 creates and fills memory; rank 1 imports it by fd (VMM) and by IPC, reads it and writes back."""
    group = connect(timeout=60)
    d = get_driver(platform)
    index = group.rank % d.device_count()
    d.set_device(index)
    if d.torch_device == "cuda":
        torch.cuda.set_device(index)
    dev, g = _device(d), d.granularity()
    report = {"granularity": g}
    assert g > 0 and g & (g - 1) == 0, f"granularity {g} is not a power of two"
    size = 2 * g
    va = d.reserve(2 * size)
    assert va % g == 0
    pattern = (torch.arange(size, dtype=torch.int64, device=dev) * 7 + 3) % 251
    if group.rank == 0:
        h = d.create(size)
        d.map(va, size, h)
        d.set_access(va, size)
        view = bytes_at(va, size, dev)
        view.copy_(pattern.to(torch.uint8))
        retained = d.retain(va + 100)
        assert retained is not None, "retain returned None for VMM memory"
        h2, base, rsize = retained
        assert base == va and rsize == size, (hex(base), rsize)
        d.release(h2)
        fd = d.export(h)
        plain = torch.full((1 << 20,), 9, dtype=torch.uint8, device=dev)
        if dev.type == "cpu":
            plain.share_memory_()
        ipc = d.ipc_export(plain.data_ptr() + 4096, 4096)
        fds = [fd] + ([ipc.fd] if ipc.fd is not None else [])
        group.exchange((ipc.data, ipc.offset, ipc.size), fds, "conformance export")
        for f in fds:
            os.close(f)
        group.barrier("peer wrote")
        if dev.type == "cuda":
            torch.cuda.synchronize()
        report["peer_write_seen"] = bool((view[:g] == 42).all()) and torch.equal(view[g:], pattern[g:].to(torch.uint8))
        report["ipc_write_seen"] = bool((plain[4096:8192] == 17).all()) and bool((plain[:4096] == 9).all())
        d.unmap(va, size)
        assert d.retain(va) is None, "retain of an unmapped address must say None"
        d.release(h)
        report["plain_retain"] = d.retain(torch.ones(1 << 10, device=dev).data_ptr())
    else:
        objs, fds = group.exchange(None, (), "conformance export")
        h = d.import_(fds[0][0])
        os.close(fds[0][0])
        d.map(va + size, size, h)  # a different VA than the owner's: mappings are per process
        d.set_access(va + size, size)
        view = bytes_at(va + size, size, dev)
        report["import_read_ok"] = torch.equal(view, pattern.to(torch.uint8))
        view[:g].fill_(42)
        data, offset, isize = objs[0]
        ptr = d.ipc_open(IpcHandle(data, offset, isize, fds[0][1] if len(fds[0]) > 1 else None))
        if len(fds[0]) > 1:
            os.close(fds[0][1])
        other = bytes_at(ptr, isize, dev)
        report["ipc_read_ok"] = bool((other == 9).all())
        other.fill_(17)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        group.barrier("peer wrote")
        d.ipc_close(ptr, isize)
        d.unmap(va + size, size)
        d.release(h)
    d.free_va(va, 2 * size)
    with pytest.raises(DriverError) as err:
        d.unmap(0, g)
    report["error_names_call"] = err.value.call in str(err.value) and bool(err.value.call)
    report["capture_ids"] = _capture_ids(d, dev)
    group.barrier("done")
    group.close()
    return report


def _capture_ids(d, dev):
    """capture_id of two streams outside capture, both inside one capture, and one inside the next."""
    if dev.type == "cpu":
        return [d.capture_id(0)] * 5
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    ids = [d.capture_id(a.cuda_stream), d.capture_id(b.cuda_stream)]
    x = torch.zeros(4, device=dev)
    for g, fork in ((torch.cuda.CUDAGraph(), True), (torch.cuda.CUDAGraph(), False)):
        with torch.cuda.graph(g, stream=a):
            x.add_(1)
            ids.append(d.capture_id(a.cuda_stream))
            if fork:
                b.wait_stream(a)
                with torch.cuda.stream(b):
                    x.add_(1)
                ids.append(d.capture_id(b.cuda_stream))
                a.wait_stream(b)
    return ids


@pytest.mark.parametrize("platform", PLATFORMS)
def test_driver_conformance(platform):
    ok, why = _available(platform)
    if not ok:
        pytest.skip(why)
    owner, peer = iris.spawn(rank_conformance, 2, args=(platform,))
    assert peer["import_read_ok"], "the importing process did not read the owner's bytes"
    assert peer["ipc_read_ok"], "ipc_open did not show the owner's block"
    assert owner["peer_write_seen"], "the owner did not see the importer's write"
    assert owner["ipc_write_seen"], "the owner did not see the write through ipc_open"
    assert owner["plain_retain"] is None, "retain of non-VMM memory must say None"
    assert owner["error_names_call"] and peer["error_names_call"]
    ids = owner["capture_ids"]
    if platform == "host":
        assert ids == [0] * 5, ids
    else:  # none outside capture; one id for both streams of a capture; another for the next capture
        assert ids[:2] == [0, 0] and ids[2] == ids[3] != 0 and ids[4] not in (0, ids[2]), ids
    if platform != "host":
        assert owner["granularity"] >= 1 << 16


def test_unknown_platform_is_refused():
    with pytest.raises(ValueError, match="unknown platform"):
        get_driver("tpu")
