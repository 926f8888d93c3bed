"""The backend's refusals: one RuntimeError per problem, naming the call and the fix, raised before the
call queues anything; and the reduce ops it takes, by name.
"""
from __future__ import annotations

import torch.distributed as dist

from .options import NAME

_R = dist.ReduceOp.RedOpType
SUM = _R.SUM  # opts.reduceOp == SUM is the cheapest test of the common op (no .op, no hashing)
# keyed by the enum's int value: hashing torch's enum object costs a microsecond per call
_OPS = {_R.SUM.value: "sum", _R.AVG.value: "avg", _R.MAX.value: "max", _R.MIN.value: "min", _R.PRODUCT.value: "product",
        _R.BAND.value: "band", _R.BOR.value: "bor", _R.BXOR.value: "bxor"}


def refuse(call, why) -> RuntimeError:
    return RuntimeError(f"{call} on the {NAME!r} backend: {why}")


def op_name(call, reduce_op) -> str:
    """torch's reduce op (a ReduceOp or its RedOpType) as one of _OPS' names."""
    if reduce_op == SUM:
        return "sum"
    kind = getattr(reduce_op, "op", reduce_op)
    name = _OPS.get(getattr(kind, "value", None))
    if name is None:
        raise refuse(call, f"reduce op {reduce_op} is not supported; use SUM, AVG, MAX, MIN, PRODUCT, BAND, "
                           "BOR or BXOR")
    return name


def check_op(call, op, t) -> None:
    """op (a name of op_name's) applies to t's dtype."""
    if op == "avg" and not t.is_floating_point():
        raise refuse(call, f"AVG needs a floating dtype, got {t.dtype}; use SUM and divide")
    if op in ("band", "bor", "bxor") and (t.is_floating_point() or t.is_complex()):
        raise refuse(call, f"{op.upper()} needs an integer or bool dtype, got {t.dtype}")
