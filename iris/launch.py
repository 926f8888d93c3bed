"""A lean launch path for Triton kernels whose arguments repeat: compile once through the JIT, then
launch the compiled kernel directly.

A Launcher keeps the CompiledKernel of its first launch per specialization of the arguments, and later
calls go straight to its launcher (`CompiledKernel.run`, the call Triton >= 3.3 itself makes after its
lookup, with every bound argument, constexprs included), skipping the JIT's binding and cache lookup.
Under TRITON_INTERPRET=1, with launch hooks installed, or on a Triton whose CompiledKernel lacks that
entry point, every call takes the JIT path.

Measured on 2x H200 with Triton 3.6 (benchmarks/collectives.py, host_costs): this saves little there,
because 3.6 binds arguments natively; a ctx.ccl.all_reduce call cost 29.9 us of host time against
26.9 us for a bare JIT launch of the same kernel (torch copy_: 9.8 us). Calling cuLaunchKernel from
ctypes with a prebuilt parameter array was tried in another run and was no faster (17.7 against a
JIT launch's 15.3 us, copy_ 5.6 us), so it was removed.
"""
from __future__ import annotations

import os

import torch
import triton

try:  # Triton >= 3.3 keeps the launch hooks in knobs
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover
    _knobs = None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _hooks():
    rt = getattr(_knobs, "runtime", None)
    return (getattr(rt, "launch_enter_hook", None), getattr(rt, "launch_exit_hook", None)) if rt else (None, None)


def _int_spec(x: int) -> tuple:
    return x == 1, x % 16 == 0, -2 ** 31 <= x < 2 ** 31


def specialization(args) -> tuple:
    """What Triton specializes a launch on, per argument: a tensor's dtype and 16-byte alignment, an
    int's ==1, %16 and width; anything else (floats, constexpr values) by value or type."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((a.dtype, a.data_ptr() % 16 == 0))
        elif isinstance(a, bool) or a is None:
            key.append(a)
        elif isinstance(a, int):
            key.append(_int_spec(a))
        elif isinstance(a, float):
            key.append(float)
        else:
            key.append(a)
    return tuple(key)


class Launcher:
    """kernel[grid](*args, **options) with the JIT's lookup paid once per argument specialization.

    `Launcher(kernel, grid, num_warps=8)(*args)` passes every kernel parameter positionally, constexprs
    included, in the kernel's order. `launch_trusted(args)` skips the specialization check: for callers
    (iris.ccl) that already keyed their cache on shapes, dtypes and alignments.
    """

    def __init__(self, fn, grid, **options):
        self.fn, self.options = fn, options
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.compiled = {}  # specialization -> CompiledKernel
        self.last = None
        self.direct = not _interpreting()
        self.device = None
        self.fallback = None  # why the direct path was given up, if it was

    def __call__(self, *args):
        self._launch(args, specialization(args))

    def launch_trusted(self, args) -> None:
        k = self.last
        if k is not None:
            self._run(k, args)
        else:
            self._launch(args, None)

    def _launch(self, args, key):
        k = self.compiled.get(key)
        if k is not None:
            self._run(k, args)
            return
        k = self.fn[self.grid](*args, **self.options)
        if hasattr(k, "result"):  # an async compile's future
            k = k.result()
        if self.direct and self.fallback is None and all(hasattr(k, a) for a in ("run", "packed_metadata", "function")):
            self.device = torch.cuda.current_device()
            self.compiled[key] = self.last = k

    def _run(self, k, args):
        enter, leave = _hooks()
        if enter is not None or leave is not None:  # a profiler wants its metadata: the JIT path builds it
            self.fn[self.grid](*args, **self.options)
            return
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        try:
            k.run(self.grid[0], self.grid[1], self.grid[2], stream, k.function, k.packed_metadata, None, None, None,
                  *args)
        except TypeError as e:  # a Triton whose launcher takes other arguments: the JIT path from now on
            self.direct, self.compiled, self.last, self.fallback = False, {}, None, str(e)
            self.fn[self.grid](*args, **self.options)
