"""Every environment variable iris reads, in one table: its type, its default and what it means.

- A value is read when it is asked for (`Setting.get`), so a variable changed at run time counts
  from the next read; the few a kernel compiles in (IRIS_DEBUG, IRIS_RANK_CHECK, IRIS_INDIRECT_PEERS,
  TRITON_INTERPRET) are read by the device modules when they load.
- One rule for all: unset or empty means the default. A flag is on for 1, true, yes, on, y and off
  for 0, false, no, off, n (any case), as Triton reads TRITON_INTERPRET; anything else is a
  SettingError naming the variable and the values it takes.
- The launcher's variables (IRIS_RANK ... IRIS_JOB_SECRET) are set for each rank by `iris.run` and
  `iris.spawn`, which write them under the names in this table.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any, Callable, NamedTuple

from .errors import SettingError

_ON = ("1", "true", "yes", "on", "y")
_OFF = ("0", "false", "no", "off", "n")


class Setting(NamedTuple):
    name: str
    default: Any
    meaning: str
    parse: Callable[[str, str], Any]  # (name, non-empty text) -> value, or SettingError

    def get(self):
        """The variable's value now, parsed; the default where it is unset or empty."""
        return self.value_of(os.environ.get(self.name))

    def value_of(self, text: str | None):
        """What the variable would mean set to text (None: unset)."""
        return self.default if text is None or text.strip() == "" else self.parse(self.name, text)

    def is_set(self) -> bool:
        return os.environ.get(self.name, "").strip() != ""


def _flag(name: str, text: str) -> bool:
    # not stripped: Triton reads TRITON_INTERPRET=" 1" as off, so iris refuses it rather than disagree
    if text.lower() in _ON:
        return True
    if text.lower() in _OFF:
        return False
    raise SettingError(f"{name}={text!r} is neither on nor off; use 1 or 0 (or {'/'.join(_ON[1:])} and "
                       f"{'/'.join(_OFF[1:])})")


def _text(name: str, text: str) -> str:
    return text.strip()


def _choice(what: str, options: tuple) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise SettingError(f"{name}={value!r} is not a {what}; use one of {', '.join(options)}")
        return value
    return parse


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SettingError(f"{name}={text!r} is not a number of seconds; e.g. {name}=300") from None
    if not (math.isfinite(value) and value > 0):
        raise SettingError(f"{name}={text!r} must be a finite positive number of seconds; e.g. {name}=300")
    return value


