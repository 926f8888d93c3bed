"""PyTorch symmetric memory as an allocation provider for iris device kernels.

What matters:
- The rendezvous handle's buffer_ptrs is the table iris translates against, its own entry the
  tensor's data_ptr(): the provider reads it per allocation and checks it (length, own entry),
  computing nothing. Each table serves only its own allocation.
- It never calls symm_mem.set_backend: the backend is the caller's choice (torch's default otherwise).
- allocate_symmetric* rendezvous, which is collective: all ranks, same order, same sizes. torch
  frees the memory when the last tensor over it goes; free only forgets the handle.
"""
from __future__ import annotations

import torch

from ..errors import ProviderUnavailable
from .symmetric_memory import SymmetricAddressMap, address_map

__all__ = ["TorchSymmMemProvider", "SymmetricAddressMap"]


def _modules():
    try:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:
        raise ProviderUnavailable(f"TorchSymmMemProvider needs a CUDA build of torch with torch.distributed ({e})") from e
    return dist, symm_mem


class TorchSymmMemProvider:
    """Allocates torch symmetric tensors and describes them for iris kernels (Iris's provider surface).
    torch.distributed must be initialised first: rendezvous runs over its group."""

    def __init__(self, group=None, device=None):
        dist, self._symm_mem = _modules()
        if not dist.is_initialized():
            raise ProviderUnavailable("initialise torch.distributed (dist.init_process_group) before building "
                                      "TorchSymmMemProvider: every allocation rendezvous over its group")
        self._dist = dist
        self._group = group if group is not None else dist.group.WORLD
        self.cur_rank = dist.get_rank(self._group)
        self.num_ranks = dist.get_world_size(self._group)
        self._device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        self._handles = {}  # storage address -> (rendezvous handle, SymmetricAddressMap)

    def allocate_symmetric(self, *size, dtype=None):
        """(tensor, peer_bases), as Iris.allocate_symmetric. Collective: all ranks, same order, same sizes."""
        t, amap = self.allocate_symmetric_map(*size, dtype=dtype)
        return t, amap.direct_table()

    def allocate_symmetric_map(self, *size, dtype=None):
        """(tensor, SymmetricAddressMap) over symm_mem.empty + rendezvous. Collective: all ranks, same
        order, same sizes."""
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)
        with torch.inference_mode(False), torch.no_grad():  # a tensor made under inference_mode could not be written later
            t = self._symm_mem.empty(*shape, dtype=dtype or torch.get_default_dtype(), device=self._device)
        handle = self._symm_mem.rendezvous(t, group=self._group)
        amap = address_map([int(p) for p in handle.buffer_ptrs], self.cur_rank, self.num_ranks, t.data_ptr(),
                           t.numel() * t.element_size(), t.device)
        self._handles[t.untyped_storage().data_ptr()] = (handle, amap)
        return t, amap

    def symmetric_address_map(self, tensor: torch.Tensor) -> SymmetricAddressMap:
        """The map of the allocation tensor is a view of (its storage's); KeyError for a tensor this
        provider did not allocate. Never rendezvous again here: that is collective."""
        got = self._handles.get(tensor.untyped_storage().data_ptr())
        if got is None:
            raise KeyError("the tensor was not allocated by this provider: allocate it with allocate_symmetric "
                           "(rendezvous cannot be repeated here, it is collective)")
        return got[1]

    def free(self, tensor: torch.Tensor) -> None:
        """Forget tensor's handle; torch frees the memory when its last tensor goes."""
        self._handles.pop(tensor.untyped_storage().data_ptr(), None)

    def barrier(self) -> None:
        """Collective: all ranks."""
        torch.cuda.synchronize(self._device)
        self._dist.barrier(self._group)

    def get_rank(self) -> int:
        return self.cur_rank

    def get_num_ranks(self) -> int:
        return self.num_ranks
