"""ctx.ccl: the collectives' host calls. Each call checks its tensors, finds (or, the first time, builds)
the plan for its (collective, shapes, dtype, op, config) and launches one kernel. Calls over a subset
group go to group_kernel.py's kernel instead, which allocates nothing on the heap (see _plan_group).

A plan holds the heap workspace (staging buffers and flags), this rank's epoch counters and a
Launcher of the compiled kernel with its grid and argument tuple, so a repeated call costs a cache
lookup and a direct launch, and a call repeated on the same tensors replays a one-kernel CUDA graph
(iris/ccl/launch.py: about 3 us of host time where a launch costs 11). Building a plan allocates on the heap and ends with a barrier, so the
FIRST call of a new (collective, shape, dtype, op, config) is collective on all ranks and must run
outside CUDA graph capture (all_reduce_preamble builds one ahead of time). Later calls synchronise on
the device only and can be captured and replayed.
"""
from __future__ import annotations

import importlib
import weakref
from typing import NamedTuple

import torch

from ..allocators.offsets import round_up
from ..errors import CollectiveError, GluonUnavailable
from ..distributed.host_collectives import group_ranks
from .launch import Launcher
from .config import Config, ConfigError, ReduceOp, checked
from .group_kernel import group_kernel
from .kernels import pull_kernel, push_kernel, two_shot_kernel
from .variants import (accumulate_kernel, gather_push_kernel, ring_gather_kernel, ring_kernel,
                       ring_reduce_scatter_kernel, tile_reduce_scatter_kernel)

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)
_NAMES = {"ar": "all_reduce", "ag": "all_gather", "rs": "reduce_scatter", "rst": "reduce_scatter", "a2a": "all_to_all",
          "bc": "broadcast"}
# the Config field that picks each collective's kernel, and the values its group kernel (group=) stands for
_VARIANT = {"ar": ("all_reduce_variant", ("auto", "one_shot")), "ag": ("all_gather_variant", ("pull",)),
            "rs": ("reduce_scatter_variant", ("two_shot",)), "a2a": ("all_to_all_variant", ("default",))}
_KiB, _MiB = 1 << 10, 1 << 20


class _Recent(NamedTuple):
    """The previous all_reduce call: the common loop repeats it, and a repeat skips the plan lookup."""
    inp: weakref.ref
    out: weakref.ref
    op: object
    key: tuple
    inp_ptr: int
    out_ptr: int
    numel: int
    plan: object


def _pow2(x: int) -> int:
    return 1 << max(1, (x - 1).bit_length())


def _chunk(mode, out, inp, world) -> int:
    """Elements each rank contributes per destination: its share of out (rs), one column block (a2a),
    else all of inp."""
    return out.numel() if mode == "rs" else inp.numel() // world if mode == "a2a" else inp.numel()


