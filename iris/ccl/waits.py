"""Finding the device waits that gave up (IRIS_SPIN_LIMIT, Config.spin_limit) and naming them.

A wait that gives up writes -(1 + slot + 65536 * epoch) into a slot no peer writes (kernels/common.py
_await): slot `rank` of the waiting program's own flag row, a ring program's own flag, or seen[p][rank]
of the group and pair kernels. The host looks where it synchronises anyway (ctx.barrier(),
ctx.ccl.free(), ctx.close()) and raises one WaitTimeout for the first wait it finds.
"""
from __future__ import annotations

import torch

from .. import settings
from ..errors import WaitTimeout
from .modes import MODES

# plan keys that are no collective of MODES: what a message calls them
OTHER_PLANS = {"group": "a group collective", "reduce": "ctx.ccl.reduce"}

RING = ("ring", "ring_chunked")


def _marks(ccl):
    """(key, plan, column of marks, what a slot names, the call's variant) for every plan whose wait can
    mark."""
    rank, world = ccl.ctx.rank, ccl.ctx.world
    for key, whole in ccl.plans.items():
        for plan in getattr(whole, "parts", (whole,)):  # a plan of several launches names each
            at = getattr(plan, "at", None)
            if not at or "flags" not in at:
                continue
            flags = plan.args[at["flags"]]
            if not isinstance(flags, torch.Tensor) or flags.dtype != torch.int64:
                continue
            if plan.variant in RING or flags.numel() == plan.grid[0]:
                yield key, plan, flags.view(-1), None, whole.variant
            elif flags.numel() % world == 0:
                yield key, plan, flags.view(-1, world)[:, rank], "rank", whole.variant
    if ccl.seen is not None:
        yield ("group",), None, ccl.seen[:, rank], "member", ""


def raise_gave_up(ccl) -> None:
    """Raise WaitTimeout for the first device wait of ccl's plans that gave up, if any did. One look at
    every mark column together (one device-to-host read), then the marked one is found."""
    rank = ccl.ctx.rank
    marks = list(_marks(ccl))
    if not marks or not bool((torch.cat([m[2] for m in marks]) < 0).any()):
        return
    for key, plan, column, slot, variant in marks:
        bad = (column < 0).nonzero()
        if bad.numel() == 0:
            continue
        row = int(bad[0])
        code = -int(column[row]) - 1
        late, epoch = code % 65536, code // 65536
        mode = MODES.get(key[0])
        what = f"ctx.ccl.{mode.name}" if mode else OTHER_PLANS.get(key[0], str(key[0]))
        variant = f" ({variant})" if variant else ""
        programs = plan.grid[0] if plan is not None else column.numel()
        peer = f"rank {late}" if slot == "rank" else (f"group member {late}" if slot else "its ring predecessor or "
                                                                                       "successor")
        spin = plan.args[plan.at["SPIN"]] if plan is not None and "SPIN" in plan.at else settings.SPIN_LIMIT.get()
        raise WaitTimeout(
            f"rank {rank}: {what}{variant} gave up waiting for {peer}: flag row {row} (program "
            f"{row % programs}, wait {row // programs + 1} of the call) never reached epoch {epoch} within the spin "
            f"limit ({spin} polls, IRIS_SPIN_LIMIT or Config.spin_limit). That rank did not make the matching call, "
            "made it in another order or with other sizes, or is stuck; its result here is wrong and the workspace "
            "unusable. Check that every rank makes the same collectives in the same order.")
