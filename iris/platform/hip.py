"""HIP driver: the hipMem* VMM twins of the CUDA calls, through hip-python (hip.hip).

ROCm PyTorch names HIP devices "cuda". hip-python wraps out-pointers as hip._util.types.Pointer
(int() gives the address) and takes int addresses, ctypes addresses or buffers for pointer inputs.
"""
from __future__ import annotations

import ctypes
from typing import Dict, List, Optional, Sequence

from hip import hip

from ..errors import DriverError
from .driver import IpcHandle, reserve_failed

_POSIX_FD = hip.hipMemAllocationHandleType.hipMemHandleTypePosixFileDescriptor
_IPC_HANDLE_SIZE = 64
_GTE, _ALL_BITS = 0x0, (1 << 64) - 1  # hipStreamWaitValueGte (hip_runtime_api.h), a mask of every bit


def _check(call: str, result):
    """Unpack hip-python's (hipError_t, *values): raise DriverError naming the call, else the value(s)."""
    err, *values = result
    if err != hip.hipError_t.hipSuccess:
        raise DriverError(call, err.name, _message(err), oom=err == hip.hipError_t.hipErrorOutOfMemory)
    return values[0] if len(values) == 1 else tuple(values) if values else None


def _message(err) -> str:
    """hipGetErrorString's text; it returns (hipSuccess, CStr), a Pointer to the C string."""
    try:
        _, msg = hip.hipGetErrorString(err)
        return ctypes.string_at(int(msg)).decode(errors="replace")
    except Exception:  # the message is a courtesy; never let it hide the error being raised
        return ""


def _addr(p) -> int:
    """hip-python hands back None for a NULL out-pointer."""
    return 0 if p is None else int(p)


