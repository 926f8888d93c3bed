"""ctx.ccl: the collectives' host calls. Each call checks its arguments (iris/ccl/checks.py), finds (or,
the first time, builds: iris/ccl/builders.py) the plan for its (collective, shapes, dtype, op, config)
and launches one kernel. Calls over a subset group go to the group kernels instead (iris/ccl/subsets.py),
which allocate nothing on the heap; rooted collectives and point to point live in rooted.py and p2p.py.

A plan holds the heap workspace (staging buffers and flags), this rank's epoch counters and a
Launcher of the compiled kernel with its grid and arguments, so a repeated call costs a cache lookup
and a direct launch, and a call repeated on the same tensors replays a one-kernel CUDA graph, which
costs less host time than a launch (iris/ccl/launch.py; benchmarks/launch_probe.py). Building a plan
allocates on the heap and ends with a barrier, so the FIRST call of a new (collective, shape, dtype,
op, config) is collective on all ranks and must run outside CUDA graph capture (all_reduce_preamble
builds one ahead of time). Later calls synchronise on the device only and can be captured and
replayed.
"""
from __future__ import annotations

import torch

from ..allocators.offsets import round_up
from ..errors import CollectiveError, ConfigError, GluonUnavailable, WaitTimeout
from . import builders, p2p, puts, rooted, subsets, waits
from .checks import Groups, layout, pair
from .config import Config, ReduceOp, checked
from .modes import MODES
from .order import StreamOrder
from .plan import Recent

try:  # Gluon kernels need triton.experimental.gluon; without it use_gluon=True says why
    from . import gluon as _gluon
    _GLUON_MISSING = None
except ImportError as e:  # pragma: no cover - a Triton without Gluon
    _gluon, _GLUON_MISSING = None, e


