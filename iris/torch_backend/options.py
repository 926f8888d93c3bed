"""The "iris" backend's name and pg_options, and their checks. Below both the package (which registers
the name) and the group (which reads the options), so neither imports the other for them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

NAME = "iris"


@dataclass
class Options:
    """pg_options of `dist.init_process_group("iris", pg_options=Options(...))`.

    heap_size: bytes of the heap the backend builds (None: IRIS_HEAP_SIZE, else 1 GiB).
    ctx: an iris context to adopt instead of building one (its ranks are torch's global ranks).
    allocator: the heap's allocator (None: IRIS_ALLOCATOR, else iris's default).
    staging_bytes: the heap staging area for tensors not on the heap (None: a quarter of the heap).
    mailbox_bytes: per sending rank, the send/recv mailbox on every rank (larger messages go in pieces).
    """
    heap_size: Optional[int] = None
    ctx: Any = None
    allocator: Optional[str] = None
    staging_bytes: Optional[int] = None
    mailbox_bytes: int = 1 << 20


def heap_size_setting() -> int:
    """IRIS_HEAP_SIZE in bytes (iris.settings.HEAP_SIZE: a number with an optional unit, default 1 GiB)."""
    from .. import settings
    return settings.HEAP_SIZE.get()


def _count(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


def checked(options) -> Options:
    """pg_options as Options (None: the defaults), its sizes checked before anything is allocated."""
    options = Options() if options is None else options
    if not isinstance(options, Options):
        raise TypeError(f"pg_options for the {NAME!r} backend must be iris.torch_backend.Options, got "
                        f"{type(options).__name__}")
    for name in ("heap_size", "staging_bytes"):
        value = getattr(options, name)
        if value is not None and not (_count(value) and value > 0):
            raise ValueError(f"Options({name}={value!r}): give a positive int number of bytes, e.g. {1 << 26}")
    if not (_count(options.mailbox_bytes) and options.mailbox_bytes >= 4):
        raise ValueError(f"Options(mailbox_bytes={options.mailbox_bytes!r}): give an int of at least 4 bytes "
                         f"(the default is {1 << 20})")
    return options