class HipDriver:
    """AMD GPUs through hip-python; handles are ihipMemGenericAllocationHandle objects."""

    name = "hip"
    torch_device = "cuda"

    def __init__(self):
        self._ordinal: Optional[int] = None
        self._ipc: Dict[int, List[int]] = {}  # ipc_open pointer -> opened bases (opens may repeat)

    # -- device ------------------------------------------------------------
    def device_count(self) -> int:
        return _check("hipGetDeviceCount", hip.hipGetDeviceCount())

    def set_device(self, index: int) -> None:
        _check("hipSetDevice", hip.hipSetDevice(index))
        self._ordinal = index

    def _device(self) -> int:
        """The ordinal set by set_device, device 0 until one is set."""
        if self._ordinal is None:
            self.set_device(0)
        return self._ordinal

    def mem_info(self):
        self._device()
        free, total = _check("hipMemGetInfo", hip.hipMemGetInfo())
        return free, total

    # -- virtual memory ----------------------------------------------------
    def _prop(self) -> "hip.hipMemAllocationProp":
        """Pinned device memory on the current device, exportable as a POSIX (dma-buf) fd."""
        prop = hip.hipMemAllocationProp()
        prop.type = hip.hipMemAllocationType.hipMemAllocationTypePinned
        prop.location.type = hip.hipMemLocationType.hipMemLocationTypeDevice  # nested getter returns a view
        prop.location.id = self._device()
        prop.requestedHandleTypes = _POSIX_FD
        return prop

    def granularity(self) -> int:
        flag = hip.hipMemAllocationGranularity_flags.hipMemAllocationGranularityRecommended
        return _check("hipMemGetAllocationGranularity", hip.hipMemGetAllocationGranularity(self._prop(), flag))

    def reserve(self, size: int) -> int:
        try:
            return _addr(_check("hipMemAddressReserve", hip.hipMemAddressReserve(size, self.granularity(), None, 0)))
        except DriverError as e:
            raise reserve_failed(e, size) from None

    def free_va(self, va: int, size: int) -> None:
        _check("hipMemAddressFree", hip.hipMemAddressFree(va, size))

    def create(self, size: int):
        return _check("hipMemCreate", hip.hipMemCreate(size, self._prop(), 0))

    def release(self, handle) -> None:
        _check("hipMemRelease", hip.hipMemRelease(handle))

    def map(self, va: int, size: int, handle, offset: int = 0) -> None:
        if offset != 0:
            raise ValueError(f"hipMemMap maps whole allocations: offset must be 0, got {offset}; map at va + offset instead")
        _check("hipMemMap", hip.hipMemMap(va, size, 0, handle, 0))

    def unmap(self, va: int, size: int) -> None:
        _check("hipMemUnmap", hip.hipMemUnmap(va, size))

    def set_access(self, va: int, size: int, devices: Optional[Sequence[int]] = None) -> None:
        descs = bytearray()  # hipMemSetAccess wants a C array; hip-python takes any contiguous buffer
        ordinals = [self._device()] if devices is None else list(devices)
        for ordinal in ordinals:
            d = hip.hipMemAccessDesc()
            d.location.type = hip.hipMemLocationType.hipMemLocationTypeDevice
            d.location.id = int(ordinal)
            d.flags = hip.hipMemAccessFlags.hipMemAccessFlagsProtReadWrite
            descs += ctypes.string_at(int(d), d.c_sizeof())
        _check("hipMemSetAccess", hip.hipMemSetAccess(va, size, descs, len(ordinals)))

    # -- sharing -----------------------------------------------------------
    def export(self, handle) -> int:
        fd = ctypes.c_int(-1)  # out-parameter: HIP writes the int fd through this pointer
        _check("hipMemExportToShareableHandle",
               hip.hipMemExportToShareableHandle(ctypes.addressof(fd), handle, _POSIX_FD, 0))
        return fd.value

    def import_(self, fd: int):
        """The runtime reads the fd and leaves it open; the caller still owns and closes it."""
        # HIP >= 7.1 takes the fd as the pointer value, as CUDA does; earlier ROCm reads it through
        # the pointer (PyTorch's CUDASymmetricMemory passes &fd below ROCM_VERSION 70100).
        box = ctypes.c_int(fd)
        version = _check("hipRuntimeGetVersion", hip.hipRuntimeGetVersion())
        os_handle = fd if version >= 70_100_000 else ctypes.addressof(box)
        return _check("hipMemImportFromShareableHandle", hip.hipMemImportFromShareableHandle(os_handle, _POSIX_FD))

    def retain(self, ptr: int):
        """(handle, base, size) of the allocation behind ptr, None when it is not VMM memory.

        For VMM memory hipMemGetAddressRange answers with the one mapped allocation holding ptr,
        not the whole reservation.
        """
        try:
            handle = _check("hipMemRetainAllocationHandle", hip.hipMemRetainAllocationHandle(ptr))
        except DriverError as e:
            if e.code == hip.hipError_t.hipErrorInvalidValue.name:  # plain hipMalloc memory
                return None
            raise
        try:
            base, size = _check("hipMemGetAddressRange", hip.hipMemGetAddressRange(ptr))
        except BaseException:
            self.release(handle)
            raise
        return handle, _addr(base), int(size)

    def ipc_export(self, ptr: int, size: int) -> IpcHandle:
        base, _ = _check("hipMemGetAddressRange", hip.hipMemGetAddressRange(ptr))
        handle = _check("hipIpcGetMemHandle", hip.hipIpcGetMemHandle(base))
        return IpcHandle(ctypes.string_at(int(handle), _IPC_HANDLE_SIZE), ptr - _addr(base), size)

    def ipc_open(self, handle: IpcHandle) -> int:
        raw = bytearray(handle.data)  # hip-python reads a hipIpcMemHandle_st from any 64-byte buffer
        base = _addr(_check("hipIpcOpenMemHandle", hip.hipIpcOpenMemHandle(raw, hip.hipIpcMemLazyEnablePeerAccess)))
        ptr = base + handle.offset
        self._ipc.setdefault(ptr, []).append(base)
        return ptr

    def ipc_close(self, ptr: int, size: int) -> None:
        bases = self._ipc.get(ptr)
        if not bases:
            raise ValueError(f"ipc_close({ptr:#x}): that pointer did not come from ipc_open on this driver")
        _check("hipIpcCloseMemHandle", hip.hipIpcCloseMemHandle(bases[-1]))
        bases.pop()
        if not bases:
            del self._ipc[ptr]

    # -- stream-ordered words ----------------------------------------------
    def stream_write(self, stream: int, address: int, value: int) -> None:
        """Write value to the 8 bytes at address once the stream's earlier work has finished."""
        _check("hipStreamWriteValue64", hip.hipStreamWriteValue64(stream, address, value, 0))

    def stream_waiter(self, addresses: Sequence[int]):
        """A function (stream, value) that holds the stream's later work until the 8 bytes at each
        address (local or a peer's mapping) are >= value: one hipStreamWaitValue64 per address."""
        addresses = list(addresses)

        def wait(stream: int, value: int) -> None:
            for address in addresses:
                _check("hipStreamWaitValue64", hip.hipStreamWaitValue64(stream, address, value, _GTE, _ALL_BITS))
        return wait

    def relax_capture(self) -> None:
        """Let the calling thread use the runtime while another thread captures a graph in global mode."""
        _check("hipThreadExchangeStreamCaptureMode",
               hip.hipThreadExchangeStreamCaptureMode(hip.hipStreamCaptureMode.hipStreamCaptureModeRelaxed))

    def capture_id(self, stream: int) -> int:
        """The id of the graph capture the stream is part of now (unique in the process), 0 if none."""
        status, ident = _check("hipStreamGetCaptureInfo", hip.hipStreamGetCaptureInfo(stream))
        return int(ident) if status == hip.hipStreamCaptureStatus.hipStreamCaptureStatusActive else 0
