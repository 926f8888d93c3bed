"""CUDA driver: the VMM calls of the CUDA driver API through cuda-bindings (cuda.bindings.driver).

Physical memory is cuMemCreate'd with a POSIX fd handle type so peers can import it; VAs come
from cuMemAddressReserve. Everything runs in the device's primary context, the one PyTorch uses.
Only what every supported cuda-bindings release offers is used: structs are built through their
attribute setters and read as raw memory through getPtr() (tests/test_cuda_bindings.py checks both
the oldest release pyproject allows and the newest).
"""
from __future__ import annotations

import ctypes
from typing import Dict, List, Optional, Sequence

from cuda.bindings import driver as cu

from ..errors import DriverError
from .driver import IpcHandle, reserve_failed

_POSIX_FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_READWRITE = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_GEQ = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
IPC_HANDLE_SIZE = cu.CU_IPC_HANDLE_SIZE  # 64: CUipcMemHandle is char reserved[CU_IPC_HANDLE_SIZE]


def ipc_bytes(handle: "cu.CUipcMemHandle") -> bytes:
    """The handle's 64 bytes, read from the struct itself (cuda-bindings 13.4 dropped `.reserved`)."""
    return ctypes.string_at(handle.getPtr(), IPC_HANDLE_SIZE)


def ipc_struct(data: bytes) -> "cu.CUipcMemHandle":
    """A CUipcMemHandle holding data, the 64 bytes ipc_bytes gave on the exporting rank."""
    if len(data) != IPC_HANDLE_SIZE:
        raise ValueError(f"a CUDA IPC handle is {IPC_HANDLE_SIZE} bytes, got {len(data)}: pass ipc_bytes()'s result")
    handle = cu.CUipcMemHandle()  # owns its struct: getPtr() stays valid while handle lives
    ctypes.memmove(handle.getPtr(), bytes(data), IPC_HANDLE_SIZE)
    return handle


def access_descs(devices: Sequence[int]) -> List["cu.CUmemAccessDesc"]:
    """Read-write access for each device ordinal, as cuMemSetAccess takes it."""
    descs = []
    for ordinal in devices:
        d = cu.CUmemAccessDesc()
        d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE  # the nested struct is a view
        d.location.id = int(ordinal)
        d.flags = _READWRITE
        descs.append(d)
    return descs


_SUCCESS = cu.CUresult.CUDA_SUCCESS
_WRITE64, _BATCH = cu.cuStreamWriteValue64, cu.cuStreamBatchMemOp  # a free's and a reuse's calls, looked up once
_WAIT_OP = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_64
_ACTIVE = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
_MAX_BATCH = 256  # operations one cuStreamBatchMemOp takes


def _check(call: str, result):
    """Unpack cuda-bindings' (CUresult, *values): raise DriverError naming the call, else the value(s)."""
    err, *values = result
    if err != _SUCCESS:
        _, msg = cu.cuGetErrorString(err)
        detail = msg.decode() if isinstance(msg, bytes) else str(msg or "")
        raise DriverError(call, err.name, detail, oom=err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY)
    return values[0] if len(values) == 1 else tuple(values) if values else None


def _init() -> None:
    """cuInit. Where libcuda itself cannot be loaded (no NVIDIA driver), cuda-bindings raises its
    loader's error (a RuntimeError) instead of returning a code; that too becomes a DriverError."""
    try:
        result = cu.cuInit(0)
    except RuntimeError as e:
        raise DriverError("cuInit", type(e).__name__,
                          f"cuda-bindings cannot load the NVIDIA driver (libcuda): {str(e).rstrip('.')}. "
                          "Install the NVIDIA driver, or run on the CPU: IRIS_PLATFORM=host (platform='host')") from e
    _check("cuInit", result)