def _count(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise SettingError(f"{name}={text!r} is not a whole number >= 0")
    return value


def _peers(name: str, text: str):
    """'all', or the named ranks as a frozenset ('none' is the empty set); ranges are the heap's to check."""
    value = text.strip().lower()
    if value == "none":
        return frozenset()
    if value == "all":
        return "all"
    try:
        return frozenset(int(part) for part in value.split(","))
    except ValueError:
        raise SettingError(f"{name}={value!r}: use 'all', 'none' or ranks separated by commas, e.g. '1,3'") from None


_UNITS = {"": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def _bytes(name: str, text: str) -> int:
    """A positive number of bytes, with an optional unit: K, M, G (KB/KiB ..., powers of 1024)."""
    m = re.fullmatch(r"(\d+)\s*([A-Za-z]*)", text.strip())
    if m is None or m[2].lower() not in _UNITS or int(m[1]) <= 0:
        raise SettingError(f"{name}={text!r} is not a size; give bytes, e.g. {name}=1073741824 or {name}=1G")
    return int(m[1]) * _UNITS[m[2].lower()]


PLATFORMS = ("cuda", "hip", "host")
SYMMETRY_MODES = ("off", "cheap", "full")

PLATFORM = Setting("IRIS_PLATFORM", None, "the platform, one of cuda, hip, host (unset: a GPU torch sees, else host)",
                   _choice("platform", PLATFORMS))
ALLOCATOR = Setting("IRIS_ALLOCATOR", None, "the allocator of every context, over the allocator= argument (torch, "
                    "vmem, nvshmem)", _text)
TIMEOUT = Setting("IRIS_TIMEOUT", 120.0, "seconds ranks wait for each other (rendezvous, host collectives, a "
                  "streamed fused op's chunks once every rank has opened it); timeout= wins", _seconds)
CHECK_SYMMETRY = Setting("IRIS_CHECK_SYMMETRY", "cheap", "compare the ranks' collective allocations: off, cheap (at "
                         "points where ranks meet) or full (before every allocation)",
                         _choice("mode", SYMMETRY_MODES))
DEBUG = Setting("IRIS_DEBUG", False, "compile rank and pointer checks into every device function (read at import); "
                "ctx.free refuses a block other tensors still view (read when a context is made)", _flag)
REUSE_TIMEOUT = Setting("IRIS_REUSE_TIMEOUT", 120.0, "seconds a reused heap block waits for peers' work queued before "
                        "their free, with no counter moving, before ReuseTimeout", _seconds)
SPIN_LIMIT = Setting("IRIS_SPIN_LIMIT", 1 << 28, "most polls a device wait (ctx.ccl's, iris.wait, the device barrier, "
                    "the tile API's locks) makes before it gives up and the host raises WaitTimeout (about 1 us a poll "
                    "on an H100; 0: wait for ever; read when a context is made); Config.spin_limit wins for ctx.ccl",
                    _count)
RANK_CHECK = Setting("IRIS_RANK_CHECK", True, "device functions refuse a rank outside [0, world): the access is "
                     "masked and the host raises DeviceCheckError (read at import; 0 compiles the check out)", _flag)
INDIRECT_PEERS = Setting("IRIS_INDIRECT_PEERS", frozenset(), "peers reached through NVSHMEM although loads could: "
                         "all, none or ranks such as 1,3 (allocator='nvshmem')", _peers)
CCL_PUTS = Setting("IRIS_CCL_PUTS", False, "ctx.ccl moves data by puts although every peer is direct", _flag)
NVSHMEM_BITCODE = Setting("IRIS_NVSHMEM_BITCODE", None, "path of NVSHMEM's device bitcode (unset: the "
                          "nvidia-nvshmem-cu13 package's)", _text)
ADDR = Setting("IRIS_ADDR", None, "address of this host that other hosts reach rank 0's rendezvous at (unset: the "
               "one routing to MASTER_ADDR)", _text)
PORT = Setting("IRIS_PORT", 0, "TCP port of rank 0's rendezvous across hosts (0: any free port)", _count)
HOSTNAME = Setting("IRIS_HOSTNAME", None, "this rank's host as peers compare it (unset: socket.gethostname())", _text)
HEAP_SIZE = Setting("IRIS_HEAP_SIZE", 1 << 30, "bytes of the heap the torch.distributed backend \"iris\" builds "
                    "(a number, or with K, M, G); Options(heap_size=) wins", _bytes)
RANK = Setting("IRIS_RANK", None, "this process's rank (set by the launcher)", _count)
WORLD_SIZE = Setting("IRIS_WORLD_SIZE", None, "the number of ranks (set by the launcher)", _count)
LOCAL_RANK = Setting("IRIS_LOCAL_RANK", None, "this process's rank on its host (set by the launcher)", _count)
SOCKET_DIR = Setting("IRIS_SOCKET_DIR", None, "private directory of the job's rendezvous socket (set by the "
                     "launcher)", _text)
JOB_SECRET = Setting("IRIS_JOB_SECRET", None, "secret ranks prove to each other at the rendezvous (set by the "
                     "launcher)", _text)
INTERPRET = Setting("TRITON_INTERPRET", False, "kernels run in Triton's interpreter (iris sets 1 on the host "
                    "platform before any kernel is defined)", _flag)

SETTINGS = {s.name: s for s in (PLATFORM, ALLOCATOR, TIMEOUT, CHECK_SYMMETRY, DEBUG, REUSE_TIMEOUT, SPIN_LIMIT,
                                RANK_CHECK, INDIRECT_PEERS, CCL_PUTS, NVSHMEM_BITCODE, ADDR, PORT, HOSTNAME, HEAP_SIZE,
                                RANK, WORLD_SIZE, LOCAL_RANK, SOCKET_DIR, JOB_SECRET, INTERPRET)}
SECRET = (JOB_SECRET.name,)  # never printed


def shown(default) -> str:
    """A default as the settings table in docs/settings.md writes it."""
    if default is None:
        return "-"
    if isinstance(default, bool):
        return str(int(default))
    if isinstance(default, frozenset):
        return "none"
    return str(default)


def describe() -> list:
    """One dict per setting for `iris info`: name, value as set (or None), default, meaning, and the
    error where the value is unusable."""
    rows = []
    for s in SETTINGS.values():
        text = os.environ.get(s.name)
        row = {"name": s.name, "set": None if text is None else ("<hidden>" if s.name in SECRET else text),
               "default": shown(s.default), "meaning": s.meaning}
        try:
            s.get()
        except SettingError as e:
            row["error"] = str(e)
        rows.append(row)
    return rows
