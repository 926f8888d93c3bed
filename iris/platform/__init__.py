"""Pick the platform driver: NVIDIA -> cuda, ROCm -> hip, else host; IRIS_PLATFORM forces one."""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from .. import settings
from ..errors import pip_install
from ..settings import PLATFORMS
from .driver import Driver, IpcHandle


def _torch_built_for_gpus() -> bool:
    """torch.version.cuda or torch.version.hip, read from torch/version.py without importing torch
    (most of a launcher's start-up): a build for neither never sees a GPU. True where the file
    cannot be read, so that torch itself is asked."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return False
    try:
        tree = ast.parse(Path(spec.origin).with_name("version.py").read_text())
        found = {}
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and target.id in ("cuda", "hip") and node.value is not None:
                found[target.id] = ast.literal_eval(node.value)
    except (OSError, SyntaxError, ValueError):
        return True
    return set(found) != {"cuda", "hip"} or any(found.values())


def detect() -> str:
    """The platform this machine supports, without touching any GPU runtime we cannot load."""
    forced = settings.PLATFORM.get()
    if forced:
        return forced
    if "torch" not in sys.modules and not _torch_built_for_gpus():
        return "host"
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
                          f"{pip_install(extra)} (or unset IRIS_PLATFORM)") from e
    from .host import HostDriver
    return HostDriver()


__all__ = ["Driver", "IpcHandle", "PLATFORMS", "detect", "get_driver"]
