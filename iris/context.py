"""Iris: the user's handle on a symmetric heap: ranks, torch-like tensor factories, barriers."""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from functools import cached_property
from numbers import Number
from typing import Optional

import torch

from . import distributed, settings
from .allocators import ALIASES, ALLOCATORS
from .device_name import DeviceName
from .errors import IrisError
from .factory_args import check_layout, check_pin_memory, out_as, restride
from .distributed.host_collectives import broadcast, covers_job
from .logging import DEBUG, ERROR, INFO, WARNING, log
from .device import indirect as _indirect
from .device.translate import HIDDEN, bases_table
from .heap import SymmetricHeap, reach
from .heap import reserve as _reserve
from .heap.reserve import Reserve
from .platform import get_driver
from .validate import ClosedHeap, heap_tensor, plain_request, request

_STRIDED, _CONTIGUOUS = torch.strided, torch.contiguous_format  # the factories' defaults, looked up once
def _shape(size) -> torch.Size:
    """torch's size convention: ints, or one tuple/list/Size (nested ones unwrapped, as Iris does)."""
    while len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    for s in size:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"sizes must be ints, got {type(s).__name__} {s!r} in {tuple(size)}")
        if s < 0:
            raise ValueError(f"negative dimension {s} in size {tuple(size)}")
        if s >= 1 << 63:
            raise ValueError(f"dimension {s} in size {tuple(size)} does not fit in 64 bits; check the sizes")
    return torch.Size(size)


def _use_nvshmem_device_api(device: torch.device) -> None:
    from .device import indirect, nvshmem
    major, minor = torch.cuda.get_device_capability(device)
    nvshmem.enable(10 * major + minor)
    indirect.use_indirect_peers()


def _check_heap_size(heap_size) -> int:
    if isinstance(heap_size, bool) or not isinstance(heap_size, int):
        raise TypeError(f"heap_size must be an int number of bytes, got {type(heap_size).__name__} {heap_size!r}")
    if heap_size <= 0:
        raise ValueError(f"heap_size must be positive, got {heap_size}; e.g. heap_size=1 << 30 for 1 GiB")
    return heap_size


