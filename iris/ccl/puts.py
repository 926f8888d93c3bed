"""ctx.ccl in a job with indirect peers: the plans of kernels/put.py's put_kernel, which serves every collective.

What matters:
- The path is chosen once per context (ctx.reserve.puts): where some rank of the job has an indirect peer
  (heap_bases entry 0), or where IRIS_CCL_PUTS=1 asks for it (tests and benchmarks, on peers that loads
  reach too). A job without either runs the load/store kernels, unchanged.
- Whole-job all_reduce, all_gather, reduce_scatter, all_to_all and broadcast receive into an area that
  their plan allocates on the heap once per shape (collective, outside capture, as the other plans);
  group calls, the rooted collectives, point to point and barriers receive into iris's receive area
  in its reserve (PUT_PROGRAMS programs, PUT_SLOT bytes per program, parity and source rank), in
  rounds, and allocate nothing on the heap: ranks outside a group never call.
- The arguments and checks are the load/store path's; a Config variant that reads or writes peers by
  load and store (atomic, spinlock, ring, persistent, partitioned, Gluon) runs this algorithm instead,
  with a warning once per variant.
"""
from __future__ import annotations

import warnings

import torch

from ..allocators.offsets import round_up
from ..heap.reserve import GROUP_PROGRAMS, PUT_PROGRAMS, PUT_SLOT
from .checks import not_capturing
from .kernels import put as pk
from .kernels.put import put_kernel
from .modes import elements
from .plan import Plan, block_for, options, split

KINDS = {name: c.value for name, c in (("ar", pk.AR), ("ar2", pk.AR2), ("ag", pk.AG), ("rs", pk.RS), ("a2a", pk.A2A),
                                       ("rst", pk.RST), ("barrier", pk.BARRIER), ("bc", pk.BC),
                                       ("scatter", pk.SCATTER), ("reduce", pk.REDUCE), ("gather", pk.GATHER),
                                       ("p2p", pk.P2P))}
OPS = {"sum": 0, "max": pk.MAX.value, "min": pk.MIN.value}
SYMMETRIC = ("ar", "ar2", "ag", "rs", "a2a", "rst")  # every member sends to every other, its own inp included
FROM_ROOT, TO_ROOT = ("bc", "scatter"), ("reduce", "gather")
_MiB = 1 << 20
# a whole-job call's receive area: at most this many bytes, or twice its larger tensor, before it moves in rounds
AREA_BYTES = 64 * _MiB
# all_reduce variants that have a put-based counterpart: one shot or two
SHOTS = {"one_shot": "ar", "one_shot_push": "ar", "two_shot": "ar2", "two_shot_push": "ar2"}


def warn_variant(ccl, call, field, value) -> None:
    """Once per (field, value): the variant reaches peers by load and store, so the put algorithm runs."""
    if (field, value) in ccl.warned:
        return
    ccl.warned.add((field, value))
    warnings.warn(f"{call}: Config.{field}={value!r} reads or writes peers by load and store, which indirect peers "
                  "(heap_bases entry 0) do not allow; ctx.ccl runs its put-based algorithm instead "
                  "(docs/multi-node.md)", stacklevel=4)


def all_reduce_kind(ccl, variant, auto) -> str:
    """'ar' (one shot) or 'ar2' (two shots) for all_reduce_variant (auto resolved: one_shot or two_shot_push)."""
    if variant not in SHOTS:
        warn_variant(ccl, "all_reduce", "all_reduce_variant", variant)
        variant = auto
    return SHOTS[variant]


