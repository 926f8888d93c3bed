"""iris.ccl.utils.extract_group_info on real ranks (3 and 4 on the host driver): Iris's five numbers
for every kind of group ctx.ccl takes (None, torch groups, lists and tuples in their own order), its
members as Iris's kernels walk them (rank_start + i * rank_stride), where ctx.ccl.all_gather puts
each member's rows, and the groups it refuses before anything runs."""
import pytest
import torch

import iris
from iris.ccl import CollectiveError
from iris.ccl.utils import extract_group_info
from test_ccl import POISON, _dist


def _check(ctx, what, group, ranks, bad):
    """extract_group_info(group) against the group's global ranks in order."""
    r = ctx.get_rank()
    got = extract_group_info(group, ctx)
    stride = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    if got != (ranks.index(r), r, len(ranks), ranks[0], stride):
        bad.append((what, ranks, got))
    _, _, size, start, stride = got
    if [start + i * stride for i in range(size)] != ranks:  # how Iris's kernels find the members
        bad.append((what, ranks, "members", got))


def _refused(ctx, what, group, words, bad):
    try:
        extract_group_info(group, ctx)
    except CollectiveError as e:
        if words not in str(e):
            bad.append((what, str(e)))
    else:
        bad.append((what, "not refused"))


def rank_group_info():
    ctx = iris.iris(heap_size=1 << 20)
    dist = _dist(ctx)
    r, w, bad = ctx.get_rank(), ctx.get_num_ranks(), []
    evens, odds = list(range(0, w, 2)), list(range(1, w, 2))
    pairs = [list(range(i, min(i + 2, w))) for i in range(0, w, 2)]  # Iris's consecutive groups; 3 ranks: [2] alone
    made = {tuple(g): dist.new_group(g) for g in [evens, odds] + pairs}  # collective: every rank makes each
    everyone = dist.new_group(list(range(w)))
    _check(ctx, "None", None, list(range(w)), bad)
    _check(ctx, "torch group of every rank", everyone, list(range(w)), bad)
    for ranks in (evens, odds, *pairs):
        if r in ranks:
            _check(ctx, "torch group", made[tuple(ranks)], ranks, bad)
            _check(ctx, "list", list(ranks), ranks, bad)
    _check(ctx, "every rank reversed", list(range(w))[::-1], list(range(w))[::-1], bad)  # stride -1
    other = (r + 1) % w
    _check(ctx, "a tuple in its own order", (other, r), [other, r], bad)
    _check(ctx, "this rank alone", [r], [r], bad)

    if w >= 3:
        uneven = [0, 2, 1] if w == 3 else [0, 1, 3]
        _refused(ctx, "uneven", uneven, "not evenly spaced" if r in uneven else f"rank {r} is not in group", bad)
    _refused(ctx, "not a member", [q for q in range(w) if q != r], f"rank {r} is not in group", bad)
    _refused(ctx, "out of range", [r, w], "global ranks in [0,", bad)

    # where ctx.ccl.all_gather puts member i's rows: at rank_in_group i (Iris's strided-group test)
    inp = ctx.full((2, 3), float(r + 1))
    ctx.barrier()
    mine = made[tuple(evens if r in evens else odds)]
    me, _, size, start, stride = extract_group_info(mine, ctx)
    out = torch.full((2 * size, 3), float(POISON), device=ctx.get_device())
    ctx.ccl.all_gather(out, inp, group=mine)
    want = torch.cat([torch.full((2, 3), float(start + i * stride + 1)) for i in range(size)])
    if not torch.equal(out.cpu(), want) or not torch.equal(out[2 * me:2 * me + 2].cpu(), inp.cpu()):
        bad.append(("all_gather rows by rank_in_group", out.cpu().tolist()))
    ctx.barrier()
    dist.destroy_process_group()
    ctx.close()
    return bad


@pytest.mark.parametrize("world", [3, 4])
def test_extract_group_info(world):
    for r, bad in enumerate(iris.spawn(rank_group_info, world, timeout=300)):
        assert not bad, f"rank {r}: {bad}"


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_extract_group_info_gpu(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"one GPU per rank: needs {world} GPUs")
    for r, bad in enumerate(iris.spawn(rank_group_info, world, timeout=300)):
        assert not bad, f"rank {r}: {bad}"
