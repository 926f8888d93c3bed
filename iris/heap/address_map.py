"""SymmetricAddressMap: one allocation's peer-base table, checked, for any provider.

What matters:
- A kernel reaches rank r's copy of a pointer p as `peer_bases[r] + (p - peer_bases[me])`, so the
  table's own entry must be this allocation's base: `address_map` raises otherwise, and for a table
  shorter than the job (a kernel indexes it by rank and would read past its end).
- Entry 0 means the peer is indirect (another node: reachable through NVSHMEM's device API, not
  by load and store). `direct_table` refuses such a table: translating through 0 writes anywhere.
- Imports only torch (and iris's own error tree and table layout), so no provider drags in another's
  dependency (providers import it as iris.experimental.symmetric_memory). The table is laid out as
  heap_bases is, so IRIS_DEBUG=1 checks that every pointer a device function translates lies inside
  this allocation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from ..errors import AddressMapError


@dataclass(frozen=True)
class SymmetricAddressMap:
    """Address metadata of one symmetric allocation (Iris's names). peer_bases: int64[num_ranks] on
    the allocation's device; direct[r]: whether rank r's copy is reachable by load and store."""

    peer_bases: torch.Tensor
    local_rank: int
    allocation_base: int
    allocation_bytes: int
    direct: Tuple[bool, ...]

    def all_direct(self) -> bool:
        return all(self.direct)

    def indirect_peers(self) -> list:
        return [r for r, d in enumerate(self.direct) if not d]

    def direct_table(self) -> torch.Tensor:
        """peer_bases, for kernels that translate by load and store; raises if any peer is indirect."""
        indirect = self.indirect_peers()
        if indirect:
            raise AddressMapError(
                f"ranks {indirect} are not reachable by load and store from rank {self.local_rank} (their "
                "peer_bases entry is 0): a kernel translating through this table would write through a wild "
                "pointer. Use allocate_symmetric_map and reach those ranks through NVSHMEM's device API, or run "
                "the job within one NVLink domain")
        return self.peer_bases


def address_map(bases: Sequence[int], rank: int, world: int, base: int, nbytes: int, device,
                direct: Optional[Sequence[bool]] = None, table=None) -> SymmetricAddressMap:
    """The map of the allocation [base, base + nbytes) on this rank, from bases (entry r: where rank
    r's copy is mapped here, 0 where it is not). direct defaults to `entry != 0`; a peer said to be
    direct with entry 0 raises. Checked before any kernel can use the table. table(bases, nbytes): the
    heap's table maker (its fault record and spin limit in the hidden entries); None: no record."""
    bases = [int(b) for b in bases]
    if len(bases) != world:
        raise AddressMapError(f"the peer-base table has {len(bases)} entries for a job of {world} ranks: a kernel "
                              "indexing it by rank would read past its end. Build it from every rank's base")
    if not 0 <= rank < world:
        raise AddressMapError(f"local rank {rank} is not in [0, {world})")
    if bases[rank] != base:
        raise AddressMapError(f"peer_bases[{rank}] = {bases[rank]:#x} is not this allocation's base {base:#x}: "
                              "every remote address a kernel computes from it would be off by their difference. "
                              "Describe the allocation itself, not a view or another allocation")
    direct = tuple(b != 0 for b in bases) if direct is None else tuple(bool(d) for d in direct)
    if len(direct) != world:
        raise AddressMapError(f"direct has {len(direct)} entries for a job of {world} ranks")
    wild = [r for r in range(world) if direct[r] and bases[r] == 0]
    if wild:
        raise AddressMapError(f"ranks {wild} are marked direct but their peer_bases entry is 0: a kernel would "
                              "write through a null pointer. Mark them indirect (direct=False)")
    from ..device.translate import bases_tensor  # iris's own layout: IRIS_DEBUG checks pointers against it
    peer_bases = bases_tensor(bases, int(nbytes), rank, device) if table is None else table(bases, int(nbytes))
    return SymmetricAddressMap(peer_bases, rank, base, int(nbytes), direct)
