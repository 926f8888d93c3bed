"""SymmetricHeap: one allocator's memory, a view of every peer's, and heap_bases for kernels."""
from __future__ import annotations

import math
from contextlib import ExitStack
from functools import cached_property
from weakref import ref

import torch

from .. import settings
from ..errors import BootstrapError, CaptureError, HeapOutOfMemory, SymmetryError
from ..allocators.vmem import always
from ..device.faults import new_record, raise_noted
from ..device.translate import HIDDEN, bases_table
from .address_map import SymmetricAddressMap, address_map
from .as_symmetric import AsSymmetric
from .factories import Factories
from .imports import Imports
from .lifetime import Block, FreedTensor, Lifetimes, Owner
from .peers import PeerMaps
from .symmetry import SymmetryCheck, mode_from_env
from .views import tensor_at, tensor_maker


def _not_capturing() -> bool:
    """Whether new memory may be mapped now: not during CUDA graph capture. The allocator asks only
    when a request needs new segments, so the usual allocation skips the query."""
    return not torch.cuda.is_current_stream_capturing()


class SymmetricHeap(Lifetimes):
    """Every rank's heap at one layout, each peer's mapped here. Creating it is collective."""

    def __init__(self, allocator, driver, group, device: torch.device):
        self.alloc, self.driver, self.group, self.device = allocator, driver, group, device
        self.rank, self.world, self.size = group.rank, group.world, allocator.size
        self.peers = [p for p in range(self.world) if p != self.rank]
        self.symmetry = SymmetryCheck(mode_from_env())
        self._record, self._guarded = self.symmetry.note, self.symmetry.mode == "full"
        self._stats = {"growths": 0, "exchanges": 0, "trims": 0, "collected": 0}  # stats adds the two hot counts
        self.imports = Imports(self, self._stats)  # memory mapped from elsewhere (as_symmetric)
        self._frees = 0
        self.peer_maps = PeerMaps(self, self._stats)  # each peer's memory mapped here
        self.closed = False
        self._init_lifetimes()
        self._copied_imports = {}  # none until as_symmetric is first used
        self._capturable = device.type == "cuda"
        self._device_index = device.index if self._capturable else -1  # as Tensor.get_device() says
        self._may_grow = _not_capturing if self._capturable else always  # no bound method per call
        self._view = tensor_maker(device, carrier=True)  # Owner has the slot
        self._reuse, self._release = allocator.reuse, allocator.free
        # the fault record every table of this heap points to, and the spin limit they carry (faults.py)
        self.faults, self.spin_limit = new_record(device), settings.SPIN_LIMIT.get()
        self.own_parts = []  # (name, address, bytes, element size) of iris's own flags here (reserve.py's parts)
        with ExitStack() as undo:
            self.peer_maps.open(undo)
            self.bases = [allocator.base if p == self.rank else self.peer_maps.va[p] for p in range(self.world)]
            self._base = allocator.base
            self.heap_bases = self.table(self.bases, self.size)
            self._peer_blocks = undo.pop_all()  # closing it unmaps a block heap's peers

    # -- allocation --------------------------------------------------------
    def allocate(self, num_elements: int, dtype: torch.dtype, alignment: int = 1024) -> torch.Tensor:
        """Iris's ctx.heap.allocate: a 1-D heap tensor of num_elements. Blocks start 256-byte aligned
        (what TMA and vector loads need); alignment is accepted for Iris's programs. Collective: all
        ranks, same order, same sizes."""
        if isinstance(num_elements, bool) or not isinstance(num_elements, int) or num_elements < 0:
            raise ValueError(f"allocate: num_elements must be an int >= 0, got {num_elements!r}")
        return self.new_tensor(torch.Size((num_elements,)), dtype)

    def new_tensor(self, shape, dtype: torch.dtype, nbytes=None) -> torch.Tensor:
        """A fresh heap tensor of shape and dtype (nbytes: its size, if known) over a new block: one
        allocation, one view. Collective: all ranks, same order, same sizes.

        Blocks are whole multiples of 256 bytes, so every free block starts aligned and the policy's
        first candidate always fits. The usual request takes a freed block of its exact size, which
        is backed memory on every rank: no exchange, and at most a stream wait on the peers' progress
        (none after a barrier), so it also works inside CUDA graph capture."""
        if nbytes is None:
            nbytes = math.prod(shape) * dtype.itemsize
        if self._guarded:  # closed, or IRIS_CHECK_SYMMETRY=full: one test on the usual path
            if self.closed:
                raise ValueError("the heap is closed (ctx.close() was called); create a new context to allocate")
            self.check_symmetry(f"allocate({nbytes}, 256)")
        size = ((nbytes or 1) + 255) & -256
        offset = self._reuse(size)
        if offset is None:
            if self._kept:  # the policy looks at its free blocks as a whole now: the kept tensors go
                self._drop_kept()
            offset = self._allocate(nbytes, size)
            fresh, kept = True, None
        else:
            fresh, kept = False, self._kept.pop(offset, None) if self._kept else None
        self._record(nbytes)  # the symmetry digest's record of allocate(nbytes, align=256)
        self._serial = serial = self._serial + 1
        if not serial & 1023:
            self.symmetry.bound()
        if kept is not None:
            block, t = kept[0], kept[1]
            if kept[3] is dtype and kept[2] == shape:  # the tensor ctx.free kept: the block's Owner is on it
                block.serial, block.freed = serial, False
                self._at[offset] = block
                if self._fence:
                    self._reused(offset, nbytes)
                if self._track is not None:
                    self._track(ref(t))
                return t
            del t, kept
            if block.tensors:  # the user still views the old tensor: trim must leave it mapped
                self._pinned[block.serial] = block
        self._at[offset] = block = Block(offset, nbytes, serial)
        if self._fence:  # made on every rank before the wait, so a ReuseTimeout leaves the ranks' heaps alike
            self._fresh(offset, nbytes) if fresh else self._reused(offset, nbytes)
        t = self._view(self._base + offset, shape, dtype, self.device, Owner(self, block), nbytes)
        if self._track is not None:
            self._track(ref(t))
        return t

    def _allocate(self, nbytes: int, size: int) -> int:
        """new_tensor's offset when no freed block of the size is cached: the policy, growing the heap
        if needed (never during CUDA graph capture: growth maps memory and exchanges it with peers),
        and garbage collection when the heap is full."""
        try:
            offset, new = self.alloc.allocate(size, 256, self._may_grow)
        except HeapOutOfMemory as e:
            if getattr(e, "during_growth", False):
                self.peer_maps.grow(nbytes, None, None, nbytes, None)  # peers grew; tell them this rank could not
                raise
            if not self.collect("allocate (heap full)"):  # every rank is full here too
                raise
            offset, new = self.alloc.allocate(size, 256, self._may_grow)
        if offset is None:
            raise CaptureError(f"allocating {nbytes} bytes needs the heap to grow, which cannot happen during CUDA "
                               "graph capture (growth maps new memory and exchanges it with the peers). Allocate "
                               "this tensor before capture, or reserve room first: before capturing, allocate and "
                               "free one tensor as large as everything the graph allocates.")
        if new:
            self.peer_maps.grow(nbytes, offset, new, nbytes, lambda: self.alloc.undo(offset, new))
        return offset

    def free(self, offset: int) -> int:
        """Give the block at offset back to the pool now; its next allocation waits in stream order for
        every rank's work queued before this free (see lifetime.py). Collective: all ranks, same order."""
        block = self._at.get(offset)
        if block is not None:
            return self.free_block(block)
        if not self.imports.is_adopted(offset):
            raise ValueError(f"free: no live allocation starts at heap offset {offset}: it was freed already "
                             "(by ctx.free, scope() or garbage collection), or the tensor does not start its block")
        self.imports.free(offset)  # an imported tensor: its region goes once no tensor covers it
        self._record(~offset)
        self._frees += 1
        return 0

    @property
    def stats(self) -> dict:
        """Counts of what the heap did (allocations, frees, growths, exchanges, trims, ...; frees include
        the blocks collected as agreed garbage)."""
        return {"allocations": self._serial, "frees": self._frees, **self._stats}

    def check_symmetry(self, pending: str = "", what: str = "barrier", sync=None) -> None:
        """Compare every rank's call digest and release agreed garbage; doubles as a barrier. sync: a
        stream, or True for the whole device, that each rank waits for first (ctx.barrier): then what
        was freed before it goes back to the pool here. Collective: all ranks."""
        got = self.group.allgather((self.symmetry.token(pending), self._point(sync)), what)
        self.symmetry.compare([g[0] for g in got], self.rank, f"{what} before {pending}" if pending else what)
        self._release_agreed([g[1] for g in got], synced=sync is True)

    def trim(self) -> int:
        """Give segments without live data back to the device on every rank; returns bytes released.
        Memory that a tensor still covers on any rank (freed, but referenced) stays. Collective: all ranks."""
        self._drop_kept()
        self.collect("trim")
        segments = self.alloc.trimmable()
        desc = [(s.offset, s.size) for s in segments]
        pinned = self._pinned_segments(desc)
        got = self.group.allgather((desc, pinned, self.symmetry.token("trim()")), "trim")
        self.symmetry.compare([g[2] for g in got], self.rank, "trim")
        diverged = [p for p, g in enumerate(got) if g[0] != desc]
        if diverged:
            raise SymmetryError(f"trim: ranks {diverged} hold different free segments than rank {self.rank}; "
                                "the ranks' allocations have diverged")
        keep = set().union(*(g[1] for g in got))
        segments = [s for s in segments if s.offset not in keep]
        for s in segments:
            self.peer_maps.drop_range(s.offset, s.offset + s.size)
        self.alloc.release(segments)
        self._stats["trims"] += 1
        return sum(s.size for s in segments)

    def _pinned_segments(self, desc):
        """Offsets of the segments in desc that a freed-but-referenced block overlaps on this rank."""
        out = set()
        for lo, n in self.pinned_ranges():
            out.update(off for off, size in desc if off < lo + max(n, 1) and lo < off + size)
        return sorted(out)

    @cached_property
    def factories(self) -> Factories:
        """torch's tensor factories over this heap (ctx.zeros, ...)."""
        return Factories(self)

    @cached_property
    def as_symmetric(self) -> AsSymmetric:
        """heap.as_symmetric(t, copy): t's contents on the heap, zero copy where t's memory can be mapped."""
        imports = AsSymmetric(self, self.factories)
        self._copied_imports = imports.starts  # offsets where an import starts: free_tensor leaves them
        return imports

    # -- address maps (Iris's allocate_symmetric) ---------------------------
    def allocate_symmetric_map(self, *size, dtype=None):
        """(new heap tensor, its SymmetricAddressMap). Collective: all ranks, same order, same sizes."""
        t = self.factories.empty(*size, dtype=dtype)
        return t, self.address_map(t)

    def address_map(self, t: torch.Tensor) -> SymmetricAddressMap:
        """The SymmetricAddressMap of the allocation t lies in (a view maps to its whole allocation,
        so translation stays exact); KeyError if t is not in a live allocation of this heap."""
        if not isinstance(t, torch.Tensor) or not self.contains(t):
            raise KeyError("the tensor is not on this heap: allocate it with ctx.allocate_symmetric or a factory")
        try:
            block = self.block_of(t)[0]
        except ValueError as e:
            raise KeyError(str(e)) from None
        bases = [b + block.offset if b else 0 for b in self.bases]
        return address_map(bases, self.rank, self.world, bases[self.rank], block.nbytes, self.device,
                           table=self.table)

    def table(self, bases, size: int, tail=(), keep: int = 0):
        """bases as kernels take them, with this heap's hidden entries before them (translate.bases_table:
        its fault record and spin limit, size, rank, world); keep: how many of those entries to leave in
        the tensor (2: a DeviceContext's [rank, world, bases..., tail])."""
        table = bases_table(bases, size, self.rank, self.device, tail, self.faults.data_ptr(), self.spin_limit)
        return table[HIDDEN - keep:]

    # -- faults kernels noted (iris/device/faults.py) ------------------------
    def raise_faults(self) -> None:
        """Raise, once, the first fault a kernel noted in this heap's record: a rank outside [0, world)
        (DeviceCheckError) or a device wait that gave up (WaitTimeout). One small device-to-host read;
        sync the device first (ctx.barrier(), ctx.ccl.free() and ctx.close() do)."""
        raise_noted(self.faults, self.rank, self.name_address, self.spin_limit)

    def name_address(self, address: int):
        """What the heap holds at address (this process's view of its own heap), for error messages;
        None outside it."""
        offset = address - self._base
        if not 0 <= offset < self.size:
            return None
        for name, start, nbytes, size in self.own_parts:
            if start <= address < start + nbytes:
                return f"{name}[{(address - start) // size}] (heap byte offset {offset})"
        for block in [*self._at.values(), *self.imports.blocks.values()]:
            if block.offset <= offset < block.offset + block.nbytes:
                return (f"the flag at heap byte offset {offset} (byte {offset - block.offset} of the heap tensor of "
                        f"{block.nbytes} bytes at offset {block.offset})")
        return f"the flag at heap byte offset {offset} (in no live allocation)"

    # -- views -------------------------------------------------------------
    def block_at(self, address: int):
        """The live block made by allocate that starts at address, or None: ctx.free's usual path."""
        return self._at.get(address - self._base)

    def tensor(self, offset: int, shape, dtype: torch.dtype) -> torch.Tensor:
        """A view of the imported tensor at offset (as_symmetric)."""
        block = self.imports.blocks[offset]
        return tensor_at(self.bases[self.rank] + offset, torch.Size(shape), dtype, self.device, Owner(self, block))

    def block_of(self, t: torch.Tensor):
        """(the live block t's storage was made over, t's byte offset in the heap); raises if there is none."""
        start = t.untyped_storage().data_ptr() - self._base
        block = self._at.get(start) or self.imports.blocks.get(start)
        if block is None or t.get_device() != self._device_index:
            offset = self.offset_of(t)  # names a tensor that is not on the heap at all
            raise ValueError(f"the tensor at heap offset {offset} belongs to no live allocation: it was freed "
                             "already (by ctx.free, scope() or garbage collection)")
        return block, start + t.storage_offset() * t.element_size()

    def peer_tensor(self, t: torch.Tensor, rank: int) -> torch.Tensor:
        """rank's copy of heap tensor t, mapped in this process, with t's shape and strides."""
        block = self.block_of(t)[0]
        n = block.nbytes // t.element_size()
        base = tensor_at(self.bases[rank] + block.offset, torch.Size((n,)), t.dtype, self.device, Owner(self, block))
        return base.as_strided(t.shape, t.stride(), t.storage_offset())

    @staticmethod
    def address(t: torch.Tensor) -> int:
        """Where t's first element is, also for a tensor with no elements (whose data_ptr() is 0)."""
        return t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()

    def offset_of(self, t: torch.Tensor) -> int:
        """Byte offset of t's first element in this rank's heap; raises if t is not on the heap."""
        offset = self.address(t) - self.bases[self.rank]
        if not 0 <= offset < self.size or t.device != self.device:
            raise ValueError(f"tensor at {self.address(t):#x} on {t.device} is not on this rank's symmetric heap "
                             f"[{self.bases[self.rank]:#x}, +{self.size}) on {self.device}; allocate it with the "
                             "context's factories (ctx.empty, ctx.zeros, ...) or import it with ctx.as_symmetric")
        return offset

    def contains(self, t: torch.Tensor) -> bool:
        if type(t) is FreedTensor or t.device != self.device:  # a freed tensor is on no heap any more
            return False
        start = self.address(t) - self.bases[self.rank]
        span = 0 if t.numel() == 0 else sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
        return 0 <= start and start + span * t.element_size() <= self.size

    # -- lifetime ----------------------------------------------------------
    def close(self) -> None:
        """Leave the group; unmap peers and release memory now, or, while tensors over the heap are
        still alive, when the last of them goes. Idempotent. Collective when peers are alive."""
        if self.closed:
            return
        self.closed = self._guarded = True
        self._drop_kept()  # the tensors kept for reuse must not hold the heap open
        self._queued.clear()
        diverged, reported = None, self.symmetry.reported
        try:
            self.check_symmetry(what="close")  # compares digests, as every collective point does
        except SymmetryError as e:
            diverged = None if reported else e  # raised once this rank's memory is released
        except (BootstrapError, OSError):
            pass  # a peer is gone: still release what this rank holds
        try:
            if getattr(self.alloc, "free_is_collective", False) and self._held_anywhere():
                self.alloc.keep()  # its free must be made by all ranks at once: not possible at each one's GC
            if self._alive:
                self._teardown_pending = True
            else:
                self._teardown()
        finally:
            self.group.close()
        if diverged is not None:
            raise diverged

    def _held_anywhere(self) -> bool:
        """Whether any rank still holds a tensor over the heap (True where a peer cannot answer)."""
        try:
            return any(self.group.allgather(self._alive > 0, "close: tensors still held"))
        except (BootstrapError, OSError):
            return True

    def _teardown(self) -> None:
        if self.progress is not None:
            self.progress.close()
        try:
            self.peer_maps.drop_range(0, self.size)
            self._peer_blocks.close()  # peer reservations, or peer blocks opened once
            self.alloc.close()
        finally:
            self.heap_bases = None
