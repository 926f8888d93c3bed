"""Point to point behind ctx.ccl: send, recv and sendrecv as Iris has them, and the barrier over a subset
of the ranks. Two forms of send and recv, as Iris has both: on a heap tensor (the sender stores into
the receiver's copy at the same offset), or on any tensors through a mailbox (p2p_state=, from
init_p2p: one slot per sending rank on every rank's heap; recv copies its slot out), with isend,
irecv and batch_isend_irecv. Peers are positions in the group, as Iris numbers them. Transfers
pair by call order between two ranks (NCCL's rule), not by tag, which is accepted and not used, as
in Iris's mailbox form: a heap-tensor transfer meets the peer's next transfer call with it (both
wait), a mailbox message is the next one the peer receives from this rank (a send waits only for
its slot to be free). Kernels: kernels/pair.py's p2p_kernel, mailbox_kernel and barrier_kernel; nothing
but a mailbox is allocated on the heap.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import settings
from ..errors import CollectiveError
from . import puts
from .builders import pair_state
from .checks import contiguous, nonempty, not_capturing, on_heap, overlap, position, tensor
from .kernels.pair import barrier_kernel, mailbox_kernel, p2p_kernel
from .plan import Knobs, Plan, pair_knobs, pair_split, pow2

PROGRAMS = 128  # the most programs of a mailbox transfer: each keeps its own counts per rank


class P2PState:
    """The mailbox of the p2p_state= form (Iris's P2PState): on every rank's heap, at the same offset,
    a slot of max_numel elements of dtype per sending rank, and per program and rank the count of
    messages landed (sent) and consumed (acked); this rank's counts of messages it sent and received
    live in its device memory. Built collectively by init_p2p. Program p of every message owns the
    same part of a slot (per elements, fixed here from config's block_size and comm_sms), so its
    acknowledgement frees exactly the part its next message writes, whatever the messages' sizes."""

    def __init__(self, ctx, max_numel: int = 2 ** 20, dtype=None, config=None):
        if isinstance(max_numel, bool) or not isinstance(max_numel, int) or max_numel < 1:
            raise CollectiveError(f"init_p2p: max_numel must be an int >= 1 (the most elements one message "
                                  f"holds), got {max_numel!r}")
        w = ctx.get_num_ranks()
        self.max_numel, self.dtype = max_numel, torch.bfloat16 if dtype is None else dtype
        _, self.per, self.block = pair_split(max_numel, self.dtype, pair_knobs(config), ctx.ccl.sms, PROGRAMS)
        self.inbox = ctx.zeros(w * max_numel, dtype=self.dtype)
        self.sent, self.acked = (ctx.zeros((PROGRAMS, w), dtype=torch.int64) for _ in range(2))
        self.counts = {send: torch.zeros(PROGRAMS, w, dtype=torch.int64, device=self.inbox.device)
                       for send in (True, False)}
        self.plans = {}  # (send, peer, numel, dtype, knobs) -> Plan: they live as long as this mailbox
        ctx.barrier()  # every rank's counts are zero before any peer adds to them

    def slot(self, call, sender: int, t):
        """The slot of global rank sender (on every rank), as many elements as t, which must fit it."""
        tensor(call, "tensor", t, self.inbox.device)
        nonempty(call, "tensor", t)
        if t.dtype != self.dtype or t.numel() > self.max_numel:
            raise CollectiveError(f"{call}(p2p_state=...): the mailbox holds up to {self.max_numel} elements of "
                                  f"{self.dtype}, got {t.numel()} of {t.dtype}; build one that fits with "
                                  f"init_p2p(max_numel=..., dtype=...)")
        start = sender * self.max_numel
        return self.inbox[start:start + t.numel()]


class P2PWork:
    """What isend and irecv return: wait() blocks the host until the transfer is done (the device's
    work queued so far, in stream order); later work on the stream is ordered after it anyway."""

    def __init__(self, device):
        self._event = None
        if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
            self._event = torch.cuda.Event()
            self._event.record()

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()


class P2POp(NamedTuple):
    """One transfer of batch_isend_irecv, as torch.distributed.P2POp: op is isend or irecv (or send, recv)."""
    op: object
    tensor: torch.Tensor
    peer: int
    group: object = None
    tag: int = 0


def init_p2p(ctx, max_numel: int = 2 ** 20, dtype=None, config=None) -> P2PState:
    """A mailbox for send/recv(p2p_state=) of any tensors up to max_numel elements of dtype (default
    bfloat16). config's block_size and comm_sms split every message among programs; a message's own
    config sets its num_warps and spin_limit. Collective: all ranks, same order, same sizes."""
    return P2PState(ctx, max_numel, dtype, config)


def send(ctx, tensor, dst, p2p_state=None, group=None, tag=0, config=None) -> None:
    """tensor to the rank at group position dst (its matching recv). Without p2p_state, tensor is a heap
    tensor stored into dst's copy of it (a rendezvous: the send waits for the recv); with one, any
    contiguous tensor, stored into this rank's slot of dst's mailbox once dst has taken the previous
    message out of it. Collective over the pair: this rank and dst, same order, same sizes."""
    if p2p_state is None:
        _transfer(ctx.ccl, "send", tensor, tensor, dst, None, group, config)
    else:
        _mail(ctx.ccl, True, tensor, dst, p2p_state, group, config)


def recv(ctx, tensor, src, p2p_state=None, group=None, tag=0, config=None) -> None:
    """Receives into tensor what the rank at group position src sends (its matching send): into this
    rank's copy of a heap tensor, or with p2p_state into any tensor, from src's slot of this rank's
    mailbox. Collective over the pair: this rank and src, same order, same sizes."""
    if p2p_state is None:
        _transfer(ctx.ccl, "recv", tensor, tensor, None, src, group, config)
    else:
        _mail(ctx.ccl, False, tensor, src, p2p_state, group, config)


def isend(ctx, tensor, dst, p2p_state=None, group=None, tag=0, config=None) -> P2PWork:
    """send, returning a P2PWork (calls are ordered on the stream; wait() blocks the host)."""
    send(ctx, tensor, dst, p2p_state, group, tag, config)
    return P2PWork(ctx.device)


def irecv(ctx, tensor, src, p2p_state=None, group=None, tag=0, config=None) -> P2PWork:
    """recv, returning a P2PWork (calls are ordered on the stream; wait() blocks the host)."""
    recv(ctx, tensor, src, p2p_state, group, tag, config)
    return P2PWork(ctx.device)


def batch_isend_irecv(ctx, p2p_op_list, p2p_state=None) -> list:
    """Every send of the list, then every recv, each in list order (as Iris orders them): a ring or
    all-pairs exchange whose ranks list their peers in the same order pairs up without waiting for
    ever. Returns one P2PWork per op."""
    sends = [op for op in p2p_op_list if getattr(op.op, "__name__", "") in ("send", "isend")]
    recvs = [op for op in p2p_op_list if getattr(op.op, "__name__", "") in ("recv", "irecv")]
    if len(sends) + len(recvs) != len(p2p_op_list):
        raise CollectiveError("batch_isend_irecv: every P2POp's op must be isend, irecv, send or recv")
    return ([isend(ctx, op.tensor, op.peer, p2p_state, op.group, op.tag) for op in sends]
            + [irecv(ctx, op.tensor, op.peer, p2p_state, op.group, op.tag) for op in recvs])


def sendrecv(ctx, send_t, recv_t, dst, src, group=None, tag=0, config=None) -> None:
    """send_t into recv_t (a heap tensor) of the rank at group position dst, src's into this rank's
    recv_t. Collective over the ranks named as a dst or src: same order, same sizes."""
    _transfer(ctx.ccl, "sendrecv", send_t, recv_t, dst, src, group, config)


def barrier(ctx, group=None) -> None:
    """Every rank of group meets on the device (the whole job: ctx.device_barrier)."""
    ccl = ctx.ccl
    ranks = ccl.groups.of(group, "barrier")[0]
    if ranks is None:
        ccl.ctx.device_barrier()
        return
    key = ("barrier", ranks)
    plan = ccl.plans.get(key)
    if plan is None and ccl.puts:
        flags = ccl.ctx.reserve.put_counters.view(torch.float32)  # a barrier moves no data: the fp32 kernel serves
        plan = ccl.plans[key] = puts.plan(ccl, "barrier", flags, flags, ranks,
                                                   Knobs(sms=1, spin=settings.SPIN_LIMIT.get()))
    if plan is None:
        not_capturing(ccl.ctx.device, "the first barrier of a group builds small device tensors", "call it once")
        counters, seen = pair_state(ccl)
        g = len(ranks)
        plan = ccl.plans[key] = Plan(barrier_kernel, 1, {"num_warps": 1}, members=ccl.groups.members(ranks),
                                     counters=counters, seen=seen, me=ranks.index(ccl.ctx.rank), rank=ccl.ctx.rank,
                                     world=ccl.ctx.world, GROUP=g, PEERS=pow2(g),
                                     SPIN=settings.SPIN_LIMIT.get())
    plan()


def _mail(ccl, send, t, peer, state, group, config) -> None:
    """One message through the mailbox (mailbox_kernel): this rank's slot of the peer's mailbox, or the
    peer's slot of this rank's, as many elements as t; a recv into a non-contiguous t lands in a
    contiguous copy first."""
    call = "send" if send else "recv"
    ranks = ccl.groups.ranks(group, call)
    pos = position(call, "dst" if send else "src", peer, ranks)
    if ranks[pos] == ccl.ctx.rank:
        raise CollectiveError(f"{call}: the peer is this rank itself (position {pos}); copy locally with t.copy_()")
    slot = state.slot(call, ccl.ctx.rank if send else ranks[pos], t)
    if send:
        contiguous("send(p2p_state=...)", "tensor", t)
    knob = pair_knobs(config)
    key = (send, ranks[pos], t.numel(), t.dtype, knob.warps, knob.spin)
    plan = state.plans.get(key)
    if plan is None:
        not_capturing(ccl.ctx.device, f"the first {call} through a mailbox at a new size and peer builds its launch",
                      "call it once")
        plan = state.plans[key] = Plan(mailbox_kernel, -(-t.numel() // state.per), {"num_warps": knob.warps or 8},
                                       src=t, dst=slot,
                                       sent=state.sent, acked=state.acked, counts=state.counts[send],
                                       heap_bases=ccl.ctx.get_heap_bases(), n=t.numel(), per=state.per,
                                       rank=ccl.ctx.rank, peer=ranks[pos], world=ccl.ctx.world, SEND=send,
                                       BLOCK=state.block, SPIN=knob.spin, FAR=ccl.puts)
    if send:
        plan(t, slot)
    elif t.is_contiguous():
        plan(slot, t)
    else:
        out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        plan(slot, out)
        t.copy_(out)


def _transfer(ccl, call, src_t, dst_t, to, frm, group, config) -> None:
    dev = ccl.ctx.device
    named = [("send tensor" if call == "sendrecv" else "tensor", src_t)]
    if dst_t is not src_t:
        named.append(("recv tensor", dst_t))
    for name, t in named:
        tensor(call, name, t, dev)
        nonempty(call, name, t)
    ranks = ccl.groups.ranks(group, call)
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
    knob = pair_knobs(config)
    g_to = -1 if to is None else ranks[to]
    g_frm = -1 if frm is None else ranks[frm]
    key = ("p2p", g_to, g_frm, src_t.shape, dst_t.shape, src_t.dtype, dst_t.dtype, knob)
    plan = ccl.plans.get(key)
    if plan is None and (src_t.shape != dst_t.shape or src_t.dtype != dst_t.dtype):
        raise CollectiveError(f"sendrecv: send tensor {tuple(src_t.shape)} {src_t.dtype} and recv tensor "
                              f"{tuple(dst_t.shape)} {dst_t.dtype} must have the same shape and dtype")
    on_heap(call, "recv tensor" if call == "sendrecv" else "tensor", dst_t, ccl.span,
            "the sender stores into the receiver's copy at its own offset")
    if call == "sendrecv":
        contiguous(call, "send tensor", src_t)
        if overlap(src_t, dst_t):
            raise CollectiveError(f"{call}: send tensor overlaps recv tensor, which the source writes while this "
                                  "rank reads the send tensor; pass separate tensors")
    if plan is None and ccl.puts:
        plan = ccl.plans[key] = puts.plan(ccl, "p2p", dst_t, src_t, None, knob, to=g_to, frm=g_frm)
    if plan is None:
        not_capturing(ccl.ctx.device, f"the first {call} at a new shape and peer builds small device tensors",
                      "call it once")
        counters, seen = pair_state(ccl)
        n = dst_t.numel()
        programs, per, block = pair_split(n, dst_t.dtype, knob, ccl.sms, counters.shape[0])
        plan = ccl.plans[key] = Plan(p2p_kernel, programs, {"num_warps": knob.warps or 8}, src=src_t, dst=dst_t,
                                     counters=counters, seen=seen, heap_bases=ccl.ctx.get_heap_bases(), n=n, per=per,
                                     rank=ccl.ctx.rank, to=g_to, frm=g_frm, world=ccl.ctx.world, BLOCK=block,
                                     SPIN=knob.spin)
    plan(src_t, dst_t)
