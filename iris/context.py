"""Iris: the user's handle on a symmetric heap: ranks, torch-like tensor factories, barriers."""
from __future__ import annotations

import os
import warnings
from functools import cached_property
from numbers import Number
from typing import Optional

import torch

from . import distributed, settings
from .allocators import ALLOCATORS, allocator_named, check_heap_size
from .device_name import DeviceName
from .errors import DeviceCheckError, IrisError, WaitTimeout, pip_install, user_stacklevel
from .distributed.host_collectives import broadcast, covers_job
from .logging import DEBUG, ERROR, INFO, WARNING, log
from .heap import SymmetricHeap, reach
from .heap import reserve as _reserve
from .heap.reserve import Reserve
from .heap.lifetime import FreedTensor, detach
from .platform import get_driver
from .validate import ClosedHeap, heap_tensor, plain_request

_STRIDED, _CONTIGUOUS, _PRESERVE = torch.strided, torch.contiguous_format, torch.preserve_format  # torch's defaults


def _check_no_other_views(t: torch.Tensor, block, base: int, rank: int) -> None:
    """IRIS_DEBUG=1: raise naming the other tensors over the block that t's free would give back
    (base: where this rank's heap starts)."""
    import gc
    lo, hi = block.offset, block.offset + max(block.nbytes, 1)
    others = []
    for o in gc.get_objects():
        if type(o) is torch.Tensor and o is not t and o.device == t.device:
            start = o.untyped_storage().data_ptr() - base + o.storage_offset() * o.element_size()
            if lo <= start < hi:
                others.append(f"{tuple(o.shape)} {o.dtype} at byte {start - lo}")
    if others or block.tensors > 1:
        named = "; ".join(others) if others else f"{block.tensors - 1} peer view(s) or storage handle(s)"
        raise IrisError(f"rank {rank}: ctx.free of the block at heap offset {block.offset} ({block.nbytes} bytes) "
                        f"while other tensors still view it: {named}. They would reach memory that a later "
                        "allocation takes; drop them (del) before the free")


