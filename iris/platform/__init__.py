"""Pick the platform driver: NVIDIA -> cuda, ROCm -> hip, else host; IRIS_PLATFORM forces one."""
from __future__ import annotations

import os

from .driver import Driver, IpcHandle

PLATFORMS = ("cuda", "hip", "host")


def detect() -> str:
    """The platform this machine supports, without touching any GPU runtime we cannot load."""
    forced = os.environ.get("IRIS_PLATFORM", "").strip().lower()
    if forced:
        if forced not in PLATFORMS:
            raise ValueError(f"IRIS_PLATFORM={forced!r} is not a platform; use one of {', '.join(PLATFORMS)}")
        return forced
    try:
        import torch
    except ImportError:
        return "host"
    if torch.cuda.is_available():
        return "hip" if getattr(torch.version, "hip", None) else "cuda"
    return "host"


def get_driver(name: str | None = None) -> Driver:
    """A driver instance for `name` (or the detected platform)."""
    name = detect() if name is None else name
    if not isinstance(name, str) or name.lower() not in PLATFORMS:
        raise ValueError(f"unknown platform {name!r}; use one of {', '.join(PLATFORMS)} (or unset IRIS_PLATFORM)")
    name = name.lower()
    try:
        if name == "cuda":
            from .cuda import CudaDriver
            return CudaDriver()
        if name == "hip":
            from .hip import HipDriver
            return HipDriver()
    except ImportError as e:
        extra, package = {"cuda": ("cuda", "cuda-bindings"), "hip": ("rocm", "hip-python")}[name]
        raise ImportError(f"the {name} platform needs {package}, which cannot be imported ({e}): "
                          f"pip install 'iris[{extra}]' (or unset IRIS_PLATFORM)") from e
    from .host import HostDriver
    return HostDriver()


__all__ = ["Driver", "IpcHandle", "PLATFORMS", "detect", "get_driver"]
