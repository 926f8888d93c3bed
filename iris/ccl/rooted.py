"""Rooted collectives behind ctx.ccl: broadcast in Iris's in-place form, reduce, scatter and gather. One
rank, the root, sends to or receives from every member of the group; roots (src, dst) are positions in
the group, as Iris numbers them. The kernel (kernels/pair.py's rooted_kernel) reads the members' inp in
place, so inp must be a heap tensor, the same allocation on every member; nothing is allocated on the
heap, and the same kernel serves the whole job and any subset group. A large reduce over a whole job
of three or more ranks runs by stores (push.py's scatter_push_kernel, "rd": every rank but the root
reduces a part, which it stores into the root), and its plan holds a stage on the heap; over three or
more members of another group, a large reduce into a heap out, and a broadcast from and into heap
tensors, spread the work over the members but the root (kernels/pair.py's spread_kernel). Also the
plan checks and sizing that p2p.py shares. See docs/collectives.md.
"""
from __future__ import annotations

from ..allocators.offsets import round_up
from ..errors import CollectiveError
from . import puts
from .builders import pair_state, roomy, scatter_push
from .checks import contiguous, nonempty, not_capturing, on_heap, overlap, pair, position, same_dtype, tensor, within
from .config import ReduceOp
from .kernels.pair import rooted_kernel, spread_kernel
from .plan import Plan, Recent, knobs, pair_knobs, pair_split, pow2


# -- the collectives ---------------------------------------------------------
def broadcast_src(ccl, pos, src, group) -> int:
    """The global rank of Iris's broadcast(tensor, src=0, ...)'s src, a position in the group (pos: src given
    positionally); ctx.ccl runs it as broadcast(tensor, tensor, src=<that rank>)."""
    if pos is not None:
        if src != 0:
            raise CollectiveError(f"broadcast(tensor, {pos!r}, src={src!r}): src given twice; pass it once")
        src = pos
    ranks = ccl.groups.ranks(group, "broadcast")
    position("broadcast", "src", src, ranks)
    return ranks[src]


STORE_REDUCE = 4 << 20  # bytes from which a whole-job reduce over 3+ ranks runs by stores (_stores)
SPREAD = {"reduce": 4 << 20, "broadcast": 1 << 20}  # bytes from which, over 3+ members on heap tensors, spread


def reduce(ccl, out, inp, dst, op, group, config, launch=True):
    inp = out if inp is None else inp
    return _rooted(ccl, "reduce", out, inp, dst, "dst", group, config, op, launch)


def _stores(ccl, out, inp, dst, op, config):
    """The whole job's reduce by stores (builders.scatter_push's "rd"), planned once per root, shapes and
    residence of out (the reduced chunks go straight into a heap out); None where its stage (2 to 6 times
    inp) does not fit in the heap, which every rank finds alike (a symmetric heap): the forms that stage
    nothing run instead."""
    cfg, out_heap = ccl._config(config), within(out, ccl.span)
    key = ("reduce", dst, op, inp.shape, inp.dtype, out.shape, out_heap, cfg.key())  # waits.py names "reduce"
    plan = ccl.plans.get(key)
    if plan is None:
        plan = roomy(lambda: scatter_push(ccl, "rd", out, inp, op, cfg, dst, out_heap))
        if plan is not None:
            ccl.plans[key] = plan
    return plan


def scatter(ccl, out, inp, src, group, config) -> None:
    _rooted(ccl, "scatter", out, inp, src, "src", group, config, ReduceOp.SUM)


def gather(ccl, out, inp, dst, group, config) -> None:
    _rooted(ccl, "gather", out, inp, dst, "dst", group, config, ReduceOp.SUM)


def _rooted(ccl, mode, out, inp, root, role, group, config, op, launch=True):
    """The plan of this call, the previous call's where this one repeats it (ccl.recent), else found or
    built after every check; (launch) runs it. Returns the plan."""
    call = (root, op, group, STORE_REDUCE)  # STORE_REDUCE: reduce's form, which the plan remembers
    m = ccl.recent.get(mode)
    if m is not None and m.repeats(out, inp, call, config):
        plan = m.plan
    else:
        plan = _checked(ccl, mode, out, inp, root, role, group, config, op)
        ccl.recent[mode] = Recent.of(out, inp, call, config, plan)
    if launch:
        plan(inp, out)
    return plan


