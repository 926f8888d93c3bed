"""IrisGroup: a torch.distributed ProcessGroup whose collectives are ctx.ccl's calls.

Every call is collective as torch's are: all ranks of the group, same order, same sizes. Calls are
ordered on the current stream (ctx.ccl launches there); one that asks for a Work (async_op, or any
call from torch's C++ side) gets one whose wait() orders the waiting stream after it, as NCCL's does,
and one that does not gets None, which torch's dist.X takes as done. A tensor on the heap
(contiguous, of a dtype ctx.ccl moves) is handed to ctx.ccl as it is; any other is copied into the
group's staging area, a prefix of it rounded up to a power-of-two size class, so ctx.ccl sees one
shape per class and reuses its plan.
The staging area and the send/recv mailbox are allocated once, with the first group of a context:
heap allocation is collective over the whole context, and a sub-group's call runs on its members only.
"""
from __future__ import annotations

import atexit
import functools
import gc
import sys
import weakref

import torch
import torch.distributed as dist

from ..ccl import ReduceOp
from ..context import Iris
from ..distributed.bootstrap import from_store
from . import NAME, Options, heap_size_setting

_CCL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)  # ctx.ccl reduces these
_WORDS = (torch.float32, torch.int32)  # dtypes ctx.ccl's copies take as they are (others: viewed as int32)
_MIN_CLASS = 4096  # bytes: the smallest staging size class
_R = dist.ReduceOp.RedOpType
_SUM = _R.SUM  # opts.reduceOp == _SUM is the cheapest test of the common op (no .op, no hashing)
# keyed by the enum's int value: hashing torch's enum object costs a microsecond per call
_OPS = {_R.SUM.value: "sum", _R.AVG.value: "avg", _R.MAX.value: "max", _R.MIN.value: "min", _R.PRODUCT.value: "product",
        _R.BAND.value: "band", _R.BOR.value: "bor", _R.BXOR.value: "bxor"}
