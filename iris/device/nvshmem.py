"""NVSHMEM's device API in Triton kernels: the calls iris makes for peers that loads and stores cannot reach.

What matters:
- Nothing here is linked into a kernel until `enable()` runs: it installs a compile hook that links
  NVSHMEM's device bitcode and iris's helper IR into kernels compiled after it, and a load hook
  that initialises every loaded module that uses NVSHMEM (cumodule_init) before its first launch.
- Triton calls an extern function from every thread of a program. Block-scoped calls (a whole
  program moves a contiguous tile) are made by all threads; single-issuer calls (atomics) go
  through the helper, which issues them from thread 0 and hands the result to every thread.
- Ranks are NVSHMEM PEs (the nvshmem allocator initialises NVSHMEM with rank = PE), and a heap
  pointer in the caller's view is a valid NVSHMEM symmetric address.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import sysconfig
import tempfile

import triton
import triton.language as tl
from triton.language import core

from .. import settings
from ..errors import NvshmemUnavailable, pip_install

_HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvshmem_helpers.ll")
_STATE_SYMBOL = b"nvshmemi_device_state_d"  # the device state every NVSHMEM call reads; cumodule_init sets it
# Operation codes of iris_amo32/iris_amo64 in nvshmem_helpers.ll
AMO_ADD: tl.constexpr = tl.constexpr(0)
AMO_CAS: tl.constexpr = tl.constexpr(1)
AMO_SWAP: tl.constexpr = tl.constexpr(2)
AMO_AND: tl.constexpr = tl.constexpr(3)
AMO_OR: tl.constexpr = tl.constexpr(4)
AMO_XOR: tl.constexpr = tl.constexpr(5)
AMO_FETCH: tl.constexpr = tl.constexpr(6)
_enabled = None  # (bitcode path, previous stages hook) once enable() ran


def bitcode_path(arch: int | None = None) -> str:
    """NVSHMEM's device bitcode for compute capability arch (e.g. 90): IRIS_NVSHMEM_BITCODE, else
    the nvidia-nvshmem-cu13 package (libnvshmem_device_sm_<arch>.bc, then libnvshmem_device.bc)."""
    path = settings.NVSHMEM_BITCODE.get()
    if path:
        if not os.path.isfile(path):
            raise NvshmemUnavailable(f"IRIS_NVSHMEM_BITCODE={path} is not a file; point it at libnvshmem_device.bc")
        return path
    dirs = [os.path.join(p, "nvidia", "nvshmem", "lib") for p in {sysconfig.get_path("purelib"),
                                                                 sysconfig.get_path("platlib")}]
    try:
        import nvidia.nvshmem as pkg  # namespace package of nvidia-nvshmem-cu13
        dirs = [os.path.join(p, "lib") for p in pkg.__path__] + dirs
    except ImportError:
        pass
    names = ([f"libnvshmem_device_sm_{arch}.bc"] if arch else []) + ["libnvshmem_device.bc"]
    for d in dirs:
        for name in names:
            if os.path.isfile(os.path.join(d, name)):
                return os.path.join(d, name)
    raise NvshmemUnavailable(f"NVSHMEM's device bitcode ({' or '.join(names)}) is not in {sorted(set(dirs))}: "
                             f"pip install nvidia-nvshmem-cu13 ({pip_install('nvshmem')}), or set "
                             "IRIS_NVSHMEM_BITCODE to the file")


def _slice(path: str, digest: str) -> str:
    """iris's helpers and the part of NVSHMEM's bitcode they call, as one LLVM IR file built once per
    bitcode, helpers and Triton version, and kept in Triton's cache. Triton parses every library it
    links anew for each kernel: NVSHMEM's whole bitcode costs seconds per kernel, this slice a fraction."""
    from triton._C.libtriton import ir, llvm
    from triton.runtime.cache import get_cache_manager
    cache = get_cache_manager(hashlib.sha256(f"iris-nvshmem-slice-{digest}-{triton.__version__}".encode()).hexdigest())
    found = cache.get_file("iris_nvshmem.ll")
    if found:
        return found
    with open(_HELPERS) as f:
        helpers = re.findall(r"^define (\S+) @(iris_\w+)\(([^)]*)\)", f.read(), re.M)
    # a module that declares each helper: linking pulls in their definitions and what they call, no more
    decls = "".join(f"  llvm.func @{name}({', '.join(a.split()[0] for a in args.split(','))}) -> {ret}\n"
                    for ret, name, args in helpers)
    context = ir.context()
    ir.load_dialects(context)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "decls.mlir")
        with open(source, "w") as f:
            f.write("module {\n" + decls + "}\n")
        module = llvm.to_module(ir.parse_mlir_module(source, context), llvm.context())
    llvm.link_extern_libs(module, [_HELPERS, path])
    # linking made every library function internal; the helpers must stay callable from kernels
    text = re.sub(r"^define internal (.*?@iris_)", r"define \1", str(module), flags=re.M)
    return cache.put(text, "iris_nvshmem.ll")


def _link(slice_path, backend, stages, options, language, capability) -> None:
    """Make the LLVM stage of a CUDA compilation link iris's helpers with NVSHMEM (Triton links extern
    libraries only into a module that calls an external function)."""
    if "llir" not in stages or getattr(options, "backend_name", "cuda") != "cuda":
        return
    libs = {"iris_nvshmem": slice_path(), **dict(options.extern_libs or ())}
    linked = dataclasses.replace(options, extern_libs=tuple(libs.items()))
    stages["llir"] = lambda src, metadata: backend.make_llir(src, metadata, linked, capability)


