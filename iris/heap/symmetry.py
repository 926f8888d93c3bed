"""Symmetry check: every rank folds its collective allocate/free calls into a digest; ranks compare digests.

IRIS_CHECK_SYMMETRY=off skips it; "cheap" (the default) compares at the collective points that
happen anyway (growth, trim, barrier, close); "full" compares before every allocation, so a
divergent request is refused before any rank acts on it.
"""
from __future__ import annotations

import hashlib
import os

from ..errors import SymmetryError

MODES = ("off", "cheap", "full")


def mode_from_env() -> str:
    mode = os.environ.get("IRIS_CHECK_SYMMETRY", "cheap").strip().lower()
    if mode not in MODES:
        raise ValueError(f"IRIS_CHECK_SYMMETRY={mode!r} is not a mode; use one of {', '.join(MODES)}")
    return mode


def _text(call) -> str:
    return call if isinstance(call, str) else f"{call[0]}({', '.join(map(str, call[1:]))})"


class SymmetryCheck:
    """The digest of one rank's collective calls, and the comparison of every rank's."""

    def __init__(self, mode: str):
        self.mode, self.calls, self.last = mode, 0, "none yet"
        self._digest = hashlib.blake2b(digest_size=16)
        self._unhashed = []  # calls since the last token: hashed there, off the allocation path

    def record(self, call) -> None:
        """call: a string, or a tuple (name, *args) formatted only when hashed."""
        if self.mode != "off":
            self._unhashed.append(call)
            if len(self._unhashed) >= 1024:
                self._flush()

    def _flush(self) -> None:
        # one repr per batch; batches end at the same call on every rank that made the same calls
        self._digest.update(repr(self._unhashed).encode())
        self.calls += len(self._unhashed)
        self.last = _text(self._unhashed[-1])
        self._unhashed.clear()

    def token(self, pending: str = ""):
        """What this rank sends at a collective point (None when the check is off)."""
        if self.mode == "off":
            return None
        if self._unhashed:
            self._flush()
        return self.calls, self._digest.hexdigest(), self.last, _text(pending) if pending else ""

    def compare(self, tokens, rank: int, where: str) -> None:
        """Raise SymmetryError if any rank's token differs from ours."""
        mine = tokens[rank]
        if mine is None:
            return
        diverged = [p for p, t in enumerate(tokens) if t is not None and t != mine]
        if diverged:
            lines = [f"rank {p}: {t[0]} collective calls, last {t[2]}" + (f", now {t[3]}" if t[3] else "")
                     for p, t in enumerate(tokens) if t is not None]
            raise SymmetryError(
                f"ranks diverged at {where}: every rank must allocate and free the same sizes in the same order.\n  "
                + "\n  ".join(lines))