def _checked(ccl, mode, out, inp, root, role, group, config, op):
    """Checks the call, then finds or builds its plan (a whole-job reduce's by stores where _by_stores says)."""
    if mode == "reduce":
        op = ReduceOp.SUM if op is None else op
        try:
            op = ReduceOp(op)
        except ValueError:
            raise CollectiveError(f"reduce: op must be one of {[o.value for o in ReduceOp]} (or None: sum), "
                                  f"got {op!r}") from None
    for name, t in (("out", out), ("inp", inp)):
        tensor(mode, name, t, ccl.ctx.device)
        nonempty(mode, name, t)
    ranks = ccl.groups.ranks(group, mode)
    position(mode, role, root, ranks)
    knob = pair_knobs(config)
    key = ("rooted", mode, ranks, root, op, inp.shape, out.shape, inp.dtype, out.dtype, knob)
    plan = ccl.plans.get(key)
    if plan is None:
        _check_shapes(mode, out, inp, len(ranks))
    on_heap(mode, "inp", inp, ccl.span, f"the {'members read' if mode == 'scatter' else 'root reads'} it in place")
    contiguous(mode, "out", out)
    if overlap(out, inp):
        me = ranks.index(ccl.ctx.rank)
        exact = (out.data_ptr() == inp.data_ptr() if mode == "reduce" else
                 out.data_ptr() == inp.data_ptr() + me * out.nbytes if mode == "scatter" else False)
        if not exact:
            raise CollectiveError(
                f"{mode}: out overlaps inp; " + {
                    "reduce": "in place, out must be inp itself (or call reduce(tensor, dst=...))",
                    "scatter": f"in place, out must be inp's chunk of this rank's position {me}",
                    "gather": "the root reads inp at the same heap offset on every rank, and inp inside out sits "
                              "at another offset on each; pass a separate heap inp"}[mode])
    stores = _stores(ccl, out, inp, root, op, config) if mode == "reduce" and _by_stores(ccl, out, inp, ranks) else None
    if stores is not None:
        return stores
    if mode == "reduce" and spreads(ccl, "reduce", out, inp, len(ranks)):
        key = ("spread",) + key[1:]
        plan = ccl.plans.get(key)
        if plan is None:
            plan = ccl.plans[key] = _spread(ccl, mode, out, inp, ranks, root, op, knob)
        return plan
    if plan is None:
        plan = ccl.plans[key] = (puts.plan(ccl, mode, out, inp, ranks, knob, op.value, root) if ccl.puts else
                                 _plan(ccl, mode, out, inp, ranks, root, op, knob))
    return plan


def spreads(ccl, mode, out, inp, g) -> bool:
    """Whether a reduce or broadcast (mode) over g members runs spread_kernel: 3+ members, from SPREAD[mode]
    bytes (below, the rooted and pull kernels took less time at 4 ranks), out and inp contiguous and
    whole in this rank's heap (so, by the collectives' rule, at the same offset on every member)."""
    return (g > 2 and not ccl.puts and inp.numel() * inp.element_size() >= SPREAD[mode] and out.is_contiguous()
            and inp.is_contiguous() and within(out, ccl.span) and within(inp, ccl.span))


def broadcast(ccl, out, inp, ranks, src, config) -> tuple:
    """A broadcast that spreads (spreads() holds): checked, planned the first time, run. src: a global
    rank. Returns (plan, per-call flags)."""
    g = len(ranks)
    knob = knobs(config)
    key = ("spread", "broadcast", ranks, src, inp.shape, out.shape, inp.dtype, out.dtype, knob)
    plan = ccl.plans.get(key)
    if plan is None:
        pair("broadcast", out, inp, tuple(inp.shape), ccl.ctx.device, g)
        plan = ccl.plans[key] = _spread(ccl, "broadcast", out, inp, ranks, ranks.index(src), ReduceOp.SUM, knob)
    flags = (out.data_ptr() != inp.data_ptr(),)
    plan(inp, out, flags=flags)
    return plan, flags


