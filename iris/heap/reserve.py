"""The reserve: iris's own block of the heap, beyond heap_size, carved into the flags its kernels
synchronise on, at the same offsets on every rank.

What matters:
- It is the heap's first allocation, so no scope() or free can take it, and it is zeroed once at
  creation: every counter in it only grows, so nothing ever resets it.
- Its layout (the device barrier's flags; ccl's pairwise counters for group, rooted and point-to-point
  calls, the group spinlock's locks and the group rings' channel; where ccl moves data by puts, their
  counters and receive area) depends only on the world and on whether ccl uses puts, so every rank
  carves the same views.
- Whether ccl uses puts must be known before the heap exists (the receive area is part of the
  size): `puts_expected` guesses it, and the context grows the reserve inside heap_size where the
  guess was short.
"""
from __future__ import annotations

import torch

from .. import settings
from ..allocators.offsets import round_up
from ..errors import IrisError
from . import reach

ALIGN = 256
GROUP_PROGRAMS = 128  # most programs of a group collective: each has a counter per source rank
PUT_PROGRAMS = 4  # most programs of a put-based call that receives into the reserve (groups, rooted, p2p)
PUT_SLOT = 16 << 10  # bytes of that receive area per program, parity and source rank: what a round moves per peer
RING_PROGRAMS = 8  # most programs of a ring over a subset group: each has a slot of RING_SLOT bytes and a 0/1 flag
RING_SLOT = 16 << 10  # bytes a group ring's program hands to its successor at a time (an fp32 slice of 4096)


def size(world: int, puts: bool = False) -> int:
    """Bytes of the reserve for world ranks; puts: with ccl's put counters and receive area."""
    used = round_up(8 * (world + 1), ALIGN) + 8 * GROUP_PROGRAMS * world + ALIGN  # ALIGN: the progress counter
    used += 16 * GROUP_PROGRAMS + RING_PROGRAMS * (RING_SLOT + 8) + 2 * ALIGN  # group locks and ring channel
    if puts:
        used += 16 * GROUP_PROGRAMS * world + PUT_PROGRAMS * 2 * world * PUT_SLOT
    return round_up(used, 4096)  # whole pages: the user's part of a heap rounded up to chunks stays page-aligned


def puts_asked() -> bool:
    """IRIS_CCL_PUTS=1: ctx.ccl moves data by puts although every peer is direct (tests, benchmarks)."""
    return settings.CCL_PUTS.get()


def puts_expected(allocator, world: int, group) -> bool:
    """Whether ctx.ccl may move data by puts, guessed before the heap exists: asked for, or a provider
    that can have indirect peers, in a job whose ranks IRIS_INDIRECT_PEERS names or which spans hosts."""
    return puts_asked() or not getattr(allocator, "one_host", True) and (
        bool(reach.forced(world)) or len(group.ranks_by_host()) > 1)


class Reserve:
    """The reserve's views over block (a zeroed uint8 heap tensor of size(world, puts) bytes or more).

    barrier_flags: (world + 1) int64, the device barrier's. group_counters: (GROUP_PROGRAMS, world)
    int64, [p][s] counts the signals program p of rank s sent here (ccl's group, rooted and p2p
    kernels). group_locks: (GROUP_PROGRAMS, 2) int64, program p's ticket lock on this rank's out in
    the group spinlock ([p][0] tickets taken, [p][1] tickets served: both only grow). ring_slots and
    ring_flags: RING_PROGRAMS slots of RING_SLOT bytes and 0/1 flags, the channel that a group ring's
    program p fills in its successor (the flag returns to 0 when the successor has read the slot).
    With puts: put_counters (GROUP_PROGRAMS, 2, world) int64, [p][0][s] puts received from
    s, [p][1][s] puts s acknowledged; put_area, PUT_PROGRAMS * 2 * world * PUT_SLOT bytes that ccl's
    put kernel receives into. progress: one int64, the heap's count of frees this rank has passed
    (lifetime.py). puts: ccl moves data by puts (every rank decides the same); indirect:
    some rank of the job has an indirect peer (iris.ops refuses such a job)."""

    def __init__(self, block: torch.Tensor, world: int, puts: bool, indirect: bool):
        self.block, self.nbytes = block, block.numel()
        self.puts, self.indirect = puts, indirect
        self._used = 0
        self.parts = []  # (name, address, bytes, element size) of each part, for naming a flag in errors
        block.zero_()
        self.barrier_flags = self._carve(world + 1, torch.int64, "iris's device barrier flags")
        self.group_counters = self._carve(GROUP_PROGRAMS * world, torch.int64, "iris's ccl group counters").view(
            GROUP_PROGRAMS, world)
        self.group_locks = self._carve(2 * GROUP_PROGRAMS, torch.int64, "iris's ccl group locks").view(
            GROUP_PROGRAMS, 2)
        self.ring_slots = self._carve(RING_PROGRAMS * RING_SLOT, torch.uint8, "iris's ccl ring slots")
        self.ring_flags = self._carve(RING_PROGRAMS, torch.int64, "iris's ccl ring flags")
        self.put_counters = self.put_area = None
        if puts:
            self.put_counters = self._carve(2 * GROUP_PROGRAMS * world, torch.int64, "iris's ccl put counters").view(
                GROUP_PROGRAMS, 2, world)
            self.put_area = self._carve(PUT_PROGRAMS * 2 * world * PUT_SLOT, torch.uint8, "iris's ccl put area")
        # this rank's count of frees passed, in stream order (progress.py)
        self.progress = self._carve(1, torch.int64, "iris's heap progress counter")

    def _carve(self, count: int, dtype: torch.dtype, name: str) -> torch.Tensor:
        start = round_up(self._used, ALIGN)
        end = start + count * dtype.itemsize
        if end > self.nbytes:
            raise IrisError(f"iris's reserve of {self.nbytes} bytes is full ({start} used, {count * dtype.itemsize} "
                            "more asked): raise size() in iris/heap/reserve.py")
        self._used = end
        part = self.block[start:end].view(dtype)
        self.parts.append((name, part.data_ptr(), part.nbytes, dtype.itemsize))
        return part
