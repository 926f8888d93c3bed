"""Host driver: memfd is the physical handle, mmap(MAP_FIXED) into a PROT_NONE reservation maps it.

Kernels over this memory run in the Triton interpreter. ctypes reaches libc's mmap because
Python's mmap module neither returns addresses nor takes MAP_FIXED.
"""
from __future__ import annotations

import ctypes
import errno
import os
import time
from typing import Optional, Sequence

from ..errors import DriverError
from .driver import IpcHandle, reserve_failed

PROT_NONE, PROT_RW = 0, 0x1 | 0x2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _fail(call: str) -> DriverError:
    code = ctypes.get_errno()
    return DriverError(call, errno.errorcode.get(code, code), os.strerror(code), oom=code in (errno.ENOMEM, errno.ENOSPC))


def _mmap(call: str, va: int, size: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    out = _libc.mmap(va or None, size, prot, flags, fd, offset)
    if out in (None, _MAP_FAILED):
        raise _fail(call)
    return out


def _mapping_of(ptr: int):
    """(start, end, file offset, maps range) of the shared file mapping that holds ptr, else None."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= ptr < hi:
                shared_file = parts[1][3] == "s" and parts[4] != "0"
                return (lo, hi, int(parts[2], 16), parts[0]) if shared_file else None
    return None


class HostDriver:
    """CPU memory through memfd_create + mmap; the memfd itself is the shareable handle."""

    name = "host"
    torch_device = "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, index: int) -> None:
        pass

    def mem_info(self):
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":")
                info[key] = int(value.split()[0]) * 1024
        return info["MemAvailable"], info["MemTotal"]

    def granularity(self) -> int:
        return os.sysconf("SC_PAGE_SIZE")

    def reserve(self, size: int) -> int:
        try:
            return _mmap("mmap(PROT_NONE reserve)", 0, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
        except DriverError as e:
            raise reserve_failed(e, size) from None

    def free_va(self, va: int, size: int) -> None:
        if _libc.munmap(va, size) != 0:
            raise _fail("munmap")

    def create(self, size: int) -> int:
        fd = os.memfd_create("iris", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)  # commit now, as cuMemCreate does, so OOM surfaces here
        except OSError as e:
            os.close(fd)
            raise DriverError("memfd_create/fallocate", errno.errorcode.get(e.errno, e.errno), f"{size} bytes: {e.strerror}",
                              oom=e.errno in (errno.ENOMEM, errno.ENOSPC)) from None
        return fd

    def create_sparse(self, size: int) -> int:
        """A memfd of size bytes that commits pages only as they are first touched (the torch
        allocator's block: a host heap takes only the memory its tensors use)."""
        fd = os.memfd_create("iris", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
        except OSError as e:
            os.close(fd)
            raise DriverError("memfd_create/ftruncate", errno.errorcode.get(e.errno, e.errno), f"{size} bytes: {e.strerror}",
                              oom=e.errno in (errno.ENOMEM, errno.ENOSPC, errno.EFBIG)) from None
        return fd

    def release(self, handle: int) -> None:
        os.close(handle)

    def map(self, va: int, size: int, handle: int, offset: int = 0) -> None:
        _mmap("mmap(MAP_FIXED|MAP_SHARED)", va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, handle, offset)

    def unmap(self, va: int, size: int) -> None:
        # Put the reservation back rather than punch a hole another mmap could land in.
        _mmap("mmap(MAP_FIXED unmap)", va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE)

    def set_access(self, va: int, size: int, devices: Optional[Sequence[int]] = None) -> None:
        if _libc.mprotect(va, size, PROT_RW) != 0:
            raise _fail("mprotect")

    def export(self, handle: int) -> int:
        return os.dup(handle)

    def import_(self, fd: int) -> int:
        return os.dup(fd)

    def retain(self, ptr: int):
        """The memfd (or shm file) behind a shared mapping, through /proc/self/map_files."""
        found = _mapping_of(ptr)
        if found is None:
            return None
        lo, _, file_offset, span = found
        try:
            fd = os.open(f"/proc/self/map_files/{span}", os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise DriverError("open(/proc/self/map_files)", errno.errorcode.get(e.errno, e.errno),
                              f"{e.strerror}; retaining shared host memory needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE") from None
        return fd, lo - file_offset, os.fstat(fd).st_size

    def ipc_export(self, ptr: int, size: int) -> IpcHandle:
        found = self.retain(ptr)
        if found is None:
            raise DriverError("ipc_export", "EINVAL", f"{ptr:#x} is not shared memory; allocate it with share_memory_()")
        fd, base, _ = found
        return IpcHandle(b"", ptr - base, size, fd)

    def ipc_open(self, handle: IpcHandle) -> int:
        page = self.granularity()
        lead = handle.offset % page
        va = _mmap("mmap(ipc_open)", 0, lead + handle.size, PROT_RW, MAP_SHARED, handle.fd, handle.offset - lead)
        return va + lead

    def ipc_close(self, ptr: int, size: int) -> None:
        page = self.granularity()
        lead = ptr % page
        self.free_va(ptr - lead, lead + size)

    # -- stream-ordered words: the host runs work synchronously, so "in stream order" is now --------
    def stream_write(self, stream: int, address: int, value: int) -> None:
        """Store value at address now: every kernel this process queued before has already run."""
        ctypes.c_int64.from_address(address).value = value

    def stream_wait(self, stream: int, address: int, value: int, timeout: float = None) -> None:
        """Return once the 8 bytes at address (a peer process may write them) are >= value; raise
        DriverError(ETIMEDOUT) after timeout seconds (None: no limit)."""
        word, start = ctypes.c_int64.from_address(address), time.monotonic()
        deadline = None if timeout is None else start + timeout
        while word.value < value:
            now = time.monotonic()
            if now - start < 2e-3:  # the writer is usually a step away: give it the core, do not sleep past it
                os.sched_yield()
            else:
                time.sleep(1e-4)
                if deadline is not None and now > deadline:
                    raise DriverError("stream_wait", "ETIMEDOUT", f"the word at {address:#x} is {word.value}, "
                                      f"below {value}, after {timeout} s")

    def relax_capture(self) -> None:
        """Nothing to relax: the host captures no graphs."""

    def capture_id(self, stream: int) -> int:
        """No stream is ever captured on the host."""
        return 0
