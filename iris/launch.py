"""A lean launch path for Triton kernels whose arguments repeat: compile once through the JIT, then
launch the compiled kernel directly.

JITFunction.__call__ binds the arguments, computes their specialization key and looks the kernel up
on every launch, and the compiled kernel's own launcher (CompiledKernel.run) then converts every
argument again: measured on the H200 host with Triton 3.6, ~27 us of host time per launch, where
torch's copy_ takes ~10. A Launcher keeps the CompiledKernel of its first launch per specialization
of the arguments; on CUDA it then calls cuLaunchKernel itself (through ctypes) with a parameter array
built once, after checking that array against the kernel's parameters as the driver reports them
(cuFuncGetParamInfo); where that check cannot be made or fails, it calls CompiledKernel.run (the call
Triton >= 3.3 itself makes after its lookup). Under TRITON_INTERPRET=1, with launch hooks installed,
or on a Triton whose CompiledKernel lacks that entry point, every call takes the JIT path.
"""
from __future__ import annotations

import ctypes
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


_CTYPES = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
           "i64": ctypes.c_int64, "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16,
           "u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "f32": ctypes.c_float,
           "fp64": ctypes.c_double}
_cuda = None


def _libcuda():
    global _cuda
    if _cuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        lib.cuLaunchKernel.restype = ctypes.c_int
        lib.cuFuncGetParamInfo.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                           ctypes.POINTER(ctypes.c_size_t)]
        lib.cuFuncGetParamInfo.restype = ctypes.c_int
        _cuda = lib
    return _cuda


class _Direct:
    """cuLaunchKernel on a compiled Triton kernel, with its parameter array built once: every call
    rewrites the values in place (pointers from data_ptr()) and launches. Raises at construction if
    the kernel's parameters, as the driver reports them, are not the ones the signature implies."""

    def __init__(self, k, grid):
        md = k.metadata
        if (getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False)
                or getattr(md, "launch_pdl", False) or getattr(md, "global_scratch_size", 0)
                or getattr(md, "profile_scratch_size", 0) or torch.version.hip):
            raise ValueError("needs Triton's launcher (clusters, cooperative, PDL, scratch or HIP)")
        names, sig = k.src.fn.arg_names, k.src.signature
        self.slots = []  # (argument index, ctypes value)
        for i, name in enumerate(names):
            ty = sig[name] if isinstance(sig, dict) else sig[i]
            if ty == "constexpr":
                continue
            c = ctypes.c_uint64() if ty.startswith("*") else _CTYPES[ty]()
            self.slots.append((i, c, ty.startswith("*")))
        values = [c for _, c, _ in self.slots] + [ctypes.c_uint64(0), ctypes.c_uint64(0)]  # scratch pointers
        self.keep = values
        lib = _libcuda()
        sizes, off, size = [], ctypes.c_size_t(), ctypes.c_size_t()
        while lib.cuFuncGetParamInfo(k.function, len(sizes), ctypes.byref(off), ctypes.byref(size)) == 0:
            sizes.append(size.value)
        want = [ctypes.sizeof(c) for c in values]
        if not sizes or sizes != want[:len(sizes)] or len(sizes) < len(self.slots):
            raise ValueError(f"kernel parameters {sizes} do not match the signature's {want}")
        self.params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(c) for c in values])
        self.launch = lib.cuLaunchKernel
        self.fn, self.grid = k.function, grid
        self.block, self.shared = 32 * md.num_warps, md.shared

    def __call__(self, args, stream):
        for i, c, ptr in self.slots:
            a = args[i]
            c.value = a.data_ptr() if ptr and a is not None and not isinstance(a, int) else (a or 0)
        g = self.grid
        rc = self.launch(self.fn, g[0], g[1], g[2], self.block, 1, 1, self.shared, stream, self.params, None)
        if rc:
            raise RuntimeError(f"cuLaunchKernel failed with CUresult {rc}")


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
        self.why_not_ctypes = None  # why CompiledKernel.run is used instead of cuLaunchKernel

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
        if self.direct and self.fallback is None and hasattr(k, "run") and hasattr(k, "packed_metadata") and hasattr(k, "function"):
            self.device = torch.cuda.current_device()
            try:
                k = _Direct(k, self.grid)
            except Exception as e:  # Triton's own launcher then
                self.why_not_ctypes = f"{type(e).__name__}: {e}"
            self.compiled[key] = self.last = k

    def _run(self, k, args):
        enter, leave = _hooks()
        if enter is not None or leave is not None:  # a profiler wants its metadata: the JIT path builds it
            self.fn[self.grid](*args, **self.options)
            return
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        if isinstance(k, _Direct):
            k(args, stream)
            return
        try:
            k.run(self.grid[0], self.grid[1], self.grid[2], stream, k.function, k.packed_metadata, None, None, None,
                  *args)
        except TypeError as e:  # a Triton whose launcher takes other arguments: the JIT path from now on
            self.direct, self.compiled, self.last, self.fallback = False, {}, None, str(e)
            self.fn[self.grid](*args, **self.options)
