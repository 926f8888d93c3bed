"""Per-call epochs kept on the device, so that flags never need resetting and graph replays work.

Every fused kernel owns a ctl block on the heap: ctl[0] the number of calls completed, ctl[1]
how many programs have finished (over all calls), ctl[2:2+world] flags that peers set. A call's
epoch is ctl[0] + 1; flags are set to the epoch and waited on with ">=", so old values never
satisfy a newer wait. The last program to finish advances ctl[0] (all others have read it).
"""
import triton
import triton.language as tl

from ..device import signal


@triton.jit
def _epoch(ctl):
    return tl.load(ctl, volatile=True) + 1


@triton.jit
def _finish(ctl, ep, rank, world, heap_bases, NUM_PROGRAMS: tl.constexpr, NOTIFY: tl.constexpr):
    """Counts this program out; the last one of the call advances the epoch and, where NOTIFY, tells
    every peer (flag ctl[2 + rank] on the peer) that this rank has finished reading what they sent."""
    tl.debug_barrier()
    old = tl.atomic_add(ctl + 1, 1, sem="acq_rel", scope="gpu")
    if old == ep * NUM_PROGRAMS - 1:
        if NOTIFY:
            for i in range(1, world):
                signal(ctl + 2 + rank, ep, rank, (rank + i) % world, heap_bases)
        tl.atomic_xchg(ctl, ep, sem="release", scope="gpu")