def _by_stores(ccl, out, inp, ranks) -> bool:
    """Whether a reduce of inp into out over ranks runs by stores (_stores): the whole job of 3+ ranks, in
    rank order, from STORE_REDUCE bytes, out and inp contiguous. Over 2 ranks the rooted kernel's root
    reads its one peer's tensor, the link's whole load either way, and stages nothing."""
    return (ccl.ctx.world > 2 and not ccl.puts and inp.numel() * inp.element_size() >= STORE_REDUCE
            and ranks == tuple(range(ccl.ctx.world)) and out.is_contiguous() and inp.is_contiguous())


def _check_shapes(mode, out, inp, g) -> None:
    same_dtype(mode, out, inp)
    small, big = (out, inp) if mode == "scatter" else (inp, out) if mode == "gather" else (None, None)
    if small is None:
        if out.shape != inp.shape:
            raise CollectiveError(f"reduce: out has shape {tuple(out.shape)} but inp {tuple(inp.shape)}; they must "
                                  "match")
        return
    want = (g * small.shape[0],) + tuple(small.shape[1:]) if small.dim() else None
    if want is None or tuple(big.shape) != want:
        names = ("out", "inp") if mode == "scatter" else ("inp", "out")
        raise CollectiveError(f"{mode}: {names[1]} must be {names[0]} stacked {g} times along dim 0, shape "
                              f"{want or '(g*M, ...)'} for {names[0]} of shape {tuple(small.shape)} over {g} ranks; "
                              f"got {tuple(big.shape)}")


def _plan(ccl, mode, out, inp, ranks, root, op, knob) -> Plan:
    not_capturing(ccl.ctx.device, "the first call of a rooted collective at a new shape builds small device tensors",
                  "call it once")
    ctx, g = ccl.ctx, len(ranks)
    counters, seen = pair_state(ccl)
    n = out.numel() if mode == "scatter" else inp.numel()
    programs, per, block = pair_split(n, inp.dtype, _sized(knob, n, inp.element_size(), ccl), ccl.sms,
                                      counters.shape[0])
    return Plan(rooted_kernel, programs, {"num_warps": knob.warps or 8}, inp=inp, out=out,
                members=ccl.groups.members(ranks), counters=counters, seen=seen, n=n, per=per, me=ranks.index(ctx.rank),
                rank=ctx.rank, root=root, world=ctx.world, GROUP=g, PEERS=pow2(g), MODE=mode, OP=op.value,
                IS_FLOAT=inp.dtype.is_floating_point, BLOCK=block, SPIN=knob.spin)


def _spread(ccl, mode, out, inp, ranks, root, op, knob) -> Plan:
    """spread_kernel's plan: each of the g - 1 owners' parts 16-element aligned, split over programs."""
    not_capturing(ccl.ctx.device, f"the first call of a {mode} at a new shape builds small device tensors",
                  "call it once")
    ctx, g, n = ccl.ctx, len(ranks), inp.numel()
    counters, seen = pair_state(ccl)
    part = round_up(-(-n // (g - 1)), 16)
    programs, per, block = pair_split(part, inp.dtype, _sized(knob, part, inp.element_size(), ccl), ccl.sms,
                                      counters.shape[0])
    return Plan(spread_kernel, programs, {"num_warps": knob.warps or 8}, (), "spread",
                ("COPY",) if mode == "broadcast" else (), inp=inp, out=out, members=ccl.groups.members(ranks),
                counters=counters, seen=seen, n=n, part=part, per=per, me=ranks.index(ctx.rank), rank=ctx.rank,
                root=root, world=ctx.world, GROUP=g, PEERS=pow2(g), MODE=mode, OP=op.value,
                IS_FLOAT=inp.dtype.is_floating_point, COPY=False, BLOCK=block, SPIN=knob.spin)


def _sized(knob, n, itemsize, ccl):
    """knob with its block (Config.block_size, where set) sized for about a program per SM: 4 to 16 KiB, so
    that a small call's reads spread over many SMs and each thread still moves 16 bytes a step."""
    if knob.block:
        return knob
    share = -(-n * itemsize // (knob.sms or ccl.sms))
    return knob._replace(block=min(16 << 10, max(4 << 10, pow2(share))) // itemsize)
