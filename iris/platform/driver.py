"""The Driver protocol: the VMM-shaped mechanism every platform offers, one call per method."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence, Tuple

from ..errors import DriverError


def reserve_failed(e: DriverError, size: int) -> DriverError:
    """e, saying what to do: a reservation fails for want of address space, not of memory."""
    return DriverError(e.call, e.code, f"{e.detail}; reserving {size} bytes of address space failed: every rank "
                       "reserves heap_size for its own heap and again for each peer's, so use a smaller heap_size "
                       "(or raise `ulimit -v`)", e.oom)


@dataclass(frozen=True)
class IpcHandle:
    """What a peer needs to open a plain (non-VMM) block: opaque bytes or an fd, and the offset into it."""

    data: bytes
    offset: int
    size: int
    fd: Optional[int] = None


class Driver(Protocol):
    """Mechanism only: each method is one driver call, checked, raising DriverError naming it.

    Handles are opaque to callers. export() returns a new fd the caller owns; import_() does
    not take ownership of the fd it is given. Every handle from create/import_/retain is
    released with release().
    """

    name: str        # "cuda" | "hip" | "host"
    torch_device: str  # "cuda" or "cpu": where torch sees this driver's memory

    def device_count(self) -> int: ...
    def set_device(self, index: int) -> None: ...
    def mem_info(self) -> Tuple[int, int]: ...      # (free, total) bytes of the current device
    def granularity(self) -> int: ...
    def reserve(self, size: int) -> int: ...
    def free_va(self, va: int, size: int) -> None: ...
    def create(self, size: int) -> Any: ...
    def release(self, handle: Any) -> None: ...
    def map(self, va: int, size: int, handle: Any, offset: int = 0) -> None: ...
    def unmap(self, va: int, size: int) -> None: ...
    def set_access(self, va: int, size: int, devices: Optional[Sequence[int]] = None) -> None: ...
    def export(self, handle: Any) -> int: ...
    def import_(self, fd: int) -> Any: ...
    def retain(self, ptr: int) -> Optional[Tuple[Any, int, int]]: ...
    def ipc_export(self, ptr: int, size: int) -> IpcHandle: ...
    def ipc_open(self, handle: IpcHandle) -> int: ...
    def ipc_close(self, ptr: int, size: int) -> None: ...
    # stream-ordered 64-bit words (the heap's progress counters); stream is a raw stream handle
    def stream_write(self, stream: int, address: int, value: int) -> None: ...
    # a function (stream, value) holding the stream's later work until every *address >= value (GPUs)
    def stream_waiter(self, addresses: Sequence[int]) -> Any: ...
    def relax_capture(self) -> None: ...  # this thread may call the driver while another captures a graph
    def capture_id(self, stream: int) -> int: ...  # the graph capture the raw stream is part of now, 0 if none