def roles(kind, members, me, root, to, frm) -> tuple:
    """Each member's role bits for put_kernel (SENDS: this rank puts to it, RECEIVES: it puts to this rank,
    OWN: on this rank's own entry, its inp is part of what it writes). root: a position; to, frm: global
    ranks (p2p; -1: none)."""
    out = []
    for j, q in enumerate(members):
        if j == me:
            own = kind in SYMMETRIC or (kind in FROM_ROOT + TO_ROOT and me == root) or (kind == "p2p" and frm == q)
            out.append(pk.OWN.value * own)
            continue
        both = kind in SYMMETRIC or kind == "barrier"
        sends = (both or (kind in FROM_ROOT and me == root) or (kind in TO_ROOT and j == root)
                 or (kind == "p2p" and q == to))
        gets = (both or (kind in TO_ROOT and me == root) or (kind in FROM_ROOT and j == root)
                or (kind == "p2p" and q == frm))
        out.append(pk.SENDS.value * sends + pk.RECEIVES.value * gets)
    return tuple(out)


def plan(ccl, kind, out, inp, ranks, knob, op="sum", root=0, to=-1, frm=-1, cfg=None, whole=False) -> Plan:
    """put_kernel's plan for one call shape. ranks: the members' global ranks in order (None: every
    rank); knob: the call's Knobs; root: a position; to, frm: global ranks (p2p); cfg: the ccl Config
    (Iris's tile layout for 'rst', launch options), None for the rooted and p2p calls; whole: receive
    into an area of the plan's own, else into iris's reserve."""
    ctx, w = ccl.ctx, ccl.ctx.world
    if whole:
        not_capturing(ctx.device)
    else:
        not_capturing(ctx.device, "the first call of a collective at a new shape builds small device tensors",
                      "call it once")
    members = tuple(range(w)) if ranks is None else tuple(ranks)
    g, dtype = len(members), inp.dtype
    total, cols, tile = inp.numel(), 0, (0, 0, 0, 1, 1, 1, 0)
    if kind == "ar2":
        n = round_up(-(-total // g), 16)
    elif kind == "rst":
        (m, ncol), bm, bn = inp.shape, cfg.block_size_m, cfg.block_size_n
        tiles = -(-m // bm) * -(-ncol // bn)
        tile = (m, ncol, tiles, bm, bn, cfg.swizzle_size, cfg.all_reduce_distribution)
        n = -(-tiles // g) * bm * bn
    else:
        n = elements(kind, out, inp, g)
        cols = inp.shape[1] // g if kind == "a2a" else 0
    block = block_for(knob.block, dtype)
    if not whole:
        block = min(block, PUT_SLOT // dtype.itemsize)
    programs, per = split(n, block, min(knob.sms or ccl.sms, GROUP_PROGRAMS if whole else PUT_PROGRAMS))
    reserve = ctx.reserve
    if whole:
        budget = max(AREA_BYTES, 2 * max(inp.nbytes, out.nbytes)) // (programs * 2 * w * dtype.itemsize)
        slot = min(per, max(block, budget // block * block))
        area = ctx.empty(programs * 2 * w * slot, dtype=dtype)
        workspace = (area,)
    else:
        slot, area, workspace = PUT_SLOT // dtype.itemsize, reserve.put_area.view(dtype), ()
    if ccl.put_state is None:
        ccl.put_state = torch.zeros_like(reserve.put_counters)
    me = members.index(ctx.rank)
    peers = torch.tensor(members + roles(kind, members, me, root, to, frm), dtype=torch.int64, device=ctx.device)
    m_, ncol_, tiles_, bm_, bn_, gm_, dist_ = tile
    warps = knob.warps or 8
    return Plan(put_kernel, programs, options(cfg, warps) if cfg is not None else {"num_warps": warps}, workspace,
                "put", inp=inp, out=out, area=area, counters=reserve.put_counters, state=ccl.put_state,
                heap_bases=ctx.get_heap_bases(), peers=peers, kind=KINDS[kind], op=OPS[op], n=n, total=total, per=per,
                slot=slot, cols=cols, M=m_, N=ncol_, tiles=tiles_, bm=bm_, bn=bn_, gm=gm_, dist=dist_, g=g, me=me,
                rank=ctx.rank, world=w, BLOCK=block, SPIN=knob.spin)
