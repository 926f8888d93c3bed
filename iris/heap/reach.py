"""Which peers a heap reaches by load and store (direct) and which through NVSHMEM (indirect).

A peer is indirect where its provider maps no copy of it here (nvshmem_ptr is 0: another node),
or where IRIS_INDIRECT_PEERS names it: "all", or ranks such as "1,3" (each rank treats the named
ranks other than itself as indirect). The setting runs NVSHMEM's path on peers that loads and
stores could reach, so that one host tests it; only allocator='nvshmem' can reach indirect peers.
"""
from __future__ import annotations

import torch

from .. import settings
from ..errors import SettingError


def forced(world: int, setting: str | None = None) -> frozenset:
    """The ranks IRIS_INDIRECT_PEERS (or setting, text as the variable would hold) names; a clear
    error for anything else."""
    peers = settings.INDIRECT_PEERS
    ranks = peers.get() if setting is None else peers.value_of(setting)
    if ranks == "all":
        return frozenset(range(world))
    if not all(0 <= r < world for r in ranks):
        raise SettingError(f"{peers.name}={','.join(map(str, sorted(ranks)))!r}: use 'all', 'none' or ranks in "
                           f"[0, {world}) separated by commas, e.g. '1,3'")
    return ranks


def narrow(bases: dict, rank: int, world: int) -> dict:
    """peer -> base with the peers IRIS_INDIRECT_PEERS names set to 0 (indirect)."""
    names = forced(world)
    return {p: (0 if p in names and p != rank else b) for p, b in bases.items()}


def use_device_api(bases, device) -> None:
    """Kernels compiled from now on carry NVSHMEM's device calls, where a peer is indirect (its entry in
    bases is 0) or an earlier heap of this process already had one (compiled kernels keep them)."""
    from ..device import indirect, nvshmem
    if 0 in bases or indirect.INDIRECT_PEERS:
        major, minor = torch.cuda.get_device_capability(device)
        nvshmem.enable(10 * major + minor)
        indirect.use_indirect_peers()