_CCL_SUM = ReduceOp.SUM  # a global: the enum's attribute costs 0.1 us per call
_ON_CCL = {"sum": ReduceOp.SUM, "avg": ReduceOp.SUM, "max": ReduceOp.MAX, "min": ReduceOp.MIN}
# ops reduced here, in rank order, over every rank's gathered input (ctx.ccl has no kernel for them)
_LOCAL = {"sum": torch.add, "avg": torch.add, "max": torch.maximum, "min": torch.minimum, "product": torch.mul,
          "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}
_shared = weakref.WeakKeyDictionary()  # context -> its _Shared (staging area, mailbox, global ranks)

# DDP keeps its process group in reference cycles; freed only at interpreter shutdown, torch aborts the
# process ("terminate called without an active exception"). Collect them while the interpreter lives.
atexit.register(gc.collect)


class _Shared:
    """What every group over one context uses: the staging area, the mailbox, the context's ranks as
    torch's global ranks."""

    def __init__(self, ctx, global_ranks, options):
        self.global_ranks = list(global_ranks)
        staging = options.staging_bytes
        if staging is None:
            staging = max(_MIN_CLASS * (ctx.world + 1), ctx.heap_size // 4)
        words = options.mailbox_bytes // 4
        self.staging = ctx.empty(staging, dtype=torch.uint8)
        self.mailbox = ctx.ccl.init_p2p(max_numel=words, dtype=torch.int32)
        self.words = words


def create(dist_options, options):
    """torch's backend creator (extended API): the group of dist_options' ranks over a context built
    from its store, or over the one of Options(ctx=...) or of an earlier "iris" group."""
    options = Options() if options is None else options
    if not isinstance(options, Options):
        raise TypeError(f"pg_options for the {NAME!r} backend must be iris.torch_backend.Options, got "
                        f"{type(options).__name__}")
    _check(options)
    rank, size = dist_options.group_rank, dist_options.group_size
    ranks = list(dist_options.global_ranks_in_group) or list(range(size))
    ctx = options.ctx
    if ctx is None:
        ctx = next((c for c, s in list(_shared.items()) if set(ranks) <= set(s.global_ranks)), None)
    if ctx is None:
        heap = heap_size_setting() if options.heap_size is None else options.heap_size
        timeout = dist_options.timeout.total_seconds()
        ctx = Iris(heap_size=heap, allocator=options.allocator, timeout=timeout,
                   group=from_store(dist_options.store, rank, size, timeout))
        _shared[ctx] = _Shared(ctx, ranks, options)
    elif ctx not in _shared:
        if ctx.world != (dist.get_world_size() if dist.is_initialized() else size):
            raise ValueError(f"Options(ctx=...): the context spans {ctx.world} ranks but torch's job has "
                             f"{size}; adopt a context of the whole job")
        _shared[ctx] = _Shared(ctx, range(ctx.world), options)
    return IrisGroup(ctx, _shared[ctx], rank, size, ranks, dist_options.group_id)


def _count(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


def _check(options) -> None:
    """Options' sizes, checked before anything is allocated."""
    for name in ("heap_size", "staging_bytes"):
        value = getattr(options, name)
        if value is not None and not (_count(value) and value > 0):
            raise ValueError(f"Options({name}={value!r}): give a positive int number of bytes, e.g. {1 << 26}")
    if not (_count(options.mailbox_bytes) and options.mailbox_bytes >= 4):
        raise ValueError(f"Options(mailbox_bytes={options.mailbox_bytes!r}): give an int of at least 4 bytes "
                         f"(the default is {1 << 20})")


def context_of(group=None):
    """The iris context of an "iris" process group (None: the default group)."""
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if not isinstance(pg, IrisGroup):
        raise ValueError(f"{pg!r} is not a process group of the {NAME!r} backend; "
                         f"make it with dist.init_process_group({NAME!r}) or dist.new_group(backend={NAME!r})")
    return pg.ctx


def _refuse(call, why):
    return RuntimeError(f"{call} on the {NAME!r} backend: {why}")


def _like(buf, t):
    """The first t.nbytes bytes of buf (a uint8 view of the heap) seen as a tensor of t's dtype and shape."""
    return buf[:t.nbytes].view(t.dtype).view(t.shape)


def _flat(t):
    """t as one dimension (t itself when it is already: a view costs a microsecond)."""
    return t if t.dim() == 1 else t.view(-1)


def _words(t):
    """t's bytes as int32 words, one dimension, for a copy (ctx.ccl moves int32 and float32 words alike)."""
    if t.dim() != 1:
        t = t.view(-1)
    return t if t.dtype in _WORDS else t.view(torch.int32)


def _cls(nbytes: int) -> int:
    return max(_MIN_CLASS, 1 << (max(nbytes, 1) - 1).bit_length())


class _Rows:
    """Per heap tensor, its bytes as one row of int32 words (1, nbytes / 4), the view all_to_all hands
    ctx.ccl, made once: two views cost about two microseconds per call. An entry is dropped with its
    tensor, and made again where the tensor's storage moved (the caller has read its address and size:
    the row's own are kept as ints, as reading them again costs as much as the checks)."""

    def __init__(self):
        self._by_id = {}

    def of(self, t, ptr, nbytes):
        """The row of t, a contiguous tensor at address ptr of nbytes bytes."""
        entry = self._by_id.get(id(t))
        if entry is not None and entry[0]() is t and entry[2] == ptr and entry[3] == nbytes:
            return entry[1]
        row = t.view(1, -1).view(torch.int32)
        key = id(t)
        self._by_id[key] = (weakref.ref(t, lambda _, key=key, table=self._by_id: table.pop(key, None)), row, ptr,
                            nbytes)
        return row


class _Work(dist.Work):
    """A call already queued on `stream`: wait() makes the current stream wait for it (and the host,
    for a barrier); the future holds the call's tensors."""

    def __init__(self):
        super().__init__()
        self.result, self.stream, self.block, self.flush = [], None, False, None

    def wait(self, timeout=None):
        if self.flush is not None:
            self.flush()
        s = self.stream
        if s is not None:
            current = torch.cuda.current_stream(s.device)
            if current != s:
                current.wait_stream(s)
            if self.block:
                s.synchronize()
        return True

    def is_completed(self):
        return self.stream is None or self.stream.query()

    def is_success(self):
        return True

    def exception(self):
        return None

    def get_future(self):
        fut = torch.futures.Future(devices=[self.stream.device] if self.stream is not None else None)
        fut.set_result(self.result)
        return fut


class IrisGroup(dist.ProcessGroup):
    """A process group of the "iris" backend over ctx (ctx.ccl's calls, with group= for a sub-group)."""

    def __init__(self, ctx, shared, rank, size, ranks, name):
        super().__init__(rank, size)
        # rank() and size() go through torch's C++ trampoline, which looks for Python overrides each call
        self._r, self._w = rank, size
        self.ctx, self._shared, self._name = ctx, shared, name
        index = {g: i for i, g in enumerate(shared.global_ranks)}
        members = [index[g] for g in ranks]  # the members as the context's ranks
        self._ccl_group = None if members == list(range(ctx.world)) else members
        self._members = members
        self._device = ctx.get_device()
        self._ccl = ctx.ccl  # the context's one CCL object (ctx.ccl is a property)
        self._lo = ctx.heap.bases[ctx.rank]
        self._hi = self._lo + ctx.heap.size
        self._cuda = self._device.type == "cuda"
        self._queued = []  # sends not yet made (see _p2p)
        self._rows = _Rows()
        self._spare = None  # the last Work handed out (see _work)

    # -- identity --------------------------------------------------------
    def getBackendName(self):
        return NAME

    def _get_backend_name(self):
        return NAME

    @property
    def group_name(self):
        return self._name

    def getGroupName(self):
        return self._name

    def __repr__(self):
        return f"IrisGroup(rank {self._r} of {self._w}, context ranks {self._members})"

    # -- helpers ---------------------------------------------------------
    def _done(self, opts, result):
        """What a collective returns: its Work where the caller keeps one (async_op=True, and every call
        from C++: DDP's hooks, functional collectives, whose options say async), else None. The call
        is already ordered on the current stream, which is all that waiting on it would give, and
        torch's dist.X skips wait() when a backend returns None."""
        return self._work(result) if opts is None or opts.asyncOp else None

    def _work(self, result, block=False, flush=None):
        """The call's Work. Making one through torch's binding costs microseconds, so the last one is
        reused once nobody holds it any more (its caller waited on it and let it go)."""
        w = self._spare
        if w is None or sys.getrefcount(w) > 3:  # 3: this attribute, w, getrefcount's argument
            w = self._spare = _Work()
        w.result, w.block, w.flush = result, block, flush
        w.stream = torch.cuda.current_stream(self._device) if self._cuda else None
        return w

    def _direct(self, t) -> bool:
        """Whether ctx.ccl can take t as it is: contiguous, on this rank's heap (memory of this rank's
        device: the address range says so without building t.device)."""
        p = t.data_ptr()
        return self._lo <= p and p + t.nbytes <= self._hi and t.is_contiguous()

    def _each(self, call, outputs, inputs, opts):
        """A coalesced form: call(output, input, opts) per pair, in order."""
        for o, i in zip(outputs, inputs):
            call(o, i, opts)
        return self._done(opts, outputs)

    def _stage(self, call, *sizes):
        """Consecutive byte views of the staging area, each of the given size (size-class multiples)."""
        area = self._shared.staging
        if sum(sizes) > area.numel():
            raise _refuse(call, f"needs {sum(sizes)} bytes of staging but the area holds {area.numel()}; raise "
                                "Options(staging_bytes=...) (and the heap: Options(heap_size=...) or IRIS_HEAP_SIZE), "
                                "or pass heap tensors (ctx.empty, ctx.as_symmetric), which need none")
        out, at = [], 0
        for n in sizes:
            out.append(area[at:at + n])
            at += n
        return out

    @staticmethod
    def _op(call, reduce_op) -> str:
        if reduce_op == _SUM:
            return "sum"
        kind = getattr(reduce_op, "op", reduce_op)
        name = _OPS.get(getattr(kind, "value", None))
        if name is None:
            raise _refuse(call, f"reduce op {reduce_op} is not supported; use SUM, AVG, MAX, MIN, PRODUCT, BAND, "
                                "BOR or BXOR")
        return name

    @staticmethod
    def _check_op(call, op, t) -> None:
        if op == "avg" and not t.is_floating_point():
            raise _refuse(call, f"AVG needs a floating dtype, got {t.dtype}; use SUM and divide")
        if op in ("band", "bor", "bxor") and (t.is_floating_point() or t.is_complex()):
            raise _refuse(call, f"{op.upper()} needs an integer or bool dtype, got {t.dtype}")

    def _on_ccl(self, op, t) -> bool:
        return op in _ON_CCL and t.dtype in _CCL_DTYPES

    # -- all_reduce --------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        if self._queued:
            self._flush()
        red = opts.reduceOp
        if red == _SUM and len(tensors) == 1 and self._w > 1:  # the common call, checks inlined
            t = tensors[0]
            p = t.data_ptr()
            if self._lo <= p < p + t.nbytes <= self._hi and t.dtype in _CCL_DTYPES and t.is_contiguous():
                self._ccl.all_reduce(t, t, op=_CCL_SUM, group=self._ccl_group)
                return self._work(tensors) if opts.asyncOp else None
        op = self._op("all_reduce", red)
        for t in tensors:
            self._all_reduce(t, op)
        return self._done(opts, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        self._flush()
        return self.allreduce(tensors, opts)

    def _all_reduce(self, t, op, call="all_reduce"):
        if op != "sum":
            self._check_op(call, op, t)
        if t.numel() == 0 or self._w == 1:
            return
        if not self._on_ccl(op, t):
            self._reduced_by_gather(t, op, call)
            return
        if self._direct(t):  # any shape: a new view per call would defeat ctx.ccl's repeat-call fast path
            self._ccl.all_reduce(t, t, op=_ON_CCL[op], group=self._ccl_group)
        else:
            (s,) = self._stage(call, _cls(t.nbytes))
            s = s.view(t.dtype)
            s[:t.numel()].view(t.shape).copy_(t)
            self._ccl.all_reduce(s, s, op=_ON_CCL[op], group=self._ccl_group)
            t.copy_(s[:t.numel()].view(t.shape))
        if op == "avg":
            t.div_(self._w)

    def _reduced_by_gather(self, t, op, call):
        """t = op over every member's t, combined in rank order here from an all_gather of the bytes."""
        rows = self._gathered_bytes(t, call)
        parts = [_like(r, t) for r in rows]
        t.copy_(functools.reduce(_LOCAL[op], parts))
        if op == "avg":
            t.div_(self._w)

    def _gathered_bytes(self, t, call):
        """Every member's bytes of t, one size-class row each (views of the staging area)."""
        c, w = _cls(t.nbytes), self._w
        s_in, s_out = self._stage(call, c, w * c)
        _like(s_in, t).copy_(t)
        self._ccl.all_gather(s_out.view(torch.int32), s_in.view(torch.int32), group=self._ccl_group)
        return s_out.view(w, c)

    # -- all_gather --------------------------------------------------------
    def allgather(self, output_tensors, input_tensors, opts=None):
        self._flush()
        for outs, t in zip(output_tensors, input_tensors):
            if len(outs) != self._w:
                raise _refuse("all_gather", f"needs {self._w} output tensors, got {len(outs)}")
            rows = self._gathered_bytes(t, "all_gather")
            for o, r in zip(outs, rows):
                o.copy_(_like(r, t))
        return self._done(opts, output_tensors)

    def all_gather_single(self, output, input, opts=None):
        if self._queued:
            self._flush()
        w, nb, dtype = self._w, input.nbytes, input.dtype
        if output.nbytes != w * nb or output.dtype != dtype:
            raise _refuse("all_gather_into_tensor", f"output must hold {w} x input's {input.numel()} elements of "
                                                    f"{dtype}; got {output.numel()} of {output.dtype}")
        if nb and nb % 4 == 0:  # the common call, checks inlined
            po, pi, lo, hi = output.data_ptr(), input.data_ptr(), self._lo, self._hi
            if (lo <= po and po + w * nb <= hi and lo <= pi and pi + nb <= hi and output.is_contiguous()
                    and input.is_contiguous()):
                if dtype in _WORDS and input.dim() == 1 == output.dim():  # words already: no helper calls
                    self._ccl.all_gather(output, input, group=self._ccl_group)
                else:
                    self._ccl.all_gather(_words(output), _words(input), group=self._ccl_group)
                return self._work([output]) if opts is None or opts.asyncOp else None
        if nb:
            rows = self._gathered_bytes(input, "all_gather_into_tensor")
            output.view(w, -1).copy_(rows[:, :input.nbytes].view(input.dtype).view(w, -1))
        return self._done(opts, [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._each(self.all_gather_single, outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """output_lists[r][i] = member r's inputs[i] (torch's layout for all_gather_coalesced)."""
        self._flush()
        if len(output_lists) != self._w:
            raise _refuse("all_gather_coalesced", f"needs {self._w} output lists, got {len(output_lists)}")
        for i, t in enumerate(inputs):
            rows = self._gathered_bytes(t, "all_gather_coalesced")
            for outs, r in zip(output_lists, rows):
                outs[i].copy_(_like(r, t).view(outs[i].shape))
        return self._done(opts, output_lists)

    # -- reduce_scatter ----------------------------------------------------
    def reduce_scatter_single(self, output, input, opts=None):
        if self._queued:
            self._flush()
        call, w, red = "reduce_scatter_tensor", self._w, opts.reduceOp
        if red == _SUM and w > 1:  # the common call, checks inlined
            nb, dtype = output.nbytes, output.dtype
            if nb and input.nbytes == w * nb and input.dtype == dtype and dtype in _CCL_DTYPES:
                po, pi, lo, hi = output.data_ptr(), input.data_ptr(), self._lo, self._hi
                if (lo <= po and po + nb <= hi and lo <= pi and pi + w * nb <= hi and output.is_contiguous()
                        and input.is_contiguous()):
                    self._ccl.reduce_scatter(_flat(output), _flat(input), op=_CCL_SUM, group=self._ccl_group)
                    return self._work([output]) if opts.asyncOp else None
        op = self._op(call, red)
        if op != "sum":
            self._check_op(call, op, output)
        n = output.numel()
        if input.numel() != w * n or output.dtype != input.dtype:
            raise _refuse(call, f"input must hold {w} x output's {n} elements of {output.dtype}; got "
                                f"{input.numel()} of {input.dtype}")
        if n == 0:
            return self._done(opts, [output])
        if w == 1:
            output.copy_(input.view(output.shape))
        elif not self._on_ccl(op, output):
            whole = input.clone()
            self._reduced_by_gather(whole, "sum" if op == "avg" else op, call)
            output.copy_(whole.view(w, -1)[self._r].view(output.shape))
        elif self._direct(output) and self._direct(input):
            self._ccl.reduce_scatter(_flat(output), _flat(input), op=_ON_CCL[op], group=self._ccl_group)
        else:
            c = _cls(output.nbytes)
            s_in, s_out = self._stage(call, w * c, c)
            rows = s_in.view(w, c)[:, :output.nbytes].view(output.dtype)
            rows.copy_(input.reshape(w, n))
            self._ccl.reduce_scatter(s_out.view(output.dtype), s_in.view(output.dtype), op=_ON_CCL[op],
                                        group=self._ccl_group)
            output.copy_(s_out[:output.nbytes].view(output.dtype).view(output.shape))
        if op == "avg":
            output.div_(w)
        return self._done(opts, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        self._flush()
        for o, ins in zip(output_tensors, input_tensors):
            if len(ins) != self._w:
                raise _refuse("reduce_scatter", f"needs {self._w} input tensors, got {len(ins)}")
            whole = torch.stack([i.reshape(o.shape) for i in ins])
            self.reduce_scatter_single(o, whole, opts)
        return self._done(opts, output_tensors)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._each(self.reduce_scatter_single, outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- all_to_all --------------------------------------------------------
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if self._queued:
            self._flush()
        call, w, nb = "all_to_all_single", self._w, input.nbytes
        if not output_split_sizes and not input_split_sizes and nb and nb % (4 * w) == 0:  # the common call
            pi, po, lo, hi = input.data_ptr(), output.data_ptr(), self._lo, self._hi
            if (lo <= pi and pi + nb <= hi and lo <= po and po + nb <= hi and output.nbytes == nb
                    and output.dtype == input.dtype and input.numel() % w == 0 and input.is_contiguous()
                    and output.is_contiguous()):
                rows = self._rows
                self._ccl.all_to_all(rows.of(output, po, nb), rows.of(input, pi, nb), group=self._ccl_group)
                return self._work([output]) if opts is None or opts.asyncOp else None
        if output.dtype != input.dtype:
            raise _refuse(call, f"output is {output.dtype} but input is {input.dtype}; they must match")
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % w or output.numel() != input.numel():
                raise _refuse(call, f"equal splits need input and output of the same size, a multiple of {w}; "
                                    f"got {input.numel()} and {output.numel()} elements")
            ins, outs = list(input.reshape(w, -1)), list(output.view(w, -1))
            self._exchange(call, ins, outs, even=True)
        else:
            ins = self._split(call, "input", input, input_split_sizes)
            outs = self._split(call, "output", output, output_split_sizes)
            self._exchange(call, ins, outs, even=False)
        return self._done(opts, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._flush()
        if len(output_tensors) != self._w or len(input_tensors) != self._w:
            raise _refuse("all_to_all", f"needs {self._w} input and output tensors, got "
                                        f"{len(input_tensors)} and {len(output_tensors)}")
        self._exchange("all_to_all", list(input_tensors), list(output_tensors), even=False)
        return self._done(opts, output_tensors)

    def _split(self, call, name, t, sizes):
        w = self._w
        if not sizes:
            sizes = [t.shape[0] // w] * w if t.dim() and t.shape[0] % w == 0 else None
        if sizes is None or len(sizes) != w or sum(sizes) != (t.shape[0] if t.dim() else 0):
            raise _refuse(call, f"{name} split sizes {sizes} must be {w} row counts adding up to {name}'s "
                                f"{t.shape[0] if t.dim() else 0} rows")
        return list(t.split(list(sizes), 0))

    def _exchange(self, call, ins, outs, even):
        """outs[r] = member r's ins[me]: padded to one size class (the largest chunk any member sends, told
        by a MAX all_reduce unless every chunk has one size) and moved by ctx.ccl.all_to_all."""
        w = self._w
        for i, o in zip(ins, outs):
            if i.dtype != o.dtype:
                raise _refuse(call, f"input is {i.dtype} but output is {o.dtype}; they must match")
        if not even and self._cuda and torch.cuda.is_current_stream_capturing():
            raise _refuse(call, "with split sizes (or a list of tensors) agrees the largest chunk on the host, "
                                "which a CUDA graph cannot capture; capture all_to_all_single without split "
                                "sizes (equal chunks: pad them to one size), or make this call outside the graph")
        most = max(t.nbytes for t in ins + outs)
        if not even:
            (m,) = self._stage(call, _MIN_CLASS)
            m = m.view(torch.int64)[:1]
            m.fill_(most)
            self._ccl.all_reduce(m, m, op=ReduceOp.MAX, group=self._ccl_group)
            most = int(m.item())
        c = _cls(most)
        s_in, s_out = self._stage(call, w * c, w * c)
        rows_in, rows_out = s_in.view(w, c), s_out.view(w, c)
        for r, t in enumerate(ins):
            if t.numel():
                _like(rows_in[r], t).copy_(t)
        self._ccl.all_to_all(s_out.view(torch.int32).view(1, -1), s_in.view(torch.int32).view(1, -1),
                                group=self._ccl_group)
        for r, t in enumerate(outs):
            if t.numel():
                t.copy_(_like(rows_out[r], t))

    # -- rooted --------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        if self._queued:
            self._flush()
        root = opts.rootRank
        src = self._members[root]
        if len(tensors) == 1 and self._w > 1:  # the common call, checks inlined
            t = tensors[0]
            p, nb = t.data_ptr(), t.nbytes
            if nb % 4 == 0 and self._lo <= p < p + nb <= self._hi and t.is_contiguous():
                flat = _words(t)
                self._ccl.broadcast(flat, flat, src=src, group=self._ccl_group)
                return self._work(tensors) if opts.asyncOp else None
        for t in tensors:
            nb = t.nbytes
            if nb == 0 or self._w == 1:
                continue
            if nb % 4 == 0 and self._direct(t):
                flat = _words(t)
                self._ccl.broadcast(flat, flat, src=src, group=self._ccl_group)
                continue
            (s,) = self._stage("broadcast", _cls(t.nbytes))
            if self._r == root:
                _like(s, t).copy_(t)
            w = s.view(torch.int32)
            self._ccl.broadcast(w, w, src=src, group=self._ccl_group)
            if self._r != root:
                t.copy_(_like(s, t))
        return self._done(opts, tensors)

    def reduce(self, tensors, opts=None):
        if self._queued:
            self._flush()
        call, red, root = "reduce", opts.reduceOp, opts.rootRank
        if red == _SUM and len(tensors) == 1 and self._w > 1:  # the common call, checks inlined
            t = tensors[0]
            p = t.data_ptr()
            if self._lo <= p < p + t.nbytes <= self._hi and t.dtype in _CCL_DTYPES and t.is_contiguous():
                self._ccl.reduce(t, t, dst=root, op=_CCL_SUM, group=self._ccl_group)
                return self._work(tensors) if opts.asyncOp else None
        op = self._op(call, red)
        for t in tensors:
            if op != "sum":
                self._check_op(call, op, t)
            if t.nbytes == 0 or self._w == 1:
                continue
            if not self._on_ccl(op, t):
                self._reduced_by_gather(t, op, call)
                continue
            if self._direct(t):  # in place: the root reads every member's t where it is
                self._ccl.reduce(t, t, dst=root, op=_ON_CCL[op], group=self._ccl_group)
            else:
                c = _cls(t.nbytes)
                s_in, s_out = self._stage(call, c, c)
                s_in, s_out = s_in.view(t.dtype), s_out.view(t.dtype)
                s_in[:t.numel()].view(t.shape).copy_(t)
                self._ccl.reduce(s_out, s_in, dst=root, op=_ON_CCL[op], group=self._ccl_group)
                if self._r == root:
                    t.copy_(s_out[:t.numel()].view(t.shape))
            if self._r == root and op == "avg":
                t.div_(self._w)
        return self._done(opts, tensors)

    def _root_list(self, call, lists, root, what) -> None:
        if self._r == root and (len(lists) != 1 or len(lists[0]) != self._w):
            raise _refuse(call, f"the root needs one list of {self._w} {what} tensors")

    def gather(self, output_tensors, input_tensors, opts=None):
        self._flush()
        call, w, root = "gather", self._w, opts.rootRank
        (t,) = input_tensors
        self._root_list(call, output_tensors, root, "output")
        if t.numel():
            c = _cls(t.nbytes)
            s_in, s_out = self._stage(call, c, w * c)
            _like(s_in, t).copy_(t)
            self._ccl.gather(s_out.view(torch.int32), s_in.view(torch.int32), dst=root, group=self._ccl_group)
            if self._r == root:
                for o, r in zip(output_tensors[0], s_out.view(w, c)):
                    o.copy_(_like(r, t).view(o.shape))
        return self._done(opts, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        self._flush()
        call, w, root = "scatter", self._w, opts.rootRank
        (t,) = output_tensors
        self._root_list(call, input_tensors, root, "input")
        if t.numel():
            c = _cls(t.nbytes)
            s_in, s_out = self._stage(call, w * c, c)
            if self._r == root:
                for i, r in zip(input_tensors[0], s_in.view(w, c)):
                    _like(r, t).copy_(i)
            self._ccl.scatter(s_out.view(torch.int32), s_in.view(torch.int32), src=root, group=self._ccl_group)
            t.copy_(_like(s_out, t))
        return self._done(opts, output_tensors)

    # -- point to point ------------------------------------------------------
    def send(self, tensors, dstRank, tag=0):
        self._p2p([(True, t, dstRank) for t in tensors])
        return self._work(tensors, flush=self._flush)

    def recv(self, tensors, srcRank, tag=0):
        self._p2p([(False, t, srcRank) for t in tensors])
        return self._work(tensors)

    def recv_anysource(self, tensors, tag=0):
        raise _refuse("recv (from any source)", "a receive names its source; pass src=")

    def _p2p(self, transfers):
        """Sends wait in a queue until a receive, a wait(), or any other call of this group: then they go
        together with it, as NCCL's batched ones, so a ring of isends then irecvs cannot wait on itself."""
        self._queued.extend(transfers)
        if any(not sending for sending, _, _ in transfers):
            self._flush()

    def _flush(self):
        if self._queued:
            queued, self._queued = self._queued, []
            self._transfer(queued)

    def _transfer(self, transfers):
        """Transfers through the mailbox in pieces of its slot size, interleaved: piece k of every send,
        then piece k of every receive, so an exchange larger than the mailbox (a ring) cannot wait on
        itself. A tensor that is not whole 4-byte words on this device passes through a padded copy."""
        jobs = []
        for sending, t, peer in transfers:
            if peer == self._r:
                raise _refuse("send" if sending else "recv", f"the peer {peer} is this rank; copy locally")
            if t.numel() == 0:
                continue
            if t.is_contiguous() and t.nbytes % 4 == 0 and t.device == self._device:
                words, copy = t.view(-1).view(torch.int32), None
            else:
                words = torch.empty(-(-t.nbytes // 4), dtype=torch.int32, device=self._device)
                copy = _like(words.view(torch.uint8), t)
                if sending:
                    copy.copy_(t)
            jobs.append((sending, t, peer, words, copy))
        box, step, ccl = self._shared.mailbox, self._shared.words, self._ccl
        pieces = max((j[3].numel() for j in jobs), default=0)
        for at in range(0, pieces, step):
            for sending in (True, False):
                for s, t, peer, words, _ in jobs:
                    if s == sending and at < words.numel():
                        call = ccl.send if sending else ccl.recv
                        call(words[at:at + step], peer, group=self._ccl_group, p2p_state=box)
        for sending, t, _, _, copy in jobs:
            if not sending and copy is not None:
                t.copy_(copy)

    # -- synchronisation -----------------------------------------------------
    def barrier(self, opts=None):
        """Every member meets on the device, then (at wait(), as NCCL's barrier) the host waits for it."""
        if self._cuda and torch.cuda.is_current_stream_capturing():
            raise _refuse("barrier", "blocks the host until every member has reached it, which a CUDA graph cannot "
                                     "capture; inside the graph call iris.torch_backend.context().ccl.barrier() (a "
                                     "device barrier), or call dist.barrier() outside it")
        self._flush()
        self._ccl.barrier(group=self._ccl_group)
        return self._work([], block=True)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        raise _refuse("monitored_barrier", "gloo's host barrier with rank reports; use dist.barrier()")

    def _start_coalescing(self, device=None):
        self._flush()

    def _end_coalescing(self, device=None):
        self._flush()
        return self._work([])

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing
