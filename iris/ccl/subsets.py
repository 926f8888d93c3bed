"""ctx.ccl over a subset of the ranks (group=): the kernel that serves each (collective, Config variant),
which of inp and out it needs on the heap, and its plan.

What matters:
- Ranks outside a group never make its calls and heap allocation is collective over the whole job, so
  a group call allocates nothing on the heap. Its kernels read the peers' inp in place (pull, two_shot,
  Iris's reduce_scatter layout), store into the members' out (two_shot, atomic, spinlock, persistent,
  partitioned), or hand pieces over through iris's reserve (the rings), and synchronise through the
  reserve's pairwise counters (kernels/group*.py).
- A kernel that reads the peers' inp needs inp on the heap, one that stores into the peers needs out
  there, the same allocation on every member; the rings need neither. Out overlapping inp is staged
  through a local scratch (pull), or must be the call's in-place form (out is inp; all_gather's inp
  is out's own chunk; reduce_scatter's out is inp's own chunk). Each check names the fix and runs
  before anything is built.
- one_shot_push and two_shot_push need a receive area larger than out, which a group call cannot
  have: they run one_shot and two_shot (the same results), with a warning once.
"""
from __future__ import annotations

import warnings
from typing import Callable, NamedTuple

import torch

from ..allocators.offsets import round_up
from ..errors import CollectiveError
from ..heap.reserve import GROUP_PROGRAMS, RING_PROGRAMS, RING_SLOT
from . import builders, puts
from .checks import layout, not_capturing, overlap, pair, within
from .kernels.group import group_kernel, group_tile_kernel
from .kernels.group_accumulate import group_accumulate_kernel
from .kernels.group_push import group_gather_push_kernel, group_two_shot_kernel
from .kernels.group_ring import group_ring_gather_kernel, group_ring_kernel, group_ring_reduce_scatter_kernel
from .modes import MODES, elements
from .plan import Plan, block_for, options, pow2, split

# all_reduce variants that need a receive area no group call has, and the variant that stands in
STAND_INS = {"one_shot_push": "one_shot", "two_shot_push": "two_shot"}


def _members(ccl, ranks) -> dict:
    """The arguments every group kernel takes: the members table, the pairwise counters and seen counts,
    this rank's position and global rank, the world, GROUP and PEERS."""
    counters, seen = builders.pair_state(ccl)
    g = len(ranks)
    return dict(members=ccl.groups.members(ranks), counters=counters, seen=seen, me=ranks.index(ccl.ctx.rank),
                rank=ccl.ctx.rank, world=ccl.ctx.world, GROUP=g, PEERS=pow2(g))


def _sms(cfg) -> int:
    """The most programs a group kernel launches: comm_sms, within the pairwise counters' rows."""
    return min(cfg.comm_sms, GROUP_PROGRAMS)


def _pull(ccl, mode, out, inp, ranks, op, cfg, src) -> Plan:
    """group_kernel: every member's inp read in place (one_shot, pull, two_shot torch layout, all_to_all,
    broadcast)."""
    g = len(ranks)
    n = elements(mode, out, inp, g)
    block = block_for(cfg.block_size, inp.dtype)
    programs, per = split(n, block, _sms(cfg))
    return Plan(group_kernel, programs, options(cfg, 8), (), "group", ("STAGED",), inp=inp, out=out, scratch=out,
                n=n, per=per, cols=inp.shape[1] // g if mode == "a2a" else 1, src=ranks.index(src) if mode == "bc" else 0,
                MODE=mode, OP=op.value, IS_FLOAT=inp.dtype.is_floating_point, STAGED=False, BLOCK=block,
                SPIN=cfg.spin_limit, **_members(ccl, ranks))


