"""The rooted collectives in torch's forms over ctx.ccl's: broadcast and reduce (heap tensors in place,
any other through the staging area), gather and scatter (through the staging area). Roots are group
ranks, passed to ctx.ccl as the positions of the group's members.
"""
from __future__ import annotations

import torch

from .checks import SUM, check_op, op_name, refuse
from .reductions import CCL_DTYPES, CCL_SUM, ON_CCL, Reductions, on_ccl
from .views import as_words, like, size_class


class Rooted(Reductions):
    """broadcast, reduce, gather and scatter (reduce shares Reductions' reduction by gather)."""

    def broadcast(self, tensors, opts=None):
        if self._queued:
            self._enter()
        root = opts.rootRank
        src = self._members[root]
        if len(tensors) == 1 and self._w > 1:  # the common call, checks inlined
            t = tensors[0]
            p, nb = t.data_ptr(), t.nbytes
            if nb % 4 == 0 and self._lo <= p < p + nb <= self._hi and t.is_contiguous():
                flat = as_words(t)
                self._ccl.broadcast(flat, flat, src=src, group=self._ccl_group)
                return self._work(tensors) if opts.asyncOp else None
        for t in tensors:
            nb = t.nbytes
            if nb == 0 or self._w == 1:
                continue
            if nb % 4 == 0 and self._direct(t):
                flat = as_words(t)
                self._ccl.broadcast(flat, flat, src=src, group=self._ccl_group)
                continue
            (s,) = self._shared.stage("broadcast", size_class(t.nbytes))
            if self._r == root:
                like(s, t).copy_(t)
            w = s.view(torch.int32)
            self._ccl.broadcast(w, w, src=src, group=self._ccl_group)
            if self._r != root:
                t.copy_(like(s, t))
        return self._done(opts, tensors)

    def reduce(self, tensors, opts=None):
        if self._queued:
            self._enter()
        call, red, root = "reduce", opts.reduceOp, opts.rootRank
        if red == SUM and len(tensors) == 1 and self._w > 1:  # the common call, checks inlined
            t = tensors[0]
            p = t.data_ptr()
            if self._lo <= p < p + t.nbytes <= self._hi and t.dtype in CCL_DTYPES and t.is_contiguous():
                self._ccl.reduce(t, t, dst=root, op=CCL_SUM, group=self._ccl_group)
                return self._work(tensors) if opts.asyncOp else None
        op = op_name(call, red)
        for t in tensors:
            if op != "sum":
                check_op(call, op, t)
            if t.nbytes == 0 or self._w == 1:
                continue
            if not on_ccl(op, t):
                self._reduced_by_gather(t, op, call)
                continue
            if self._direct(t):  # in place: the root reads every member's t where it is
                self._ccl.reduce(t, t, dst=root, op=ON_CCL[op], group=self._ccl_group)
            else:
                c = size_class(t.nbytes)
                s_in, s_out = self._shared.stage(call, c, c)
                s_in, s_out = s_in.view(t.dtype), s_out.view(t.dtype)
                s_in[:t.numel()].view(t.shape).copy_(t)
                self._ccl.reduce(s_out, s_in, dst=root, op=ON_CCL[op], group=self._ccl_group)
                if self._r == root:
                    t.copy_(s_out[:t.numel()].view(t.shape))
            if self._r == root and op == "avg":
                t.div_(self._w)
        return self._done(opts, tensors)

    def _root_list(self, call, lists, root, what) -> None:
        if self._r == root and (len(lists) != 1 or len(lists[0]) != self._w):
            raise refuse(call, f"the root needs one list of {self._w} {what} tensors")

    def gather(self, output_tensors, input_tensors, opts=None):
        self._enter()
        call, w, root = "gather", self._w, opts.rootRank
        (t,) = input_tensors
        self._root_list(call, output_tensors, root, "output")
        if t.numel():
            c = size_class(t.nbytes)
            s_in, s_out = self._shared.stage(call, c, w * c)
            like(s_in, t).copy_(t)
            self._ccl.gather(s_out.view(torch.int32), s_in.view(torch.int32), dst=root, group=self._ccl_group)
            if self._r == root:
                for o, r in zip(output_tensors[0], s_out.view(w, c)):
                    o.copy_(like(r, t).view(o.shape))
        return self._done(opts, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        self._enter()
        call, w, root = "scatter", self._w, opts.rootRank
        (t,) = output_tensors
        self._root_list(call, input_tensors, root, "input")
        if t.numel():
            c = size_class(t.nbytes)
            s_in, s_out = self._shared.stage(call, w * c, c)
            if self._r == root:
                for i, r in zip(input_tensors[0], s_in.view(w, c)):
                    like(r, t).copy_(i)
            self._ccl.scatter(s_out.view(torch.int32), s_in.view(torch.int32), src=root, group=self._ccl_group)
            t.copy_(like(s_out, t))
        return self._done(opts, output_tensors)

