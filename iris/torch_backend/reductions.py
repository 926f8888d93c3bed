"""all_reduce and reduce_scatter in torch's forms over ctx.ccl: SUM, AVG, MAX and MIN of ctx.ccl's
dtypes on its kernels (heap tensors in place, any other through the staging area); every other op or
dtype combined here, in rank order, from an all_gather of every member's bytes.
"""
from __future__ import annotations

import functools

import torch

from ..ccl import ReduceOp
from .checks import SUM, check_op, op_name, refuse
from .gathers import Gathers
from .views import flat, like, size_class

CCL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)  # ctx.ccl reduces these
CCL_SUM = ReduceOp.SUM  # a global: the enum's attribute costs 0.1 us per call
ON_CCL = {"sum": ReduceOp.SUM, "avg": ReduceOp.SUM, "max": ReduceOp.MAX, "min": ReduceOp.MIN}
# ops reduced here, in rank order, over every rank's gathered input (ctx.ccl has no kernel for them)
LOCAL = {"sum": torch.add, "avg": torch.add, "max": torch.maximum, "min": torch.minimum, "product": torch.mul,
         "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}


def on_ccl(op, t) -> bool:
    """Whether ctx.ccl has a kernel for op on t's dtype."""
    return op in ON_CCL and t.dtype in CCL_DTYPES


class Reductions(Gathers):
    """The all_reduce and reduce_scatter calls, and the reduction by gather that rooted reduce shares."""

    def allreduce(self, tensors, opts=None):
        if self._queued:
            self._enter()
        red = opts.reduceOp
        if red == SUM and len(tensors) == 1 and self._w > 1:  # the common call, checks inlined
            t = tensors[0]
            p = t.data_ptr()
            if self._lo <= p < p + t.nbytes <= self._hi and t.dtype in CCL_DTYPES and t.is_contiguous():
                self._ccl.all_reduce(t, t, op=CCL_SUM, group=self._ccl_group)
                return self._work(tensors) if opts.asyncOp else None
        op = op_name("all_reduce", red)
        for t in tensors:
            self._all_reduce(t, op)
        return self._done(opts, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        self._enter()
        return self.allreduce(tensors, opts)

    def _all_reduce(self, t, op, call="all_reduce"):
        if op != "sum":
            check_op(call, op, t)
        if t.numel() == 0 or self._w == 1:
            return
        if not on_ccl(op, t):
            self._reduced_by_gather(t, op, call)
            return
        if self._direct(t):  # any shape: a new view per call would defeat ctx.ccl's repeat-call fast path
            self._ccl.all_reduce(t, t, op=ON_CCL[op], group=self._ccl_group)
        else:
            (s,) = self._shared.stage(call, size_class(t.nbytes))
            s = s.view(t.dtype)
            s[:t.numel()].view(t.shape).copy_(t)
            self._ccl.all_reduce(s, s, op=ON_CCL[op], group=self._ccl_group)
            t.copy_(s[:t.numel()].view(t.shape))
        if op == "avg":
            t.div_(self._w)

    def _reduced_by_gather(self, t, op, call):
        """t = op over every member's t, combined in rank order here from an all_gather of the bytes."""
        rows = self._gathered_bytes(t, call)
        parts = [like(r, t) for r in rows]
        t.copy_(functools.reduce(LOCAL[op], parts))
        if op == "avg":
            t.div_(self._w)

    def reduce_scatter_single(self, output, input, opts=None):
        if self._queued:
            self._enter()
        call, w, red = "reduce_scatter_tensor", self._w, opts.reduceOp
        if red == SUM and w > 1:  # the common call, checks inlined
            nb, dtype = output.nbytes, output.dtype
            if nb and input.nbytes == w * nb and input.dtype == dtype and dtype in CCL_DTYPES:
                po, pi, lo, hi = output.data_ptr(), input.data_ptr(), self._lo, self._hi
                if (lo <= po and po + nb <= hi and lo <= pi and pi + w * nb <= hi and output.is_contiguous()
                        and input.is_contiguous()):
                    self._ccl.reduce_scatter(flat(output), flat(input), op=CCL_SUM, group=self._ccl_group)
                    return self._work([output]) if opts.asyncOp else None
        op = op_name(call, red)
        if op != "sum":
            check_op(call, op, output)
        n = output.numel()
        if input.numel() != w * n or output.dtype != input.dtype:
            raise refuse(call, f"input must hold {w} x output's {n} elements of {output.dtype}; got "
                                f"{input.numel()} of {input.dtype}")
        if n == 0:
            return self._done(opts, [output])
        if w == 1:
            output.copy_(input.view(output.shape))
        elif not on_ccl(op, output):
            whole = input.clone()
            self._reduced_by_gather(whole, "sum" if op == "avg" else op, call)
            output.copy_(whole.view(w, -1)[self._r].view(output.shape))
        elif self._direct(output) and self._direct(input):
            self._ccl.reduce_scatter(flat(output), flat(input), op=ON_CCL[op], group=self._ccl_group)
        else:
            c = size_class(output.nbytes)
            s_in, s_out = self._shared.stage(call, w * c, c)
            rows = s_in.view(w, c)[:, :output.nbytes].view(output.dtype)
            rows.copy_(input.reshape(w, n))
            self._ccl.reduce_scatter(s_out.view(output.dtype), s_in.view(output.dtype), op=ON_CCL[op],
                                        group=self._ccl_group)
            output.copy_(s_out[:output.nbytes].view(output.dtype).view(output.shape))
        if op == "avg":
            output.div_(w)
        return self._done(opts, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        self._enter()
        for o, ins in zip(output_tensors, input_tensors):
            if len(ins) != self._w:
                raise refuse("reduce_scatter", f"needs {self._w} input tensors, got {len(ins)}")
            whole = torch.stack([i.reshape(o.shape) for i in ins])
            self.reduce_scatter_single(o, whole, opts)
        return self._done(opts, output_tensors)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._each(self.reduce_scatter_single, outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