class CCL:
    """Collectives over the heap, as ctx.ccl. Every call is collective: all ranks (of the group), same
    order, same sizes; the first call of a new shape over every rank allocates its workspace on the
    heap (collectively) and must not be inside CUDA graph capture. Tensors need not be heap tensors:
    inputs are staged through the workspace, except over a subset group (group=), where nothing is
    allocated on the heap and inp or out must be heap tensors where the variant reads or writes the
    members' copy of them (docs/collectives.md). Calls run on the current stream like any kernel, and
    all of a context's calls keep one device order, the host's: a call from another stream than the
    previous call's first waits for what that stream queued (iris/ccl/order.py), so calls from several
    streams never overlap. async_op is accepted for Iris compatibility and changes nothing (nothing
    waits on the host). config: an iris.ccl.Config (Iris's fields and iris's own; docs/collectives.md), read at
    every call, so a field changed between calls takes effect (and is validated) at the next."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.plans = {}
        self.recent = {}  # collective -> its previous call (Recent)
        self.groups = Groups(ctx.rank, ctx.world, ctx.heap.bases, ctx.device)
        self.seen = None  # signals waited for, per (program, source rank): the group and pair kernels' own counts
        self.puts = ctx.reserve.puts  # a job with indirect peers: kernels/put.py serves every call
        self.put_state = None  # put_kernel's counts in this rank's memory, built once
        self.warned = set()  # Config variants the put path stood in for, warned once
        lo = ctx.heap.bases[ctx.rank]
        self.span = (lo, lo + ctx.heap.size)  # this rank's heap
        if ctx.device.type == "cuda":
            self.sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
        else:
            self.sms = 4
        self._default = Config(comm_sms=self.sms)
        self.order = StreamOrder(ctx.device, ctx.driver.capture_id)  # one device order (iris/ccl/order.py)
        self.gave_up = None  # the WaitTimeout raised once, if a device wait gave up

    # -- public calls ------------------------------------------------------
    def all_reduce_preamble(self, out, inp, config=None, workspace=None, op=ReduceOp.SUM):
        """Builds (collectively) what all_reduce(out, inp) needs, so the first real call can be captured
        in a CUDA graph. Returns the plan; passing it back as workspace= is optional. Collective: all
        ranks, same order, same sizes."""
        cfg = self._config(config)
        key = ("ar", op, inp.shape, out.shape, inp.dtype, cfg.key())
        if key not in self.plans:
            self.plans[key] = self._all_reduce_plan(out, inp, ReduceOp(op), cfg)
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
        global ranks; over a subset every variant runs, with inp or out on the heap where it reads or
        writes the members' copy, the push variants as one_shot and two_shot (docs/collectives.md). workspace= is accepted for Iris compatibility: plans are found by
        shape, so all_reduce_preamble's result need not be passed; one passed back whose spinlock
        locks or ring flags are fewer than this config's tiles need raises ValueError ("Lock array too
        small", "Flags array too small"), as Iris's does. Collective: all ranks, same order, same sizes."""
        self.order.enter()
        if config is None:
            cfg = self._default
        else:
            cfg = checked(config)  # refuses a non-Config
        ck = cfg.key()  # validates a changed Config, cached otherwise
        if op is None:  # Iris's default
            op = ReduceOp.SUM
        if workspace is not None:
            short = builders.too_small(workspace, inp, cfg, self.ctx.world)
            if short:
                raise CollectiveError(short)
        if group is not None:
            ranks = self.groups.of(group, "all_reduce")[0]
            if ranks is not None:
                subsets.run(self, "ar", out, inp, ranks, cfg, tuple(inp.shape), ReduceOp(op), 0)
                return
        m = self.recent.get("all_reduce")
        if m is not None and m.repeats(out, inp, (op, None, None, None), config):
            m.plan(inp, out, flags=m.flags)
            return
        key = ("ar", op, inp.shape, out.shape, inp.dtype, ck)
        plan = self.plans.get(key)
        if plan is None or inp.device != self.ctx.device or out.dtype != inp.dtype:
            plan = self.plans[key] = self._all_reduce_plan(out, inp, ReduceOp(op), cfg)
        layout(out, inp)
        flags = (self._resident(inp), self._resident(out)) if plan.per_call else ()
        self.recent["all_reduce"] = Recent.of(out, inp, (op, None, None, None), config, plan, flags)
        plan(inp, out, flags=flags)

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
        self.order.enter()
        cfg = self._config(config)
        ranks, w = self.groups.of(group, "all_gather")
        if cfg.use_gluon and self._gluon_or_puts("all_gather"):
            self._gluon("all_gather", out, inp, cfg, ranks)
            return
        self._run("ag", out, inp, ranks, cfg, self._gathered(inp, w))

    def reduce_scatter_preamble(self, out, inp, config=None, op=ReduceOp.SUM):
        """Builds (collectively) what reduce_scatter(out, inp) in torch's layout needs, so the first real
        call can be captured in a CUDA graph. Returns the plan. Collective: all ranks, same order, same
        sizes."""
        return self._plan_for("rs", out, inp, self._config(config), self._scattered(inp, self.ctx.world), ReduceOp(op))

    def reduce_scatter(self, out, inp, op=ReduceOp.SUM, group=None, async_op=False, config=None, workspace=None):
        """Two layouts. torch's reduce_scatter_tensor: out (M, N) on rank r = rows [r*M, (r+1)*M) of inp
        (world*M, N) reduced over all ranks (over a group, world is its size and r a rank's position in
        it). Iris's: out shaped as inp (M, N), 2-D, every rank: rank r's tiles of out (block_size_m x
        block_size_n tiles in Iris's order, swizzle_size tile rows per group, dealt to the ranks by
        Config.all_reduce_distribution: 0 round robin, 1 a contiguous run each) get those tiles of inp
        reduced over all ranks; out's other elements are left as they were. Config.reduce_scatter_variant:
        "two_shot" (torch's layout: each rank stores every peer's rows into that peer's stage, then
        reduces its own rows locally; Iris's: each rank stages its input, then reduces its own tiles by
        reading them from every peer) or "ring_chunked" (each part travels the ring rank -> rank + 1, every rank adding its
        input, and ends at its owner; either layout). workspace= is accepted for Iris
        compatibility (plans are found by shape); an iris.ccl.reduce_scatter.ReduceScatterWorkspace
        whose flags are fewer than ring_chunked's tiles raises ValueError. Collective: all ranks (of the group), same order,
        same sizes."""
        self.order.enter()
        cfg = self._config(config)
        op = ReduceOp.SUM if op is None else op
        if cfg.use_gluon:
            raise ConfigError("reduce_scatter has no Gluon kernel (Config.use_gluon=True); set use_gluon=False")
        ranks, w = self.groups.of(group, "reduce_scatter")
        flags = getattr(workspace, "flags", None)  # Iris's ReduceScatterWorkspace: its capacity is checked
        if cfg.reduce_scatter_variant == "ring_chunked" and isinstance(flags, torch.Tensor):
            need = builders.rs_tiles(out, inp, cfg, w)
            if flags.numel() < need:
                raise CollectiveError(f"reduce_scatter: Flags array too small: have {flags.numel()} but need {need} "
                                      f"for block_size_m={cfg.block_size_m}, block_size_n={cfg.block_size_n}. "
                                      "Pre-allocate workspace with the smallest block sizes you intend to use, or "
                                      "leave workspace= out")
        if w > 1 and inp.dim() == 2 and tuple(out.shape) == tuple(inp.shape):
            self._run("rst", out, inp, ranks, cfg, tuple(inp.shape), ReduceOp(op))
            return
        self._run("rs", out, inp, ranks, cfg, self._scattered(inp, w), ReduceOp(op))

    def all_to_all(self, out, inp, group=None, async_op=False, config=None):
        """inp and out (M, N*world): columns [r*N, (r+1)*N) of inp go to rank r, and out's columns
        [r*N, (r+1)*N) come from rank r (over a group: world its size, r a position in it).
        Config.all_to_all_variant "default": each rank stages its inp, then reads its columns from
        every peer; with use_gluon=True, iris.ccl.gluon's kernel. Collective: all ranks (of the
        group), same order, same sizes."""
        self.order.enter()
        cfg = self._config(config)
        ranks, w = self.groups.of(group, "all_to_all")
        if cfg.use_gluon and self._gluon_or_puts("all_to_all"):
            self._gluon("all_to_all", out, inp, cfg, ranks)
            return
        if inp.dim() != 2 or inp.shape[1] % w:
            raise CollectiveError(f"all_to_all: inp must be 2-D (M, N*world) with N*world a multiple of "
                                  f"{w}; got shape {tuple(inp.shape)}")
        self._run("a2a", out, inp, ranks, cfg, tuple(inp.shape))

    def broadcast(self, out, inp=None, src=0, group=None, async_op=False, config=None):
        """out = rank src's inp on every rank (inp is read on src only; out may be inp). src is a global
        rank, also with a group (as torch.distributed.broadcast). Iris's form, broadcast(tensor, src=0,
        ...), is in place, and its src is a position in the group. Collective: all ranks (of the group),
        same order, same sizes."""
        self.order.enter()
        iris_form = not isinstance(inp, torch.Tensor)
        call, t = ((iris_form, inp, src, group), out) if iris_form else ((iris_form, None, src, group), inp)
        m = self.recent.get("broadcast")
        if m is not None and m.repeats(out, t, call, config):
            m.plan(t, out, flags=m.flags)
            return
        cfg = self._config(config)
        if cfg.use_gluon:
            raise ConfigError("broadcast has no Gluon kernel here (Config.use_gluon=True); set use_gluon=False")
        ranks, g = self.groups.of(group, "broadcast")
        if iris_form:
            inp, src = out, rooted.broadcast_src(self, inp, src, group)
        elif isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self.ctx.world:
            raise CollectiveError(f"broadcast: src must be a rank in [0, {self.ctx.world}), got {src!r}")
        elif ranks is not None and src not in ranks:
            raise CollectiveError(f"broadcast: src {src} is not in the group of ranks {list(ranks)}; src is a "
                                  "global rank, as in torch.distributed.broadcast")
        if rooted.spreads(self, "broadcast", out, inp, g):
            ran = rooted.broadcast(self, out, inp, ranks or tuple(range(g)), src, config)
        else:
            ran = self._run("bc", out, inp, ranks, cfg, tuple(inp.shape), src=src)
        if ran is not None:
            self.recent["broadcast"] = Recent.of(out, inp, call, config, *ran)

    def check_waits(self) -> None:
        """Raise WaitTimeout (once) if a device wait of these collectives gave up; the device must be synced
        first (ctx.barrier(), free() and close() call it)."""
        if self.gave_up is None:
            try:
                waits.raise_gave_up(self)
            except WaitTimeout as e:
                self.gave_up = e
                raise

    def free(self) -> None:
        """Gives every workspace back to the heap (the next call of each shape builds it again).
        Collective: all ranks, at the same point of their calls."""
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)
        self.ctx._raise_noted()
        for plan in {id(p): p for p in self.plans.values()}.values():
            for t in plan.workspace:
                if self.ctx.is_symmetric(t):
                    self.ctx.free(t)
        self.plans, self.recent = {}, {}

    def forget(self) -> None:
        """Drop every plan without freeing its workspace (the context is closing): a later call builds
        its plan again, which raises ContextClosed."""
        self.plans, self.recent = {}, {}

    def reduce_preamble(self, out, inp=None, dst=0, op=None, group=None, config=None, workspace=None, root=None):
        """Checks reduce(out, inp, ...) and builds its plan (collectively), so the first real call can be
        captured in a CUDA graph; root= is Iris's name for dst. Returns the plan; passing it back as
        workspace= is optional. Collective: all ranks (of the group), same order, same sizes."""
        return rooted.reduce(self, out, inp, _root(dst, root), op, group, config, launch=False)

    def reduce(self, out, inp=None, dst=0, op=None, group=None, async_op=False, config=None, workspace=None,
               root=None):
        """out on the rank at group position dst (root=, Iris's other name for it) = every member's inp
        combined by op (None: sum; SUM, MAX, MIN), in group order, floats in fp32; other ranks' out is
        not written. inp=None reduces out in place (Iris's tests call reduce(tensor, dst=...)); else out
        is inp or apart from it. inp: a heap tensor, the same allocation on every member (dst reads it
        in place); out: any tensor of inp's shape. Config.reduce_variant ("one_shot", "two_shot") is
        accepted as Iris names it; both run the one rooted kernel, or from 4 MiB over 3+ ranks, over the
        whole job a reduce by stores, over another group the work spread over the members (out on the
        heap; iris/ccl/rooted.py). workspace= is accepted for Iris
        (plans are found by shape). Collective: all ranks (of the group), same order, same sizes."""
        self.order.enter()
        rooted.reduce(self, out, inp, _root(dst, root), op, group, config)

    def scatter(self, out, inp, src=0, group=None, async_op=False, config=None):
        """out (M, ...) on the rank at group position i = rows [i*M, (i+1)*M) of inp (g*M, ...) on the
        rank at position src. inp: a heap tensor of that shape on every member (the members read src's
        in place; only src's contents matter); out: any tensor, or inp's own chunk i. Collective: all
        ranks (of the group), same order, same sizes."""
        self.order.enter()
        rooted.scatter(self, out, inp, src, group, config)

    def gather(self, out, inp, dst=0, group=None, async_op=False, config=None):
        """out (g*M, ...) on the rank at group position dst = every member's inp (M, ...), position i's at
        rows [i*M, (i+1)*M); other ranks' out is not written. inp: a heap tensor, the same allocation
        on every member (dst reads it in place), apart from out; out: any tensor of that shape on every
        member. Collective: all ranks (of the group), same order, same sizes."""
        self.order.enter()
        rooted.gather(self, out, inp, dst, group, config)

    def init_p2p(self, max_numel=2 ** 20, dtype=None, config=None):
        """A mailbox (iris.ccl.p2p.P2PState) for send/recv/isend/irecv(p2p_state=) of any tensors up to
        max_numel elements of dtype (default bfloat16). Collective: all ranks, same order, same sizes."""
        return p2p.init_p2p(self.ctx, max_numel, dtype, config)

    def send(self, tensor, dst, group=None, tag=0, config=None, p2p_state=None):
        """Sends tensor to the rank at group position dst, which must call recv(..., src=<this rank's
        position>) as its matching call. Without p2p_state, tensor is a heap tensor (the same allocation
        on both ranks) stored into dst's copy; with a mailbox from init_p2p, any tensor. Pairs by call
        order; tag is accepted for Iris and not used. Collective over the pair: this rank and dst, same
        order, same sizes."""
        self.order.enter()
        p2p.send(self.ctx, tensor, dst, p2p_state, group, tag, config)

    def recv(self, tensor, src, group=None, tag=0, config=None, p2p_state=None):
        """Receives into tensor what the rank at group position src sends with its matching send:
        tensor a heap tensor (the same allocation on both ranks), or with p2p_state any tensor.
        Collective over the pair: this rank and src, same order, same sizes."""
        self.order.enter()
        p2p.recv(self.ctx, tensor, src, p2p_state, group, tag, config)

    def isend(self, tensor, dst, group=None, tag=0, config=None, p2p_state=None):
        """send, returning a work whose wait() blocks the host until it is done. Collective over the pair."""
        self.order.enter()
        return p2p.isend(self.ctx, tensor, dst, p2p_state, group, tag, config)

    def irecv(self, tensor, src, group=None, tag=0, config=None, p2p_state=None):
        """recv, returning a work whose wait() blocks the host until it is done. Collective over the pair."""
        self.order.enter()
        return p2p.irecv(self.ctx, tensor, src, p2p_state, group, tag, config)

    def batch_isend_irecv(self, p2p_op_list, p2p_state=None):
        """Every iris.ccl.p2p.P2POp's send, then every recv, each in list order (Iris's order); one work
        each. Collective over each transfer's pair, as send and recv."""
        self.order.enter()
        return p2p.batch_isend_irecv(self.ctx, p2p_op_list, p2p_state)

    def sendrecv(self, send_tensor, recv_tensor, dst, src, group=None, tag=0, config=None):
        """Sends send_tensor (any tensor) into recv_tensor (a heap tensor, the same allocation on every
        rank involved) of the rank at group position dst, and receives src's into this rank's
        recv_tensor. Every rank named as a dst or src makes its own sendrecv (a ring or any
        permutation). Collective over those ranks: same order, same sizes."""
        self.order.enter()
        p2p.sendrecv(self.ctx, send_tensor, recv_tensor, dst, src, group, tag, config)

    def barrier(self, group=None):
        """Every rank of group (None: all) waits on the device until all reached it, in stream order:
        no host round trip, capturable in a CUDA graph. Collective: all ranks (of the group), same
        order."""
        self.order.enter()
        p2p.barrier(self.ctx, group)

    # -- check, plan, launch ---------------------------------------------
    def _gluon_or_puts(self, call) -> bool:
        """Whether Config(use_gluon=True) runs its Gluon kernel: not where the put path serves (warned once)."""
        if self.puts:
            puts.warn_variant(self, call, "use_gluon", True)
        return not self.puts

    def _config(self, config) -> Config:
        """config, or this context's default, validated as it stands now (Config.key() checks it)."""
        return checked(self._default if config is None else config)

    def _gluon(self, call, out, inp, cfg, ranks):
        """Config(use_gluon=True): iris.ccl.gluon's kernel, over every rank (ranks None)."""
        if ranks is not None:
            raise ConfigError(f"{call}(group= of ranks {list(ranks)}, config=Config(use_gluon=True)): iris's Gluon "
                              "kernels run over every rank only (a device barrier of the whole job frames them); set "
                              "use_gluon=False to run the Triton kernels, which take every variant over a group")
        why = None
        if self.ctx.device.type != "cuda":
            why = f"this rank's heap is on {self.ctx.device}: Gluon kernels need a GPU (Gluon has no interpreter)"
        elif _gluon is None:
            why = (f"iris.ccl.gluon cannot be imported ({_GLUON_MISSING}): Gluon kernels need a GPU and a Triton with "
                   "triton.experimental.gluon")
        if why:
            raise GluonUnavailable(f"{call}(config=Config(use_gluon=True)): {why}; set use_gluon=False to run "
                                   "iris's Triton kernels")
        getattr(_gluon, call)(self.ctx, out, inp, cfg)

    def _all_reduce_plan(self, out, inp, op, cfg):
        pair("all_reduce", out, inp, tuple(inp.shape), self.ctx.device, self.ctx.world)
        cfg.validate(self.ctx.world)
        if cfg.use_gluon:
            raise ConfigError("all_reduce has no Gluon kernel (Config.use_gluon=True); set use_gluon=False")
        variant = cfg.all_reduce_variant
        if variant in ("atomic", "spinlock") and op != ReduceOp.SUM:
            raise CollectiveError(f"all_reduce: Config.all_reduce_variant={variant!r} adds into a zeroed buffer, so "
                                  f"it reduces with sum only, not {op.value}; pick 'one_shot', 'two_shot', 'ring' or "
                                  "'auto'")
        return builders.all_reduce(self, out, inp, op, cfg)

    def _run(self, mode, out, inp, ranks, cfg, want, op=ReduceOp.SUM, src=0):
        """Runs the call; returns its whole-job plan and per-call flags (None over a group)."""
        if ranks is not None:
            subsets.run(self, mode, out, inp, ranks, cfg, want, op, src)
            return None
        plan = self._plan_for(mode, out, inp, cfg, want, op, src)
        layout(out, inp)
        flags = (self._resident(out),) if plan.per_call else ()
        plan(inp, out, flags=flags)
        return plan, flags

    def _plan_for(self, mode, out, inp, cfg, want, op=ReduceOp.SUM, src=0):
        """The whole-job plan of this call, built (collectively, checked first) the first time."""
        key = (mode, op, inp.shape, out.shape, inp.dtype, cfg.key(), src)
        plan = self.plans.get(key)
        if plan is None or inp.device != self.ctx.device or out.dtype != inp.dtype:
            pair(MODES[mode].name, out, inp, want, self.ctx.device, self.ctx.world)
            cfg.validate(self.ctx.world)
            plan = self.plans[key] = builders.whole(self, mode, out, inp, op, cfg, src)
        return plan

    @staticmethod
    def _scattered(inp, w):
        """reduce_scatter's out shape (torch's layout) for inp over w ranks (None for a 0-d inp, which the
        checks refuse); raises where inp's rows do not split into w parts."""
        if inp.dim() and inp.shape[0] % w:
            raise CollectiveError(f"reduce_scatter: inp's first dimension {inp.shape[0]} is not a multiple of "
                                  f"the {w} ranks; pad it to {round_up(inp.shape[0], w)}")
        return (inp.shape[0] // w,) + tuple(inp.shape[1:]) if inp.dim() else None

    @staticmethod
    def _gathered(inp, w):
        """all_gather's out shape for inp over w ranks (None for a 0-d inp, which the checks refuse)."""
        return (w * inp.shape[0],) + tuple(inp.shape[1:]) if inp.dim() else None

    def _resident(self, t) -> bool:
        """Whether t starts in this rank's heap (the kernels then reach it at its offset on every rank)."""
        return self.span[0] <= t.data_ptr() < self.span[1]


def _root(dst, root):
    """reduce's root: dst, or root= as Iris's reduce names it (one of the two)."""
    if root is None:
        return dst
    if dst != 0 and dst != root:
        raise CollectiveError(f"reduce: dst={dst!r} and root={root!r} name two roots; pass one of them")
    return root


__all__ = ["CCL", "CollectiveError", "Config", "ConfigError", "GluonUnavailable", "ReduceOp"]
