"""Symmetry check: every rank folds its collective allocate/free calls into a digest; ranks compare digests.

IRIS_CHECK_SYMMETRY=off skips it; "cheap" (the default) compares at the collective points that
happen anyway (growth, trim, barrier, close); "full" compares before every allocation, so a
divergent request is refused before any rank acts on it.
"""
from __future__ import annotations

import hashlib
from array import array

from .. import settings
from ..errors import SymmetryError


def mode_from_env() -> str:
    return settings.CHECK_SYMMETRY.get()


def _ignore(call) -> None:
    pass


def _text(call) -> str:
    if isinstance(call, int):
        return f"allocate({call}, align=256)" if call >= 0 else f"free({~call})"
    return call if isinstance(call, str) else f"{call[0]}({', '.join(map(str, call[1:]))})"


class SymmetryCheck:
    """The digest of one rank's collective calls, and the comparison of every rank's.

    Since the last point where the ranks agreed, each rank also keeps its first WINDOW calls, so
    that a divergence names each rank's own first divergent call, not merely its last one."""

    WINDOW = 64

    def __init__(self, mode: str):
        self.mode, self.calls, self.last = mode, 0, "none yet"
        self._digest = hashlib.blake2b(digest_size=16)
        self.agreed, self.since = 0, []  # call count at the last agreement, and calls after it
        self.reported = False  # a divergence was raised here already (close() does not raise it again)
        self._unhashed = []  # calls since the last token: hashed there, off the allocation path
        # note(call): record a call without the length check (a C call, no Python frame; the heap
        # calls bound() every 1024 allocations instead). A call is a string; a tuple (name, *args),
        # formatted only when hashed; or an int: n >= 0 allocated n bytes at the usual alignment,
        # n < 0 freed the block at offset ~n. Batches of ints alone hash as raw int64s.
        self.note = self._unhashed.append if mode != "off" else _ignore

    def record(self, call) -> None:
        """note(call), then bound()."""
        self.note(call)
        self.bound()

    def bound(self) -> None:
        """Hash the calls noted so far if they are many. Called at points every rank reaches after
        the same calls, so batches end at the same call on every rank."""
        if len(self._unhashed) >= 1024:
            self._flush()

    def _flush(self) -> None:
        # one hash update per batch; batches end at the same call on every rank that made the same calls
        if len(self.since) < self.WINDOW:  # the window fills here, off the allocation path
            self.since += self._unhashed[:self.WINDOW - len(self.since)]
        try:
            data = array("q", self._unhashed).tobytes()
        except TypeError:  # a string or tuple among the calls
            data = repr(self._unhashed).encode()
        self._digest.update(data)
        self.calls += len(self._unhashed)
        self.last = _text(self._unhashed[-1])
        self._unhashed.clear()

    def token(self, pending: str = ""):
        """What this rank sends at a collective point (None when the check is off)."""
        if self.mode == "off":
            return None
        if self._unhashed:
            self._flush()
        return (self.calls, self._digest.hexdigest(), _text(pending) if pending else "", self.last, self.agreed,
                tuple(map(_text, self.since)))

    def compare(self, tokens, rank: int, where: str) -> None:
        """Raise SymmetryError if any rank's calls differ from ours (all ranks reach the same verdict)."""
        mine = tokens[rank]
        if mine is None:
            return
        live = [(p, t) for p, t in enumerate(tokens) if t is not None]
        if all(t[:3] == mine[:3] for _, t in live):
            self.agreed, self.since = self.calls, []
            return
        self.reported = True
        lines = [f"rank {p}: {t[0]} collective calls, {self._first_divergent(t, live)}"
                 + (f", now {t[2]}" if t[2] else "") for p, t in live]
        raise SymmetryError(
            f"ranks diverged at {where}: every rank must allocate and free the same sizes in the same order.\n  "
            + "\n  ".join(lines))

    @staticmethod
    def _first_divergent(t, live) -> str:
        """This rank's call at the first index where the ranks' kept call lists differ."""
        start, stop = max(u[4] for _, u in live), min(u[4] + len(u[5]) for _, u in live)
        for i in range(start, stop):
            if len({u[5][i - u[4]] for _, u in live}) > 1:
                return f"call #{i + 1} was {t[5][i - t[4]]}"
        if stop - t[4] < len(t[5]):  # the lists agree up to the shortest one: that rank stopped early
            return f"call #{stop + 1} was {t[5][stop - t[4]]}"
        if t[0] == stop:
            return f"no call #{stop + 1}"
        return f"last {t[3]}"
