"""Rooted collectives behind ctx.ccl: broadcast in Iris's in-place form, reduce, scatter and gather. One
rank, the root, sends to or receives from every member of the group; roots (src, dst) are positions in
the group, as Iris numbers them. The kernel (pair_kernels.rooted_kernel) reads the members' inp in
place, so inp must be a heap tensor, the same collective allocation on every member; nothing is
allocated on the heap, and the same kernel serves the whole job and any subset group. Also the plan
type that p2p.py shares. See docs/collectives.md.
"""
from __future__ import annotations

import torch

from ..allocators.offsets import round_up
from .launch import Launcher
from .collectives import DTYPES, CollectiveError
from .config import ReduceOp, checked
from .pair_kernels import rooted_kernel

_KiB = 1 << 10


class Plan:
    """A pair kernel at one shape: its arguments (by parameter name) and a Launcher per alignment of the
    tensors that change between calls (the kernel's leading parameters); a call repeated on the same
    tensors replays a captured one-kernel graph (iris/launch.py)."""
    __slots__ = ("fn", "grid", "args", "warps", "launchers")
    workspace = ()  # nothing on the heap: CCL.free() has nothing to give back

    def __init__(self, fn, programs, warps, **args):
        self.fn, self.grid, self.warps = fn, (programs,), warps
        self.args = [args[a] for a in fn.arg_names]
        self.launchers = {}

    def __call__(self, *tensors):
        a = self.args
        a[:len(tensors)] = tensors
        ptrs = tuple(t.data_ptr() for t in tensors)
        aligned = all(p % 16 == 0 for p in ptrs)
        launcher = self.launchers.get(aligned)
        if launcher is None:
            launcher = self.launchers[aligned] = Launcher(self.fn, self.grid, num_warps=self.warps)
        if aligned:
            launcher.launch_trusted(a, ptrs)
        else:
            launcher(*a)


def knobs(config) -> tuple:
    """(block_size, num_warps, comm_sms, spin_limit) of config, 0 where automatic; a Config that can
    change after construction is checked here, where it is used."""
    if checked(config) is None:
        return 0, 0, 0, 0
    if config.use_gluon:
        raise CollectiveError("these collectives have no Gluon kernel (Config.use_gluon=True); set use_gluon=False")
    return config.block_size, config.num_warps or 0, config.comm_sms or 0, config.spin_limit