class _Plan:
    """One collective at one shape: its workspace, its kernel arguments (given by parameter name), and a
    Launcher per alignment of the user's tensors and per value of the constexprs named in `per_call`
    (set at each call: the heap residence of inp and out for some variants, overlap for a group)."""
    __slots__ = ("fn", "grid", "args", "options", "launchers", "workspace", "variant", "per_call", "at")

    def __init__(self, fn, grid, options, workspace, variant, per_call=(), **args):
        names = fn.arg_names
        missing = set(names) - set(args)
        if missing:
            raise TypeError(f"{fn.__name__}: no value for {sorted(missing)}")
        self.fn, self.grid, self.options = fn, grid, options
        self.args = [args[a] for a in names]
        self.launchers = {}
        self.workspace, self.variant = workspace, variant
        self.per_call = tuple(names.index(a) for a in per_call)
        self.at = {a: names.index(a) for a in names}

    def __call__(self, out, inp, flags=()):
        a = self.args
        a[0], a[1] = inp, out
        for i, v in zip(self.per_call, flags):
            a[i] = v
        key = (inp.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0, flags)
        launcher = self.launchers.get(key)
        if launcher is None:
            launcher = self.launchers[key] = Launcher(self.fn, self.grid, **self.options)
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
    host). config: an iris.ccl.Config (Iris's fields and iris's own; docs/collectives.md), read at
    every call, so a field changed between calls takes effect (and is validated) at the next."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.plans = {}
        self._last_ar = None
        self._groups = {}   # group (or tuple of ranks) -> its ranks, or None for every rank in order
        self._members = {}  # a group's ranks -> int64 device tensor of its ranks, then their heap bases
        self._seen = None   # signals waited for, per (program, source rank): the group kernel's own counts
        self.puts = getattr(ctx, "_ccl_puts", False)  # a job with indirect peers: put_kernel.py serves every call
        self._put_state = None  # put_kernel's counts in this rank's memory, built once
        self._warned = set()  # Config variants the put path stood in for, warned once
        self._lo = ctx.heap.bases[ctx.rank]
        self._hi = self._lo + ctx.heap.size
        if ctx.device.type == "cuda":
            self.sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
        else:
            self.sms = 4
        self._default = Config(comm_sms=self.sms)

    # -- public calls ------------------------------------------------------
    def all_reduce_preamble(self, out, inp, config=None, workspace=None, op=ReduceOp.SUM):
        """Builds (collectively) what all_reduce(out, inp) needs, so the first real call can be captured
        in a CUDA graph. Returns the plan; passing it back as workspace= is optional. Collective: all
        ranks, same order, same sizes."""
        cfg = self._config(config)
        key = ("ar", op, inp.shape, out.shape, inp.dtype, cfg.key())
        if key not in self.plans:
            self.plans[key] = self._plan_all_reduce(out, inp, ReduceOp(op), cfg)
        return self.plans[key]

    def all_reduce(self, out, inp, op=ReduceOp.SUM, group=None, async_op=False, config=None, workspace=None):
        """out = inp reduced (sum, max or min; None: sum, as Iris) over all ranks (of group); out may be
        inp. Shapes (M, N) or any, equal; fp32, bf16, fp16, int32, int64. Config.all_reduce_variant picks the algorithm:
        "one_shot" (each rank reads every peer's staged copy), "two_shot" (rank r reduces its share,
        Config.all_reduce_distribution, pulling it from every peer, then stores it into every peer),
        "one_shot_push" / "two_shot_push" (the same by remote stores only), "atomic" (every rank adds
        its input into every rank's accumulator with atomics; sum only), "spinlock" (the same under a
        lock per block; sum only), "ring" (reduce-scatter then all-gather around the ring), "auto"
        (the default: one_shot up to Config.one_shot_max_bytes, two_shot_push above). one_shot,
        two_shot and the push variants accumulate floats in fp32 in rank order, ring in ring order
        from each slice's rank, so every rank gets bit-identical results; atomic and spinlock add
        in arrival order (fp32 for floats). Where a variant writes out on the heap directly, out must
        be the same heap tensor on every rank. group: None, a torch.distributed group or a list of
        global ranks; over a subset inp must be a heap tensor and the variant "auto" or "one_shot"
        (see docs/collectives.md). workspace= is accepted for Iris compatibility: plans are found by
        shape, so all_reduce_preamble's result need not be passed. Collective: all ranks, same
        order, same sizes."""
        cfg = self._config(config)
        ck = cfg.key()
        if op is None:  # Iris's default
            op = ReduceOp.SUM
        if group is not None:
            ranks = self._group(group, "all_reduce")[0]
            if ranks is not None:
                self._run_group("ar", out, inp, ranks, cfg, tuple(inp.shape), ReduceOp(op))
                return
        m = self._last_ar
        if (m is not None and m.inp() is inp and m.out() is out and m.op is op and m.key is ck
                and m.inp_ptr == inp.data_ptr() and m.out_ptr == out.data_ptr()
                and m.numel == inp.numel() == out.numel()):
            plan = m.plan
        else:
            key = ("ar", op, inp.shape, out.shape, inp.dtype, ck)
            plan = self.plans.get(key)
            if plan is None or inp.device != self.ctx.device or out.dtype != inp.dtype:
                plan = self.plans[key] = self._plan_all_reduce(out, inp, ReduceOp(op), cfg)
            self._check_layout(out, inp)
            self._last_ar = _Recent(weakref.ref(inp), weakref.ref(out), op, ck, inp.data_ptr(), out.data_ptr(),
                                    inp.numel(), plan)
        if plan.per_call:
            plan(out, inp, (self._on_heap(inp), self._on_heap(out)))
        else:
            plan(out, inp)

    def all_gather_preamble(self, out, inp, config=None):
        """Builds (collectively) what all_gather(out, inp, config=config) needs, so the first real call
        can be captured in a CUDA graph. Returns the plan (None with use_gluon, which has none);
        passing it back as workspace= is optional. Collective: all ranks, same order, same sizes."""
        cfg = self._config(config)
        if cfg.use_gluon:
            return None
        return self._plan_for("ag", out, inp, cfg, self._gathered(inp, self.ctx.world))

    def all_gather(self, out, inp, group=None, async_op=False, config=None, workspace=None):
        """out (world*M, N) = every rank's inp (M, N), rank r's at rows [r*M, (r+1)*M); over a group,
        world is the group's size and r a rank's position in it (torch's layout).
        Config.all_gather_variant: "pull" (the default: each rank stages its inp, then reads every
        peer's), "persistent" (each program stores its range of inp into every rank), "partitioned"
        (the programs are split evenly by destination rank; comm_sms a multiple of world), "ring"
        (world - 1 hops around rank -> rank + 1, each passing one chunk on); with use_gluon=True,
        iris.ccl.gluon's kernel. workspace= is accepted for Iris compatibility (plans are found by
        shape). Collective: all ranks (of the group), same order, same sizes."""
        cfg = self._config(config)
        if cfg.use_gluon and self._gluon_or_puts("all_gather"):
            self._gluon("all_gather", out, inp, cfg)
            return
        ranks, w = self._group(group, "all_gather")
        self._run("ag", out, inp, ranks, cfg, self._gathered(inp, w))

    def reduce_scatter(self, out, inp, op=ReduceOp.SUM, group=None, async_op=False, config=None, workspace=None):
        """Two layouts. torch's reduce_scatter_tensor: out (M, N) on rank r = rows [r*M, (r+1)*M) of inp
        (world*M, N) reduced over all ranks (over a group, world is its size and r a rank's position in
        it). Iris's: out shaped as inp (M, N), 2-D, every rank: rank r's tiles of out (block_size_m x
        block_size_n tiles in Iris's order, swizzle_size tile rows per group, dealt to the ranks by
        Config.all_reduce_distribution: 0 round robin, 1 a contiguous run each) get those tiles of inp
        reduced over all ranks; out's other elements are left as they were. Config.reduce_scatter_variant:
        "two_shot" (each rank stages its input, then reduces its own part by reading it from every
        peer) or "ring_chunked" (each part travels the ring rank -> rank + 1, every rank adding its
        input, and ends at its owner; either layout, whole job only). workspace= is accepted for Iris
        compatibility (plans are found by shape). Collective: all ranks (of the group), same order,
        same sizes."""
        cfg = self._config(config)
        op = ReduceOp.SUM if op is None else op
        if cfg.use_gluon:
            raise ConfigError("reduce_scatter has no Gluon kernel (Config.use_gluon=True); set use_gluon=False")
        ranks, w = self._group(group, "reduce_scatter")
        if w > 1 and inp.dim() == 2 and tuple(out.shape) == tuple(inp.shape):
            if ranks is not None:
                raise CollectiveError(f"reduce_scatter(group= of ranks {list(ranks)}): Iris's layout (out shaped as "
                                      "inp) runs over every rank only; use torch's layout (out with 1/world of "
                                      "inp's rows) over a group")
            self._run("rst", out, inp, None, cfg, tuple(inp.shape), ReduceOp(op))
            return
        want = (inp.shape[0] // w,) + tuple(inp.shape[1:]) if inp.dim() else None
        if inp.dim() and inp.shape[0] % w:
            raise CollectiveError(f"reduce_scatter: inp's first dimension {inp.shape[0]} is not a multiple of "
                                  f"the {w} ranks; pad it to {round_up(inp.shape[0], w)}")
        self._run("rs", out, inp, ranks, cfg, want, ReduceOp(op))

    def all_to_all(self, out, inp, group=None, async_op=False, config=None):
        """inp and out (M, N*world): columns [r*N, (r+1)*N) of inp go to rank r, and out's columns
        [r*N, (r+1)*N) come from rank r (over a group: world its size, r a position in it).
        Config.all_to_all_variant "default": each rank stages its inp, then reads its columns from
        every peer; with use_gluon=True, iris.ccl.gluon's kernel. Collective: all ranks (of the
        group), same order, same sizes."""
        cfg = self._config(config)
        if cfg.use_gluon and self._gluon_or_puts("all_to_all"):
            self._gluon("all_to_all", out, inp, cfg)
            return
        ranks, w = self._group(group, "all_to_all")
        if inp.dim() != 2 or inp.shape[1] % w:
            raise CollectiveError(f"all_to_all: inp must be 2-D (M, N*world) with N*world a multiple of "
                                  f"{w}; got shape {tuple(inp.shape)}")
        self._run("a2a", out, inp, ranks, cfg, tuple(inp.shape))

    def broadcast(self, out, inp=None, src=0, group=None, async_op=False, config=None):
        """out = rank src's inp on every rank (inp is read on src only; out may be inp). src is a global
        rank, also with a group (as torch.distributed.broadcast). Iris's form, broadcast(tensor, src=0,
        ...), is in place, and its src is a position in the group. Collective: all ranks (of the group),
        same order, same sizes."""
        cfg = self._config(config)
        if cfg.use_gluon:
            raise ConfigError("broadcast has no Gluon kernel here (Config.use_gluon=True); set use_gluon=False")
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
        self._run("bc", out, inp, ranks, cfg, tuple(inp.shape), src=src)

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

    def init_p2p(self, max_numel=2 ** 20, dtype=None, config=None):
        """A mailbox (iris.ccl.p2p.P2PState) for send/recv/isend/irecv(p2p_state=) of any tensors up to
        max_numel elements of dtype (default bfloat16). Collective: all ranks, same order, same sizes."""
        from .p2p import init_p2p
        return init_p2p(self.ctx, max_numel, dtype, config)

    def send(self, tensor, dst, group=None, tag=0, config=None, p2p_state=None):
        """Sends tensor to the rank at group position dst, which must call recv(..., src=<this rank's
        position>) as its matching call. Without p2p_state, tensor is a heap tensor (the same allocation
        on both ranks) stored into dst's copy; with a mailbox from init_p2p, any tensor. Pairs by call
        order; tag is accepted for Iris and not used. Collective over the pair: this rank and dst, same
        order, same sizes."""
        from .p2p import send
        send(self.ctx, tensor, dst, p2p_state, group, tag, config)

    def recv(self, tensor, src, group=None, tag=0, config=None, p2p_state=None):
        """Receives into tensor what the rank at group position src sends with its matching send:
        tensor a heap tensor (the same allocation on both ranks), or with p2p_state any tensor.
        Collective over the pair: this rank and src, same order, same sizes."""
        from .p2p import recv
        recv(self.ctx, tensor, src, p2p_state, group, tag, config)

    def isend(self, tensor, dst, group=None, tag=0, config=None, p2p_state=None):
        """send, returning a work whose wait() blocks the host until it is done. Collective over the pair."""
        from .p2p import isend
        return isend(self.ctx, tensor, dst, p2p_state, group, tag, config)

    def irecv(self, tensor, src, group=None, tag=0, config=None, p2p_state=None):
        """recv, returning a work whose wait() blocks the host until it is done. Collective over the pair."""
        from .p2p import irecv
        return irecv(self.ctx, tensor, src, p2p_state, group, tag, config)

    def batch_isend_irecv(self, p2p_op_list, p2p_state=None):
        """Every iris.ccl.p2p.P2POp's send, then every recv, each in list order (Iris's order); one work
        each. Collective over each transfer's pair, as send and recv."""
        from .p2p import batch_isend_irecv
        return batch_isend_irecv(self.ctx, p2p_op_list, p2p_state)

    def sendrecv(self, send_tensor, recv_tensor, dst, src, group=None, tag=0, config=None):
        """Sends send_tensor (any tensor) into recv_tensor (a heap tensor, the same allocation on every
        rank involved) of the rank at group position dst, and receives src's into this rank's
        recv_tensor. Every rank named as a dst or src makes its own sendrecv (a ring or any
        permutation). Collective over those ranks: same order, same sizes."""
        from .p2p import sendrecv
        sendrecv(self.ctx, send_tensor, recv_tensor, dst, src, group, tag, config)

    def barrier(self, group=None):
        """Every rank of group (None: all) waits on the device until all reached it, in stream order:
        no host round trip, capturable in a CUDA graph. Collective: all ranks (of the group), same
        order."""
        from .p2p import barrier
        barrier(self.ctx, group)

    # -- plans -------------------------------------------------------------
    def _gluon_or_puts(self, call) -> bool:
        """Whether Config(use_gluon=True) runs its Gluon kernel: not where the put path serves (warned once)."""
        if self.puts:
            from .puts import warn_variant
            warn_variant(self, call, "use_gluon", True)
        return not self.puts

    def _plan_puts(self, kind, out, inp, ranks, op, cfg, root=0, whole=False):
        """put_kernel's plan for one call shape (iris/ccl/puts.py)."""
        from .puts import knobs, plan_args, put_kernel
        programs, warps, workspace, args = plan_args(self, kind, out, inp, ranks, knobs(cfg), op.value, root, cfg=cfg,
                                                     whole=whole)
        return _Plan(put_kernel, (programs,), self._options(cfg, warps), workspace, "put", **args)

    def _config(self, config) -> Config:
        """config, or this context's default, validated as it stands now (Config.key() checks it)."""
        return checked(self._default if config is None else config)

    def _gluon(self, call, out, inp, cfg):
        """Config(use_gluon=True): iris.ccl.gluon's kernel, imported on first use."""
        why = None
        if self.ctx.device.type != "cuda":
            why = f"this rank's heap is on {self.ctx.device}: Gluon kernels need a GPU (Gluon has no interpreter)"
        else:
            try:
                module = importlib.import_module(__package__ + ".gluon")
            except ImportError as e:
                why = (f"iris.ccl.gluon cannot be imported ({e}): Gluon kernels need a GPU and a Triton with "
                       "triton.experimental.gluon")
        if why:
            raise GluonUnavailable(f"{call}(config=Config(use_gluon=True)): {why}; set use_gluon=False to run "
                                   "iris's Triton kernels")
        getattr(module, call)(self.ctx, out, inp, cfg)

    def _run(self, mode, out, inp, ranks, cfg, want, op=ReduceOp.SUM, src=0):
        if ranks is not None:
            self._run_group(mode, out, inp, ranks, cfg, want, op, src)
            return
        plan = self._plan_for(mode, out, inp, cfg, want, op, src)
        self._check_layout(out, inp)
        if plan.per_call:
            plan(out, inp, (self._on_heap(out),))
        else:
            plan(out, inp)

    def _plan_for(self, mode, out, inp, cfg, want, op=ReduceOp.SUM, src=0):
        """The whole-job plan of this call, built (collectively, checked first) the first time."""
        key = (mode, op, inp.shape, out.shape, inp.dtype, cfg.key(), src)
        plan = self.plans.get(key)
        if plan is None or inp.device != self.ctx.device or out.dtype != inp.dtype:
            self._check(mode, out, inp, want)
            cfg.validate(self.ctx.world)
            if self.puts:
                from .puts import warn_variant
                if mode == "ag" and cfg.all_gather_variant != "pull":
                    warn_variant(self, "all_gather", "all_gather_variant", cfg.all_gather_variant)
                elif mode in ("rs", "rst") and cfg.reduce_scatter_variant == "ring_chunked":
                    warn_variant(self, "reduce_scatter", "reduce_scatter_variant", cfg.reduce_scatter_variant)
                plan = self._plan_puts(mode, out, inp, None, op, cfg, src, whole=True)
            elif mode == "ag" and cfg.all_gather_variant == "ring":
                plan = self._plan_ring_gather(out, inp, cfg)
            elif mode == "ag" and cfg.all_gather_variant != "pull":
                plan = self._plan_gather_push(out, inp, cfg)
            elif mode in ("rs", "rst") and cfg.reduce_scatter_variant == "ring_chunked":
                plan = self._plan_ring_reduce_scatter(out, inp, op, cfg, mode == "rst")
            elif mode == "rst":
                plan = self._plan_tile_reduce_scatter(out, inp, op, cfg)
            else:
                plan = self._plan_pull(mode, out, inp, op, cfg, src)
            self.plans[key] = plan
        return plan

    @staticmethod
    def _gathered(inp, w):
        """all_gather's out shape for inp over w ranks (None for a 0-d inp, which _check refuses)."""
        return (w * inp.shape[0],) + tuple(inp.shape[1:]) if inp.dim() else None

    def _run_group(self, mode, out, inp, ranks, cfg, want, op=ReduceOp.SUM, src=0):
        key = ("group", mode, ranks, op, inp.shape, out.shape, inp.dtype, cfg.key(), src)
        plan = self.plans.get(key)
        if plan is None or inp.device != self.ctx.device or out.dtype != inp.dtype:
            self._check(mode, out, inp, want, len(ranks))
            field, kernels = _VARIANT.get(mode, (None, ()))
            if field and getattr(cfg, field) not in kernels:
                raise ConfigError(f"{_NAMES[mode]}(group= of ranks {list(ranks)}): over a subset of the ranks one "
                                  f"kernel reads the peers' inp in place; Config.{field}={getattr(cfg, field)!r} "
                                  f"is not available there, use {' or '.join(map(repr, kernels))}")
            plan = None
        self._check_layout(out, inp)
        self._check_heap_inp(mode, inp, ranks)
        o, i = out.data_ptr(), inp.data_ptr()
        staged = o < i + inp.nbytes and i < o + out.nbytes  # in place: results wait in scratch (see group_kernel)
        if staged and mode == "ag" and len(ranks) > 1:
            raise CollectiveError(f"all_gather(group= of ranks {list(ranks)}) cannot run in place: the peers read inp "
                                  "at their own heap offset, and inp inside out sits at another offset on every rank; "
                                  "pass a separate heap inp")
        if self.puts:  # peers receive puts: nothing reads inp in place, so in place needs no scratch
            if plan is None:
                plan = self.plans[key] = self._plan_puts(mode, out, inp, ranks, op, cfg,
                                                         ranks.index(src) if mode == "bc" else 0)
            plan(out, inp)
            return
        if plan is None:
            plan = self.plans[key] = self._plan_group(mode, out, inp, ranks, op, cfg, src)
        if staged and not plan.workspace:
            self._ready("the first in-place call of a group collective at a new shape allocates a scratch tensor",
                        "call it once in place")
            plan.workspace = (torch.empty_like(out),)
        plan.args[plan.at["scratch"]] = plan.workspace[0] if staged else out
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

    def _plan_all_reduce(self, out, inp, op, cfg):
        self._check("all_reduce", out, inp, tuple(inp.shape))
        cfg.validate(self.ctx.world)
        if cfg.use_gluon:
            raise ConfigError("all_reduce has no Gluon kernel (Config.use_gluon=True); set use_gluon=False")
        n, w = inp.numel(), self.ctx.world
        limit = cfg.one_shot_max_bytes or (4 * _MiB if w <= 2 else 256 * _KiB)
        auto = "one_shot" if n * inp.element_size() <= limit or w == 1 else "two_shot_push"
        variant = auto if cfg.all_reduce_variant == "auto" else cfg.all_reduce_variant
        if variant in ("atomic", "spinlock") and op != ReduceOp.SUM:
            raise CollectiveError(f"all_reduce: Config.all_reduce_variant={variant!r} adds into a zeroed buffer, so "
                                  f"it reduces with sum only, not {op.value}; pick 'one_shot', 'two_shot', 'ring' or "
                                  "'auto'")
        if self.puts:
            from .puts import all_reduce_kind
            return self._plan_puts(all_reduce_kind(self, variant, auto), out, inp, None, op, cfg, whole=True)
        self._ready()
        if variant == "one_shot":
            return self._plan_pull("ar", out, inp, op, cfg)
        if variant in ("atomic", "spinlock"):
            return self._plan_accumulate(out, inp, cfg, variant == "spinlock")
        if variant == "ring":
            return self._plan_ring(out, inp, op, cfg)
        return self._plan_shots(out, inp, op, cfg, variant)

    def _plan_shots(self, out, inp, op, cfg, variant):
        """two_shot (pull, then push), one_shot_push and two_shot_push."""
        ctx, n, w = self.ctx, inp.numel(), self.ctx.world
        block, warps = self._block(cfg, inp), cfg.num_warps or 8
        if variant == "two_shot_push":  # benchmarks/collectives.py --variants: 32 KiB of elements a step, 16 warps
            block, warps = cfg.block_size or max(16, (32 * _KiB) // inp.element_size()), cfg.num_warps or 16
        one = variant == "one_shot_push"  # one-shot push: every rank's whole input in every peer's stage
        strided = variant == "two_shot" and cfg.all_reduce_distribution == 0
        if strided:  # whole blocks dealt round robin: a rank's share is a whole number of blocks
            chunk = -(-(-(-n // block)) // w) * block
        else:
            chunk = round_up(n if one else -(-n // w), 16)
        programs, per = self._split(chunk, block, cfg)
        stage = ctx.empty((2 if one else 1) * w * chunk, dtype=inp.dtype)
        gather = stage if one else ctx.empty(w * chunk, dtype=inp.dtype)
        flags = ctx.zeros((1 if one else 2) * programs * w, dtype=torch.int64)
        counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
        ctx.barrier()  # every rank's flags are zero before any rank signals into them
        workspace = (stage, flags, counters) if one else (stage, gather, flags, counters)
        common = dict(inp=inp, out=out, stage=stage, gather=gather, flags=flags, counters=counters,
                      heap_bases=ctx.get_heap_bases(), n=n, chunk=chunk, per=per, rank=ctx.rank, WORLD=w,
                      PEERS=_pow2(w), OP=op.value, IS_FLOAT=inp.dtype.is_floating_point, IN_HEAP=False,
                      OUT_HEAP=False, BLOCK=block, SPIN=cfg.spin_limit)
        per_call = () if one else ("IN_HEAP", "OUT_HEAP")  # all_reduce passes where inp and out live
        opts = self._options(cfg, warps)
        if variant == "two_shot":
            return _Plan(two_shot_kernel, (programs,), opts, workspace, variant, per_call, STRIDED=strided, **common)
        return _Plan(push_kernel, (programs,), opts, workspace, variant, per_call,
                     parity_stride=w * chunk if one else 0, TWO_SHOT=not one, **common)

    def _plan_accumulate(self, out, inp, cfg, lock):
        """atomic and spinlock: a heap accumulator (fp32 for floats) that every rank adds into."""
        ctx, n, w = self.ctx, inp.numel(), self.ctx.world
        block = self._tile(cfg)
        programs, per = self._split(n, block, cfg)
        acc = ctx.empty(round_up(n, 16), dtype=torch.float32 if inp.dtype.is_floating_point else inp.dtype)
        locks = ctx.zeros(-(-n // block) if lock else 1, dtype=torch.int64)
        flags = ctx.zeros(3 * programs * w, dtype=torch.int64)
        counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
        ctx.barrier()  # every rank's flags and locks are zero before any rank touches them
        return _Plan(accumulate_kernel, (programs,), self._options(cfg, 8), (acc, locks, flags, counters),
                     "spinlock" if lock else "atomic", inp=inp, out=out, acc=acc, locks=locks, flags=flags,
                     counters=counters, heap_bases=ctx.get_heap_bases(), n=n, per=per, rank=ctx.rank, WORLD=w,
                     PEERS=_pow2(w), BLOCK=block, SPIN=cfg.spin_limit, LOCK=lock, TURNS=ctx.device.type != "cuda")

    def _plan_ring(self, out, inp, op, cfg):
        """ring: tiles of world slices; a slot of one slice and a 0/1 flag per program on every rank."""
        ctx, n, w = self.ctx, inp.numel(), self.ctx.world
        slice_ = max(1, 1 << ((self._tile(cfg) // w).bit_length() - 1)) if self._tile(cfg) >= w else 1
        tiles = -(-n // (slice_ * w))
        rings = cfg.all_reduce_num_rings
        programs = rings * max(1, min(cfg.comm_sms, tiles) // rings)
        buf = ctx.zeros(programs * slice_, dtype=torch.float32 if inp.dtype.is_floating_point else inp.dtype)
        flags = ctx.zeros(programs, dtype=torch.int64)
        ctx.barrier()  # every rank's flags are zero before any rank signals into them
        return _Plan(ring_kernel, (programs,), self._options(cfg, 8), (buf, flags), "ring", inp=inp, out=out,
                     buf=buf, flags=flags, heap_bases=ctx.get_heap_bases(), n=n, tiles=tiles, rank=ctx.rank,
                     WORLD=w, OP=op.value, IS_FLOAT=inp.dtype.is_floating_point, SLICE=slice_, RINGS=rings,
                     SPIN=cfg.spin_limit)

    def _plan_gather_push(self, out, inp, cfg):
        """all_gather persistent and partitioned: stores into the peers' out (a heap out) or stage."""
        self._ready()
        ctx, n, w = self.ctx, inp.numel(), self.ctx.world
        parted = cfg.all_gather_variant == "partitioned"
        block = self._block(cfg, inp)
        if parted:  # comm_sms // w programs per destination, each a range of inp
            parts, per = self._split(n, block, cfg, max(1, cfg.comm_sms // w))
            programs = parts * w
        else:
            programs, per = self._split(n, block, cfg)
        stage = ctx.empty(w * n, dtype=inp.dtype)
        flags = ctx.zeros(2 * programs * w, dtype=torch.int64)
        counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
        ctx.barrier()  # every rank's flags are zero before any rank signals into them
        return _Plan(gather_push_kernel, (programs,), self._options(cfg, 8), (stage, flags, counters),
                     cfg.all_gather_variant, ("OUT_HEAP",), inp=inp, out=out, stage=stage, flags=flags,
                     counters=counters, heap_bases=ctx.get_heap_bases(), n=n, per=per, rank=ctx.rank, WORLD=w,
                     PEERS=_pow2(w), BLOCK=block, SPIN=cfg.spin_limit, OUT_HEAP=False, PARTITIONED=parted)

    def _plan_ring_gather(self, out, inp, cfg):
        """all_gather ring: a slot of inp's size and a 0/1 flag per program on every rank."""
        self._ready()
        ctx, n = self.ctx, inp.numel()
        block = self._block(cfg, inp)
        programs = max(1, min(cfg.comm_sms, -(-n // block)))
        slot = ctx.empty(round_up(n, 16), dtype=inp.dtype)
        flags = ctx.zeros(programs, dtype=torch.int64)
        ctx.barrier()  # every rank's flags are zero before any rank hands over into them
        return _Plan(ring_gather_kernel, (programs,), self._options(cfg, 8), (slot, flags), "ring", inp=inp,
                     out=out, slot=slot, flags=flags, heap_bases=ctx.get_heap_bases(), n=n, rank=ctx.rank,
                     WORLD=ctx.world, BLOCK=block, SPIN=cfg.spin_limit)

    def _plan_ring_reduce_scatter(self, out, inp, op, cfg, tiled):
        """reduce_scatter ring_chunked: units of a rank's part (Iris's tiles of its share, or blocks of
        its rows), a slot of one part (fp32 for floats) and a 0/1 flag per program on every rank, and a
        local buffer of partials for more than two ranks."""
        self._ready()
        ctx, w, n = self.ctx, self.ctx.world, out.numel()
        if tiled:
            (m, cols), bm, bn, group = inp.shape, cfg.block_size_m, cfg.block_size_n, cfg.swizzle_size
            tiles = -(-m // bm) * -(-cols // bn)
            units = -(-tiles // w)
        else:
            m, cols, bm, bn, group = 1, n, 1, self._block(cfg, inp), 1
            tiles = units = -(-n // bn)
        programs = max(1, min(cfg.comm_sms, units))
        acc = torch.float32 if inp.dtype.is_floating_point else inp.dtype
        slot = ctx.empty(units * bm * bn, dtype=acc)
        part = torch.empty(units * bm * bn if w > 2 else 1, dtype=acc, device=ctx.device)
        flags = ctx.zeros(programs, dtype=torch.int64)
        ctx.barrier()  # every rank's flags are zero before any rank hands over into them
        return _Plan(ring_reduce_scatter_kernel, (programs,), self._options(cfg, 8), (slot, flags), "ring_chunked",
                     inp=inp, out=out, slot=slot, part=part, flags=flags, heap_bases=ctx.get_heap_bases(), n=n, M=m,
                     N=cols, tiles=tiles, units=units, rank=ctx.rank, WORLD=w, BM=bm, BN=bn, GROUP_M=group,
                     DIST=cfg.all_reduce_distribution, TILED=tiled, OP=op.value, SPIN=cfg.spin_limit)

    def _plan_tile_reduce_scatter(self, out, inp, op, cfg):
        """reduce_scatter in Iris's layout: Iris's tiles, a stage of inp in two copies (by epoch parity)."""
        self._ready()
        ctx, w = self.ctx, self.ctx.world
        (m, n), bm, bn = inp.shape, cfg.block_size_m, cfg.block_size_n
        tiles = -(-m // bm) * -(-n // bn)
        programs = max(1, min(cfg.comm_sms, -(-tiles // w)))
        cs = round_up(m * n, 16)
        stage = ctx.empty(2 * cs, dtype=inp.dtype)
        flags = ctx.zeros(programs * w, dtype=torch.int64)
        counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
        ctx.barrier()  # every rank's flags are zero before any rank signals into them
        return _Plan(tile_reduce_scatter_kernel, (programs,), self._options(cfg, 4), (stage, flags, counters),
                     "two_shot", inp=inp, out=out, stage=stage, flags=flags, counters=counters,
                     heap_bases=ctx.get_heap_bases(), M=m, N=n, tiles=tiles, parity_stride=cs, rank=ctx.rank,
                     WORLD=w, PEERS=_pow2(w), BM=bm, BN=bn, GROUP_M=cfg.swizzle_size,
                     DIST=cfg.all_reduce_distribution, OP=op.value, IS_FLOAT=inp.dtype.is_floating_point,
                     SPIN=cfg.spin_limit)

    def _plan_pull(self, mode, out, inp, op, cfg, src=0):
        self._ready()
        ctx, w = self.ctx, self.ctx.world
        n = _chunk(mode, out, inp, w)
        chunks = w if mode in ("rs", "a2a") else 1
        block = self._block(cfg, inp)
        cs = round_up(n, 16)
        programs, per = self._split(n, block, cfg)
        stage = ctx.empty(2 * chunks * cs, dtype=inp.dtype)
        flags = ctx.zeros(programs * w, dtype=torch.int64)
        counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
        ctx.barrier()  # every rank's flags are zero before any rank signals into them
        return _Plan(pull_kernel, (programs,), self._options(cfg, 8), (stage, flags, counters), "one_shot",
                     inp=inp, out=out, stage=stage, flags=flags, counters=counters, heap_bases=ctx.get_heap_bases(),
                     n=n, cs=cs, per=per, parity_stride=chunks * cs, cols=inp.shape[1] // w if mode == "a2a" else 1,
                     rank=ctx.rank, src=src, WORLD=w, PEERS=_pow2(w), MODE=mode, OP=op.value,
                     IS_FLOAT=inp.dtype.is_floating_point, BLOCK=block, SPIN=cfg.spin_limit)

    def _plan_group(self, mode, out, inp, ranks, op, cfg, src):
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
        n = _chunk(mode, out, inp, g)
        block = self._block(cfg, inp)
        programs, per = self._split(n, block, cfg, counters.shape[0])
        return _Plan(group_kernel, (programs,), self._options(cfg, 8), (), "group", ("STAGED",), inp=inp, out=out,
                     scratch=out, members=members, counters=counters, seen=self._seen, n=n, per=per,
                     cols=inp.shape[1] // g if mode == "a2a" else 1, me=ranks.index(ctx.rank), rank=ctx.rank,
                     src=ranks.index(src) if mode == "bc" else 0, world=ctx.world, GROUP=g, PEERS=_pow2(g),
                     MODE=mode, OP=op.value, IS_FLOAT=inp.dtype.is_floating_point, STAGED=False, BLOCK=block,
                     SPIN=cfg.spin_limit)

    def _split(self, n, block, cfg, cap=1 << 30):
        """(programs, elements per program): at most comm_sms and cap programs, each a whole number of
        blocks, none empty."""
        programs = max(1, min(cfg.comm_sms, -(-n // block), cap))
        per = round_up(-(-n // programs), block)
        return -(-n // per), per

    @staticmethod
    def _block(cfg, inp) -> int:
        """Elements per step of the flat kernels: Config.block_size, else 16 KiB worth
        (benchmarks/collectives.py --variants)."""
        return cfg.block_size or max(16, (16 * _KiB) // inp.element_size())

    @staticmethod
    def _tile(cfg) -> int:
        """Elements per tile of atomic, spinlock and ring: Config.block_size, else block_size_m * block_size_n
        (Iris's tile of the flattened tensor)."""
        return cfg.block_size or cfg.block_size_m * cfg.block_size_n

    @staticmethod
    def _options(cfg, warps) -> dict:
        """Launch options: num_warps (the variant's default where None) and num_stages. waves_per_eu is an
        AMD option, left out here."""
        return {"num_warps": cfg.num_warps or warps, "num_stages": cfg.num_stages}

    def _ready(self, what="the first call of a collective at a new shape allocates its workspace "
                           "collectively", how="call it once (or all_reduce_preamble)") -> None:
        if self.ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise CollectiveError(f"{what} and cannot be captured; {how} before capturing the graph")


__all__ = ["CCL", "CollectiveError", "Config", "ConfigError", "GluonUnavailable", "ReduceOp"]
