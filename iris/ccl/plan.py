"""A plan: one collective at one shape, ready to launch, and the sizing every plan builder shares.

A plan holds its heap workspace, its kernel's arguments (given by parameter name) and a Launcher per
alignment of the tensors that change between calls (the kernel's leading parameters) and per value
of the constexprs it names in `per_call`, so a repeated call costs a lookup and a direct launch, and
one repeated on the same tensors replays a one-kernel CUDA graph (iris/ccl/launch.py).
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

from .. import settings
from ..allocators.offsets import round_up
from ..errors import CollectiveError
from .config import checked
from .launch import Launcher

_KiB = 1 << 10


class Plan:
    """fn over grid with options (num_warps, num_stages); workspace: the heap tensors ccl.free() gives
    back; variant: the algorithm, for messages and tests; per_call: constexpr names set at each call."""
    __slots__ = ("fn", "grid", "args", "options", "launchers", "workspace", "variant", "per_call", "at")

    def __init__(self, fn, programs, options, workspace=(), variant="", per_call=(), **args):
        names = fn.arg_names
        missing = set(names) - set(args)
        if missing:
            raise TypeError(f"{fn.__name__}: no value for {sorted(missing)}")
        self.fn, self.grid, self.options = fn, (programs,), options
        self.args = [args[a] for a in names]
        self.launchers = {}
        self.workspace, self.variant = workspace, variant
        self.per_call = tuple(names.index(a) for a in per_call)
        self.at = {a: i for i, a in enumerate(names)}

    def __call__(self, *tensors, flags=()):
        """Launch with tensors as the kernel's leading arguments and flags as the per_call constexprs."""
        a = self.args
        if len(tensors) == 2:  # the common (inp, out): no generators
            t0, t1 = tensors
            a[0], a[1] = t0, t1
            ptrs = (t0.data_ptr(), t1.data_ptr())
            key = (not (ptrs[0] | ptrs[1]) & 15, flags)
        else:
            a[:len(tensors)] = tensors
            ptrs = tuple(t.data_ptr() for t in tensors)
            key = (all(p % 16 == 0 for p in ptrs), flags)
        if flags:
            for i, v in zip(self.per_call, flags):
                a[i] = v
        launcher = self.launchers.get(key)
        if launcher is None:
            launcher = self.launchers[key] = Launcher(self.fn, self.grid, **self.options)
        if key[0]:
            launcher.launch_trusted(a, ptrs)
        else:
            launcher(*a)


class Recent(NamedTuple):
    """The previous call of one collective, which the common loop repeats with the same tensors. A repeat
    (the same tensor objects at the same addresses and shapes, the same four other arguments by identity,
    None where a collective has fewer, the same Config unchanged) skips the checks and the plan lookup; a
    first call and any difference make them all. A group given as a list is remembered as a tuple, so it
    never repeats: the list may have changed in place."""
    inp: weakref.ref
    out: weakref.ref
    inp_ptr: int
    out_ptr: int
    inp_shape: torch.Size
    out_shape: torch.Size
    strides: tuple  # inp's and out's: a tensor restrided in place (t_, as_strided_) is checked anew
    call: tuple
    config: object
    key: tuple | None
    plan: object
    flags: tuple = ()

    @classmethod
    def of(cls, out, inp, call, config, plan, flags=()) -> Recent:
        """A call just checked and planned (config validated: its key is cached)."""
        call = tuple(tuple(a) if isinstance(a, list) else a for a in call)
        return cls(weakref.ref(inp), weakref.ref(out), inp.data_ptr(), out.data_ptr(), inp.shape, out.shape,
                   (inp.stride(), out.stride()), call, config, None if config is None else config.key(), plan, flags)

    def repeats(self, out, inp, call, config) -> bool:
        c = self.call
        return (self.inp() is inp and self.out() is out and self.inp_ptr == inp.data_ptr()
                and self.out_ptr == out.data_ptr() and inp.shape == self.inp_shape and out.shape == self.out_shape
                and (inp.stride(), out.stride()) == self.strides
                and call[0] is c[0] and call[1] is c[1] and call[2] is c[2] and call[3] is c[3]
                and self.config is config and (config is None or config.key() is self.key))


class Knobs(NamedTuple):
    """What a Config sets in every kernel, 0 where automatic: elements per step, warps, most programs,
    most polls of a flag (Config.block_size, num_warps, comm_sms, spin_limit)."""
    block: int = 0
    warps: int = 0
    sms: int = 0
    spin: int = 0


def knobs(config) -> Knobs:
    """config's Knobs (None: all automatic), config checked as it stands now."""
    if checked(config) is None:
        return Knobs(spin=settings.SPIN_LIMIT.get())
    return Knobs(config.block_size, config.num_warps or 0, config.comm_sms or 0, config.spin_limit)


def pair_knobs(config) -> Knobs:
    """config's Knobs for the rooted and point-to-point calls, which have no Gluon kernel."""
    knob = knobs(config)
    if config is not None and config.use_gluon:
        raise CollectiveError("these collectives have no Gluon kernel (Config.use_gluon=True); set use_gluon=False")
    return knob


def block_for(block_size: int, dtype: torch.dtype) -> int:
    """Elements per step of the flat kernels: Config.block_size, else 16 KiB worth
    (benchmarks/collectives.py --variants)."""
    return block_size or max(16, (16 * _KiB) // dtype.itemsize)


def split(n: int, block: int, most: int) -> tuple:
    """(programs, elements per program): at most `most` programs, each a whole number of blocks, none
    empty (one program of one block for n = 0)."""
    programs = max(1, min(most, -(-n // block)))
    per = round_up(-(-n // programs), block) or block
    return max(1, -(-n // per)), per


def segment(per: int, block: int, most: int) -> int:
    """Elements per segment where a program's per elements are cut into at most `most` segments of whole
    blocks (cdiv(per, segment) of them, the last possibly short)."""
    return round_up(-(-per // max(1, most)), block) or block


def pair_split(n: int, dtype: torch.dtype, knob: Knobs, sms: int, cap: int) -> tuple:
    """(programs, elements per program, block) of a pair kernel: at most comm_sms (else sms) and cap
    programs."""
    block = block_for(knob.block, dtype)
    return split(n, block, min(knob.sms or sms, cap)) + (block,)


def options(cfg, warps: int) -> dict:
    """Launch options of a Config: num_warps (warps, the kernel's default, where None) and num_stages.
    waves_per_eu is an AMD option, left out here."""
    return {"num_warps": cfg.num_warps or warps, "num_stages": cfg.num_stages}


def pow2(x: int) -> int:
    """The least power of two >= x, at least 2: the width of a kernel's block over ranks."""
    return 1 << max(1, (x - 1).bit_length())
