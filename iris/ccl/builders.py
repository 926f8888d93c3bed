"""The plans of ctx.ccl's load/store kernels, one builder per kernel, and the routing from a call's
Config to its builder (or to put_kernel's plans where ctx.ccl moves data by puts).

A whole-job builder allocates its workspace on the heap and ends with a barrier (every rank's flags
are zero before any rank signals into them), so it is collective and runs outside CUDA graph
capture; the group calls' builders (iris/ccl/subsets.py) allocate nothing on the heap. Arguments are checked before a builder
runs (iris/ccl/checks.py).
"""
from __future__ import annotations

import torch

from ..allocators.offsets import round_up
from ..errors import HeapOutOfMemory
from .kernels.accumulate import accumulate_kernel
from .kernels.pull import broadcast_kernel, pull_kernel
from .kernels.push import gather_push_kernel, push_kernel, scatter_push_kernel
from .kernels.ring import ring_gather_kernel, ring_kernel, ring_reduce_scatter_kernel
from .kernels.shots import two_shot_kernel
from .kernels.tiles import tile_reduce_scatter_kernel
from .checks import not_capturing
from .modes import elements
from .plan import Plan, block_for, knobs, options, pow2, segment, split
from . import puts

_KiB, _MiB = 1 << 10, 1 << 20
SPLIT_BROADCAST = _MiB  # bytes from which a broadcast over 3+ ranks is a scatter then an all_gather
# bytes of inp from which all_gather pull, all_to_all, reduce_scatter two_shot and all_reduce
# two_shot_push store into the peers in segments, each rank's local pass over one beside its stores of the
# next (scatter_push_kernel), below which one exchange keeps small calls' latency. 2 and 4x H200
# (collectives_pull-gpu-*ranks.json), graph us at 2 / 4 ranks, one exchange against pipelined: all_gather
# 4 MiB 23.7 / 48.9 against 26.7 / 52.3, 16 MiB 79.1 / 191 against 74.7 / 163; all_to_all 16 MiB 46.1 /
# 58.5 against 50.0 / 63.3, 64 MiB 165 / 211 against 129 / 170; reduce_scatter 32 MiB of inp at 2 ranks
# 75.8 against 81.1, 64 MiB at 4 186 against 168; all_reduce at 2 ranks (collectives_ar-gpu-2ranks.json,
# plain / heap tensors) 4 MiB 20.9 / 19.5 against 21.8 / 21.7, 64 MiB 207.9 / 208.5 against 211.9 / 216.7,
# 256 MiB 803.9 / 760.4 against 769.3 / 742.7
PIPELINE_BYTES = {"ag": 16 * _MiB, "a2a": 32 * _MiB, "rs": 64 * _MiB, "ar": 256 * _MiB, "rd": 0}
SEGMENTS = 4  # the pipelined form's most segments per program where Config.pull_segments is 0


def all_reduce(ccl, out, inp, op, cfg) -> Plan:
    """all_reduce's plan for Config.all_reduce_variant ("auto": one_shot up to one_shot_max_bytes, else
    two_shot_push; benchmarks/results/collectives_variants-gpu-2ranks.json chose the defaults)."""
    n, w = inp.numel(), ccl.ctx.world
    limit = cfg.one_shot_max_bytes or (4 * _MiB if w <= 2 else 256 * _KiB)
    auto = "one_shot" if n * inp.element_size() <= limit or w == 1 else "two_shot_push"
    variant = auto if cfg.all_reduce_variant == "auto" else cfg.all_reduce_variant
    if ccl.puts:
        return put(ccl, puts.all_reduce_kind(ccl, variant, auto), out, inp, None, op, cfg, whole=True)
    not_capturing(ccl.ctx.device)
    if variant == "one_shot":
        return pull(ccl, "ar", out, inp, op, cfg)
    if variant in ("atomic", "spinlock"):
        return accumulate(ccl, out, inp, cfg, variant == "spinlock")
    if variant == "two_shot_push" and pipelined("ar", inp, cfg, ccl.ctx.world):
        # the pipelined stage (4 x inp) where it fits, else one exchange (2 x inp), unless pull_segments asks
        plan = roomy(lambda: scatter_push(ccl, "ar", out, inp, op, cfg), bool(cfg.pull_segments))
        if plan is not None:
            return plan
    if variant == "ring":
        return ring(ccl, out, inp, op, cfg)
    return shots(ccl, out, inp, op, cfg, variant)


