"""NVSHMEM as an allocation provider for iris device kernels: each allocation is one nvshmem_malloc.

What matters:
- NVSHMEM is initialised by the caller, or here with a unique id passed through the job's own
  bootstrap (an iris group, torch.distributed, or MPI); its PE numbers must be the ranks.
- Each allocation's table comes from nvshmem_ptr: entry r is rank r's copy as mapped here, the own
  entry the allocation's base, and 0 for a rank reachable only through NVSHMEM's device API.
- allocate_symmetric* and free are collective where NVSHMEM's malloc and free are: all ranks, same
  order, same sizes. A tensor that is dropped without free keeps its memory until NVSHMEM finalizes.
- Several ranks on one GPU: put, get, atomics and barrier_all work; team operations and NVSHMEM's
  collectives exit the process there, so the provider offers none of them.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from typing import Optional

import torch

from ..heap.views import tensor_at
from ..platform import nvshmem as runtime
from .symmetric_memory import SymmetricAddressMap, address_map

__all__ = ["NvshmemProvider", "SymmetricAddressMap"]


def _shape(size) -> tuple:
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)


def _share_through(bootstrap):
    """share(raw) over the job's bootstrap: rank 0's bytes on every rank."""
    if hasattr(bootstrap, "allgather"):  # an iris group
        return lambda raw: bootstrap.allgather(raw, "nvshmem unique id")[0]
    if bootstrap == "torch":
        import torch.distributed as dist

        def share(raw):
            box = [raw]
            dist.broadcast_object_list(box, src=0)
            return box[0]
        return share
    if bootstrap == "mpi":
        from mpi4py import MPI
        return lambda raw: MPI.COMM_WORLD.bcast(raw, root=0)
    raise ValueError(f"bootstrap must be an iris group, 'torch' or 'mpi', got {bootstrap!r}")


class NvshmemProvider:
    """Allocates NVSHMEM symmetric tensors and describes them for iris kernels (Iris's provider surface).

    bootstrap (used only when NVSHMEM is not initialised yet): None for iris's own rendezvous (its
    launcher, torch.distributed or MPI, as iris.iris() finds them), or 'torch', 'mpi' or an iris
    group. Creating the provider is collective when it initialises NVSHMEM: all ranks."""

    def __init__(self, device=None, bootstrap=None):
        index = torch.device(device).index if device is not None else None
        self._device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
        torch.cuda.set_device(self._device)
        if not runtime.initialized():
            group = None
            if bootstrap is None:  # iris's rendezvous: its launcher, torch.distributed or MPI, as iris.iris() finds them
                from .. import distributed
                bootstrap = group = distributed.connect()
            rank, world = self._job(bootstrap)
            try:
                runtime.ensure_init(_share_through(bootstrap), rank, world, self._device.index)
            finally:
                if group is not None:
                    group.close()
        _, b = runtime.load()
        self.cur_rank, self.num_ranks = b.my_pe(), b.n_pes()
        self._allocations = {}  # base -> (nbytes, SymmetricAddressMap)
        self._bases = []  # their bases, sorted: a view is found by bisection

    @staticmethod
    def _job(bootstrap):
        if hasattr(bootstrap, "allgather"):
            return bootstrap.rank, bootstrap.world
        if bootstrap == "torch":
            import torch.distributed as dist
            return dist.get_rank(), dist.get_world_size()
        if bootstrap == "mpi":
            from mpi4py import MPI
            return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        raise ValueError(f"bootstrap must be an iris group, 'torch' or 'mpi', got {bootstrap!r}")

    def allocate_symmetric(self, *size, dtype=None):
        """(tensor, peer_bases), as Iris.allocate_symmetric; raises if a peer is reachable only
        through NVSHMEM's device API. Collective: all ranks, same order, same sizes."""
        t, amap = self.allocate_symmetric_map(*size, dtype=dtype)
        return t, amap.direct_table()

    def allocate_symmetric_map(self, *size, dtype=None):
        """(tensor, SymmetricAddressMap) over one nvshmem_malloc. Collective: all ranks, same order, same sizes."""
        shape, dtype = _shape(size), dtype or torch.get_default_dtype()
        nbytes = math.prod(shape) * dtype.itemsize
        base = runtime.malloc(max(nbytes, 1))
        bases = [runtime.check_peer(base, p, self.cur_rank) for p in range(self.num_ranks)]
        amap = address_map(bases, self.cur_rank, self.num_ranks, base, nbytes, self._device)
        self._allocations[base] = (nbytes, amap)
        self._bases.insert(bisect_right(self._bases, base), base)
        return tensor_at(base, torch.Size(shape), dtype, self._device), amap

    def _base_of(self, t: torch.Tensor) -> Optional[int]:
        address = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
        i = bisect_right(self._bases, address) - 1
        if i >= 0 and t.device == self._device:
            base = self._bases[i]
            if address < base + max(self._allocations[base][0], 1):
                return base
        return None

    def symmetric_address_map(self, tensor: torch.Tensor) -> SymmetricAddressMap:
        """The map of the allocation tensor lies in (a view maps to its whole allocation); KeyError
        for a tensor this provider did not allocate, or freed."""
        base = self._base_of(tensor)
        if base is None:
            raise KeyError("the tensor was not allocated by this provider (or was freed): allocate it with "
                           "allocate_symmetric")
        return self._allocations[base][1]

    def free(self, tensor: torch.Tensor) -> None:
        """nvshmem_free of tensor's allocation; tensors over it must not be used after. Collective:
        all ranks, same order."""
        base = self._base_of(tensor)
        if base is None:
            raise KeyError("free: the tensor was not allocated by this provider, or was freed already")
        torch.cuda.synchronize(self._device)  # no kernel of this rank still uses it
        del self._allocations[base]
        self._bases.remove(base)
        runtime.free(base)

    def barrier(self) -> None:
        """Waits for this rank's device work, then nvshmem_barrier_all. Collective: all ranks."""
        torch.cuda.synchronize(self._device)
        runtime.barrier_all()

    def get_rank(self) -> int:
        return self.cur_rank

    def get_num_ranks(self) -> int:
        return self.num_ranks