def _two_shot(ccl, mode, out, inp, ranks, op, cfg, src) -> Plan:
    """all_reduce two_shot: each position's share read from every member's inp, stored into every out."""
    n, g = inp.numel(), len(ranks)
    block = block_for(cfg.block_size, inp.dtype)
    strided = cfg.all_reduce_distribution == 0
    chunk = -(-(-(-n // block)) // g) * block if strided else round_up(-(-n // g), 16)
    programs, per = split(chunk, block, _sms(cfg))
    return Plan(group_two_shot_kernel, programs, options(cfg, 8), (), "two_shot", inp=inp, out=out, n=n, chunk=chunk,
                per=per, OP=op.value, IS_FLOAT=inp.dtype.is_floating_point, BLOCK=block, SPIN=cfg.spin_limit,
                STRIDED=strided, **_members(ccl, ranks))


def _accumulate(ccl, mode, out, inp, ranks, op, cfg, src) -> Plan:
    """all_reduce atomic and spinlock: every member adds into every member's out."""
    lock = cfg.all_reduce_variant == "spinlock"
    block = builders._tile(cfg)
    programs, per = split(inp.numel(), block, _sms(cfg))
    return Plan(group_accumulate_kernel, programs, options(cfg, 8), (), cfg.all_reduce_variant, ("SNAP",), inp=inp,
                out=out, snap=inp, locks=ccl.ctx.reserve.group_locks, n=inp.numel(), per=per, BLOCK=block,
                SPIN=cfg.spin_limit, LOCK=lock, TURNS=ccl.ctx.device.type != "cuda", SNAP=False,
                **_members(ccl, ranks))


def _slots(ccl, dtype) -> tuple:
    """The reserve's ring channel with slots of dtype: (slots, flags, elements per program's slot)."""
    r = ccl.ctx.reserve
    return r.ring_slots.view(dtype), r.ring_flags, RING_SLOT // dtype.itemsize


def _accumulator(dtype) -> torch.dtype:
    return torch.float32 if dtype.is_floating_point else dtype


def _ring(ccl, mode, out, inp, ranks, op, cfg, src) -> Plan:
    """all_reduce ring: builders.ring's tiles and slices, a slice no larger than a channel slot."""
    n, g = inp.numel(), len(ranks)
    slots, flags, elems = _slots(ccl, _accumulator(inp.dtype))
    slice_, tiles = builders._ring_tiles(n, cfg, g)
    if slice_ > elems:
        slice_, tiles = elems, -(-n // (elems * g))
    rings = min(cfg.all_reduce_num_rings, RING_PROGRAMS)
    programs = rings * max(1, min(cfg.comm_sms, tiles, RING_PROGRAMS) // rings)
    return Plan(group_ring_kernel, programs, options(cfg, 8), (), "ring", inp=inp, out=out, slots=slots, flags=flags,
                n=n, tiles=tiles, OP=op.value, SLICE=slice_, RINGS=rings, ELEMS=elems, SPIN=cfg.spin_limit,
                **_members(ccl, ranks))


def _gather_push(ccl, mode, out, inp, ranks, op, cfg, src) -> Plan:
    """all_gather persistent and partitioned: stores into every member's out."""
    n, g = inp.numel(), len(ranks)
    parted = cfg.all_gather_variant == "partitioned"
    block = block_for(cfg.block_size, inp.dtype)
    if parted:  # comm_sms // g programs per destination, each a range of inp
        parts, per = split(n, block, max(1, _sms(cfg) // g))
        programs = parts * g
    else:
        programs, per = split(n, block, _sms(cfg))
    return Plan(group_gather_push_kernel, programs, options(cfg, 8), (), cfg.all_gather_variant, inp=inp, out=out, n=n,
                per=per, BLOCK=block, SPIN=cfg.spin_limit, PARTITIONED=parted, **_members(ccl, ranks))


def _ring_gather(ccl, mode, out, inp, ranks, op, cfg, src) -> Plan:
    """all_gather ring: pieces of a block, no larger than a channel slot."""
    n = inp.numel()
    slots, flags, elems = _slots(ccl, inp.dtype)
    piece = min(block_for(cfg.block_size, inp.dtype), elems)
    programs = max(1, min(cfg.comm_sms, RING_PROGRAMS, -(-n // piece)))
    return Plan(group_ring_gather_kernel, programs, options(cfg, 8), (), "ring", inp=inp, out=out, slots=slots,
                flags=flags, n=n, PIECE=piece, ELEMS=elems, SPIN=cfg.spin_limit, **_members(ccl, ranks))


def _ring_reduce_scatter(ccl, mode, out, inp, ranks, op, cfg, src) -> Plan:
    """reduce_scatter ring_chunked, both layouts: pieces of Iris's tiles (rst) or blocks of out's
    elements, each no larger than a channel slot."""
    g, n = len(ranks), out.numel()
    slots, flags, elems = _slots(ccl, _accumulator(inp.dtype))
    if mode == "rst":
        (m, cols), bm, bn = inp.shape, cfg.block_size_m, cfg.block_size_n
        tiles = -(-m // bm) * -(-cols // bn)
        sbn = min(bn, elems)
        sbm = min(bm, elems // sbn)
        pieces = -(-tiles // g) * (bm // sbm) * (bn // sbn)
    else:
        m, cols, bm = 1, n, 1
        bn = sbn = min(block_for(cfg.block_size, inp.dtype), elems)
        sbm, tiles = 1, -(-n // bn)
        pieces = tiles
    programs = max(1, min(cfg.comm_sms, RING_PROGRAMS, pieces))
    return Plan(group_ring_reduce_scatter_kernel, programs, options(cfg, 8), (), "ring_chunked", inp=inp, out=out,
                slots=slots, flags=flags, n=n, M=m, N=cols, tiles=tiles, pieces=pieces, BM=bm, BN=bn, SBM=sbm, SBN=sbn,
                GROUP_M=cfg.swizzle_size, DIST=cfg.all_reduce_distribution, TILED=mode == "rst", OP=op.value,
                ELEMS=elems, SPIN=cfg.spin_limit, **_members(ccl, ranks))


def _tiles(ccl, mode, out, inp, ranks, op, cfg, src) -> Plan:
    """reduce_scatter in Iris's layout, two_shot: this position's tiles read from every member's inp."""
    (m, n), bm, bn = inp.shape, cfg.block_size_m, cfg.block_size_n
    tiles = -(-m // bm) * -(-n // bn)
    programs = max(1, min(_sms(cfg), -(-tiles // len(ranks))))
    return Plan(group_tile_kernel, programs, options(cfg, 4), (), "two_shot", inp=inp, out=out, M=m, N=n, tiles=tiles,
                BM=bm, BN=bn, GROUP_M=cfg.swizzle_size, DIST=cfg.all_reduce_distribution, OP=op.value,
                IS_FLOAT=inp.dtype.is_floating_point, SPIN=cfg.spin_limit, **_members(ccl, ranks))


class Route(NamedTuple):
    """How a group call runs: its plan's builder; whether the peers read inp in place (inp on the heap)
    and store into out (out on the heap); spare: the kernel argument that takes a local scratch when
    out overlaps inp (pull: results wait there; atomic, spinlock: a copy of inp), its per-call
    constexpr saying whether it does. Only pull takes any overlap; the others, the in-place form."""
    build: Callable
    reads: bool = False
    writes: bool = False
    spare: str = ""


PULL = Route(_pull, reads=True, spare="scratch")
ACCUMULATE = Route(_accumulate, writes=True, spare="snap")
ROUTES = {
    ("ar", "auto"): PULL, ("ar", "one_shot"): PULL, ("ar", "two_shot"): Route(_two_shot, reads=True, writes=True),
    ("ar", "atomic"): ACCUMULATE, ("ar", "spinlock"): ACCUMULATE, ("ar", "ring"): Route(_ring),
    ("ag", "pull"): PULL, ("ag", "persistent"): Route(_gather_push, writes=True),
    ("ag", "partitioned"): Route(_gather_push, writes=True), ("ag", "ring"): Route(_ring_gather),
    ("rs", "two_shot"): PULL, ("rs", "ring_chunked"): Route(_ring_reduce_scatter),
    ("rst", "two_shot"): Route(_tiles, reads=True), ("rst", "ring_chunked"): Route(_ring_reduce_scatter),
    ("a2a", "default"): PULL, ("bc", None): PULL,
}


def route(ccl, mode, cfg) -> Route:
    """The Route of a group call of mode under cfg; a push all_reduce variant warns once and runs its
    pull twin (STAND_INS)."""
    field = MODES[mode].variant
    variant = getattr(cfg, field) if field else None
    if mode == "ar" and variant in STAND_INS:
        if ("group", variant) not in ccl.warned:
            ccl.warned.add(("group", variant))
            warnings.warn(f"all_reduce(group=...): Config.all_reduce_variant={variant!r} stores every rank's input "
                          "into a receive area larger than out, which a call over a subset of the ranks cannot "
                          f"allocate; it runs {STAND_INS[variant]!r} there (the same results; docs/collectives.md)",
                          stacklevel=4)
        variant = STAND_INS[variant]
    return ROUTES[mode, variant]


def _in_place(mode, out, inp, me) -> bool:
    """Whether out and inp are the call's in-place form: out is inp (all_reduce, Iris's reduce_scatter),
    inp is out's chunk me (all_gather), out is inp's chunk me (reduce_scatter)."""
    if mode == "ag":
        return inp.data_ptr() == out.data_ptr() + me * inp.nbytes
    if mode == "rs":
        return out.data_ptr() == inp.data_ptr() + me * out.nbytes
    return out.data_ptr() == inp.data_ptr()


def run(ccl, mode, out, inp, ranks, cfg, want, op, src) -> None:
    """One collective of mode over the group of global ranks `ranks` (a subset, in group order)."""
    ctx, g = ccl.ctx, len(ranks)
    key = ("group", mode, ranks, op, inp.shape, out.shape, inp.dtype, cfg.key(), src)
    plan = ccl.plans.get(key)
    name = MODES[mode].name
    call = f"{name}(group= of ranks {list(ranks)})"
    if plan is None or inp.device != ctx.device or out.dtype != inp.dtype:
        pair(name, out, inp, want, ctx.device, g)
        cfg.validate(g)
        plan = None
    layout(out, inp)
    how = PULL if ccl.puts else route(ccl, mode, cfg)  # puts: every variant runs put_kernel (_put_kind)
    if how.reads and not within(inp, ccl.span):
        raise CollectiveError(
            f"{call}: inp must be a heap tensor, the same collective allocation on every rank: a group's peers read "
            "it in place (a workspace cannot be allocated, heap allocation is collective over all ranks); allocate "
            "inp with ctx.empty/ctx.zeros or import it with ctx.as_symmetric (collective), or pick a Config variant "
            "that reads only this rank's inp (docs/collectives.md)")
    if how.writes and not within(out, ccl.span):
        raise CollectiveError(
            f"{call}: Config.{MODES[mode].variant}={getattr(cfg, MODES[mode].variant)!r} stores into the members' out, so out must "
            "be a heap tensor, the same collective allocation on every rank of the group (ctx.empty/ctx.zeros), or "
            "pick a variant that writes only this rank's out (docs/collectives.md)")
    crossing = overlap(out, inp)
    if crossing and how is PULL and mode == "ag" and g > 1:
        raise CollectiveError(f"{call} cannot run in place with all_gather_variant='pull': the peers read inp at "
                              "their own heap offset, and inp inside out sits at another offset on every rank; pass a "
                              "separate heap inp, or pick 'persistent', 'partitioned' or 'ring'")
    if crossing and how is not PULL and not _in_place(mode, out, inp, ranks.index(ctx.rank)):
        raise CollectiveError(f"{call}: out overlaps inp without being the call's in-place form (out is inp; "
                              "all_gather's inp is out's own chunk; reduce_scatter's out is inp's own chunk); pass "
                              "a separate out")
    if plan is None:
        not_capturing(ctx.device, "the first call of a group collective at a new shape builds small device tensors",
                      "call it once")
        if ccl.puts:
            plan = builders.put(ccl, _put_kind(ccl, mode, cfg), out, inp, ranks, op, cfg,
                                ranks.index(src) if mode == "bc" else 0)
        else:
            plan = how.build(ccl, mode, out, inp, ranks, op, cfg, src)
        ccl.plans[key] = plan
    if ccl.puts or not how.spare:  # peers receive puts: nothing reads inp in place, so in place needs no scratch
        plan(inp, out)
        return
    if crossing and not plan.workspace:
        not_capturing(ctx.device, "the first in-place call of a group collective at a new shape allocates a scratch "
                      "tensor", "call it once in place")
        plan.workspace = (torch.empty_like(out),)
    plan.args[plan.at[how.spare]] = plan.workspace[0] if crossing else out
    plan(inp, out, flags=(crossing,))


def _put_kind(ccl, mode, cfg) -> str:
    """put_kernel's kind for a group call where ctx.ccl moves data by puts: all_reduce in one shot or two,
    the other collectives as themselves; a variant that reaches peers by load and store warns once."""
    variant = cfg.all_reduce_variant
    if mode == "ar":
        return puts.all_reduce_kind(ccl, "one_shot" if variant == "auto" else variant, "one_shot")
    field = MODES[mode].variant
    if field and getattr(cfg, field) not in ("pull", "two_shot", "default"):
        puts.warn_variant(ccl, MODES[mode].name, field, getattr(cfg, field))
    return mode