def whole(ccl, mode, out, inp, op, cfg, src=0) -> Plan:
    """The whole-job plan of all_gather ("ag"), reduce_scatter ("rs", "rst": Iris's layout), all_to_all
    and broadcast, by Config variant."""
    if ccl.puts:
        if mode == "ag" and cfg.all_gather_variant != "pull":
            puts.warn_variant(ccl, "all_gather", "all_gather_variant", cfg.all_gather_variant)
        elif mode in ("rs", "rst") and cfg.reduce_scatter_variant == "ring_chunked":
            puts.warn_variant(ccl, "reduce_scatter", "reduce_scatter_variant", cfg.reduce_scatter_variant)
        return put(ccl, mode, out, inp, None, op, cfg, src, whole=True)
    if mode == "ag" and cfg.all_gather_variant == "ring":
        return ring_gather(ccl, out, inp, cfg)
    if mode == "ag" and cfg.all_gather_variant != "pull":
        return gather_push(ccl, out, inp, cfg)
    if mode in ("rs", "rst") and cfg.reduce_scatter_variant == "ring_chunked":
        return ring_reduce_scatter(ccl, out, inp, op, cfg, mode == "rst")
    if mode == "rst":
        return tile_reduce_scatter(ccl, out, inp, op, cfg)
    if mode == "rs":
        return scatter_push(ccl, mode, out, inp, op, cfg)
    if pipelined(mode, inp, cfg, ccl.ctx.world):  # all_gather's stage 2 x world x inp, one exchange's 2 x inp
        plan = roomy(lambda: scatter_push(ccl, mode, out, inp, op, cfg), bool(cfg.pull_segments))
        if plan is not None:
            return plan
    if mode == "bc" and ccl.ctx.world > 2 and inp.numel() * inp.element_size() >= SPLIT_BROADCAST:
        return broadcast(ccl, out, inp, cfg, src)
    return pull(ccl, mode, out, inp, op, cfg, src)


def put(ccl, kind, out, inp, ranks, op, cfg, root=0, whole=False) -> Plan:
    """put_kernel's plan for one call shape (iris/ccl/puts.py); whole: a whole-job call, which receives
    into an area of its own on the heap."""
    return puts.plan(ccl, kind, out, inp, ranks, knobs(cfg), op.value, root, cfg=cfg, whole=whole)