class Iris:
    """A symmetric heap shared by every rank of the job. Creating one is collective: all ranks.

    heap_size bytes are the user's: iris's own flags live in a small reserve beyond them.
    allocator_type is Iris's name for allocator. group: an iris.distributed.Group already formed (the
    torch.distributed backend forms one from torch's store); None finds the job's launcher.
    """

    def __init__(self, heap_size: int = 1 << 30, allocator: Optional[str] = None, platform: Optional[str] = None,
                 timeout: Optional[float] = None, allocator_type: Optional[str] = None, group=None):
        heap_size = _check_heap_size(heap_size)
        if allocator is not None and allocator_type is not None and allocator != allocator_type:
            raise ValueError(f"allocator={allocator!r} and allocator_type={allocator_type!r} disagree; pass one")
        name = settings.ALLOCATOR.get() or allocator or allocator_type or "torch"
        name = ALIASES.get(name, name)
        if name not in ALLOCATORS:
            raise ValueError(f"unknown allocator {name!r}; use one of {sorted(ALLOCATORS)} (argument or IRIS_ALLOCATOR)")
        self.allocator_name = name
        self._imported = {}  # (address, nbytes, dtype, shape) of an imported tensor -> (heap view, tensor)
        self._imported_at = {}  # heap offset -> keys of _imported there, so free forgets an import in O(1)
        self.driver = get_driver(platform)
        self.group = distributed.connect(timeout) if group is None else group
        self.rank, self.world = self.group.rank, self.group.world
        alloc = None
        try:
            if getattr(ALLOCATORS[name], "one_host", True):  # peers mapped by IPC or fds: one host only
                self.group.require_one_host(f"allocator={name!r}", "Use allocator='nvshmem', whose peers on other "
                                            "hosts are reached through NVSHMEM (pip install 'iris[nvshmem]').")
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
            alloc = ALLOCATORS[name](self.driver, heap_size + reserve, self.device, self.group)
            alloc.reserved = reserve
            if heap_size % alloc.granularity:
                warnings.warn(f"heap_size={heap_size} is not a multiple of the {alloc.granularity}-byte chunk of the "
                              f"{name} allocator: rounded up; the heap holds {alloc.size - reserve} bytes", stacklevel=2)
            self.heap = SymmetricHeap(alloc, self.driver, self.group, self.device)
            if 0 in self.heap.bases or _indirect.INDIRECT_PEERS:  # kernels compiled from now on carry NVSHMEM calls
                _use_nvshmem_device_api(self.device)
            # whether some rank has an indirect peer: every rank must pick the same collectives
            indirect = not getattr(ALLOCATORS[name], "one_host", True) and any(
                self.group.allgather(0 in self.heap.bases, "indirect peers"))
            ccl_puts = indirect or _reserve.puts_asked()
            if ccl_puts and not puts:  # indirect peers on one host (no peer-to-peer access)
                grown = _reserve.size(self.world, True)
                warnings.warn(f"this job's ranks reach some peers only through NVSHMEM although it runs on one host: "
                              f"ctx.ccl's receive area ({grown - reserve} bytes) comes out of heap_size; "
                              "set IRIS_CCL_PUTS=1 to add it beyond heap_size instead", stacklevel=2)
                alloc.reserved = reserve = grown
            # allocated first, so no scope() or free can take it
            self.reserve = Reserve(self.heap.new_tensor(torch.Size((reserve,)), torch.uint8), self.world, ccl_puts,
                                   indirect)
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
        if self._device_context is None:  # IRIS_DEBUG's hidden entries sit before it, as before heap_bases
            table = bases_table(self.heap.bases, self.heap.size, self.rank, self.device, self.tracing.slots().tolist())
            self._device_context = table[HIDDEN - 2:]
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
        """src's value on every rank: a Python object, number, numpy array, or tensor (returned on
        the heap's device). Collective: all ranks, same order; only src's value is read."""
        return broadcast(self.group, value, src if source_rank is None else source_rank, self.device)

    def barrier(self, stream=None, group=None) -> None:
        """Waits for this rank's device work (on `stream` only, if given), then for every rank.
        Collective: all ranks. group: None or every rank (subsets raise NotImplementedError)."""
        covers_job(group, self.world, "barrier")
        self.heap.check_symmetry(sync=True if stream is None else stream)

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
        """Take t's block out of use now; it is reused once the work every rank queued before the free
        has finished (known at a later collective point). Collective: all ranks free the same tensors in the same
        order. t must cover its whole block (the tensor a factory returned, or a view of all of it);
        freeing a block twice raises. Tensors that are simply dropped are freed at the next
        collective point instead (see collect)."""
        heap = self.heap
        if type(t) is torch.Tensor:  # the usual call: the factory's tensor itself, not a copied import
            block = heap._at.get(t.data_ptr() - heap._base)  # addresses are unique in a process: no device check
            if block is not None and block.nbytes == t.nbytes != 0 and block.offset not in self._imported_at:
                heap.free_block(block)
                return
        block, offset = heap.block_of(heap_tensor(t, "free"))
        nbytes = t.nbytes
        if offset != block.offset or nbytes != block.nbytes:
            raise ValueError(f"free takes a tensor that covers its whole block: this one covers bytes "
                             f"[{offset - block.offset}, {offset - block.offset + nbytes}) of a {block.nbytes}-byte "
                             "block (a slice or part of it); free the tensor the factory returned")
        self.heap.free(offset)
        keys = self._imported_at.get(offset) if self._imported_at else None
        if keys:  # forget the import this was (one of those at this offset, its shape and dtype first)
            key = next((k for k in keys if k[2] == t.dtype and k[3] == tuple(t.shape)), keys[0])
            keys.remove(key)
            del self._imported[key]
            if not keys:
                del self._imported_at[offset]

    def collect(self) -> int:
        """Wait for this rank's device work, then release the blocks whose tensors are gone on every rank
        and the blocks freed before; returns the bytes released.

        A heap tensor that is dropped (no view, slice or peer view of it left) is queued on its rank;
        queued blocks are released at collective points (heap growth, barrier, trim, close, and
        this call) once every rank has queued them, in one order on all ranks, so garbage
        collection timing never makes ranks' offsets differ. Collective: all ranks."""
        return self.heap.collect()

    def trim(self) -> int:
        """Give memory with no live tensor back to the device; returns bytes released. Collective."""
        return self.heap.trim()

    def _made(self, size, dtype, device, out, requires_grad, fill=None) -> torch.Tensor:
        """A new heap tensor (or out, checked), filled outside autograd. requires_grad is checked here
        and set by the caller, last, so that a restrided result is still a leaf."""
        if device is not None:
            self._check_device(device)
        shape, dtype = request(size, dtype, requires_grad, _shape)
        if out is not None:
            if not self.is_symmetric(out) or out.shape != shape or out.dtype != dtype:
                raise ValueError(f"out must be a heap tensor of shape {tuple(shape)} and dtype {dtype}; got "
                                 f"{'a heap' if self.is_symmetric(out) else 'a non-heap'} tensor of shape "
                                 f"{tuple(out.shape)} and dtype {out.dtype}")
            t = out
        else:
            t = self.heap.new_tensor(shape, dtype)
        if fill is not None:
            with torch.no_grad():
                fill(t)
        return t

    def _check_device(self, device) -> None:
        if device is not None and torch.device(device).type != self.device.type:
            raise ValueError(f"the heap lives on {self.device}; got device={device!r} (leave it out)")

    def _copied(self, ref: torch.Tensor, out, requires_grad) -> torch.Tensor:
        t = self._made(ref.shape, ref.dtype, None, out, requires_grad, lambda t: t.copy_(ref))
        return t.requires_grad_(requires_grad) if requires_grad else t

    # -- factories (collective: all ranks, same order, same sizes) ---------
    # torch's keywords: layout (strided only), pin_memory (no effect: a warning), memory_format, device (this
    # heap's), out (a heap tensor of as many elements; returned viewed with the size asked for).
    def _factory(self, size, dtype, device, out, requires_grad, fill=None, layout=None, pin_memory=False,
                 memory_format=None, like=None) -> torch.Tensor:
        if (out is None and device is None and like is None and not requires_grad and not pin_memory
                and (layout is torch.strided or layout is None)
                and (memory_format is torch.contiguous_format or memory_format is None)):
            plain = plain_request(size, dtype)
            if plain is not None:  # the usual call, checked in full: one allocation, one view
                t = self.heap.new_tensor(*plain)
                if fill is not None:
                    with torch.no_grad():
                        fill(t)
                return t
        check_layout(layout)
        check_pin_memory(pin_memory)
        shape = _shape(size if isinstance(size, tuple) else (size,))
        out = out_as(out, shape)
        t = self._made((shape,), dtype, device, out, requires_grad, fill)
        if out is None:
            t = restride(t, memory_format, like)
        return t.requires_grad_(requires_grad) if requires_grad else t

    def empty(self, *size, out=None, dtype=None, layout=_STRIDED, device=None, requires_grad=False,
              pin_memory=False, memory_format=_CONTIGUOUS) -> torch.Tensor:
        if (out is None and device is None and layout is _STRIDED and memory_format is _CONTIGUOUS
                and not requires_grad and not pin_memory):  # the usual call: _factory's short path, inlined
            plain = plain_request(size, dtype)
            if plain is not None:
                return self.heap.new_tensor(*plain)
        return self._factory(size, dtype, device, out, requires_grad, None, layout, pin_memory, memory_format)

    def zeros(self, *size, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False) -> torch.Tensor:
        return self._factory(size, dtype, device, out, requires_grad, lambda t: t.fill_(0), layout)

    def ones(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False) -> torch.Tensor:
        return self._factory(size, dtype, device, out, requires_grad, lambda t: t.fill_(1), layout)

    def full(self, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False) -> torch.Tensor:
        if dtype is None:  # torch infers it from the fill value
            dtype = torch.full((), fill_value).dtype
        return self._factory(size, dtype, device, out, requires_grad, lambda t: t.fill_(fill_value), layout)

    def _like(self, t, dtype, layout, device, requires_grad, memory_format, fill=None) -> torch.Tensor:
        return self._factory(tuple(t.shape), dtype or t.dtype, device, None, requires_grad, fill, layout,
                             memory_format=memory_format, like=t)

    def empty_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format) -> torch.Tensor:
        return self._like(t, dtype, layout, device, requires_grad, memory_format)

    def zeros_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format) -> torch.Tensor:
        return self._like(t, dtype, layout, device, requires_grad, memory_format, lambda x: x.fill_(0))

    def ones_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format) -> torch.Tensor:
        return self._like(t, dtype, layout, device, requires_grad, memory_format, lambda x: x.fill_(1))

    def full_like(self, t, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format) -> torch.Tensor:
        return self._like(t, dtype, layout, device, requires_grad, memory_format, lambda x: x.fill_(fill_value))

    def _ranged(self, ref: torch.Tensor, out, layout, requires_grad) -> torch.Tensor:
        check_layout(layout)
        return self._copied(ref, out_as(out, ref.shape), requires_grad)

    def arange(self, start: Number, end: Optional[Number] = None, step: Number = 1, *, out=None, dtype=None,
               layout=torch.strided, device=None, requires_grad=False) -> torch.Tensor:
        self._check_device(device)
        if end is None:
            start, end = 0, start
        ref = torch.arange(start, end, step, dtype=dtype if dtype else (out.dtype if out is not None else None),
                           device=self.device)
        return self._ranged(ref, out, layout, requires_grad)

    def linspace(self, start, end, steps: int, *, out=None, dtype=None, layout=torch.strided, device=None,
                 requires_grad=False) -> torch.Tensor:
        self._check_device(device)
        ref = torch.linspace(start, end, steps, dtype=dtype if dtype else (out.dtype if out is not None else None),
                             device=self.device)
        return self._ranged(ref, out, layout, requires_grad)

    def rand(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False, pin_memory=False):
        return self._factory(size, dtype, device, out, requires_grad, lambda t: t.uniform_(0, 1, generator=generator),
                             layout, pin_memory)

    def randn(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False, pin_memory=False):
        return self._factory(size, dtype, device, out, requires_grad, lambda t: t.normal_(0, 1, generator=generator),
                             layout, pin_memory)

    def uniform(self, *size, low: float = 0.0, high: float = 1.0, generator=None, out=None, dtype=None,
                layout=torch.strided, device=None, requires_grad=False):
        if not low < high:
            raise ValueError(f"uniform needs low < high, got low={low} high={high}")
        return self._factory(size, dtype, device, out, requires_grad,
                             lambda t: t.uniform_(low, high, generator=generator), layout)

    def randint(self, *args, size=None, generator=None, out=None, dtype=torch.int64, layout=torch.strided,
                device=None, requires_grad=False):
        """randint(high, size) or randint(low, high, size), as torch.randint."""
        if size is not None:
            args = (*args, size)
        if len(args) == 2:
            args = (0, *args)
        if len(args) != 3:
            raise TypeError("randint takes (high, size) or (low, high, size)")
        low, high, size = args
        if not low < high:
            raise ValueError(f"randint needs low < high, got low={low} high={high}")
        return self._factory(size, dtype, device, out, requires_grad,
                             lambda t: t.random_(low, high, generator=generator), layout)

    # -- importing existing tensors ----------------------------------------
    def as_symmetric(self, t, copy: Optional[bool] = None):
        """A heap tensor with t's contents. Collective: all ranks, the same tensors in the same order.

        Zero copy where t's memory is VMM-backed (PyTorch with expandable_segments:True, cuMem
        allocations, another heap; shared memory on the host) and the heap is vmem: the result
        aliases t. Otherwise copy=None copies with a warning, copy=False raises, copy=True always
        copies. ctx.is_zero_copy(result) tells which. Importing t again returns the same view.
        t may be a list or tuple of tensors: one batched import, one exchange for all; returns a list.
        """
        batch = isinstance(t, (list, tuple))
        tensors = list(t) if batch else [t]
        if copy not in (None, True, False):
            raise TypeError(f"copy must be None, True or False, got {copy!r}")
        for x in tensors:
            self._check_importable(x)
        keys = [self._import_key(x) for x in tensors]
        out, todo, first = [None] * len(tensors), [], {}
        for i, (x, key) in enumerate(zip(tensors, keys)):
            if self.heap.contains(x):
                out[i] = x
            elif key in self._imported:
                out[i] = self._imported[key][0]
            elif key not in first:  # a repeat in this batch takes its first occurrence's view
                first[key] = i
                todo.append(i)
        call = f"as_symmetric({len(todo)} tensors)" if batch else f"as_symmetric({tuple(t.shape)}, {t.dtype})"
        offsets = [None] * len(todo)
        if todo and self.heap.alloc.vmm and copy is not True:
            xs = [tensors[i] for i in todo]
            offsets = self.heap.adopt([keys[i][:2] for i in todo], [(tuple(x.shape), str(x.dtype)) for x in xs], call)
        for i, offset in zip(todo, offsets):
            x = tensors[i]
            out[i] = self.heap.tensor(offset, x.shape, x.dtype) if offset is not None else self._copy_in(x, copy, call)
            self._imported[keys[i]] = (out[i], x)  # holding x keeps its allocator off the memory
            self._imported_at.setdefault(self.heap.offset_of(out[i]), []).append(keys[i])
        for i, key in enumerate(keys):
            if out[i] is None:
                out[i] = out[first[key]]
        return out if batch else out[0]

    def _check_importable(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"as_symmetric takes a torch.Tensor (or a list of them), got {type(t).__name__}")
        if t.device != self.device:
            raise ValueError(f"as_symmetric: the tensor is on {t.device} but this rank's heap is on {self.device}; "
                             f"move it first (t.to('{self.device}'))")
        if not t.is_contiguous():
            raise ValueError("as_symmetric needs a contiguous tensor (its bytes must be one range); "
                             "call t.contiguous() first, which copies")

    def _import_key(self, t: torch.Tensor) -> tuple:
        return self.heap.address(t), t.numel() * t.element_size(), t.dtype, tuple(t.shape)

    def _copy_in(self, t: torch.Tensor, copy: Optional[bool], call: str) -> torch.Tensor:
        why = (f"the {self.allocator_name} allocator cannot map memory it did not allocate; use allocator='vmem'"
               if not self.heap.alloc.vmm else
               "its memory (on some rank) is not VMM-backed; on GPUs set "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch allocates it, on the host "
               "use t.share_memory_()")
        if copy is False:
            raise ValueError(f"{call}: zero copy is impossible: {why}")
        if copy is None:
            warnings.warn(f"{call} copied {t.numel() * t.element_size()} bytes into the heap: {why}", stacklevel=3)
        return self._copied(t, None, False)

    # -- allocations with their address maps (Iris's allocate_symmetric) ---
    def allocate_symmetric(self, *size, dtype=None):
        """(tensor, peer_bases): a new heap tensor and its int64 table on the heap's device, entry r
        where rank r's copy sits in this process; a kernel translates with peer_bases[to] + (ptr -
        peer_bases[me]), or passes the table in place of heap_bases. Raises if a peer is reachable
        only through NVSHMEM (entry 0). Collective: all ranks, same order, same sizes."""
        t, amap = self.allocate_symmetric_map(*size, dtype=dtype)
        return t, amap.direct_table()

    def allocate_symmetric_map(self, *size, dtype=None):
        """(tensor, SymmetricAddressMap): as allocate_symmetric, with which peers are direct.
        Collective: all ranks, same order, same sizes."""
        t = self.empty(*size, dtype=dtype)
        return t, self.symmetric_address_map(t)

    def symmetric_address_map(self, t: torch.Tensor):
        """The SymmetricAddressMap of the allocation t lies in (a view maps to its whole allocation,
        so translation stays exact); KeyError if t is not in a live allocation of this heap."""
        from .experimental.symmetric_memory import address_map
        if not isinstance(t, torch.Tensor) or not self.heap.contains(t):
            raise KeyError("the tensor is not on this heap: allocate it with ctx.allocate_symmetric or a factory")
        try:
            block = self.heap.block_of(t)[0]
        except ValueError as e:
            raise KeyError(str(e)) from None
        bases = [b + block.offset if b else 0 for b in self.heap.bases]
        return address_map(bases, self.rank, self.world, bases[self.rank], block.nbytes, self.device)

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
        return self.heap.contains(t) and self.heap.is_adopted(self.heap.offset_of(t))

    @contextmanager
    def scope(self):
        """Frees, at exit, every block the factories allocated inside that is still live, newest
        last, whether or not tensors over it remain. Collective: all ranks."""
        mark = self.heap._serial + 1
        try:
            yield self
        finally:
            for offset in self.heap.offsets_since(mark):
                self.heap.free(offset)

    # -- lifetime ----------------------------------------------------------
    def close(self) -> None:
        """Leave the job; idempotent. Collective while peers are alive. The heap's memory (this
        rank's and its peer views) goes back now, or when the last heap tensor still held goes."""
        if getattr(self, "heap", None) is not None:
            if self.device.type == "cuda" and not isinstance(self.heap, ClosedHeap):
                torch.cuda.synchronize(self.device)  # no kernel of this rank still touches what goes now
            self._imported, self._imported_at = {}, {}
            self.__dict__.pop("reserve", None)  # the context's tensors must not hold it
            for cache in (self.__dict__.pop("_ccl", None), self.__dict__.pop("ops", None)):
                if cache is not None:  # nor the collectives' workspaces; a held reference builds anew, and raises
                    cache.forget()
            try:
                self.heap.close()
            finally:
                self.heap = ClosedHeap()  # any later use raises ContextClosed

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
        from .device.sync import barrier_kernel
        barrier_kernel[(1,)](self.reserve.barrier_flags, self.rank, self.world, self.heap.heap_bases,
                             BLOCK=max(2, 1 << (self.world - 1).bit_length()), num_warps=1)


def iris(heap_size: int = 1 << 30, allocator: Optional[str] = None, platform: Optional[str] = None,
         timeout: Optional[float] = None, allocator_type: Optional[str] = None) -> Iris:
    """Create this job's symmetric heap. Collective: every rank calls it with the same arguments."""
    return Iris(heap_size, allocator, platform, timeout, allocator_type)
