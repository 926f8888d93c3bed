"""A lean launch path for Triton kernels whose arguments repeat: compile once through the JIT, then
launch the compiled kernel directly, and replay a one-kernel CUDA graph where the same arguments
keep coming back.

A Launcher keeps the CompiledKernel of its first launch per specialization of the arguments, and later
calls go straight to its launcher (`CompiledKernel.run`, the call Triton >= 3.3 itself makes after its
lookup, with every bound argument, constexprs included), skipping the JIT's binding and cache lookup.
Under TRITON_INTERPRET=1, with launch hooks installed, or on a Triton whose CompiledKernel lacks that
entry point, every call takes the JIT path.

A replayed graph costs less host time than a JIT launch or even the compiled kernel's own run
(`benchmarks/launch_probe.py`, figures in docs/collectives.md), so `launch_trusted(args, key)`
captures a graph for an argument tuple seen `CAPTURE_AFTER` times and replays it from then on.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from .. import settings

try:  # Triton >= 3.3 keeps the launch hooks in knobs
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover
    _knobs = None

CAPTURE_AFTER = 2   # launches of one argument tuple before it is captured (the first ones also compile)
GRAPHS = 8          # graphs kept per Launcher, least recently used dropped


def _interpreting() -> bool:
    return settings.INTERPRET.get()


def _hooked() -> bool:
    """Whether a profiler installed launch hooks (Triton >= 3.5 keeps them in always-present HookChains)."""
    rt = getattr(_knobs, "runtime", None)
    for name in ("launch_enter_hook", "launch_exit_hook"):
        h = getattr(rt, name, None)
        if h is not None and getattr(h, "calls", True):
            return True
    return False


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


class _Graphs:
    """One-kernel CUDA graphs by argument key, through cuda-bindings (captured on a private stream in
    thread-local mode, so other threads' work and torch's allocator are untouched)."""

    def __init__(self, device: int):
        from cuda.bindings import driver as cu

        from ..platform.cuda import _check
        self.cu, self.check, self.device = cu, _check, device
        self.stream = torch.cuda.Stream(device)
        self.execs = OrderedDict()  # key -> CUgraphExec
        self.seen = {}              # key -> launches so far, until captured
        self.streams = {}           # raw stream -> CUstream

    def launch(self, key, stream: int) -> bool:
        """Replay key's graph on stream; False if it has none yet."""
        ex = self.execs.get(key)
        if ex is None:
            return False
        st = self.streams.get(stream)
        if st is None:
            st = self.streams[stream] = self.cu.CUstream(stream)
        result = self.cu.cuGraphLaunch(ex, st)
        if result[0] != self.cu.CUresult.CUDA_SUCCESS:
            self.check("cuGraphLaunch", result)  # raises DriverError naming the error
        return True

    def count(self, key) -> bool:
        """Count a direct launch of key; True when it is time to capture it."""
        n = self.seen.get(key, 0) + 1
        if n < CAPTURE_AFTER:
            self.seen[key] = n
            return False
        self.seen.pop(key, None)
        return True

    def capture(self, key, run) -> None:
        """Capture run(stream) into key's graph."""
        cu, check, s = self.cu, self.check, self.stream.cuda_stream
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check("cuStreamBeginCapture", cu.cuStreamBeginCapture(s, mode))
        try:
            run(s)
        finally:
            graph = check("cuStreamEndCapture", cu.cuStreamEndCapture(s))
        try:
            ex = check("cuGraphInstantiate", cu.cuGraphInstantiate(graph, 0))
        finally:
            check("cuGraphDestroy", cu.cuGraphDestroy(graph))
        self.execs[key] = ex
        if len(self.execs) > GRAPHS:
            self._destroy(self.execs.popitem(last=False)[1])
        if len(self.seen) > 16 * GRAPHS:  # argument tuples that never came back
            self.seen.clear()

    def _destroy(self, ex) -> None:
        self.cu.cuGraphExecDestroy(ex)

    def close(self) -> None:
        for ex in self.execs.values():
            self._destroy(ex)
        self.execs.clear()


def _graphs_for(device: int):
    """A graph cache on CUDA devices where cuda-bindings is installed; None elsewhere (ROCm, host)."""
    if torch.version.cuda is None:
        return None
    try:
        return _Graphs(device)
    except ImportError:  # pragma: no cover - cuda-bindings is a dependency of the CUDA driver
        return None


class Launcher:
    """kernel[grid](*args, **options) with the JIT's lookup paid once per argument specialization.

    `Launcher(kernel, grid, num_warps=8)(*args)` passes every kernel parameter positionally, constexprs
    included, in the kernel's order. `launch_trusted(args, key)` skips the specialization check, for
    callers (iris.ccl) that already keyed their cache on shapes, dtypes and alignments; key names the
    values in args that change between calls (their data pointers): the same key with the same
    argument objects is replayed from a CUDA graph once it has been launched CAPTURE_AFTER times.
    """

    def __init__(self, fn, grid, **options):
        self.fn, self.options = fn, options
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.compiled = {}  # specialization -> CompiledKernel
        self.last = None
        self.direct = not _interpreting()
        self.device = None
        self.graphs = None
        self.fallback = None  # why the direct path was given up, if it was

    def __call__(self, *args):
        self._launch(args, specialization(args))

    def launch_trusted(self, args, key=None) -> None:
        k = self.last
        if k is None:
            self._launch(args, None)
            return
        graphs = self.graphs
        if key is None or graphs is None or _hooked() or torch.cuda.is_current_stream_capturing():
            self._run(k, args)
            return
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        if graphs.launch(key, stream):
            return
        if graphs.count(key):
            graphs.capture(key, lambda s: self._run_on(k, args, s))
            graphs.launch(key, stream)
        else:
            self._run_on(k, args, stream)

    def close(self) -> None:
        """Destroy the captured graphs (they hold nothing else)."""
        if self.graphs is not None:
            self.graphs.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

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
            if self.graphs is None:
                self.graphs = _graphs_for(self.device)

    def _run(self, k, args):
        if _hooked():  # a profiler wants its metadata: the JIT path builds it
            self.fn[self.grid](*args, **self.options)
            return
        self._run_on(k, args, torch._C._cuda_getCurrentRawStream(self.device))

    def _run_on(self, k, args, stream: int):
        try:
            k.run(self.grid[0], self.grid[1], self.grid[2], stream, k.function, k.packed_metadata, None, None, None,
                  *args)
        except TypeError as e:  # a Triton whose launcher takes other arguments: the JIT path from now on
            self.direct, self.compiled, self.last, self.fallback, self.graphs = False, {}, None, str(e), None
            self.fn[self.grid](*args, **self.options)
