"""Reads planned byte ranges into tensors, fast: several reader threads (preadv releases the GIL),
each streaming its own contiguous share of the plan so the kernel's readahead sees sequential
reads. On the host the bytes go straight into the destination's memory. On a GPU they go into
pinned staging buffers reused in a ring, and each filled buffer is copied to the device on a
side stream while the readers fill the next ones; an event per buffer says when it is free again.
"""
from __future__ import annotations

import ctypes
import os
import queue
import threading
from typing import Dict, List, Sequence

import numpy as np
import torch

from ..errors import ReadError
from .read_plan import Read


def _memory(ptr: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")


def _pread(fd: int, path: str, buf: memoryview, offset: int) -> None:
    """Fill buf from the file at offset (preadv may return less than asked)."""
    while len(buf):
        got = os.preadv(fd, [buf], offset)
        if got == 0:
            raise ReadError(f"{path}: end of file at byte {offset}, but its header promised more bytes; "
                            "the file was truncated while loading")
        buf, offset = buf[got:], offset + got


def _read(fds: Dict[int, int], files: Sequence[str], read: Read, ptr: int, scratch: memoryview) -> None:
    """The read's kept bytes to ptr, one run after another: straight there when they are one
    range, else through scratch and a strided copy (one syscall however many runs)."""
    fd = fds.get(read.file)
    if fd is None:
        fd = fds[read.file] = os.open(files[read.file], os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # each reader streams its share: read ahead more
    if read.contiguous:
        return _pread(fd, files[read.file], _memory(ptr, read.kept), read.offset)
    _pread(fd, files[read.file], scratch[:read.nbytes], read.offset)
    # numpy: one thread, no intra-op thread pool fighting the other readers
    src = np.lib.stride_tricks.as_strided(np.frombuffer(scratch, np.uint8, read.nbytes), (read.count, read.run),
                                          (read.stride, 1))
    np.copyto(np.frombuffer(_memory(ptr, read.kept), np.uint8).reshape(read.count, read.run), src)


def _shares(reads: List[Read], k: int) -> List[List[Read]]:
    """k contiguous parts of the plan with about the same bytes each."""
    total = sum(r.nbytes for r in reads) or 1
    parts, acc = [[] for _ in range(k)], 0
    for r in reads:
        parts[min(k - 1, acc * k // total)].append(r)
        acc += r.nbytes
    return [p for p in parts if p]


def _run_readers(files, reads, readers: int, step) -> None:
    """Run step(fds, read, scratch) over the plan on `readers` threads; the first error stops all
    and is raised here."""
    parts = _shares(reads, readers)
    scratch_len = max((r.nbytes for r in reads if not r.contiguous), default=0)
    errors: List[BaseException] = []
    stop = threading.Event()

    def worker(part):
        fds, scratch = {}, memoryview(bytearray(scratch_len))
        try:
            for read in part:
                if stop.is_set():
                    return
                step(fds, read, scratch)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            errors.append(e)
            stop.set()
        finally:
            for fd in fds.values():
                os.close(fd)

    threads = [threading.Thread(target=worker, args=(p,), daemon=True) for p in parts[1:]]
    for t in threads:
        t.start()
    worker(parts[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def read_into(files: Sequence[str], reads: List[Read], dsts: List[torch.Tensor], readers: int,
              chunk: int, slots: int) -> dict:
    """Fill dsts (contiguous uint8 views of the destination tensors) from the plan; returns stats:
    bytes read and kept, reads, pinned staging bytes at peak."""
    stats = {"bytes_read": sum(r.nbytes for r in reads), "bytes_kept": sum(r.kept for r in reads),
             "reads": len(reads), "readers": 0, "pinned_bytes": 0}
    if not reads:
        return stats
    readers = max(1, min(readers, len(reads)))
    stats["readers"] = readers
    if dsts[0].device.type == "cpu":
        _run_readers(files, reads, readers,
                     lambda fds, r, scratch: _read(fds, files, r, dsts[r.dst].data_ptr() + r.dst_offset, scratch))
        return stats
    _staged(files, reads, dsts, readers, min(chunk, max(r.kept for r in reads)), max(slots, readers), stats)
    return stats


def _staged(files, reads, dsts, readers: int, chunk: int, slots: int, stats: dict) -> None:
    """GPU destinations: readers fill pinned slots, this thread issues each slot's copy on a side
    stream and hands the slot back; a reader waits on the slot's event before refilling it."""
    device = dsts[0].device
    ring = queue.Queue()
    for _ in range(min(slots, len(reads))):
        ring.put((torch.empty(chunk, dtype=torch.uint8, pin_memory=True), torch.cuda.Event()))
    stats["pinned_bytes"] = ring.qsize() * chunk
    filled = queue.Queue()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))

    bound = threading.local()

    def step(fds, read, scratch):
        if not getattr(bound, "device", False):  # events and pinned memory of this rank's device
            torch.cuda.set_device(device)
            bound.device = True
        buf, event = ring.get()
        if buf is None:  # the loader stopped
            raise ReadError("stopped")
        event.synchronize()  # the copy out of this buffer is done
        _read(fds, files, read, buf.data_ptr(), scratch)
        filled.put((read, buf, event))

    failure: List[BaseException] = []

    def feed():
        try:
            _run_readers(files, reads, readers, step)
        except BaseException as e:  # noqa: BLE001
            failure.append(e)
        finally:
            filled.put(None)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    copied = 0
    try:
        with torch.cuda.stream(side):
            while copied < len(reads):
                item = filled.get()
                if item is None:
                    break
                read, buf, event = item
                dsts[read.dst][read.dst_offset:read.dst_offset + read.kept].copy_(buf[:read.kept], non_blocking=True)
                event.record(side)
                ring.put((buf, event))
                copied += 1
    finally:
        if copied < len(reads):  # a reader failed: wake any reader waiting for a slot
            for _ in range(readers):
                ring.put((None, None))
        feeder.join()
        side.synchronize()
    if failure:
        raise failure[0]