def shots(ccl, out, inp, op, cfg, variant):
    """two_shot (pull, then push), one_shot_push and two_shot_push."""
    ctx, n, w = ccl.ctx, inp.numel(), ccl.ctx.world
    block, warps = block_for(cfg.block_size, inp.dtype), 8
    if variant == "two_shot_push":
        block, warps = cfg.block_size or push_block(-(-n // w) * inp.element_size(), inp.element_size()), 16
    one = variant == "one_shot_push"  # one-shot push: every rank's whole input in every peer's stage
    strided = variant == "two_shot" and cfg.all_reduce_distribution == 0
    if strided:  # whole blocks dealt round robin: a rank's share is a whole number of blocks
        chunk = -(-(-(-n // block)) // w) * block
    else:
        chunk = round_up(n if one else -(-n // w), 16)
    programs, per = split(chunk, block, cfg.comm_sms)
    stage = ctx.empty((2 if one else 1) * w * chunk, dtype=inp.dtype)
    gather = stage if one else ctx.empty(w * chunk, dtype=inp.dtype)
    flags = ctx.zeros((1 if one else 2) * programs * w, dtype=torch.int64)
    counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
    ctx.barrier()  # every rank's flags are zero before any rank signals into them
    workspace = (stage, flags, counters) if one else (stage, gather, flags, counters)
    common = dict(inp=inp, out=out, stage=stage, gather=gather, flags=flags, counters=counters,
                  heap_bases=ctx.get_heap_bases(), n=n, chunk=chunk, per=per, rank=ctx.rank, WORLD=w,
                  PEERS=pow2(w), OP=op.value, IS_FLOAT=inp.dtype.is_floating_point, IN_HEAP=False,
                  OUT_HEAP=False, BLOCK=block, SPIN=cfg.spin_limit)
    per_call = () if one else ("IN_HEAP", "OUT_HEAP")  # all_reduce passes where inp and out live
    opts = options(cfg, warps)
    if variant == "two_shot":
        return Plan(two_shot_kernel, programs, opts, workspace, variant, per_call, STRIDED=strided, **common)
    return Plan(push_kernel, programs, opts, workspace, variant, per_call,
                parity_stride=w * chunk if one else 0, TWO_SHOT=not one, **common)


def push_block(share: int, itemsize: int) -> int:
    """two_shot_push's elements a step for a rank's share of `share` bytes: about a thousand steps a share,
    4 to 32 KiB each (benchmarks/collectives.py's sweep, 2 and 4 ranks: 1-16 MiB tensors want small
    steps, so that every SM has some, and 64 MiB and more large ones)."""
    step = 1 << max(0, (share >> 10).bit_length() - 1)
    return max(16, min(32 * _KiB, max(4 * _KiB, step)) // itemsize)


def accumulate(ccl, out, inp, cfg, lock):
    """atomic and spinlock: a heap accumulator (fp32 for floats) that every rank adds into."""
    ctx, n, w = ccl.ctx, inp.numel(), ccl.ctx.world
    block = _tile(cfg)
    programs, per = split(n, block, cfg.comm_sms)
    acc = ctx.empty(round_up(n, 16), dtype=torch.float32 if inp.dtype.is_floating_point else inp.dtype)
    locks = ctx.zeros(-(-n // block) if lock else 1, dtype=torch.int64)
    flags = ctx.zeros(3 * programs * w, dtype=torch.int64)
    counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
    ctx.barrier()  # every rank's flags and locks are zero before any rank touches them
    return Plan(accumulate_kernel, programs, options(cfg, 8), (acc, locks, flags, counters),
                "spinlock" if lock else "atomic", inp=inp, out=out, acc=acc, locks=locks, flags=flags,
                counters=counters, heap_bases=ctx.get_heap_bases(), n=n, per=per, rank=ctx.rank, WORLD=w,
                PEERS=pow2(w), BLOCK=block, SPIN=cfg.spin_limit, LOCK=lock, TURNS=ctx.device.type != "cuda")


def _ring_tiles(n, cfg, w):
    """ring's slice (a power of two, a world-th of a tile) and its number of tiles of world slices."""
    slice_ = max(1, 1 << ((_tile(cfg) // w).bit_length() - 1)) if _tile(cfg) >= w else 1
    return slice_, -(-n // (slice_ * w))


def rs_tiles(out, inp, cfg, w) -> int:
    """reduce_scatter ring_chunked's tiles: Iris's tiles of inp (out shaped as inp), else blocks of out."""
    if tuple(out.shape) == tuple(inp.shape) and inp.dim() == 2 and w > 1:
        return -(-inp.shape[0] // cfg.block_size_m) * -(-inp.shape[1] // cfg.block_size_n)
    return -(-out.numel() // block_for(cfg.block_size, inp.dtype))


def too_small(plan, inp, cfg, w):
    """Iris's check of a workspace passed back (workspace=) that was built for larger tiles: the
    message when plan (all_reduce spinlock or ring) holds fewer locks or flags than cfg's tiles of inp
    need, else None. Raised before anything is launched, the same on every rank."""
    if not isinstance(plan, Plan) or plan.variant != cfg.all_reduce_variant:
        return None
    n = inp.numel()
    if plan.variant == "spinlock":
        have, need, what = plan.args[plan.at["locks"]].numel(), -(-n // _tile(cfg)), "Lock"
    elif plan.variant == "ring":
        have, need, what = plan.args[plan.at["tiles"]], _ring_tiles(n, cfg, w)[1], "Flags"
    else:
        return None
    if have >= need:
        return None
    return (f"all_reduce: {what} array too small: have {have} but need {need} for block_size_m="
            f"{cfg.block_size_m}, block_size_n={cfg.block_size_n}: the workspace passed back was built for larger "
            "tiles. Pre-allocate workspace with the smallest block sizes you intend to use (all_reduce_preamble with "
            "this config), or leave workspace= out")


def ring(ccl, out, inp, op, cfg):
    """ring: tiles of world slices; a slot of one slice and a 0/1 flag per program on every rank."""
    ctx, n, w = ccl.ctx, inp.numel(), ccl.ctx.world
    slice_, tiles = _ring_tiles(n, cfg, w)
    rings = cfg.all_reduce_num_rings
    programs = rings * max(1, min(cfg.comm_sms, tiles) // rings)
    buf = ctx.zeros(programs * slice_, dtype=torch.float32 if inp.dtype.is_floating_point else inp.dtype)
    flags = ctx.zeros(programs, dtype=torch.int64)
    ctx.barrier()  # every rank's flags are zero before any rank signals into them
    return Plan(ring_kernel, programs, options(cfg, 8), (buf, flags), "ring", inp=inp, out=out,
                buf=buf, flags=flags, heap_bases=ctx.get_heap_bases(), n=n, tiles=tiles, rank=ctx.rank,
                WORLD=w, OP=op.value, IS_FLOAT=inp.dtype.is_floating_point, SLICE=slice_, RINGS=rings,
                SPIN=cfg.spin_limit)


def gather_push(ccl, out, inp, cfg):
    """all_gather persistent and partitioned: stores into the peers' out (a heap out) or stage."""
    not_capturing(ccl.ctx.device)
    ctx, n, w = ccl.ctx, inp.numel(), ccl.ctx.world
    parted = cfg.all_gather_variant == "partitioned"
    block = block_for(cfg.block_size, inp.dtype)
    if parted:  # comm_sms // w programs per destination, each a range of inp
        parts, per = split(n, block, min(cfg.comm_sms, max(1, cfg.comm_sms // w)))
        programs = parts * w
    else:
        programs, per = split(n, block, cfg.comm_sms)
    stage = ctx.empty(w * n, dtype=inp.dtype)
    flags = ctx.zeros(2 * programs * w, dtype=torch.int64)
    counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
    ctx.barrier()  # every rank's flags are zero before any rank signals into them
    return Plan(gather_push_kernel, programs, options(cfg, 8), (stage, flags, counters),
                cfg.all_gather_variant, ("OUT_HEAP",), inp=inp, out=out, stage=stage, flags=flags,
                counters=counters, heap_bases=ctx.get_heap_bases(), n=n, per=per, rank=ctx.rank, WORLD=w,
                PEERS=pow2(w), BLOCK=block, SPIN=cfg.spin_limit, OUT_HEAP=False, PARTITIONED=parted)


def ring_gather(ccl, out, inp, cfg):
    """all_gather ring: a slot of inp's size and a 0/1 flag per program on every rank."""
    not_capturing(ccl.ctx.device)
    ctx, n = ccl.ctx, inp.numel()
    block = block_for(cfg.block_size, inp.dtype)
    programs = max(1, min(cfg.comm_sms, -(-n // block)))
    slot = ctx.empty(round_up(n, 16), dtype=inp.dtype)
    flags = ctx.zeros(programs, dtype=torch.int64)
    ctx.barrier()  # every rank's flags are zero before any rank hands over into them
    return Plan(ring_gather_kernel, programs, options(cfg, 8), (slot, flags), "ring", inp=inp,
                out=out, slot=slot, flags=flags, heap_bases=ctx.get_heap_bases(), n=n, rank=ctx.rank,
                WORLD=ctx.world, BLOCK=block, SPIN=cfg.spin_limit)


def ring_reduce_scatter(ccl, out, inp, op, cfg, tiled):
    """reduce_scatter ring_chunked: units of a rank's part (Iris's tiles of its share, or blocks of
    its rows), a slot of one part (fp32 for floats) and a 0/1 flag per program on every rank, and a
    local buffer of partials for more than two ranks."""
    not_capturing(ccl.ctx.device)
    ctx, w, n = ccl.ctx, ccl.ctx.world, out.numel()
    if tiled:
        (m, cols), bm, bn, group = inp.shape, cfg.block_size_m, cfg.block_size_n, cfg.swizzle_size
        tiles = -(-m // bm) * -(-cols // bn)
        units = -(-tiles // w)
    else:
        m, cols, bm, bn, group = 1, n, 1, block_for(cfg.block_size, inp.dtype), 1
        tiles = units = -(-n // bn)
    programs = max(1, min(cfg.comm_sms, units))
    acc = torch.float32 if inp.dtype.is_floating_point else inp.dtype
    slot = ctx.empty(units * bm * bn, dtype=acc)
    part = torch.empty(units * bm * bn if w > 2 else 1, dtype=acc, device=ctx.device)
    flags = ctx.zeros(programs, dtype=torch.int64)
    ctx.barrier()  # every rank's flags are zero before any rank hands over into them
    return Plan(ring_reduce_scatter_kernel, programs, options(cfg, 8), (slot, flags), "ring_chunked",
                inp=inp, out=out, slot=slot, part=part, flags=flags, heap_bases=ctx.get_heap_bases(), n=n, M=m,
                N=cols, tiles=tiles, units=units, rank=ctx.rank, WORLD=w, BM=bm, BN=bn, GROUP_M=group,
                DIST=cfg.all_reduce_distribution, TILED=tiled, OP=op.value, SPIN=cfg.spin_limit)


def tile_reduce_scatter(ccl, out, inp, op, cfg):
    """reduce_scatter in Iris's layout: Iris's tiles, a stage of inp in two copies (by epoch parity)."""
    not_capturing(ccl.ctx.device)
    ctx, w = ccl.ctx, ccl.ctx.world
    (m, n), bm, bn = inp.shape, cfg.block_size_m, cfg.block_size_n
    tiles = -(-m // bm) * -(-n // bn)
    programs = max(1, min(cfg.comm_sms, -(-tiles // w)))
    cs = round_up(m * n, 16)
    stage = ctx.empty(2 * cs, dtype=inp.dtype)
    flags = ctx.zeros(programs * w, dtype=torch.int64)
    counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
    ctx.barrier()  # every rank's flags are zero before any rank signals into them
    return Plan(tile_reduce_scatter_kernel, programs, options(cfg, 4), (stage, flags, counters),
                "two_shot", inp=inp, out=out, stage=stage, flags=flags, counters=counters,
                heap_bases=ctx.get_heap_bases(), M=m, N=n, tiles=tiles, parity_stride=cs, rank=ctx.rank,
                WORLD=w, PEERS=pow2(w), BM=bm, BN=bn, GROUP_M=cfg.swizzle_size,
                DIST=cfg.all_reduce_distribution, OP=op.value, IS_FLOAT=inp.dtype.is_floating_point,
                SPIN=cfg.spin_limit)


def _staged(ccl, n, chunks, inp, cfg, rows=1):
    """The sizing and workspace of a kernel that moves n elements a chunk through a stage of two copies
    (by epoch parity) of `chunks` chunks, with `rows` flag exchanges: (programs, per, block, cs, (stage,
    flags, counters))."""
    programs, per, block, cs = _sizes(n, inp, cfg)
    return programs, per, block, cs, _workspace(ccl, programs, chunks, cs, inp.dtype, rows)


def _sizes(n, inp, cfg):
    """(programs, elements of a chunk per program, block, chunk stride cs) of a staged kernel."""
    block = block_for(cfg.block_size, inp.dtype)
    return split(n, block, cfg.comm_sms) + (block, round_up(n, 16))


def _workspace(ccl, programs, chunks, cs, dtype, rows):
    """A stage of two copies of `chunks` chunks cs apart, `rows` flag rows per program, and this rank's
    epoch counters (collective: ends with a barrier)."""
    not_capturing(ccl.ctx.device)
    ctx = ccl.ctx
    stage = ctx.empty(2 * chunks * cs, dtype=dtype)
    try:
        flags = ctx.zeros(rows * programs * ctx.world, dtype=torch.int64)
    except BaseException:
        ctx.free(stage)  # a heap the flags did not fit into is left as it was
        raise
    counters = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
    ctx.barrier()  # every rank's flags are zero before any rank signals into them
    return stage, flags, counters


def scatter_push(ccl, mode, out, inp, op, cfg, root=None, out_heap=False):
    """reduce_scatter two_shot ("rs"), and the pipelined all_gather, all_to_all, all_reduce ("ar",
    two_shot_push's pipelined form) and reduce ("rd", 3+ ranks, to the rank `root`, into its out where
    out_heap, always pipelined): every rank stores each peer's part into a slot of that peer's stage, in
    segments where pipelined() says so. "ar" reduces chunks of inp.numel() / world rounded up to 16
    elements, "rd" of inp.numel() / (world - 1), and their stage holds a gather half beside the slots
    where the reduced chunks go through it."""
    ctx, w = ccl.ctx, ccl.ctx.world
    total = inp.numel()
    n = round_up(-(-total // (w - 1)), 16) if mode == "rd" else \
        round_up(-(-total // w), 16) if mode == "ar" else elements(mode, out, inp, w)
    programs, per, block, cs = _sizes(n, inp, cfg)
    seg = segment(per, block, cfg.pull_segments or SEGMENTS) if pipelined(mode, inp, cfg, w) else per
    rows = 2 if mode in ("ar", "rd") else 1  # the second: reduced segments landed
    halves = 2 if mode == "ar" or (mode == "rd" and not out_heap) else 1
    stage, flags, counters = workspace = _workspace(ccl, programs, halves * w, cs, inp.dtype, rows * -(-per // seg))
    variant = "two_shot" if seg == per and mode == "rs" else "pipelined"
    return Plan(scatter_push_kernel, programs, options(cfg, 8), workspace, variant,
                ("IN_HEAP", "OUT_HEAP") if mode == "ar" else (),
                inp=inp, out=out, stage=stage, flags=flags, counters=counters, heap_bases=ctx.get_heap_bases(),
                n=n, total=total if mode in ("ar", "rd") else w * n, cs=cs, per=per, seg=seg,
                parity_stride=halves * w * cs, cols=inp.shape[1] // w if mode == "a2a" else 1, rank=ctx.rank,
                root=w if root is None else root, WORLD=w, PEERS=pow2(w), MODE=mode, OP=op.value,
                IS_FLOAT=inp.dtype.is_floating_point, BLOCK=block, SPIN=cfg.spin_limit, IN_HEAP=False,
                OUT_HEAP=out_heap)


def broadcast(ccl, out, inp, cfg, src):
    """broadcast as a scatter then an all_gather: src's links carry the tensor about once, where a pull
    from src carries it once per peer (world - 1 times)."""
    ctx, w, n = ccl.ctx, ccl.ctx.world, inp.numel()
    piece = round_up(-(-n // w), 16)
    programs, per, block, _, (stage, flags, counters) = _staged(ccl, piece, w, inp, cfg, rows=2)
    return Plan(broadcast_kernel, programs, options(cfg, 8), (stage, flags, counters), "scatter_all_gather",
                inp=inp, out=out, stage=stage, flags=flags, counters=counters, heap_bases=ctx.get_heap_bases(),
                n=n, piece=piece, per=per, parity_stride=w * piece, rank=ctx.rank, src=src, WORLD=w,
                PEERS=pow2(w), BLOCK=block, SPIN=cfg.spin_limit)


def pull(ccl, mode, out, inp, op, cfg, src=0):
    """all_reduce one_shot, all_gather pull, all_to_all and broadcast in one exchange: stage, exchange,
    read the peers."""
    ctx, w = ccl.ctx, ccl.ctx.world
    n = elements(mode, out, inp, w)
    chunks = w if mode == "a2a" else 1
    programs, per, block, cs = _sizes(n, inp, cfg)
    stage, flags, counters = workspace = _workspace(ccl, programs, chunks, cs, inp.dtype, 1)
    args = dict(inp=inp, out=out, stage=stage, flags=flags, counters=counters, heap_bases=ctx.get_heap_bases(),
                n=n, cs=cs, per=per, parity_stride=chunks * cs, cols=inp.shape[1] // w if mode == "a2a" else 1,
                rank=ctx.rank, WORLD=w, PEERS=pow2(w), MODE=mode, BLOCK=block, SPIN=cfg.spin_limit)
    return Plan(pull_kernel, programs, options(cfg, 8), workspace, "one_shot", src=src, OP=op.value,
                IS_FLOAT=inp.dtype.is_floating_point, **args)


def roomy(build, asked=False):
    """build()'s plan, or None where its stage does not fit in the heap: every rank finds that alike (a
    symmetric heap; nothing is left allocated), and the caller builds a form that stages less. asked (the
    Config asked for this form): HeapOutOfMemory is raised instead."""
    try:
        return build()
    except HeapOutOfMemory:
        if asked:
            raise
        return None


def pipelined(mode, inp, cfg, w) -> bool:
    """Whether all_gather pull, all_to_all, reduce_scatter two_shot or all_reduce two_shot_push (mode)
    runs its pipelined form (scatter_push_kernel in segments): Config.pull_segments >= 2 (at most that
    many segments per program), or 0 and PIPELINE_BYTES[mode] of inp or more (at most SEGMENTS); 1, or
    less inp: one exchange. Other collectives, and a job of one rank, take one exchange."""
    if mode not in PIPELINE_BYTES or w == 1:
        return False
    return (cfg.pull_segments or (SEGMENTS if inp.numel() * inp.element_size() >= PIPELINE_BYTES[mode] else 1)) > 1


def pair_state(ccl) -> tuple:
    """(counters, seen): the pairwise counters in iris's reserve and this rank's seen counts (shared by
    the group and pair kernels, built once outside capture)."""
    counters = ccl.ctx.reserve.group_counters
    if ccl.seen is None:
        ccl.seen = torch.zeros_like(counters)
    return counters, ccl.seen


def _tile(cfg) -> int:
    """Elements per tile of atomic, spinlock and ring: Config.block_size, else block_size_m * block_size_n
    (Iris's tile of the flattened tensor)."""
    return cfg.block_size or cfg.block_size_m * cfg.block_size_n