def _load_hook(module, function, name, metadata_group, hash, **kwargs):
    """Initialise a freshly loaded module for NVSHMEM where it references NVSHMEM's device state."""
    ptx = next((p for k, p in metadata_group.items() if k.endswith(".ptx")), None)
    if ptx is None:
        return
    with open(ptx, "rb") as f:
        if _STATE_SYMBOL not in f.read():
            return
    from nvshmem import bindings
    status = bindings.cumodule_init(int(module))
    if status not in (None, 0):
        raise NvshmemUnavailable(f"nvshmemx_cumodule_init failed with {status} for kernel {name}: is NVSHMEM "
                                 "initialised in this process (allocator='nvshmem')?")


def enable(arch: int | None = None) -> str:
    """Link NVSHMEM into every kernel compiled from now on in this process and initialise each
    loaded module that uses it; returns the bitcode's path. Idempotent."""
    global _enabled
    if _enabled is not None:
        return _enabled[0]
    path = bitcode_path(arch)
    try:
        from nvshmem import bindings  # noqa: F401
    except ImportError as e:
        raise NvshmemUnavailable(f"nvshmem4py is not importable ({e}): {pip_install('nvshmem')}") from None
    digest = hashlib.sha256()
    for f in (path, _HELPERS):
        with open(f, "rb") as fh:
            digest.update(fh.read())
    digest = digest.hexdigest()
    previous = triton.knobs.runtime.add_stages_inspection_hook
    slice_path = functools.lru_cache(maxsize=None)(lambda: _slice(path, digest))

    def hook(*args):
        """With no arguments, what it adds to the cache key; otherwise it rewrites the stages."""
        if not args:
            key = f"iris-nvshmem-{digest}"  # Triton keys its disk cache by the first, its memory by the second
            if previous is None:
                return key, digest
            pkey, phash = previous()
            return key + pkey, digest + phash
        if previous is not None:
            previous(*args)
        _link(slice_path, *args)

    triton.knobs.runtime.add_stages_inspection_hook = hook
    _enabled = (path, previous)
    triton.knobs.runtime.kernel_load_end_hook.add(_load_hook)
    return path


# -- the calls, as Triton sees them (addresses as int64, every call returns a value) ----------------

def _extern(symbol, args, types, ret, _semantic):
    return core.extern_elementwise("", "", args, {tuple(core.dtype(t) for t in types): (symbol, core.dtype(ret))},
                                   is_pure=False, _semantic=_semantic)


@core.extern
def putmem_block(dst, src, nbytes, pe, _semantic=None):
    """nvshmemx_putmem_block: every thread of the program calls it with the same arguments."""
    return _extern("iris_putmem_block", [dst, src, nbytes, pe], ("int64", "int64", "int64", "int32"), "int32",
                   _semantic)


@core.extern
def run_first(src, dst, index, _semantic=None):
    """Called on every element of a tile declared one run (int64 addresses, int32 indices): where
    index is 0 it records src and dst for putmem_run/getmem_run, with no reduction."""
    return _extern("iris_run_first", [src, dst, index], ("int64", "int64", "int32"), "int32", _semantic)


@core.extern
def putmem_run(offset, nbytes, pe, _semantic=None):
    """nvshmemx_putmem_block of nbytes from offset bytes into the run run_first recorded: every
    thread calls it."""
    return _extern("iris_putmem_run", [offset, nbytes, pe], ("int64", "int64", "int32"), "int32", _semantic)


@core.extern
def getmem_run(offset, nbytes, pe, _semantic=None):
    """nvshmemx_getmem_block likewise (src: the peer's side of the run): every thread calls it."""
    return _extern("iris_getmem_run", [offset, nbytes, pe], ("int64", "int64", "int32"), "int32", _semantic)


@core.extern
def getmem_block(dst, src, nbytes, pe, _semantic=None):
    """nvshmemx_getmem_block: every thread of the program calls it with the same arguments."""
    return _extern("iris_getmem_block", [dst, src, nbytes, pe], ("int64", "int64", "int64", "int32"), "int32",
                   _semantic)


@core.extern
def quiet(unused, _semantic=None):
    """nvshmem_quiet: this thread's NVSHMEM operations have completed at their targets."""
    return _extern("iris_quiet", [unused], ("int32",), "int32", _semantic)


@core.extern
def fence(unused, _semantic=None):
    """nvshmem_fence: this thread's NVSHMEM operations to each PE are delivered in order."""
    return _extern("iris_fence", [unused], ("int32",), "int32", _semantic)


_P = {8: "int8", 16: "int16", 32: "int32", 64: "int64"}


@core.extern
def p(dst, bits, pe, mask, _semantic=None):
    """nvshmem_intN_p per element where mask holds: bits are the values as intN."""
    n = bits.type.scalar.primitive_bitwidth
    return _extern(f"iris_p{n}", [dst, bits, pe, mask], ("int64", _P[n], "int32", "int1"), "int32", _semantic)


@core.extern
def g(src, pe, mask, other_bits, _semantic=None):
    """nvshmem_intN_g per element where mask holds, other_bits elsewhere (intN)."""
    n = other_bits.type.scalar.primitive_bitwidth
    return _extern(f"iris_g{n}", [src, pe, mask, other_bits], ("int64", "int32", "int1", _P[n]), _P[n], _semantic)


@core.extern
def amo(op, dst, a, b, pe, _semantic=None):
    """One NVSHMEM atomic (op: AMO_*) on a 32- or 64-bit integer, issued by thread 0; every thread
    gets the old value. Scalars only: a tile would issue it once per thread holding each element."""
    n = a.type.scalar.primitive_bitwidth
    return _extern(f"iris_amo{n}", [op, dst, a, b, pe], ("int32", "int64", _P[n], _P[n], "int32"), _P[n], _semantic)
