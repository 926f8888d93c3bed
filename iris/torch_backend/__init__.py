"""torch.distributed's process-group backend "iris": `dist.init_process_group("iris")` runs a torch
program's collectives on ctx.ccl's kernels over the symmetric heap. See docs/torch-distributed.md.

What matters:
- `import iris` registers the name; this module imports torch.distributed only when torch itself is
  (already) imported, and the backend's own code (group.py and the modules under it) only when a
  group is made; its name and Options live in options.py, below both.
- The default group builds one iris context from the store torch hands it (or adopts the one in
  Options(ctx=...)); sub-groups (new_group) reuse it: heap allocation is collective over the whole
  context, so nothing is allocated after the first group is made.
- Heap tensors are reduced in place (zero copy); any other tensor passes through one staging area
  on the heap, allocated with the group and reused by every call.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

from .options import NAME, Options, heap_size_setting


def _create(dist_options, options):
    from .group import create
    return create(dist_options, options)


def register() -> None:
    """Register "iris" with torch.distributed (idempotent); devices cuda and cpu, torch's defaults for
    each device stay as they were."""
    import torch.distributed as dist
    if not dist.is_available() or NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cuda", "cpu"])


def context(group=None):
    """The iris context under a process group of this backend (None: the default group)."""
    from .group import context_of
    return context_of(group)


class _AfterTorchDistributed(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Registers the backend right after torch.distributed is first imported, so that `import iris`
    before `import torch` costs nothing and still registers it."""

    def __init__(self):
        self.loader = None

    def find_spec(self, name, path, target=None):
        if name != "torch.distributed" or self.loader is not None:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self.loader
        self.loader.exec_module(module)
        register()


def install() -> None:
    """`import iris`'s hook: register now if torch.distributed is loaded, else once it is."""
    if "torch.distributed" in sys.modules:
        register()
    elif not any(isinstance(f, _AfterTorchDistributed) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchDistributed())


__all__ = ["NAME", "Options", "context", "heap_size_setting", "install", "register"]
