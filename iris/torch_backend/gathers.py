"""all_gather in torch's forms (a list per input, into one tensor, coalesced) over ctx.ccl.all_gather:
heap tensors as they are, any other through the staging area, one size-class row per member.
"""
from __future__ import annotations

import torch

from .calls import Calls
from .checks import refuse
from .views import WORDS, as_words, like, size_class


class Gathers(Calls):
    """The all_gather calls, and the gathered bytes that reductions without a ctx.ccl kernel combine."""

    def _gathered_bytes(self, t, call):
        """Every member's bytes of t, one size-class row each (views of the staging area)."""
        c, w = size_class(t.nbytes), self._w
        s_in, s_out = self._shared.stage(call, c, w * c)
        like(s_in, t).copy_(t)
        self._ccl.all_gather(s_out.view(torch.int32), s_in.view(torch.int32), group=self._ccl_group)
        return s_out.view(w, c)

    def allgather(self, output_tensors, input_tensors, opts=None):
        self._enter()
        for outs, t in zip(output_tensors, input_tensors):
            if len(outs) != self._w:
                raise refuse("all_gather", f"needs {self._w} output tensors, got {len(outs)}")
            rows = self._gathered_bytes(t, "all_gather")
            for o, r in zip(outs, rows):
                o.copy_(like(r, t))
        return self._done(opts, output_tensors)

    def all_gather_single(self, output, input, opts=None):
        if self._queued:
            self._enter()
        w, nb, dtype = self._w, input.nbytes, input.dtype
        if output.nbytes != w * nb or output.dtype != dtype:
            raise refuse("all_gather_into_tensor", f"output must hold {w} x input's {input.numel()} elements of "
                                                    f"{dtype}; got {output.numel()} of {output.dtype}")
        if nb and nb % 4 == 0:  # the common call, checks inlined
            po, pi, lo, hi = output.data_ptr(), input.data_ptr(), self._lo, self._hi
            if (lo <= po and po + w * nb <= hi and lo <= pi and pi + nb <= hi and output.is_contiguous()
                    and input.is_contiguous()):
                if dtype in WORDS and input.dim() == 1 == output.dim():  # words already: no helper calls
                    self._ccl.all_gather(output, input, group=self._ccl_group)
                else:
                    self._ccl.all_gather(as_words(output), as_words(input), group=self._ccl_group)
                return self._work([output]) if opts is None or opts.asyncOp else None
        if nb:
            rows = self._gathered_bytes(input, "all_gather_into_tensor")
            output.view(w, -1).copy_(rows[:, :input.nbytes].view(input.dtype).view(w, -1))
        return self._done(opts, [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._each(self.all_gather_single, outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """output_lists[r][i] = member r's inputs[i] (torch's layout for all_gather_coalesced)."""
        self._enter()
        if len(output_lists) != self._w:
            raise refuse("all_gather_coalesced", f"needs {self._w} output lists, got {len(output_lists)}")
        for i, t in enumerate(inputs):
            rows = self._gathered_bytes(t, "all_gather_coalesced")
            for outs, r in zip(output_lists, rows):
                outs[i].copy_(like(r, t).view(outs[i].shape))
        return self._done(opts, output_lists)

