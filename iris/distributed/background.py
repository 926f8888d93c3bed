"""A run of exchanges on a background thread: the caller goes on with driver calls (which release
the GIL) while its fds travel and its peers' arrive, so waiting for a slower peer hides behind work."""
from __future__ import annotations

import queue
import threading
from typing import Sequence

from .group import close_fds


class BackgroundExchanges:
    """n exchanges over group, in order, one per send() or per step left by fail(); next() hands out
    each result. Collective: all ranks, the same n, in the same order.

    Each step carries None (this rank is fine) or the reason this rank failed, plus the fds sent.
    Sent fds are closed once sent; fds received and not handed out are closed by close(). A broken
    group (a peer left) raises its BootstrapError from next()."""

    def __init__(self, group, n: int, what: str):
        self._group, self._n, self._what = group, n, what
        self._inbox: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        self._fed = self._taken = 0
        self._error = None
        self._thread = threading.Thread(target=self._run, name=f"iris {what}", daemon=True)
        self._thread.start()

    def send(self, fds: Sequence[int]) -> None:
        """This rank's fds for the next step; they become this object's to close."""
        if self._fed >= self._n:
            close_fds(fds)
            raise ValueError(f"{self._what}: all {self._n} exchanges were already sent")
        self._fed += 1
        self._inbox.put((None, list(fds)))

    def fail(self, reason: str) -> None:
        """Tell the peers, in every step not sent yet, that this rank failed (they raise too)."""
        while self._fed < self._n:
            self._fed += 1
            self._inbox.put((reason, []))

    def next(self):
        """(notes, fds) of the next step: notes[r] is None or the reason rank r failed; fds[r] are
        new fds from rank r that the caller owns (its own entry is empty)."""
        if self._error is None:
            if self._taken >= self._n:
                raise ValueError(f"{self._what}: all {self._n} exchanges were already taken")
            self._taken += 1
            kind, value = self._outbox.get()
            if kind == "ok":
                return value
            self._error = value
        raise self._error

    def _run(self) -> None:
        try:
            for _ in range(self._n):
                note, fds = self._inbox.get()
                try:
                    notes, got = self._group.exchange(note, fds, self._what)
                finally:
                    close_fds(fds)
                got[self._group.rank] = []
                self._outbox.put(("ok", (notes, got)))
        except BaseException as e:  # handed to the caller by next()
            self._outbox.put(("error", e))

    def close(self) -> None:
        """Finish the steps (failing those not sent), wait for the thread, close what nobody took."""
        self.fail(f"rank {self._group.rank} stopped during {self._what}")
        self._thread.join()
        while not self._outbox.empty():
            kind, value = self._outbox.get_nowait()
            if kind == "ok":
                close_fds(fd for fds in value[1] for fd in fds)
        while not self._inbox.empty():
            close_fds(self._inbox.get_nowait()[1])

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
