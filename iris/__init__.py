"""iris: multi-GPU programming in Triton over a symmetric heap.

The public names load on first use, so a process that only launches ranks (`python -m iris.run`,
`iris run`) or reads `--help` starts without torch and Triton. The platform is decided here, at
import: on the host, Triton's interpreter must be on before any kernel (iris's or the caller's) is
defined.
"""
import os as _os
from importlib import import_module as _import_module, util as _util

from . import settings as _settings
from .errors import DISTRIBUTION
from .errors import (AddressMapError, BootstrapError, CaptureError, CheckpointError, CollectiveError, ConfigError,
                     ContextClosed, DeviceCheckError, DriverError, FactoryArgumentError, GluonUnavailable,
                     HeapOutOfMemory, IndirectPeerError, IrisError, NvshmemUnavailable, ProviderUnavailable, ReadError,
                     ReuseTimeout, SettingError, SpansHostsError, SymmetryError, WaitTimeout)
from .platform import detect as _detect

try:
    _host = _detect() == "host"
except ValueError:  # a bad IRIS_PLATFORM: iris.iris() and `iris info` report it
    _host = False
if _host:  # kernels over host memory run in Triton's interpreter
    _os.environ.setdefault(_settings.INTERPRET.name, "1")

from .torch_backend import install as _install_torch_backend  # noqa: E402 (after the platform choice)

_install_torch_backend()  # dist.init_process_group("iris"): registered now or when torch.distributed loads

_DEVICE = ["atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_sub",
           "atomic_xchg", "atomic_xor", "barrier_kernel", "copy", "get", "load", "put", "signal", "store",
           "translate", "wait"]
_SOURCES = {"Iris": ".context", "iris": ".context", "DEBUG": ".logging", "ERROR": ".logging", "INFO": ".logging",
            "WARNING": ".logging", "logger": ".logging", "set_logger_level": ".logging", "do_bench": ".timing",
            "launch": ".distributed", "spawn": ".distributed", "DeviceContext": ".device.context",
            "TraceEvent": ".tracing", "Tile": ".device.tiles", "TileView": ".device.tiles",
            "TensorView": ".device.tiles", "make_tensor_view": ".device.tiles",
            **{name: ".device" for name in _DEVICE}}


def _version() -> str:
    """This source's version: the installed distribution's where it is the one imported, else the
    pyproject.toml beside the package with `+source` (a tree on PYTHONPATH, not installed)."""
    from importlib import metadata
    from pathlib import Path
    here = Path(__file__).resolve().parent
    try:
        dist = metadata.distribution(DISTRIBUTION)
        url = dist.read_text("direct_url.json") or ""  # an editable install names its source tree
        if (Path(str(dist.locate_file("iris/__init__.py"))).resolve().parent == here
                or f'"file://{here.parent}"' in url):
            return dist.version
    except metadata.PackageNotFoundError:
        pass
    try:
        text = (here.parent / "pyproject.toml").read_text()
    except OSError:
        return "unknown"
    import re
    found = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    return f"{found[1]}+source" if found and f'name = "{DISTRIBUTION}"' in text else "unknown"


def __getattr__(name):
    """A public name from the module that defines it, or a subpackage (iris.ccl), on first use."""
    if name == "__version__":
        value = _version()
    elif name in _SOURCES:
        value = getattr(_import_module(_SOURCES[name], __name__), name)
    elif not name.startswith("_") and _util.find_spec(f"{__name__}.{name}") is not None:
        value = _import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'iris' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_SOURCES) | {"__version__"})


__all__ = ["AddressMapError", "BootstrapError", "CaptureError", "CheckpointError", "CollectiveError", "ConfigError",
           "ContextClosed", "DEBUG", "DeviceCheckError", "DeviceContext", "DriverError", "ERROR",
           "FactoryArgumentError", "GluonUnavailable", "HeapOutOfMemory", "INFO", "IndirectPeerError", "Iris",
           "IrisError", "NvshmemUnavailable", "ProviderUnavailable", "ReadError", "ReuseTimeout", "SettingError",
           "SpansHostsError", "SymmetryError", "TensorView", "Tile", "TileView", "TraceEvent", "WARNING", "WaitTimeout",
           "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_sub",
           "atomic_xchg", "atomic_xor", "barrier_kernel", "copy", "do_bench", "get", "iris", "launch", "load",
           "logger", "make_tensor_view", "put", "set_logger_level", "signal", "spawn", "store", "translate", "wait"]
