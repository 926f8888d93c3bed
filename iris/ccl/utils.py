"""iris.ccl.utils: where this rank sits in a group, at Iris's module path and in Iris's terms."""
from __future__ import annotations

from ..errors import CollectiveError


def extract_group_info(group, ctx) -> tuple:
    """(rank_in_group, rank_global, world_size, rank_start, rank_stride) of this rank in group, as
    Iris's kernels walk a group: member i is global rank rank_start + i * rank_stride, and member
    rank_in_group is this rank. group takes what ctx.ccl takes: None (every rank), a torch.distributed
    group or a list of global ranks, in the group's order, checked as ctx.ccl checks it. Over ranks
    that are not evenly spaced (iris's collectives run over them) no start and stride describe the
    group: CollectiveError names its ranks."""
    ranks = ctx.ccl.groups.ranks(group, "extract_group_info")
    rank = ctx.get_rank()
    strides = {b - a for a, b in zip(ranks, ranks[1:])}
    if len(strides) > 1:
        raise CollectiveError(f"extract_group_info: the group's ranks {list(ranks)} are not evenly spaced, so no "
                              "rank_start and rank_stride describe them; index the ranks themselves (a list group, "
                              "or torch.distributed.get_process_group_ranks(group)); ctx.ccl takes such a group "
                              "as it is")
    return ranks.index(rank), rank, len(ranks), ranks[0], strides.pop() if strides else 1
