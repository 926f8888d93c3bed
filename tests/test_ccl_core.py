"""ccl's core on its own, in one process: the split of a call among programs, the element counts per
collective, the argument checks and group resolution, the reserve's layout, and the grouped tile order
that ccl's kernels and the GEMM share."""
import warnings
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from iris import settings
from iris.ccl import CollectiveError, Config, subsets
from iris.ccl.config import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, GLUON_ONLY, REDUCE_SCATTER
from iris.ccl.checks import Groups, on_heap, overlap, position, tensor
from iris.ccl.kernels.common import _tile_mn
from iris.ccl.modes import MODES, elements
from iris.ccl.plan import Knobs, knobs, pair_knobs, pair_split, segment, split
from iris.errors import IrisError
from iris.heap import reserve


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1000, 4096, 100003])
@pytest.mark.parametrize("block,most", [(16, 1), (16, 4), (64, 7), (1024, 128)])
def test_split_covers_every_element_once(n, block, most):
    programs, per = split(n, block, most)
    assert 1 <= programs <= max(1, most) and per % block == 0 and per > 0
    ranges = [(p * per, min(p * per + per, n)) for p in range(programs)]
    if n:
        assert all(lo < hi for lo, hi in ranges), ranges  # no program is empty
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    else:
        assert (programs, per) == (1, block)


@pytest.mark.parametrize("n", [1, 143, 1000, 4096, 100003])
@pytest.mark.parametrize("block,most,segs", [(16, 2, 3), (16, 3, 8), (64, 7, 2), (1024, 128, 8)])
def test_segments_cover_each_range_once(n, block, most, segs):
    """The pipelined pull's segments: whole blocks, at most segs a program, together its range exactly."""
    programs, per = split(n, block, most)
    seg = segment(per, block, segs)
    count = -(-per // seg)
    assert seg % block == 0 and 1 <= count <= segs
    for p in range(programs):
        lo, hi = p * per, min(p * per + per, n)
        parts = [(max(lo, min(lo + j * seg, hi)), min(lo + (j + 1) * seg, hi)) for j in range(count)]
        assert parts[0][0] == lo and parts[-1][1] == hi and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


def test_pair_split_and_knobs():
    assert pair_split(10 << 10, torch.float32, Knobs(), 3, 128) == (3, 4096, 4096)  # 16 KiB blocks, sms programs
    assert pair_split(10 << 10, torch.float32, Knobs(block=64, sms=2), 3, 1)[:2] == (1, 10 << 10)  # cap wins
    assert knobs(None) == Knobs(spin=settings.SPIN_LIMIT.get()) and knobs(Config(comm_sms=5, block_size=32, spin_limit=9)) == (32, 0, 5, 9)
    with pytest.raises(CollectiveError, match="no Gluon kernel"):
        pair_knobs(Config(use_gluon=True))


def test_elements_per_collective():
    inp, out = torch.empty(6, 8), torch.empty(3, 8)
    assert [elements(m, out, inp, 2) for m in ("ar", "ag", "bc", "rs", "a2a", "scatter", "p2p", "barrier")] == [
        48, 48, 48, 24, 24, 24, 24, 0]
    assert {row.name for row in MODES.values()} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                    "broadcast"}



def test_group_routes_cover_every_variant():
    """Over a subset group, every value of each collective's Config field has a kernel (tdm is Gluon's);
    the push all_reduce variants run their pull twins, warning once."""
    ccl = SimpleNamespace(warned=set())
    values = {"all_reduce_variant": ALL_REDUCE, "all_gather_variant": ALL_GATHER, "all_to_all_variant": ALL_TO_ALL,
              "reduce_scatter_variant": REDUCE_SCATTER}
    for mode, row in MODES.items():
        for v in values.get(row.variant, (None,)):
            if v == GLUON_ONLY:
                continue
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                how = subsets.route(ccl, mode, Config(**({row.variant: v} if v else {})))
            assert how in subsets.ROUTES.values() and len(seen) == (v in subsets.STAND_INS), (mode, v)
    assert subsets.route(ccl, "ar", Config(all_reduce_variant="two_shot_push")).build is subsets._two_shot


