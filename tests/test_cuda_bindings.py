"""iris's use of cuda-bindings, checked without a GPU, on the installed release and on the oldest one
pyproject allows (installed into a temporary folder with pip).

cuda-bindings imports and builds its structs without a driver, and converts every argument before
it loads libcuda; so on a machine without the driver each call iris makes either reaches the loader
(the binding took iris's arguments) or fails with a TypeError/AttributeError (it did not).
  - every `cu.NAME` and `cu.ENUM.MEMBER` in iris's source exists;
  - the structs iris builds hold, in the memory the driver reads, what iris set;
  - an IPC handle's 64 bytes survive the trip out of one struct and into another;
  - every CudaDriver method, and the graph calls of ccl's launcher, get past argument conversion.
"""
import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORDS = re.compile(r"\bcu\.([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?")


def lowest_allowed() -> str:
    """The oldest cuda-bindings the `cuda` extra admits (`cuda-bindings>=X`)."""
    match = re.search(r'"cuda-bindings>=([0-9][0-9.]*)', (ROOT / "pyproject.toml").read_text())
    assert match, "pyproject.toml: the cuda extra should read cuda-bindings>=X"
    return match.group(1)


def release(version: str) -> tuple:
    """12.8 and 12.8.0 alike."""
    parts = [int(p) for p in version.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


# The C layouts the driver reads (cuda.h): what iris set must be there, not only in a Python copy.
class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", ctypes.c_ubyte * 8)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def check_names(cu) -> int:
    """Every cu.NAME (and cu.NAME.MEMBER) that iris's source touches exists in this release."""
    used = set()
    for path in (ROOT / "iris").rglob("*.py"):
        used.update(WORDS.findall(path.read_text()))
    assert len({name for name, _ in used}) >= 30, f"found only {sorted(used)}: has iris stopped saying `cu.`?"
    missing = [f"cu.{name}" + (f".{member}" if member else "") for name, member in sorted(used)
               if not hasattr(cu, name) or (member and not hasattr(getattr(cu, name), member))]
    assert not missing, f"cuda-bindings lacks {missing}"
    return len(used)


def check_structs(cu) -> None:
    """CudaDriver's allocation property and access descriptors, read back as the driver reads them."""
    from iris.platform.cuda import CudaDriver, access_descs
    drv = CudaDriver()
    drv._ordinal = 5  # a device ordinal set without a driver call, so the struct holds a non-zero id
    prop = drv._prop()
    raw = _AllocationProp.from_address(prop.getPtr())
    assert raw.type == int(cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED) == 1
    assert raw.requestedHandleTypes == int(cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 1
    assert (raw.location.type, raw.location.id) == (int(cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE), 5) == (1, 5)
    descs = access_descs([5, 2, 7])
    read_write = int(cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    assert read_write == 3
    raw = [_AccessDesc.from_address(d.getPtr()) for d in descs]
    assert [(r.location.type, r.location.id, r.flags) for r in raw] == [(1, 5, 3), (1, 2, 3), (1, 7, 3)]


def check_ipc_round_trip(cu) -> None:
    """ipc_bytes(ipc_struct(b)) == b for 64 bytes taking every high and low value; where the release
    still has `.reserved` (up to 13.3), it agrees with the raw bytes both ways."""
    from iris.platform.cuda import IPC_HANDLE_SIZE, ipc_bytes, ipc_struct
    assert IPC_HANDLE_SIZE == 64
    for seed in (11, 200):
        data = bytes((seed + 37 * i) % 256 for i in range(64))
        h = ipc_struct(data)
        assert isinstance(h, cu.CUipcMemHandle)
        assert ctypes.string_at(h.getPtr(), 64) == data and ipc_bytes(h) == data
        if hasattr(h, "reserved"):
            assert bytes(h.reserved) == data
            other = cu.CUipcMemHandle()
            other.reserved = data
            assert ipc_bytes(other) == data
    assert ipc_bytes(cu.CUipcMemHandle()) == bytes(64)  # a fresh struct is zeroed: the copy above did the work
    with pytest.raises(ValueError, match="64 bytes, got 63"):
        ipc_struct(bytes(63))


def _driver_absent(cu) -> bool:
    try:
        cu.cuInit(0)
    except RuntimeError:  # the loader's error: no libcuda on this machine
        return True
    return False


def _reaches_driver(call, fn, *args) -> None:
    """fn(*args) may fail only for want of a driver to call (the loader's RuntimeError)."""
    try:
        fn(*args)
    except (TypeError, AttributeError, ValueError, OverflowError) as e:
        raise AssertionError(f"{call}: cuda-bindings refused iris's arguments: {type(e).__name__}: {e}") from e
    except RuntimeError:
        pass


def check_calls(cu) -> int:
    """Each CudaDriver method, and the graph calls of iris/ccl/launch.py, as iris makes them."""
    from iris.platform import IpcHandle
    from iris.platform.cuda import CudaDriver

    class Ordinal0(CudaDriver):
        """The driver with device 0 already chosen and a fixed granularity, so each method makes its own call."""

        def __init__(self):
            super().__init__()
            self._ordinal = 0

        def granularity(self):
            return 2 << 20

    drv, size, va = Ordinal0(), 2 << 20, 1 << 40
    handle = cu.CUmemGenericAllocationHandle(7)
    calls = [("device_count", drv.device_count), ("set_device", drv.set_device, 0), ("mem_info", drv.mem_info),
             ("granularity", CudaDriver.granularity, drv), ("reserve", drv.reserve, size),
             ("free_va", drv.free_va, va, size), ("create", drv.create, size), ("release", drv.release, handle),
             ("map", drv.map, va, size, handle), ("unmap", drv.unmap, va, size),
             ("set_access", drv.set_access, va, size, [0, 1]), ("export", drv.export, handle),
             ("import_", drv.import_, 9), ("retain", drv.retain, va), ("ipc_export", drv.ipc_export, va, size),
             ("ipc_open", drv.ipc_open, IpcHandle(bytes(range(64)), 256, size))]
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    stream = 0x1234  # torch's cuda_stream: an int
    calls += [("cuStreamBeginCapture", cu.cuStreamBeginCapture, stream, mode),
              ("cuStreamEndCapture", cu.cuStreamEndCapture, stream),
              ("cuGraphInstantiate", cu.cuGraphInstantiate, cu.CUgraph(), 0),
              ("cuGraphDestroy", cu.cuGraphDestroy, cu.CUgraph()),
              ("cuGraphLaunch", cu.cuGraphLaunch, cu.CUgraphExec(), cu.CUstream(stream)),
              ("cuGraphExecDestroy", cu.cuGraphExecDestroy, cu.CUgraphExec()),
              ("cuDriverGetVersion", cu.cuDriverGetVersion)]
    for call, fn, *args in calls:
        _reaches_driver(call, fn, *args)
    return len(calls)


def check_bindings() -> str:
    """All of the above on the cuda-bindings this process imports; a line saying what was checked."""
    import cuda.bindings
    from cuda.bindings import driver as cu
    names = check_names(cu)
    check_structs(cu)
    check_ipc_round_trip(cu)
    calls = check_calls(cu) if _driver_absent(cu) else 0
    return (f"cuda-bindings {cuda.bindings.__version__}: {names} names, structs, IPC round trip, "
            + (f"{calls} calls" if calls else "calls not made (a driver is loaded here)"))


def test_installed_bindings():
    pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed (the test extra installs it)")
    print(check_bindings())


def test_oldest_allowed_bindings(tmp_path):
    """The same checks in a fresh process that imports the oldest release pyproject allows."""
    version = lowest_allowed()
    target = tmp_path / "site"
    try:
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--only-binary=:all:",
                              "--disable-pip-version-check", "--target", str(target), f"cuda-bindings=={version}"],
                             capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip could not fetch cuda-bindings=={version} within 180 s")
    if pip.returncode != 0:
        tail = [line for line in pip.stderr.splitlines() if line.strip() and "WARNING" not in line][-2:]
        pytest.skip(f"pip cannot install cuda-bindings=={version} here: {' | '.join(tail)}")
    code = ("import cuda.bindings, test_cuda_bindings as t; v = cuda.bindings.__version__; "
            f"assert t.release(v) == t.release({version!r}), (v, cuda.bindings.__file__); print(t.check_bindings())")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(ROOT / "tests"), str(ROOT)]))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    print(p.stdout)
