"""all_to_all in torch's forms over ctx.ccl.all_to_all: equal chunks of heap tensors as they are (one
row each, cached), any other through the staging area, every chunk padded to one size class.
"""
from __future__ import annotations

import torch

from ..ccl import ReduceOp
from .calls import Calls
from .checks import refuse
from .views import MIN_CLASS, like, size_class


class AllToAll(Calls):
    """all_to_all_single (with or without split sizes) and all_to_all over lists."""

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if self._queued:
            self._enter()
        call, w, nb = "all_to_all_single", self._w, input.nbytes
        if not output_split_sizes and not input_split_sizes and nb and nb % (4 * w) == 0:  # the common call
            pi, po, lo, hi = input.data_ptr(), output.data_ptr(), self._lo, self._hi
            if (lo <= pi and pi + nb <= hi and lo <= po and po + nb <= hi and output.nbytes == nb
                    and output.dtype == input.dtype and input.numel() % w == 0 and input.is_contiguous()
                    and output.is_contiguous()):
                rows = self._rows
                self._ccl.all_to_all(rows.of(output, po, nb), rows.of(input, pi, nb), group=self._ccl_group)
                return self._work([output]) if opts is None or opts.asyncOp else None
        if output.dtype != input.dtype:
            raise refuse(call, f"output is {output.dtype} but input is {input.dtype}; they must match")
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % w or output.numel() != input.numel():
                raise refuse(call, f"equal splits need input and output of the same size, a multiple of {w}; "
                                    f"got {input.numel()} and {output.numel()} elements")
            ins, outs = list(input.reshape(w, -1)), list(output.view(w, -1))
            self._exchange(call, ins, outs, even=True)
        else:
            ins = self._split(call, "input", input, input_split_sizes)
            outs = self._split(call, "output", output, output_split_sizes)
            self._exchange(call, ins, outs, even=False)
        return self._done(opts, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._enter()
        if len(output_tensors) != self._w or len(input_tensors) != self._w:
            raise refuse("all_to_all", f"needs {self._w} input and output tensors, got "
                                        f"{len(input_tensors)} and {len(output_tensors)}")
        self._exchange("all_to_all", list(input_tensors), list(output_tensors), even=False)
        return self._done(opts, output_tensors)

    def _split(self, call, name, t, sizes):
        w = self._w
        if not sizes:
            sizes = [t.shape[0] // w] * w if t.dim() and t.shape[0] % w == 0 else None
        if sizes is None or len(sizes) != w or sum(sizes) != (t.shape[0] if t.dim() else 0):
            raise refuse(call, f"{name} split sizes {sizes} must be {w} row counts adding up to {name}'s "
                                f"{t.shape[0] if t.dim() else 0} rows")
        return list(t.split(list(sizes), 0))

    def _exchange(self, call, ins, outs, even):
        """outs[r] = member r's ins[me]: padded to one size class (the largest chunk any member sends, told
        by a MAX all_reduce unless every chunk has one size) and moved by ctx.ccl.all_to_all."""
        w = self._w
        for i, o in zip(ins, outs):
            if i.dtype != o.dtype:
                raise refuse(call, f"input is {i.dtype} but output is {o.dtype}; they must match")
        if not even and self._cuda and torch.cuda.is_current_stream_capturing():
            raise refuse(call, "with split sizes (or a list of tensors) agrees the largest chunk on the host, "
                                "which a CUDA graph cannot capture; capture all_to_all_single without split "
                                "sizes (equal chunks: pad them to one size), or make this call outside the graph")
        most = max(t.nbytes for t in ins + outs)
        if not even:
            (m,) = self._shared.stage(call, MIN_CLASS)
            m = m.view(torch.int64)[:1]
            m.fill_(most)
            self._ccl.all_reduce(m, m, op=ReduceOp.MAX, group=self._ccl_group)
            most = int(m.item())
        c = size_class(most)
        s_in, s_out = self._shared.stage(call, w * c, w * c)
        rows_in, rows_out = s_in.view(w, c), s_out.view(w, c)
        for r, t in enumerate(ins):
            if t.numel():
                like(rows_in[r], t).copy_(t)
        self._ccl.all_to_all(s_out.view(torch.int32).view(1, -1), s_in.view(torch.int32).view(1, -1),
                                group=self._ccl_group)
        for r, t in enumerate(outs):
            if t.numel():
                t.copy_(like(rows_out[r], t))