class Iris:
    """A symmetric heap shared by every rank of the job. Creating one is collective: all ranks.

    heap_size bytes are the user's: iris's own flags live in a small reserve beyond them.
    allocator_type is Iris's name for allocator. group: an iris.distributed.Group already formed (the
    torch.distributed backend forms one from torch's store); None finds the job's launcher.
    """

    def __init__(self, heap_size: int = 1 << 30, allocator: Optional[str] = None, platform: Optional[str] = None,
                 timeout: Optional[float] = None, allocator_type: Optional[str] = None, group=None):
        heap_size = check_heap_size(heap_size)
        if allocator is not None and allocator_type is not None and allocator != allocator_type:
            raise ValueError(f"allocator={allocator!r} and allocator_type={allocator_type!r} disagree; pass one")
        name = settings.ALLOCATOR.get() or allocator or allocator_type or "torch"
        self.allocator_name = name = allocator_named(name)
        asked = allocator or allocator_type
        if asked is not None and allocator_named(asked) != name:  # the environment wins: say so, or the
            # allocator's own messages (rounding, out of memory) read as if the argument were ignored
            warnings.warn(f"IRIS_ALLOCATOR={name} overrides allocator={asked!r}: this heap uses the {name} allocator",
                          stacklevel=user_stacklevel())
        self._debug = settings.DEBUG.get()  # ctx.free's check of other views
        self.driver = get_driver(platform)
        self.group = distributed.connect(timeout) if group is None else group
        self.rank, self.world = self.group.rank, self.group.world
        alloc = None
        try:
            if getattr(ALLOCATORS[name], "one_host", True):  # peers mapped by IPC or fds: one host only
                self.group.require_one_host(f"allocator={name!r}", "Use allocator='nvshmem', whose peers on other "
                                            f"hosts are reached through NVSHMEM ({pip_install('nvshmem')}).")
                named = reach.forced(self.world)
                if named:
                    raise IrisError(f"IRIS_INDIRECT_PEERS names ranks {sorted(named)} as indirect peers, which only "
                                    f"allocator='nvshmem' reaches; allocator={name!r} maps every peer")
            index = self.group.local_rank % self.driver.device_count()
            self.driver.set_device(index)
            if self.driver.torch_device == "cpu":
                self.device = torch.device("cpu")
            else:
                torch.cuda.set_device(index)
                self.device = torch.device("cuda", index)
            puts = _reserve.puts_expected(ALLOCATORS[name], self.world, self.group)
            reserve = _reserve.size(self.world, puts)
            alloc = ALLOCATORS[name](self.driver, heap_size + reserve, self.device, self.group, reserved=reserve)
            self.heap = SymmetricHeap(alloc, self.driver, self.group, self.device)
            reach.use_device_api(self.heap.bases, self.device)
            # whether some rank has an indirect peer: every rank must pick the same collectives
            indirect = not getattr(ALLOCATORS[name], "one_host", True) and any(
                self.group.allgather(0 in self.heap.bases, "indirect peers"))
            ccl_puts = indirect or _reserve.puts_asked()
            if ccl_puts and not puts:  # indirect peers on one host (no peer-to-peer access)
                grown = _reserve.size(self.world, True)
                warnings.warn(f"this job's ranks reach some peers only through NVSHMEM although it runs on one host: "
                              f"ctx.ccl's receive area ({grown - reserve} bytes) comes out of heap_size; "
                              "set IRIS_CCL_PUTS=1 to add it beyond heap_size instead", stacklevel=user_stacklevel())
                alloc.reserved = reserve = grown
            # allocated first, so no scope() or free can take it
            self.reserve = Reserve(self.heap.new_tensor(torch.Size((reserve,)), torch.uint8), self.world, ccl_puts,
                                   indirect)
            self.heap.use_counters(self.reserve.progress, indirect)  # reuse of freed blocks, in stream order
            self.heap.own_parts = self.reserve.parts  # a wait that gave up on one of them is named by it
            self._device_context = None
            self._torch_device, self.device = self.device, DeviceName(self.device)  # Iris's ctx.device: a str
            self.barrier()  # every rank's flags are zero before any rank signals into them
        except BaseException as e:
            self.group.abort(f"creating the heap: {type(e).__name__}: {e}")  # the others learn why
            made = self.heap if hasattr(self, "heap") else alloc  # release what this rank made
            if made is not None:
                made.close()
            raise

    # -- who and where -----------------------------------------------------
    def get_rank(self) -> int:
        return self.rank

    def get_num_ranks(self) -> int:
        return self.world

    def get_device(self) -> torch.device:
        return self._torch_device

    def get_device_id(self) -> int:
        """Index of this rank's GPU (0 on the host)."""
        return self.device.index or 0

    def get_cu_count(self) -> int:
        """Streaming multiprocessors (compute units on AMD) of this rank's GPU; CPU cores on the host,
        where programs run one after another in the interpreter: grids sized by it stay small."""
        if self.device.type == "cuda":
            return torch.cuda.get_device_properties(self.device).multi_processor_count
        return os.cpu_count() or 1

    def get_heap_bases(self) -> torch.Tensor:
        """int64 tensor on the heap's device: entry r is where rank r's heap is mapped in this process."""
        return self.heap.heap_bases

    # Iris's attribute names
    cur_rank = property(get_rank)
    num_ranks = property(get_num_ranks)
    gpu_id = property(get_device_id)
    heap_bases = property(get_heap_bases)

    @property
    def heap_size(self) -> int:
        """Bytes the user's tensors may take (iris's own flags are outside it)."""
        return self.heap.alloc.capacity

    def get_device_context(self) -> torch.Tensor:
        """int64 tensor [rank, world, heap_base_0, ..., 3 trace slots] on the heap's device, for
        iris.DeviceContext.initialize(context, rank, world_size) in a kernel. Built once (tracing
        updates its slots in place): a CUDA graph that captured a kernel taking it stays valid."""
        if self._device_context is None:  # the hidden entries sit before it, as before heap_bases
            self._device_context = self.heap.table(self.heap.bases, self.heap.size, self.tracing.slots().tolist(), 2)
        return self._device_context

    @cached_property
    def tracing(self):
        """Device-side event tracing (iris.tracing.Tracing): enable(max_events), reset(), export(filename, merge)."""
        from .tracing import Tracing
        return Tracing(self)

    # -- logging, tagged with this rank ------------------------------------
    def debug(self, message) -> None:
        log(self.rank, self.world, DEBUG, message)

    def info(self, message) -> None:
        log(self.rank, self.world, INFO, message)

    def warning(self, message) -> None:
        log(self.rank, self.world, WARNING, message)

    def error(self, message) -> None:
        log(self.rank, self.world, ERROR, message)

    # -- host collectives --------------------------------------------------
    def broadcast(self, value, src: int = 0, *, source_rank: Optional[int] = None):
        """src's value on every rank: a Python object, number or numpy array; a tensor comes back as a
        numpy array, as Iris's does (torch.from_numpy(...).to(ctx.device) for a tensor). Collective:
        all ranks, same order; only src's value is read."""
        return broadcast(self.group, value, src if source_rank is None else source_rank)

    def barrier(self, stream=None, group=None) -> None:
        """Waits for this rank's device work (on `stream` only, if given), then for every rank.
        Collective: all ranks. group: None or every rank (subsets raise NotImplementedError).
        Then raises, on the rank where it happened, what this rank's kernels noted since the last
        check: a device function's rank outside [0, world) (DeviceCheckError) or a device wait that
        gave up (WaitTimeout)."""
        covers_job(group, self.world, "barrier")
        self.heap.check_symmetry(sync=True if stream is None else stream)
        if stream is None:  # the device is synced: what a kernel noted, or a ccl wait that gave up, shows now
            self._raise_noted()

    def _raise_noted(self) -> None:
        """Raise what this rank's kernels noted since the last look (the device synced): the fault record
        first, then a streamed fused op's release (ctx.ops), then ctx.ccl's own waits. A wait noted in
        the record (a device function's, a lock's) makes the waits after it give up too: those belong to
        the same error, raised once."""
        ccl = self.__dict__.get("_ccl")
        try:
            self.heap.raise_faults()
        except WaitTimeout as e:
            if ccl is not None and ccl.gave_up is None:
                ccl.gave_up = e
            raise
        ops = self.__dict__.get("ops")
        if ops is not None:  # a streamed fused op released after a peer stopped sending its chunks
            ops.raise_failed()
        if ccl is not None:
            ccl.check_waits()

    # -- memory ------------------------------------------------------------
    def is_symmetric(self, t: torch.Tensor) -> bool:
        """Whether all of t lies on this heap (so every rank has a copy at the same offset)."""
        return self.heap.contains(t)

    def peer_view(self, t: torch.Tensor, rank: int) -> torch.Tensor:
        """rank's copy of heap tensor t, mapped in this process: host code can read and write it.
        Like t, it keeps the memory it covers mapped while it lives."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is not in [0, {self.world})")
        if not self.heap.bases[rank]:
            raise IrisError(f"rank {rank} is an indirect peer (another node, or named by IRIS_INDIRECT_PEERS): its "
                            "memory is not mapped here; reach it from kernels (iris.get/iris.put) instead")
        return self.heap.peer_tensor(t, rank)

    def free(self, t: torch.Tensor) -> None:
        """Give t's block back now: the next allocation of its size takes it, and waits in stream order
        (no host collective) for the work every rank queued before its free. Collective: all ranks free
        the same tensors in the same order. t must cover its whole block (the tensor a factory
        returned, or a view of all of it); freeing a block twice raises. Afterwards t no longer
        reaches the block: any use of it raises. Views of it made before still do: with IRIS_DEBUG=1
        freeing a block that other tensors view raises naming them. Tensors that are simply dropped
        are freed at the next collective point instead (see collect)."""
        heap = self.heap
        if type(t) is torch.Tensor and not self._debug and heap.free_tensor(t):  # the usual call
            return
        if isinstance(t, FreedTensor):
            raise ValueError("free: this tensor was freed already (by ctx.free); it reaches no memory now")
        block, offset = heap.block_of(heap_tensor(t, "free"))
        nbytes = t.nbytes
        if offset != block.offset or nbytes != block.nbytes:
            raise ValueError(f"free takes a tensor that covers its whole block: this one covers bytes "
                             f"[{offset - block.offset}, {offset - block.offset + nbytes}) of a {block.nbytes}-byte "
                             "block (a slice or part of it); free the tensor the factory returned")
        if self._debug:
            _check_no_other_views(t, block, heap._base, self.rank)
        self.heap.free(offset)
        heap.as_symmetric.forget(offset, t)  # if it was an import, importing its source again makes a new one
        if type(t) is torch.Tensor:
            detach(t)

    def collect(self) -> int:
        """Wait for this rank's device work, then free the blocks whose tensors are gone on every rank
        (and unmap freed imports no tensor covers); returns those bytes. After it, blocks freed
        before are reused with no wait on the peers.

        A heap tensor that is dropped (no view, slice or peer view of it left) is queued on its rank;
        queued blocks are released at collective points (heap growth, barrier, trim, close, and
        this call) once every rank has queued them, in one order on all ranks, so garbage
        collection timing never makes ranks' offsets differ. Collective: all ranks."""
        return self.heap.collect()

    def trim(self) -> int:
        """Give memory with no live tensor back to the device; returns bytes released. Collective."""
        return self.heap.trim()

    # -- factories (iris/heap/factories.py): torch's signatures; collective: all ranks, same order, same sizes
    def empty(self, *size, out=None, dtype=None, layout=_STRIDED, device=None, requires_grad=False,
              pin_memory=False, memory_format=_CONTIGUOUS) -> torch.Tensor:
        if (out is None and device is None and layout is _STRIDED and memory_format is _CONTIGUOUS
                and not requires_grad and not pin_memory):  # the usual call, checked in full: one block, one view
            plain = plain_request(size, dtype)
            if plain is not None:
                return self.heap.new_tensor(*plain)
        return self.heap.factories.empty(*size, out=out, dtype=dtype, layout=layout, device=device, requires_grad=
                                         requires_grad, pin_memory=pin_memory, memory_format=memory_format)

    def zeros(self, *size, out=None, dtype=None, layout=_STRIDED, device=None, requires_grad=False) -> torch.Tensor:
        return self.heap.factories.zeros(*size, out=out, dtype=dtype, layout=layout, device=device,
                                         requires_grad=requires_grad)

    def ones(self, *size, out=None, dtype=None, layout=_STRIDED, device=None, requires_grad=False) -> torch.Tensor:
        return self.heap.factories.ones(*size, out=out, dtype=dtype, layout=layout, device=device,
                                        requires_grad=requires_grad)

    def full(self, size, fill_value, *, out=None, dtype=None, layout=_STRIDED, device=None,
             requires_grad=False) -> torch.Tensor:
        return self.heap.factories.full(size, fill_value, out=out, dtype=dtype, layout=layout, device=device,
                                        requires_grad=requires_grad)

    def empty_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=_PRESERVE) -> torch.Tensor:
        return self.heap.factories.empty_like(t, dtype=dtype, layout=layout, device=device,
                                              requires_grad=requires_grad, memory_format=memory_format)

    def zeros_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=_PRESERVE) -> torch.Tensor:
        return self.heap.factories.zeros_like(t, dtype=dtype, layout=layout, device=device,
                                              requires_grad=requires_grad, memory_format=memory_format)

    def ones_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=_PRESERVE) -> torch.Tensor:
        return self.heap.factories.ones_like(t, dtype=dtype, layout=layout, device=device,
                                             requires_grad=requires_grad, memory_format=memory_format)

    def full_like(self, t, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=_PRESERVE) -> torch.Tensor:
        return self.heap.factories.full_like(t, fill_value, dtype=dtype, layout=layout, device=device,
                                             requires_grad=requires_grad, memory_format=memory_format)

    def arange(self, start: Number, end: Optional[Number] = None, step: Number = 1, *, out=None, dtype=None,
               layout=_STRIDED, device=None, requires_grad=False) -> torch.Tensor:
        return self.heap.factories.arange(start, end, step, out=out, dtype=dtype, layout=layout, device=device,
                                          requires_grad=requires_grad)

    def linspace(self, start, end, steps: int, *, out=None, dtype=None, layout=_STRIDED, device=None,
                 requires_grad=False) -> torch.Tensor:
        return self.heap.factories.linspace(start, end, steps, out=out, dtype=dtype, layout=layout, device=device,
                                            requires_grad=requires_grad)

    def rand(self, *size, generator=None, out=None, dtype=None, layout=_STRIDED, device=None,
             requires_grad=False, pin_memory=False):
        return self.heap.factories.rand(*size, generator=generator, out=out, dtype=dtype, layout=layout,
                                        device=device, requires_grad=requires_grad, pin_memory=pin_memory)

    def randn(self, *size, generator=None, out=None, dtype=None, layout=_STRIDED, device=None,
              requires_grad=False, pin_memory=False):
        return self.heap.factories.randn(*size, generator=generator, out=out, dtype=dtype, layout=layout,
                                         device=device, requires_grad=requires_grad, pin_memory=pin_memory)

    def uniform(self, *size, low: float = 0.0, high: float = 1.0, generator=None, out=None, dtype=None,
                layout=_STRIDED, device=None, requires_grad=False):
        return self.heap.factories.uniform(*size, low=low, high=high, generator=generator, out=out, dtype=dtype,
                                           layout=layout, device=device, requires_grad=requires_grad)

    def randint(self, *args, size=None, generator=None, out=None, dtype=torch.int64, layout=_STRIDED,
                device=None, requires_grad=False):
        """randint(high, size) or randint(low, high, size), as torch.randint."""
        return self.heap.factories.randint(*args, size=size, generator=generator, out=out, dtype=dtype,
                                           layout=layout, device=device, requires_grad=requires_grad)

    # -- importing existing tensors ----------------------------------------
    def as_symmetric(self, t, copy: Optional[bool] = None):
        """A heap tensor with t's contents. Collective: all ranks, the same tensors in the same order.

        Zero copy where t's memory is VMM-backed (PyTorch with expandable_segments:True, cuMem
        allocations, another heap; shared memory on the host) and the heap is vmem: the result
        aliases t. Otherwise copy=None copies with a warning, copy=False raises, copy=True always
        copies. ctx.is_zero_copy(result) tells which. Importing t again returns the same view.
        t may be a list or tuple of tensors: one batched import, one exchange for all; returns a list.
        """
        return self.heap.as_symmetric(t, copy)

    # -- allocations with their address maps (Iris's allocate_symmetric) ---
    def allocate_symmetric(self, *size, dtype=None):
        """(tensor, peer_bases): a new heap tensor and its int64 table on the heap's device, entry r
        where rank r's copy sits in this process; a kernel translates with peer_bases[to] + (ptr -
        peer_bases[me]), or passes the table in place of heap_bases. Raises if a peer is reachable
        only through NVSHMEM (entry 0). Collective: all ranks, same order, same sizes."""
        t, amap = self.heap.allocate_symmetric_map(*size, dtype=dtype)
        return t, amap.direct_table()

    def allocate_symmetric_map(self, *size, dtype=None):
        """(tensor, SymmetricAddressMap): as allocate_symmetric, with which peers are direct.
        Collective: all ranks, same order, same sizes."""
        return self.heap.allocate_symmetric_map(*size, dtype=dtype)

    def symmetric_address_map(self, t: torch.Tensor):
        """The SymmetricAddressMap of the allocation t lies in (a view maps to its whole allocation,
        so translation stays exact); KeyError if t is not in a live allocation of this heap."""
        return self.heap.address_map(t)

    def load_safetensors(self, path, shard=None, names=None, **options) -> dict:
        """name -> heap tensor, read from a safetensors file, list of files or directory of shards
        (see iris.weights.load_safetensors for options). Collective."""
        from .weights import load_safetensors
        return load_safetensors(self, path, shard, names, **options)

    def module_to_heap(self, module: torch.nn.Module, copy: Optional[bool] = None) -> torch.nn.Module:
        """Move module's parameters and buffers onto the heap in place (see iris.weights). Collective."""
        from .weights import module_to_heap
        return module_to_heap(self, module, copy)

    def is_zero_copy(self, t: torch.Tensor) -> bool:
        """Whether t is a heap view that aliases memory imported by as_symmetric."""
        return self.heap.as_symmetric.is_zero_copy(t)

    def scope(self) -> "Scope":
        """A context manager that frees, at exit, every block the factories allocated inside that is
        still live, newest last, whether or not tensors over it remain: the tensors the factories
        returned inside that are still alive are detached as ctx.free detaches them (any use
        raises). Collective: all ranks."""
        return Scope(self)

    # -- lifetime ----------------------------------------------------------
    def close(self) -> None:
        """Leave the job; idempotent. Collective while peers are alive. The heap's memory (this
        rank's and its peer views) goes back now, or when the last heap tensor still held goes. A fault
        a kernel noted since the last barrier (DeviceCheckError, WaitTimeout) is raised after that."""
        if getattr(self, "heap", None) is not None:
            if self.device.type == "cuda" and not isinstance(self.heap, ClosedHeap):
                torch.cuda.synchronize(self.device)  # no kernel of this rank still touches what goes now
            gave_up = None
            if not isinstance(self.heap, ClosedHeap):
                self.heap.as_symmetric.clear()
                try:  # raised once the heap is closed
                    self._raise_noted()
                except (DeviceCheckError, WaitTimeout) as e:
                    gave_up = e
            self.reserve = ClosedHeap("reserve")  # the context's tensors must not hold it; ccl and ops read it
            for cache in (self.__dict__.pop("_ccl", None), self.__dict__.pop("ops", None)):
                if cache is not None:  # nor the collectives' workspaces; a held reference builds anew, and raises
                    cache.forget()
            try:
                self.heap.close()
            finally:
                self.heap = ClosedHeap()  # any later use raises ContextClosed
            if gave_up is not None:
                raise gave_up

    def __enter__(self) -> "Iris":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Iris(rank={self.rank}, world={self.world}, device={self.device}, allocator={self.allocator_name}, "
                f"heap_size={self.heap_size})")

    @cached_property
    def ops(self):
        """Fused GEMM + communication (iris.ops): ctx.ops.all_gather_matmul(output, A, B) and the others."""
        from .ops import OpsNamespace
        return OpsNamespace(self)

    @property
    def ccl(self):
        """Collectives over the heap: ctx.ccl.all_reduce(out, inp), all_gather, ... (iris/ccl/)."""
        if "_ccl" not in self.__dict__:
            from .ccl import CCL
            self._ccl = CCL(self)
        return self._ccl

    # -- device barrier (iris/device/sync.py) -------------------------------
    def device_barrier(self, group=None) -> None:
        """Barrier of every rank that runs on the device, in stream order: no host round trip, and
        capturable in a CUDA graph. Collective: all ranks. group: None or every rank."""
        covers_job(group, self.world, "device_barrier")
        flags, bases = self.reserve.barrier_flags, self.heap.heap_bases
        self._barrier_launcher.launch_trusted(
            (flags, self.rank, self.world, bases, max(2, 1 << (self.world - 1).bit_length())),
            key=(flags.data_ptr(), bases.data_ptr()))

    @cached_property
    def _barrier_launcher(self):
        """device_barrier's launches: compiled once, then replayed from a one-kernel CUDA graph (its epoch
        lives on the device), not bound through Triton's JIT at every call."""
        from .ccl.launch import Launcher
        from .device.sync import barrier_kernel
        return Launcher(barrier_kernel, (1,), num_warps=1)


class Scope:
    """ctx.scope(): entering marks the heap; exit frees what was allocated since (heap.close_scope)."""

    __slots__ = ("ctx", "mark")

    def __init__(self, ctx: Iris):
        self.ctx, self.mark = ctx, None

    def __enter__(self) -> Iris:
        self.mark = self.ctx.heap.open_scope()
        return self.ctx

    def __exit__(self, *exc) -> None:
        self.ctx.heap.close_scope(self.mark)


def iris(heap_size: int = 1 << 30, allocator: Optional[str] = None, platform: Optional[str] = None,
         timeout: Optional[float] = None, allocator_type: Optional[str] = None) -> Iris:
    """Create this job's symmetric heap. Collective: every rank calls it with the same arguments."""
    return Iris(heap_size, allocator, platform, timeout, allocator_type)