def split(ccl, n, dtype, knob, cap) -> tuple:
    """(programs, elements per program, block): at most comm_sms (else an SM each) and cap programs, each
    a whole number of blocks (Config.block_size, else 16 KiB worth), none empty."""
    block = knob[0] or max(16, (16 * _KiB) // dtype.itemsize)
    programs = max(1, min(knob[2] or ccl.sms, -(-n // block), cap))
    per = round_up(-(-n // programs), block)
    return -(-n // per), per, block


def pair_state(ccl):
    """(counters, seen): the pairwise counters in iris's reserve and this rank's seen counts (shared with
    the group kernel, built once outside capture)."""
    counters = ccl.ctx._group_counters
    if ccl._seen is None:
        ccl._seen = torch.zeros_like(counters)
    return counters, ccl._seen


def members_of(ccl, ranks):
    """int64 device tensor: the ranks, then their heap bases (group_kernel's layout), cached."""
    m = ccl._members.get(ranks)
    if m is None:
        bases = [ccl.ctx.heap.bases[r] for r in ranks]
        m = ccl._members[ranks] = torch.tensor(list(ranks) + bases, dtype=torch.int64, device=ccl.ctx.device)
    return m


def ranks_of(ccl, group, call):
    """The group's global ranks in group order (every rank for None), checked."""
    ranks = ccl._group(group, call)[0]
    return tuple(range(ccl.ctx.world)) if ranks is None else ranks


def position(call, name, value, ranks) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(ranks):
        raise CollectiveError(f"{call}: {name} must be a position in the group, an int in [0, {len(ranks)}) for its "
                              f"ranks {list(ranks)} (Iris numbers {name} within the group), got {value!r}")
    return value


def tensor(call, name, t, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{call}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise CollectiveError(f"{call}: {name} is on {t.device} but this rank's heap is on {device}; move it there first")
    if t.dtype not in DTYPES:
        raise CollectiveError(f"{call}: {name} has dtype {t.dtype}, not supported; use one of "
                              f"{', '.join(str(d) for d in DTYPES)}")
    if t.numel() == 0:
        raise CollectiveError(f"{call}: {name} has no elements; there is nothing to exchange")


def on_heap(ccl, call, name, t, why) -> None:
    if not t.is_contiguous():
        raise CollectiveError(f"{call}: {name} must be contiguous; call .contiguous() first")
    p = t.data_ptr()
    if not (ccl._lo <= p and p + t.nbytes <= ccl._hi):
        raise CollectiveError(f"{call}: {name} must be a heap tensor, the same collective allocation on every rank "
                              f"involved ({why}); allocate it with ctx.empty/ctx.zeros or import it with "
                              "ctx.as_symmetric (collective)")


def overlap(a, b) -> bool:
    return a.data_ptr() < b.data_ptr() + b.nbytes and b.data_ptr() < a.data_ptr() + a.nbytes


# -- the collectives ---------------------------------------------------------
def broadcast(ccl, t, pos, src, group, config) -> None:
    """Iris's broadcast(tensor, src=0, ...): src's tensor onto every member's, in place; src a position
    (pos: src given positionally). Runs as iris's broadcast(t, t, src=<its global rank>)."""
    if pos is not None:
        if src != 0:
            raise CollectiveError(f"broadcast(tensor, {pos!r}, src={src!r}): src given twice; pass it once")
        src = pos
    ranks = ranks_of(ccl, group, "broadcast")
    position("broadcast", "src", src, ranks)
    ccl.broadcast(t, t, src=ranks[src], group=group, config=config)


def reduce(ccl, out, inp, dst, op, group, config) -> None:
    op = ReduceOp.SUM if op is None else op
    try:
        op = ReduceOp(op)
    except ValueError:
        raise CollectiveError(f"reduce: op must be one of {[o.value for o in ReduceOp]} (or None: sum), "
                              f"got {op!r}") from None
    _rooted(ccl, "reduce", out, out if inp is None else inp, dst, "dst", group, config, op)


def scatter(ccl, out, inp, src, group, config) -> None:
    _rooted(ccl, "scatter", out, inp, src, "src", group, config, ReduceOp.SUM)


def gather(ccl, out, inp, dst, group, config) -> None:
    _rooted(ccl, "gather", out, inp, dst, "dst", group, config, ReduceOp.SUM)


def _rooted(ccl, mode, out, inp, root, role, group, config, op) -> None:
    tensor(mode, "out", out, ccl.ctx.device)
    tensor(mode, "inp", inp, ccl.ctx.device)
    ranks = ranks_of(ccl, group, mode)
    position(mode, role, root, ranks)
    knob = knobs(config)
    key = ("rooted", mode, ranks, root, op, inp.shape, out.shape, inp.dtype, out.dtype, knob)
    plan = ccl.plans.get(key)
    if plan is None:
        _check_shapes(mode, out, inp, len(ranks))
    on_heap(ccl, mode, "inp", inp, f"the {'members read' if mode == 'scatter' else 'root reads'} it in place")
    if not out.is_contiguous():
        raise CollectiveError(f"{mode}: out must be contiguous; call .contiguous() first")
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
    if plan is None:
        plan = ccl.plans[key] = (puts_plan(ccl, mode, out, inp, ranks, knob, op.value, root) if ccl.puts else
                                 _plan(ccl, mode, out, inp, ranks, root, op, knob))
    plan(inp, out)


def puts_plan(ccl, kind, out, inp, ranks, knob, op="sum", root=0, to=-1, frm=-1) -> Plan:
    """put_kernel's plan (a job with indirect peers, iris/ccl/puts.py), receiving into iris's reserve."""
    from .puts import plan_args, put_kernel
    programs, warps, _, args = plan_args(ccl, kind, out, inp, ranks, knob, op, root, to, frm)
    return Plan(put_kernel, programs, warps, **args)


def _check_shapes(mode, out, inp, g) -> None:
    if out.dtype != inp.dtype:
        raise CollectiveError(f"{mode}: out is {out.dtype} but inp is {inp.dtype}; they must match")
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
    ccl._ready("the first call of a rooted collective at a new shape builds small device tensors", "call it once")
    ctx, g = ccl.ctx, len(ranks)
    counters, seen = pair_state(ccl)
    n = out.numel() if mode == "scatter" else inp.numel()
    programs, per, block = split(ccl, n, inp.dtype, knob, counters.shape[0])
    return Plan(rooted_kernel, programs, knob[1] or 8, inp=inp, out=out, members=members_of(ccl, ranks),
                counters=counters, seen=seen, n=n, per=per, me=ranks.index(ctx.rank), rank=ctx.rank, root=root,
                world=ctx.world, GROUP=g, PEERS=max(2, 1 << (g - 1).bit_length()), MODE=mode, OP=op.value,
                IS_FLOAT=inp.dtype.is_floating_point, BLOCK=block, SPIN=knob[3])