class CudaDriver:
    """NVIDIA GPUs through cuda-bindings; handles are CUmemGenericAllocationHandle objects."""

    name = "cuda"
    torch_device = "cuda"

    def __init__(self):
        self._ordinal: Optional[int] = None
        self._dev = None
        self._ctx: Dict[int, object] = {}            # ordinal -> retained primary context
        self._ipc: Dict[int, List[object]] = {}       # ipc_open pointer -> opened bases (opens may repeat)

    # -- device ------------------------------------------------------------
    def device_count(self) -> int:
        _init()
        return _check("cuDeviceGetCount", cu.cuDeviceGetCount())

    def set_device(self, index: int) -> None:
        """Make device `index`'s primary context current in this thread (PyTorch shares it)."""
        _init()
        dev = _check("cuDeviceGet", cu.cuDeviceGet(index))
        if index not in self._ctx:  # retain once per device; the driver counts retains
            self._ctx[index] = _check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))
        _check("cuCtxSetCurrent", cu.cuCtxSetCurrent(self._ctx[index]))
        self._ordinal, self._dev = index, dev

    def _device(self) -> int:
        """The ordinal set by set_device, device 0 until one is set."""
        if self._ordinal is None:
            self.set_device(0)
        return self._ordinal

    def mem_info(self):
        self._device()
        free, total = _check("cuMemGetInfo", cu.cuMemGetInfo())
        return free, total

    # -- virtual memory ----------------------------------------------------
    def _prop(self) -> "cu.CUmemAllocationProp":
        """Pinned device memory on the current device, exportable as a POSIX fd."""
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE  # the nested struct is a view
        prop.location.id = self._device()
        prop.requestedHandleTypes = _POSIX_FD
        return prop

    def granularity(self) -> int:
        flag = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        return _check("cuMemGetAllocationGranularity", cu.cuMemGetAllocationGranularity(self._prop(), flag))

    def reserve(self, size: int) -> int:
        try:
            return int(_check("cuMemAddressReserve", cu.cuMemAddressReserve(size, self.granularity(), 0, 0)))
        except DriverError as e:
            raise reserve_failed(e, size) from None

    def free_va(self, va: int, size: int) -> None:
        _check("cuMemAddressFree", cu.cuMemAddressFree(va, size))

    def create(self, size: int):
        return _check("cuMemCreate", cu.cuMemCreate(size, self._prop(), 0))

    def release(self, handle) -> None:
        _check("cuMemRelease", cu.cuMemRelease(handle))

    def map(self, va: int, size: int, handle, offset: int = 0) -> None:
        if offset != 0:
            raise ValueError(f"cuMemMap maps whole allocations: offset must be 0, got {offset}; map at va + offset instead")
        _check("cuMemMap", cu.cuMemMap(va, size, 0, handle, 0))

    def unmap(self, va: int, size: int) -> None:
        _check("cuMemUnmap", cu.cuMemUnmap(va, size))

    def set_access(self, va: int, size: int, devices: Optional[Sequence[int]] = None) -> None:
        descs = access_descs([self._device()] if devices is None else devices)
        _check("cuMemSetAccess", cu.cuMemSetAccess(va, size, descs, len(descs)))

    # -- sharing -----------------------------------------------------------
    def export(self, handle) -> int:
        # For POSIX_FILE_DESCRIPTOR cuda-bindings returns the fd as an int (_HelperCUmemAllocationHandleType).
        return _check("cuMemExportToShareableHandle", cu.cuMemExportToShareableHandle(handle, _POSIX_FD, 0))

    def import_(self, fd: int):
        """The driver reads the fd and leaves it open; the caller still owns and closes it."""
        # The fd travels as the pointer value, (void*)(uintptr_t)fd: cuda-bindings casts an int
        # osHandle straight to void* (_helper_input_void_ptr in cuda/bindings/_lib/utils.pxi).
        return _check("cuMemImportFromShareableHandle", cu.cuMemImportFromShareableHandle(fd, _POSIX_FD))

    def retain(self, ptr: int):
        """(handle, base, size) of the allocation behind ptr, None when it is not VMM memory.

        For VMM memory cuMemGetAddressRange answers with the one mapped allocation holding ptr
        (a single cuMemCreate chunk, e.g. one expandable-segments page), not the whole reservation.
        """
        try:
            handle = _check("cuMemRetainAllocationHandle", cu.cuMemRetainAllocationHandle(ptr))
        except DriverError as e:
            if e.code == cu.CUresult.CUDA_ERROR_INVALID_VALUE.name:  # plain cuMemAlloc/cudaMalloc memory
                return None
            raise
        try:
            base, size = _check("cuMemGetAddressRange", cu.cuMemGetAddressRange(ptr))
        except BaseException:
            self.release(handle)
            raise
        return handle, int(base), int(size)

    def ipc_export(self, ptr: int, size: int) -> IpcHandle:
        base, _ = _check("cuMemGetAddressRange", cu.cuMemGetAddressRange(ptr))
        handle = _check("cuIpcGetMemHandle", cu.cuIpcGetMemHandle(base))
        return IpcHandle(ipc_bytes(handle), ptr - int(base), size)

    def ipc_open(self, handle: IpcHandle) -> int:
        h = ipc_struct(handle.data)
        flags = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        base = _check("cuIpcOpenMemHandle", cu.cuIpcOpenMemHandle(h, int(flags)))
        ptr = int(base) + handle.offset
        self._ipc.setdefault(ptr, []).append(base)
        return ptr

    def ipc_close(self, ptr: int, size: int) -> None:
        bases = self._ipc.get(ptr)
        if not bases:
            raise ValueError(f"ipc_close({ptr:#x}): that pointer did not come from ipc_open on this driver")
        _check("cuIpcCloseMemHandle", cu.cuIpcCloseMemHandle(bases[-1]))
        bases.pop()
        if not bases:
            del self._ipc[ptr]

    # -- stream-ordered words ----------------------------------------------
    def stream_write(self, stream: int, address: int, value: int) -> None:
        """Write value to the 8 bytes at address once the stream's earlier work has finished (the
        default flags order the write after that work's memory operations). On every free with
        peers: _check only where the call failed."""
        result = _WRITE64(stream, address, value, 0)
        if result[0] != _SUCCESS:
            _check("cuStreamWriteValue64", result)

    def stream_waiter(self, addresses: Sequence[int]):
        """A function (stream, value) that holds the stream's later work until the 8 bytes at each
        address (local or a peer's mapping) are >= value, in one driver call for all of them: a
        batch of N waits costs about what one wait does, N waits one by one N times that."""
        params = []
        for address in addresses:
            p = cu.CUstreamBatchMemOpParams()
            p.operation = _WAIT_OP
            w = p.waitValue
            w.operation, w.address, w.flags = _WAIT_OP, address, _GEQ
            params.append(p)
        batches = [(params[i:i + _MAX_BATCH], [p.waitValue for p in params[i:i + _MAX_BATCH]])
                   for i in range(0, len(params), _MAX_BATCH)]

        def wait(stream: int, value: int) -> None:
            for batch, words in batches:
                for w in words:
                    w.value64 = value
                result = _BATCH(stream, len(batch), batch, 0)
                if result[0] != _SUCCESS:
                    _check("cuStreamBatchMemOp", result)
        return wait

    def relax_capture(self) -> None:
        """Let the calling thread use the driver while another thread captures a CUDA graph in global
        mode (torch's default); its own work stays uncaptured, on streams of its own."""
        _check("cuThreadExchangeStreamCaptureMode",
               cu.cuThreadExchangeStreamCaptureMode(cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))

    def capture_id(self, stream: int) -> int:
        """The id of the graph capture the stream is part of now (unique in the process), 0 if none."""
        status, ident = _check("cuStreamGetCaptureInfo", cu.cuStreamGetCaptureInfo(stream))[:2]
        return int(ident) if status == _ACTIVE else 0
