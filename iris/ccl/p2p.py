"""Point to point behind ctx.ccl: send, recv and sendrecv as Iris has them (the sender stores into the
receiver's copy of a heap tensor at the same offset), and the barrier over a subset of the ranks.
Peers are positions in the group, as Iris numbers them. Transfers pair by call order between two
ranks (NCCL's rule), not by tag: a send meets the peer's next transfer call with it. Kernels:
pair_kernels.p2p_kernel and barrier_kernel; nothing is allocated on the heap.
"""
from __future__ import annotations

import torch

from .collectives import CollectiveError
from .pair_kernels import barrier_kernel, p2p_kernel
from .rooted import Plan, knobs, members_of, on_heap, overlap, pair_state, position, puts_plan, ranks_of, split, tensor


def send(ccl, t, dst, group, config) -> None:
    _transfer(ccl, "send", t, t, dst, None, group, config)


def recv(ccl, t, src, group, config) -> None:
    _transfer(ccl, "recv", t, t, None, src, group, config)


def sendrecv(ccl, send_t, recv_t, dst, src, group, config) -> None:
    _transfer(ccl, "sendrecv", send_t, recv_t, dst, src, group, config)


def barrier(ccl, group) -> None:
    """Every rank of group meets on the device (the whole job: ctx.device_barrier)."""
    ranks = ccl._group(group, "barrier")[0]
    if ranks is None:
        ccl.ctx.device_barrier()
        return
    key = ("barrier", ranks)
    plan = ccl.plans.get(key)
    if plan is None and ccl.puts:
        flags = ccl.ctx._put_counters.view(torch.float32)  # a barrier moves no data: the fp32 kernel serves
        plan = ccl.plans[key] = puts_plan(ccl, "barrier", flags, flags, ranks, (0, 0, 1, 0))
    if plan is None:
        ccl._ready("the first barrier of a group builds small device tensors", "call it once")
        counters, seen = pair_state(ccl)
        g = len(ranks)
        plan = ccl.plans[key] = Plan(barrier_kernel, 1, 1, members=members_of(ccl, ranks), counters=counters,
                                     seen=seen, me=ranks.index(ccl.ctx.rank), rank=ccl.ctx.rank, world=ccl.ctx.world,
                                     GROUP=g, PEERS=max(2, 1 << (g - 1).bit_length()), SPIN=0)
    plan()


def _transfer(ccl, call, src_t, dst_t, to, frm, group, config) -> None:
    dev = ccl.ctx.device
    tensor(call, "send tensor" if call == "sendrecv" else "tensor", src_t, dev)
    if dst_t is not src_t:
        tensor(call, "recv tensor", dst_t, dev)
    ranks = ranks_of(ccl, group, call)
    me = ranks.index(ccl.ctx.rank)
    if to is not None:
        position(call, "dst", to, ranks)
    if frm is not None:
        position(call, "src", frm, ranks)
    if call != "sendrecv" and me in (to, frm):
        raise CollectiveError(f"{call}: the peer is this rank itself (position {me}); copy locally with t.copy_()")
    if call == "sendrecv" and (to == me) != (frm == me):
        raise CollectiveError(f"sendrecv(dst={to}, src={frm}) on position {me}: a rank that sends to itself receives "
                              "from itself, and only then; pass both as this rank's position, or neither")
    knob = knobs(config)
    g_to = -1 if to is None else ranks[to]
    g_frm = -1 if frm is None else ranks[frm]
    key = ("p2p", g_to, g_frm, src_t.shape, dst_t.shape, src_t.dtype, dst_t.dtype, knob)
    plan = ccl.plans.get(key)
    if plan is None and (src_t.shape != dst_t.shape or src_t.dtype != dst_t.dtype):
        raise CollectiveError(f"sendrecv: send tensor {tuple(src_t.shape)} {src_t.dtype} and recv tensor "
                              f"{tuple(dst_t.shape)} {dst_t.dtype} must have the same shape and dtype")
    on_heap(ccl, call, "recv tensor" if call == "sendrecv" else "tensor", dst_t,
            "the sender stores into the receiver's copy at its own offset")
    if call == "sendrecv":
        if not src_t.is_contiguous():
            raise CollectiveError(f"{call}: send tensor must be contiguous; call .contiguous() first")
        if overlap(src_t, dst_t):
            raise CollectiveError(f"{call}: send tensor overlaps recv tensor, which the source writes while this "
                                  "rank reads the send tensor; pass separate tensors")
    if plan is None and ccl.puts:
        plan = ccl.plans[key] = puts_plan(ccl, "p2p", dst_t, src_t, None, knob, to=g_to, frm=g_frm)
    if plan is None:
        ccl._ready(f"the first {call} at a new shape and peer builds small device tensors", "call it once")
        counters, seen = pair_state(ccl)
        n = dst_t.numel()
        programs, per, block = split(ccl, n, dst_t.dtype, knob, counters.shape[0])
        plan = ccl.plans[key] = Plan(p2p_kernel, programs, knob[1] or 8, src=src_t, dst=dst_t, counters=counters,
                                     seen=seen, heap_bases=ccl.ctx.get_heap_bases(), n=n, per=per,
                                     rank=ccl.ctx.rank, to=g_to, frm=g_frm, world=ccl.ctx.world, BLOCK=block,
                                     SPIN=knob[3])
    plan(src_t, dst_t)
