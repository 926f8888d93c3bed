"""NVSHMEM through nvshmem4py: loading it, initialising it once per process, and the host calls iris makes.

What matters:
- NVSHMEM is initialised once per process: by the caller (any method nvshmem4py offers), or by
  `ensure_init` with a unique id that rank 0 makes and the job's own bootstrap hands to every rank.
- Several PEs on one GPU run in NVSHMEM's limited multi-process-per-GPU mode: put, get, atomics,
  nvshmem_ptr and barrier_all work, while team operations and NVSHMEM's collectives exit the
  process. iris calls none of those; neither should a program running that way.
- malloc and free are collective (NVSHMEM's free starts with a barrier): all ranks, same order,
  same sizes. nvshmem_ptr is local: the address of a peer's copy here, or 0 where the peer is not
  reachable by load and store (another node).
"""
from __future__ import annotations

import os
from typing import Callable, Optional

from ..errors import DriverError, HeapOutOfMemory, ProviderUnavailable, pip_install

EXTRA = pip_install("nvshmem")
_UP = ("STATUS_IS_INITIALIZED", "STATUS_LIMITED_MPG", "STATUS_FULL_MPG")


def load():
    """(nvshmem.core, nvshmem.bindings) with NVSHMEM's host library loaded, or ProviderUnavailable."""
    try:
        import nvshmem.bindings as bindings
        import nvshmem.core as core
        core.get_version()  # loads libnvshmem_host (from nvidia-nvshmem-cu13, which CUDA builds of torch install)
    except (ImportError, OSError, RuntimeError) as e:
        raise ProviderUnavailable(f"NVSHMEM is not usable here: {type(e).__name__}: {e}. Install nvshmem4py and "
                                  f"cuda-core with {EXTRA} (NVSHMEM's library comes with CUDA builds of torch)") from e
    return core, bindings


def status() -> str:
    """Name of NVSHMEM's initialisation state in this process (NVSHMEM's own enum names)."""
    _, b = load()
    return b.Init_status(b.init_status()).name


def initialized() -> bool:
    """Whether NVSHMEM is initialised in this process (by anyone)."""
    return status() in _UP


def ensure_init(share: Callable[[Optional[bytes]], bytes], rank: int, world: int, device_index: int,
                heap_bytes: int = 0) -> None:
    """Initialise NVSHMEM for this job unless the caller already did; either way check that its PE
    numbering is the job's. share(bytes on rank 0, None elsewhere) returns rank 0's bytes on every
    rank (the job's bootstrap: an iris group, torch.distributed, MPI). Collective: all ranks."""
    core, b = load()
    if not initialized():
        import numpy as np
        from cuda.core import Device
        if heap_bytes:  # NVSHMEM reserves its heap at init; room for iris's piece and NVSHMEM's own use
            os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(heap_bytes + (256 << 20)))
        uid = core.get_unique_id(empty=rank != 0)
        raw = share(uid._data.view(np.int8).tobytes() if rank == 0 else None)
        if rank != 0:
            uid._data.view(np.int8)[:] = np.frombuffer(raw, dtype=np.int8)
        device = Device(device_index)
        device.set_current()
        core.init(device=device, uid=uid, rank=rank, nranks=world, initializer_method="uid")
    pe, pes = b.my_pe(), b.n_pes()
    if (pe, pes) != (rank, world):
        raise ProviderUnavailable(f"NVSHMEM runs as PE {pe} of {pes}, but this is rank {rank} of {world}: initialise "
                                  "NVSHMEM over the same job, with PE numbers equal to the ranks")


def malloc(nbytes: int) -> int:
    """nvshmem_malloc: nbytes of NVSHMEM's symmetric heap. Collective: all ranks, same order, same sizes."""
    _, b = load()
    ptr = b.malloc(nbytes)
    if not ptr:
        raise HeapOutOfMemory(nbytes, 0, nbytes, "NVSHMEM's symmetric heap has no room: set NVSHMEM_SYMMETRIC_SIZE "
                                                 "larger before NVSHMEM is initialised, or ask for less")
    return ptr


def free(ptr: int) -> None:
    """nvshmem_free. Collective: all ranks, same order."""
    load()[1].free(ptr)


def peer_ptr(ptr: int, pe: int) -> int:
    """nvshmem_ptr: where pe's copy of ptr is mapped in this process; 0 if pe is not reachable by load and store."""
    return load()[1].ptr(ptr, pe)


def barrier_all() -> None:
    """nvshmem_barrier_all: every PE arrives and NVSHMEM's earlier operations complete. Collective: all ranks."""
    load()[1].barrier_all()


def check_peer(ptr: int, pe: int, me: int) -> int:
    """peer_ptr, checked where its answer is known: a PE's own entry must be ptr."""
    got = peer_ptr(ptr, pe)
    if pe == me and got != ptr:
        raise DriverError("nvshmem_ptr", got, f"own copy of {ptr:#x} reported at {got:#x}")
    return got


def describe() -> str:
    """One line for `iris info`: whether NVSHMEM can be used on this machine, and which versions."""
    import torch
    if not torch.cuda.is_available():
        return "unusable: no CUDA GPU here (allocator='nvshmem' needs one)"
    try:
        core, _ = load()
    except ProviderUnavailable as e:
        return f"unusable: {e}"
    v = core.get_version()
    return f"usable: nvshmem4py {v.nvshmem4py_version}, libnvshmem {v.libnvshmem_version} (allocator='nvshmem')"