def test_tensor_checks_name_the_problem():
    dev = torch.device("cpu")
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        tensor("all_reduce", "out", [1.0], dev)
    with pytest.raises(CollectiveError, match="float64, not supported"):
        tensor("all_reduce", "out", torch.ones(2, dtype=torch.float64), dev)
    with pytest.raises(CollectiveError, match="is on meta"):
        tensor("all_reduce", "inp", torch.ones(2, device="meta"), dev)
    with pytest.raises(CollectiveError, match="position in the group"):
        position("reduce", "dst", 3, (0, 1, 2))
    with pytest.raises(CollectiveError, match="position in the group"):
        position("reduce", "dst", True, (0, 1, 2))
    x = torch.ones(8)
    span = (x.data_ptr(), x.data_ptr() + x.nbytes)
    on_heap("send", "tensor", x[2:], span, "why")
    with pytest.raises(CollectiveError, match="heap tensor"):
        on_heap("send", "tensor", torch.ones(8), span, "why")
    with pytest.raises(CollectiveError, match="contiguous"):
        on_heap("send", "tensor", x.view(2, 4).t(), span, "why")
    assert overlap(x[:5], x[4:]) and not overlap(x[:4], x[4:])


def test_groups_resolve_and_refuse():
    g = Groups(rank=1, world=4, bases=[1000, 2000, 3000, 4000], device=torch.device("cpu"))
    assert g.of(None, "c") == (None, 4) and g.of([0, 1, 2, 3], "c") == (None, 4)
    assert g.of([3, 1], "c") == ((3, 1), 2) and g.ranks(None, "c") == (0, 1, 2, 3)
    assert g.members((3, 1)).tolist() == [3, 1, 4000, 2000]
    for bad, words in (([0, 2], "not in group"), ([1, 1], "twice"), ([1, 4], "global ranks"), ("x", "group must")):
        with pytest.raises((CollectiveError, TypeError), match=words):
            g.of(bad, "all_reduce")


@pytest.mark.parametrize("world,puts", [(1, False), (2, False), (4, True), (8, True)])
def test_reserve_views_are_disjoint_and_fit(world, puts):
    size = reserve.size(world, puts)
    block = torch.full((size,), 0xAB, dtype=torch.uint8)  # poisoned: the reserve zeroes it
    r = reserve.Reserve(block, world, puts, indirect=puts)
    assert r.nbytes == size and r.puts is puts and int(block.max()) == 0
    views = [r.barrier_flags, r.group_counters, r.group_locks, r.ring_slots, r.ring_flags, r.progress] + (
        [r.put_counters, r.put_area] if puts else [])
    assert r.group_counters.shape == (reserve.GROUP_PROGRAMS, world)
    assert r.ring_slots.numel() == reserve.RING_PROGRAMS * reserve.RING_SLOT and (r.ring_slots.data_ptr() - block.data_ptr()) % 256 == 0
    assert (r.put_counters is None) is (not puts)
    spans = sorted((v.data_ptr(), v.data_ptr() + v.nbytes) for v in views)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert spans[0][0] >= block.data_ptr() and spans[-1][1] <= block.data_ptr() + size
    with pytest.raises(IrisError, match="reserve of"):
        reserve.Reserve(torch.zeros(64, dtype=torch.uint8), world, puts, False)


@triton.jit
def _order_kernel(out, num_m, num_n, GROUP_M: tl.constexpr, TILES: tl.constexpr):
    t = tl.arange(0, TILES)
    pm, pn = _tile_mn(t, num_m, num_n, GROUP_M)
    tl.store(out + 2 * t, pm)
    tl.store(out + 2 * t + 1, pn)


@pytest.mark.parametrize("num_m,num_n,group", [(5, 3, 2), (4, 4, 4), (7, 2, 3), (1, 8, 4)])
def test_grouped_tile_order(num_m, num_n, group):
    """The grouped order visits every tile once, GROUP_M row blocks at a time, column by column."""
    tiles = num_m * num_n
    width = 1 << (tiles - 1).bit_length()
    out = torch.full((2 * width,), -7, dtype=torch.int32)
    _order_kernel[(1,)](out, num_m, num_n, group, width)
    got = [tuple(out[2 * t:2 * t + 2].tolist()) for t in range(tiles)]
    want = []
    for first in range(0, num_m, group):
        rows = min(group, num_m - first)
        want += [(first + i, n) for n in range(num_n) for i in range(rows)]
    assert got == want
