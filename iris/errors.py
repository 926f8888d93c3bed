"""One small tree of errors: everything iris raises on purpose is an IrisError."""

DISTRIBUTION = "iris-shmem"  # the name on the package index; `iris` there is another project


def user_stacklevel() -> int:
    """warnings.warn's stacklevel that names the first caller outside the iris package, however deep
    inside iris the warning is raised (iris.iris() and Iris() reach an allocator by different paths)."""
    import os
    import sys
    package, frame, level = os.path.dirname(os.path.abspath(__file__)) + os.sep, sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def pip_install(extra: str = "") -> str:
    """The command that installs iris with an extra, as error messages and docs spell it."""
    return f"pip install '{DISTRIBUTION}[{extra}]'" if extra else f"pip install {DISTRIBUTION}"


class IrisError(Exception):
    """Base of every error iris raises on purpose."""


class DriverError(IrisError, RuntimeError):
    """A driver call failed; names the call and the driver's code."""

    def __init__(self, call: str, code, detail: str = "", oom: bool = False):
        self.call, self.code, self.oom, self.detail = call, code, oom, detail
        msg = f"{call} failed with {code}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class HeapOutOfMemory(IrisError, MemoryError):
    """The heap (or the device behind it) cannot back a request; the heap stays usable."""

    def __init__(self, requested: int, free: int, heap_size: int, hint: str = "", creating: bool = False):
        self.requested, self.free, self.heap_size = requested, free, heap_size
        # creating: the heap itself cannot be had, so there is no heap yet whose free bytes to count
        msg = (f"cannot create a heap of {requested} bytes (heap_size): {free} bytes free here" if creating else
               f"cannot allocate {requested} bytes: {free} bytes free in a heap of {heap_size} bytes")
        super().__init__(msg + ". " + (hint or "Free tensors with ctx.free() or create the heap with a larger heap_size."))


class BootstrapError(IrisError, RuntimeError):
    """Ranks could not meet: names who did not arrive, or who left."""

    def __init__(self, message: str, missing=()):
        self.missing = tuple(missing)
        super().__init__(message)


class DeviceCheckError(IrisError, RuntimeError):
    """A device function got a rank outside [0, world) (refused, and raised by the host at its next
    ctx.barrier(); IRIS_RANK_CHECK) or, with IRIS_DEBUG=1, a pointer outside the heap."""


class SymmetryError(IrisError, RuntimeError):
    """Ranks made different collective allocations; the heap refused to diverge."""


class CaptureError(IrisError, RuntimeError):
    """An allocation or free during CUDA graph capture that capture cannot record safely (growth, a free)."""


class WaitTimeout(IrisError, TimeoutError):
    """A device wait gave up (IRIS_SPIN_LIMIT, Config.spin_limit): names the collective or device function,
    the waiting rank, the peer it waited for, the flag and the epoch or value. What the kernel computed
    after the wait is wrong (a collective's workspace unusable); the job should end."""


class ReuseTimeout(IrisError, TimeoutError):
    """A reused heap block waited too long for peers' work queued before their free of it: names the
    block, the ranks and the ordering rule that was broken."""

    def __init__(self, message: str, offset: int = -1, ranks=()):
        self.offset, self.ranks = offset, tuple(ranks)
        super().__init__(message)


class ContextClosed(IrisError, RuntimeError):
    """A call on a context after close()."""


class SpansHostsError(IrisError, RuntimeError):
    """The job's ranks are on several hosts, and what was asked works within one host."""


class IndirectPeerError(IrisError, RuntimeError):
    """A call reaches peers by load and store, and some peer of the job is indirect (heap_bases entry 0)."""


class AddressMapError(IrisError, ValueError):
    """A peer-base table that a kernel would translate through into a wild pointer."""


class ProviderUnavailable(IrisError, ImportError, RuntimeError):
    """An optional provider or library (NVSHMEM's host or device part, torch's symmetric memory) is
    missing or cannot run here; names the pip extra to install or the variable to set."""


NvshmemUnavailable = ProviderUnavailable  # the name device code raised before the two were one


class SettingError(IrisError, ValueError):
    """An environment variable iris reads holds a value it cannot use; names the variable and its values."""


class FactoryArgumentError(IrisError, ValueError, RuntimeError):
    """A tensor factory was given an argument the heap cannot honour (a device that is not the heap's, an
    out= of another size, dtype or not on the heap, an empty random range); nothing was allocated. A
    ValueError as torch's argument errors are, and a RuntimeError as Iris's factories raise it."""


class CollectiveError(IrisError, ValueError):
    """A collective was called with tensors it cannot take; nothing was allocated or launched."""


class ConfigError(IrisError, ValueError):
    """A Config field holds a value the collective cannot use; the message names the field and the allowed values."""


class GluonUnavailable(IrisError, ImportError):
    """Config(use_gluon=True) asked for a Gluon kernel that cannot run here."""


class CheckpointError(IrisError, ValueError):
    """A checkpoint file is missing, malformed or truncated; names the file and the fix."""


class ReadError(IrisError, OSError):
    """A checkpoint file could not be read as planned (it changed or shrank after its header was read)."""
