"""ctx.ccl: the collectives' host calls. Each call checks its tensors, finds (or, the first time, builds)
the plan for its (collective, shapes, dtype, op, config) and launches one kernel. Calls over a subset
group go to group_kernel.py's kernel instead, which allocates nothing on the heap (see _plan_group).

A plan holds the heap workspace (staging buffers and flags), this rank's epoch counters and a
Launcher of the compiled kernel with its grid and argument tuple, so a repeated call costs a cache
lookup and a direct launch, and a call repeated on the same tensors replays a one-kernel CUDA graph
(iris/launch.py: about 3 us of host time where a launch costs 11). Building a plan allocates on the heap and ends with a barrier, so the
FIRST call of a new (collective, shape, dtype, op, config) is collective on all ranks and must run
outside CUDA graph capture (all_reduce_preamble builds one ahead of time). Later calls synchronise on
the device only and can be captured and replayed.
"""
from __future__ import annotations

import weakref

import torch

from ..allocators.offsets import round_up
from ..errors import IrisError
from ..host_collectives import group_ranks
from ..launch import Launcher
from .config import Config, ReduceOp
from .group_kernel import group_kernel
from .kernels import pull_kernel, push_kernel, two_shot_kernel

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)
_DEFAULT = Config()
_NAMES = {"ar": "all_reduce", "ag": "all_gather", "rs": "reduce_scatter", "a2a": "all_to_all", "bc": "broadcast"}
_KiB, _MiB = 1 << 10, 1 << 20


class CollectiveError(IrisError, ValueError):
    """A collective was called with tensors it cannot take; nothing was allocated or launched."""


def _pow2(x: int) -> int:
    return 1 << max(1, (x - 1).bit_length())


class _Plan:
    """One collective at one shape: its workspace, its argument tuple, and a Launcher per alignment of the
    user's tensors (and per value of the constexprs at flag_at: for two-shot, the heap residence of inp
    and out; for a group, whether out overlaps inp)."""
    __slots__ = ("fn", "grid", "args", "warps", "launchers", "workspace", "variant", "flag_at")

    def __init__(self, fn, grid, args, num_warps, workspace, variant, flag_at=None):
        self.fn, self.grid, self.args, self.warps = fn, grid, list(args), num_warps
        self.launchers = {}
        self.workspace, self.variant, self.flag_at = workspace, variant, flag_at

    def __call__(self, out, inp, flags=()):
        a = self.args
        a[0], a[1] = inp, out
        if flags:
            a[self.flag_at:self.flag_at + len(flags)] = flags
        key = (inp.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0, flags)
        launcher = self.launchers.get(key)
        if launcher is None:
            launcher = self.launchers[key] = Launcher(self.fn, self.grid, num_warps=self.warps)
        if key[0]:
            launcher.launch_trusted(a, (inp.data_ptr(), out.data_ptr()))
        else:
            launcher(*a)


class CCL:
    """Collectives over the heap, as ctx.ccl. Every call is collective: all ranks (of the group), same
    order, same sizes; the first call of a new shape over every rank allocates its workspace on the
    heap (collectively) and must not be inside CUDA graph capture. Tensors need not be heap tensors:
    inputs are staged through the workspace, except over a subset group (group=), where inp must be a
    heap tensor and nothing is allocated on the heap. Calls are ordered on the current stream like
    any kernel; async_op is accepted for Iris compatibility and changes nothing (nothing waits on the
    host)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.plans = {}
        self._last_ar = None
        self._groups = {}   # group (or tuple of ranks) -> its ranks, or None for every rank in order
        self._members = {}  # a group's ranks -> int64 device tensor of its ranks, then their heap bases
        self._seen = None   # signals waited for, per (program, source rank): the group kernel's own counts
        self._lo = ctx.heap.bases[ctx.rank]
        self._hi = self._lo + ctx.heap.size
        if ctx.device.type == "cuda":
            self.sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
        else:
            self.sms = 4

    # -- public calls ------------------------------------------------------
    def all_reduce_preamble(self, out, inp, config=None, workspace=None, op=ReduceOp.SUM):
        """Builds (collectively) what all_reduce(out, inp) needs, so the first real call can be captured
        in a CUDA graph. Returns the plan; passing it back as workspace= is optional. Collective: all
        ranks, same order, same sizes."""
        key = ("ar", op, inp.shape, out.shape, inp.dtype, config)
        if key not in self.plans:
            self.plans[key] = self._plan_all_reduce(out, inp, ReduceOp(op), config or _DEFAULT)
        return self.plans[key]

    def all_reduce(self, out, inp, op=ReduceOp.SUM, group=None, async_op=False, config=None, workspace=None):
        """out = inp reduced (sum, max or min) over all ranks (of group); out may be inp. Shapes (M, N) or
        any, equal; fp32, bf16, fp16, int32, int64. Floats accumulate in fp32 in rank order (group
        order for a group), so every rank gets bit-identical results. one_shot (each rank reads every
        peer's staged copy) up to Config.one_shot_max_bytes, two_shot_push above (every rank stores each
        peer's chunk of its input into that peer's stage, reduces its own chunk, stores the result into
        every peer; an out on the heap is written directly and must then be the same heap tensor on every
        rank); the pull-based "two_shot" stays selectable through config. group: None, a
        torch.distributed group or a list of global ranks; over a subset inp must be a heap tensor (see
        docs/collectives.md). workspace= is accepted for Iris compatibility: plans are found by shape,
        so all_reduce_preamble's result need not be passed. Collective: all ranks, same order, same
        sizes."""
        if group is not None:
            ranks = self._group(group, "all_reduce")[0]
            if ranks is not None:
                self._run_group("ar", out, inp, ranks, config, tuple(inp.shape), ReduceOp(op))
                return
        m = self._last_ar  # the previous call's tensors: the common loop repeats them (a cheaper check)
        if (m is not None and m[0]() is inp and m[1]() is out and m[2] is op and m[3] is config
                and m[4] == inp.data_ptr() and m[5] == out.data_ptr() and m[6] == inp.numel() == out.numel()):
            plan = m[7]
        else:
            key = ("ar", op, inp.shape, out.shape, inp.dtype, config)
            plan = self.plans.get(key)
            if plan is None or inp.device != self.ctx.device or out.dtype != inp.dtype:
                plan = self.plans[key] = self._plan_all_reduce(out, inp, ReduceOp(op), config or _DEFAULT)
            self._check_layout(out, inp)
            self._last_ar = (weakref.ref(inp), weakref.ref(out), op, config, inp.data_ptr(), out.data_ptr(),
                             inp.numel(), plan)
        if plan.variant == "two_shot":
            plan(out, inp, (self._on_heap(inp), self._on_heap(out)))
        else:
            plan(out, inp)

    def all_gather(self, out, inp, group=None, async_op=False, config=None):
        """out (world*M, N) = every rank's inp (M, N), rank r's at rows [r*M, (r+1)*M); over a group,
        world is the group's size and r a rank's position in it (torch's layout). Collective: all ranks
        (of the group), same order, same sizes."""
        ranks, w = self._group(group, "all_gather")
        self._run("ag", out, inp, ranks, config, (w * inp.shape[0],) + tuple(inp.shape[1:]) if inp.dim() else None)

    def reduce_scatter(self, out, inp, op=ReduceOp.SUM, group=None, async_op=False, config=None):
        """out (M, N) on rank r = rows [r*M, (r+1)*M) of inp (world*M, N) reduced over all ranks (torch's
        reduce_scatter_tensor layout; over a group, world is its size and r a rank's position in it).
        Collective: all ranks (of the group), same order, same sizes."""
        ranks, w = self._group(group, "reduce_scatter")
        want = (inp.shape[0] // w,) + tuple(inp.shape[1:]) if inp.dim() else None
        if inp.dim() and inp.shape[0] % w:
            raise CollectiveError(f"reduce_scatter: inp's first dimension {inp.shape[0]} is not a multiple of "
                                  f"the {w} ranks; pad it to {round_up(inp.shape[0], w)}")
        self._run("rs", out, inp, ranks, config, want, ReduceOp(op))

    def all_to_all(self, out, inp, group=None, async_op=False, config=None):
        """inp and out (M, N*world): columns [r*N, (r+1)*N) of inp go to rank r, and out's columns
        [r*N, (r+1)*N) come from rank r (over a group: world its size, r a position in it). Collective:
        all ranks (of the group), same order, same sizes."""
        ranks, w = self._group(group, "all_to_all")
        if inp.dim() != 2 or inp.shape[1] % w:
            raise CollectiveError(f"all_to_all: inp must be 2-D (M, N*world) with N*world a multiple of "
                                  f"{w}; got shape {tuple(inp.shape)}")
        self._run("a2a", out, inp, ranks, config, tuple(inp.shape))

    def broadcast(self, out, inp=None, src=0, group=None, async_op=False, config=None):
        """out = rank src's inp on every rank (inp is read on src only; out may be inp). src is a global
        rank, also with a group (as torch.distributed.broadcast). Iris's form, broadcast(tensor, src=0,
        ...), is in place, and its src is a position in the group. Collective: all ranks (of the group),
        same order, same sizes."""
        ranks = self._group(group, "broadcast")[0]
        if not isinstance(inp, torch.Tensor):  # Iris's form
            from .rooted import broadcast
            broadcast(self, out, inp, src, group, config)
            return
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self.ctx.world:
            raise CollectiveError(f"broadcast: src must be a rank in [0, {self.ctx.world}), got {src!r}")
        if ranks is not None and src not in ranks:
            raise CollectiveError(f"broadcast: src {src} is not in the group of ranks {list(ranks)}; src is a "
                                  "global rank, as in torch.distributed.broadcast")
        self._run("bc", out, inp, ranks, config, tuple(inp.shape), src=src)

    def free(self) -> None:
        """Gives every workspace back to the heap (the next call of each shape builds it again).
        Collective: all ranks, at the same point of their calls."""
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)
        for plan in {id(p): p for p in self.plans.values()}.values():
            for t in plan.workspace:
                if self.ctx.is_symmetric(t):
                    self.ctx.free(t)
        self.plans, self._last_ar = {}, None

    def forget(self) -> None:
        """Drop every plan without freeing its workspace (the context is closing): a later call builds
        its plan again, which raises ContextClosed."""
        self.plans, self._last_ar = {}, None

    def reduce(self, out, inp=None, dst=0, op=None, group=None, async_op=False, config=None):
        """out on the rank at group position dst = every member's inp combined by op (None: sum; SUM, MAX,
        MIN), in group order, floats in fp32; other ranks' out is not written. inp=None reduces out in
        place (Iris's tests call reduce(tensor, dst=...)); else out is inp or apart from it. inp: a heap
        tensor, the same allocation on every member (dst reads it in place); out: any tensor of inp's
        shape. Collective: all ranks (of the group), same order, same sizes."""
        from .rooted import reduce
        reduce(self, out, inp, dst, op, group, config)

    def scatter(self, out, inp, src=0, group=None, async_op=False, config=None):
        """out (M, ...) on the rank at group position i = rows [i*M, (i+1)*M) of inp (g*M, ...) on the
        rank at position src. inp: a heap tensor of that shape on every member (the members read src's
        in place; only src's contents matter); out: any tensor, or inp's own chunk i. Collective: all
        ranks (of the group), same order, same sizes."""
        from .rooted import scatter
        scatter(self, out, inp, src, group, config)

    def gather(self, out, inp, dst=0, group=None, async_op=False, config=None):
        """out (g*M, ...) on the rank at group position dst = every member's inp (M, ...), position i's at
        rows [i*M, (i+1)*M); other ranks' out is not written. inp: a heap tensor, the same allocation
        on every member (dst reads it in place), apart from out; out: any tensor of that shape on every
        member. Collective: all ranks (of the group), same order, same sizes."""
        from .rooted import gather
        gather(self, out, inp, dst, group, config)

    def send(self, tensor, dst, group=None, tag=0, config=None):
        """Stores tensor into the copy of it on the rank at group position dst, which must call
        recv(tensor, src=<this rank's position>) as its matching call. tensor: a heap tensor, the same
        allocation on both ranks. Pairs by call order, not tag (accepted for Iris). Collective over the
        pair: this rank and dst, same order, same sizes."""
        from .p2p import send
        send(self, tensor, dst, group, config)

    def recv(self, tensor, src, group=None, tag=0, config=None):
        """Receives into tensor (a heap tensor, the same allocation on both ranks) what the rank at group
        position src sends with its matching send(tensor, dst=<this rank's position>). Collective over
        the pair: this rank and src, same order, same sizes."""
        from .p2p import recv
        recv(self, tensor, src, group, config)

    def sendrecv(self, send_tensor, recv_tensor, dst, src, group=None, tag=0, config=None):
        """Sends send_tensor (any tensor) into recv_tensor (a heap tensor, the same allocation on every
        rank involved) of the rank at group position dst, and receives src's into this rank's
        recv_tensor. Every rank named as a dst or src makes its own sendrecv (a ring or any
        permutation). Collective over those ranks: same order, same sizes."""
        from .p2p import sendrecv
        sendrecv(self, send_tensor, recv_tensor, dst, src, group, config)

    def barrier(self, group=None):
        """Every rank of group (None: all) waits on the device until all reached it, in stream order:
        no host round trip, capturable in a CUDA graph. Collective: all ranks (of the group), same
        order."""
        from .p2p import barrier
        barrier(self, group)

    # -- plans -------------------------------------------------------------
    def _run(self, mode, out, inp, ranks, config, want, op=ReduceOp.SUM, src=0):
        if ranks is not None:
            self._run_group(mode, out, inp, ranks, config, want, op, src)
            return
        key = (mode, op, inp.shape, out.shape, inp.dtype, config, src)
        plan = self.plans.get(key)
        if plan is None or inp.device != self.ctx.device or out.dtype != inp.dtype:
            self._check(mode, out, inp, want)
            plan = self.plans[key] = self._plan_pull(mode, out, inp, op, config or _DEFAULT, src)
        self._check_layout(out, inp)
        plan(out, inp)

    def _run_group(self, mode, out, inp, ranks, config, want, op=ReduceOp.SUM, src=0):
        key = ("group", mode, ranks, op, inp.shape, out.shape, inp.dtype, config, src)
        plan = self.plans.get(key)
        if plan is None or inp.device != self.ctx.device or out.dtype != inp.dtype:
            self._check(mode, out, inp, want, len(ranks))
            plan = None
        self._check_layout(out, inp)
        self._check_heap_inp(mode, inp, ranks)
        o, i = out.data_ptr(), inp.data_ptr()
        staged = o < i + inp.nbytes and i < o + out.nbytes  # in place: results wait in scratch (see group_kernel)
        if staged and mode == "ag" and len(ranks) > 1:
            raise CollectiveError(f"all_gather(group= of ranks {list(ranks)}) cannot run in place: the peers read inp "
                                  "at their own heap offset, and inp inside out sits at another offset on every rank; "
                                  "pass a separate heap inp")
        if plan is None:
            plan = self.plans[key] = self._plan_group(mode, out, inp, ranks, op, config or _DEFAULT, src)
        if staged and not plan.workspace:
            self._ready("the first in-place call of a group collective at a new shape allocates a scratch tensor",
                        "call it once in place")
            plan.workspace = (torch.empty_like(out),)
        plan.args[2] = plan.workspace[0] if staged else out
        plan(out, inp, (staged,))

    def _check(self, call, out, inp, want, ranks=None) -> None:
        """Every argument error, raised before anything is allocated."""
        for name, t in (("out", out), ("inp", inp)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{call}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.device != self.ctx.device:
                raise CollectiveError(f"{call}: {name} is on {t.device} but this rank's heap is on "
                                      f"{self.ctx.device}; move it there first")
            if t.dtype not in DTYPES:
                raise CollectiveError(f"{call}: dtype {t.dtype} is not supported; use one of "
                                      f"{', '.join(str(d) for d in DTYPES)}")
        if out.dtype != inp.dtype:
            raise CollectiveError(f"{call}: out is {out.dtype} but inp is {inp.dtype}; they must match")
        if want is None:
            raise CollectiveError(f"{call}: inp must have at least one dimension (rows are exchanged); "
                                  f"got a 0-d tensor, use inp.reshape(1)")
        if tuple(out.shape) != tuple(want):
            raise CollectiveError(f"{call}: out has shape {tuple(out.shape)}, expected {tuple(want)} for inp of "
                                  f"shape {tuple(inp.shape)} on {ranks or self.ctx.world} ranks")
        if inp.numel() == 0:
            raise CollectiveError(f"{call}: inp has no elements; there is nothing to exchange")
        self._check_layout(out, inp)

    @staticmethod
    def _check_layout(out, inp) -> None:
        if not (out.is_contiguous() and inp.is_contiguous()):
            raise CollectiveError("collectives need contiguous out and inp; call .contiguous() first")

    def _check_heap_inp(self, call, inp, ranks) -> None:
        if not (self._lo <= inp.data_ptr() and inp.data_ptr() + inp.nbytes <= self._hi):
            raise CollectiveError(
                f"{_NAMES[call]}(group= of ranks {list(ranks)}): inp must be a heap tensor, the same collective "
                "allocation on every rank: a group's peers read it in place (a workspace cannot be allocated, heap "
                "allocation is collective over all ranks); allocate inp with ctx.empty/ctx.zeros or import it with "
                "ctx.as_symmetric (collective), out may be any tensor")

    def _group(self, group, call):
        """(None, world) for group=None or every rank in order (the whole-job path); else (the group's
        global ranks, checked, as a tuple; their count)."""
        if group is None:
            return None, self.ctx.world
        key = tuple(group) if isinstance(group, list) else group
        try:
            ranks = self._groups[key]
        except (KeyError, TypeError):
            ranks = self._group_ranks(group, call)
            try:
                self._groups[key] = ranks
            except TypeError:  # an unhashable group: checked every call
                pass
        return ranks, self.ctx.world if ranks is None else len(ranks)

    def _group_ranks(self, group, call):
        ranks, w = group_ranks(group, call), self.ctx.world
        if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < w for r in ranks):
            raise CollectiveError(f"{call}: group= must hold global ranks in [0, {w}); got {ranks}")
        if len(set(ranks)) != len(ranks):
            raise CollectiveError(f"{call}: group= names a rank twice: {ranks}")
        if self.ctx.rank not in ranks:
            raise CollectiveError(f"{call}: rank {self.ctx.rank} is not in group= of ranks {ranks}; only the "
                                  "group's ranks make its calls")
        return None if ranks == list(range(w)) else tuple(ranks)

    def _on_heap(self, t) -> bool:
        return self._lo <= t.data_ptr() < self._hi

    def _plan_all_reduce(self, out, inp, op, config):
        self._check("all_reduce", out, inp, tuple(inp.shape))
        n, w = inp.numel(), self.ctx.world
        limit = config.one_shot_max_bytes or (4 * _MiB if w <= 2 else 256 * _KiB)
        variant = config.all_reduce_variant
        if variant == "auto":
            variant = "one_shot" if n * inp.element_size() <= limit or w == 1 else "two_shot_push"
        if variant == "one_shot":
            return self._plan_pull("ar", out, inp, op, config)
        self._ready()
        block, warps = self._block(config, inp), config.num_warps or 8
        if variant == "two_shot_push":  # measured best on 2x H200: 32 KiB of elements a step, 16 warps
            block, warps = config.block_size or max(16, (32 * _KiB) // inp.element_size()), config.num_warps or 16
        one = variant == "one_shot_push"  # one-shot push: every rank's whole input in every peer's stage
        chunk = round_up(n if one else -(-n // w), 16)
        programs, per = self._split(chunk, block, config)
        ctx = self.ctx
        stage = ctx.empty((2 if one else 1) * w * chunk, dtype=inp.dtype)
        gather = None if one else ctx.empty(w * chunk, dtype=inp.dtype)
        flags = ctx.zeros((1 if one else 2) * programs * w, dtype=torch.int64)
        counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
        ctx.barrier()  # every rank's flags are zero before any rank signals into them
        head = (inp, out, stage, gather if gather is not None else stage, flags, counters, ctx.get_heap_bases(), n,
                chunk, per)
        tail = (w, _pow2(w), op.value, inp.dtype.is_floating_point, False, False, block, config.spin_limit)
        workspace = (stage, flags, counters) if one else (stage, gather, flags, counters)
        # _Plan.variant "two_shot" makes all_reduce pass (inp, out on the heap) into the two constexprs at flag_at
        if variant == "two_shot":
            return _Plan(two_shot_kernel, (programs,), head + (ctx.rank,) + tail, warps, workspace, "two_shot", 15)
        args = head + (w * chunk if one else 0, ctx.rank) + tail + (not one,)
        return _Plan(push_kernel, (programs,), args, warps, workspace, "one_shot" if one else "two_shot", 16)

    def _plan_pull(self, mode, out, inp, op, config, src=0):
        self._ready()
        ctx, w = self.ctx, self.ctx.world
        n = out.numel() if mode == "rs" else inp.numel() // w if mode == "a2a" else inp.numel()
        chunks = w if mode in ("rs", "a2a") else 1
        block, warps = self._block(config, inp), config.num_warps or 8
        cs = round_up(n, 16)
        programs, per = self._split(n, block, config)
        stage = ctx.empty(2 * chunks * cs, dtype=inp.dtype)
        flags = ctx.zeros(programs * w, dtype=torch.int64)
        counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
        ctx.barrier()  # every rank's flags are zero before any rank signals into them
        cols = inp.shape[1] // w if mode == "a2a" else 1
        args = (inp, out, stage, flags, counters, ctx.get_heap_bases(), n, cs, per, chunks * cs, cols, ctx.rank, src,
                w, _pow2(w), mode, op.value, inp.dtype.is_floating_point, block, config.spin_limit)
        return _Plan(pull_kernel, (programs,), args, warps, (stage, flags, counters), "one_shot")

    def _plan_group(self, mode, out, inp, ranks, op, config, src):
        """The group kernel's plan: no heap workspace (ranks outside the group never call, and heap
        allocation is collective), only this rank's device tensors: the group's members and the
        kernel's seen counts, both built outside capture."""
        self._ready("the first call of a group collective at a new shape builds small device tensors",
                    "call it once")
        ctx, g = self.ctx, len(ranks)
        counters = ctx._group_counters
        if self._seen is None:
            self._seen = torch.zeros_like(counters)
        members = self._members.get(ranks)
        if members is None:
            bases = [ctx.heap.bases[r] for r in ranks]
            members = self._members[ranks] = torch.tensor(list(ranks) + bases, dtype=torch.int64, device=ctx.device)
        n = out.numel() if mode == "rs" else inp.numel() // g if mode == "a2a" else inp.numel()
        block = self._block(config, inp)
        programs, per = self._split(n, block, config, counters.shape[0])
        cols = inp.shape[1] // g if mode == "a2a" else 1
        me = ranks.index(ctx.rank)
        args = (inp, out, out, members, counters, self._seen, n, per, cols, me, ctx.rank,
                ranks.index(src) if mode == "bc" else 0, ctx.world, g, _pow2(g), mode, op.value,
                inp.dtype.is_floating_point, False, block, config.spin_limit)
        return _Plan(group_kernel, (programs,), args, config.num_warps or 8, (), "group", 18)

    def _split(self, n, block, config, cap=1 << 30):
        """(programs, elements per program): at most comm_sms (or an SM each) and cap programs, each a
        whole number of blocks, none empty."""
        programs = max(1, min(config.comm_sms or self.sms, -(-n // block), cap))
        per = round_up(-(-n // programs), block)
        return -(-n // per), per

    def _block(self, config, inp) -> int:
        return config.block_size or max(16, (16 * _KiB) // inp.element_size())

    def _ready(self, what="the first call of a collective at a new shape allocates its workspace "
                           "collectively", how="call it once (or all_reduce_preamble)") -> None:
        if self.ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise CollectiveError(f"{what} and cannot be captured; {how} before capturing the graph")


__all__ = ["CCL", "CollectiveError", "Config", "ReduceOp"]
