"""A job's private rendezvous: ranks meet over AF_UNIX in a 0700 directory, fds travel by SCM_RIGHTS.

Star-shaped: every rank keeps one connection to rank 0, which gathers and broadcasts. A peer
must present the job's secret (and run as our uid) before it is answered. Every wait has a
deadline and a timeout names the ranks that did not arrive.
"""
from __future__ import annotations

import hmac
import os
import pickle
import select
import socket
import struct
import time
from typing import Any, List, Sequence, Tuple

from ..errors import BootstrapError, SymmetryError

_HEADER = struct.Struct("!QI")
_FDS_PER_MSG = 250  # under the kernel's SCM_MAX_FD (253)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionResetError("peer closed the connection")
        buf += part
    return bytes(buf)


def send_msg(sock: socket.socket, obj: Any, fds: Sequence[int] = ()) -> None:
    data = pickle.dumps(obj)
    sock.sendall(_HEADER.pack(len(data), len(fds)) + data)
    for i in range(0, len(fds), _FDS_PER_MSG):
        socket.send_fds(sock, [b"F"], list(fds[i:i + _FDS_PER_MSG]))


def recv_msg(sock: socket.socket) -> Tuple[Any, List[int]]:
    size, nfds = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    obj = pickle.loads(_recv_exact(sock, size))
    fds: List[int] = []
    while len(fds) < nfds:
        _, got, _, _ = socket.recv_fds(sock, 1, _FDS_PER_MSG)
        if not got:
            raise ConnectionResetError("peer closed the connection while sending fds")
        fds += got
    for fd in fds:
        os.set_inheritable(fd, False)
    return obj, fds


class Group:
    """Collective channel among `world` ranks of one host. Collective: all ranks, same order."""

    def __init__(self, rank: int, world: int, path: str, secret: str, timeout: float):
        self.rank, self.world, self.timeout = rank, world, timeout
        self._peers: dict[int, socket.socket] = {}
        self._root: socket.socket | None = None
        if world == 1:
            return
        if rank == 0:
            self._accept(path, secret)
        else:
            self._connect(path, secret)

    # -- forming the group -------------------------------------------------
    def _accept(self, path: str, secret: str) -> None:
        deadline = time.monotonic() + self.timeout
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            os.chmod(path, 0o600)
            listener.listen(self.world)
            while len(self._peers) < self.world - 1:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([listener], [], [], left)[0]:
                    break
                conn, _ = listener.accept()
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                    (peer_rank, token), _ = recv_msg(conn)
                except (OSError, ValueError, pickle.UnpicklingError):
                    conn.close()
                    continue
                uid = struct.unpack("3i", creds)[1]
                ok = (uid == os.getuid() and isinstance(token, str) and hmac.compare_digest(token, secret)
                      and isinstance(peer_rank, int) and 0 < peer_rank < self.world and peer_rank not in self._peers)
                if not ok:
                    conn.close()  # not of this job: it learns nothing
                    continue
                self._peers[peer_rank] = conn
        finally:
            listener.close()
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        missing = [r for r in range(1, self.world) if r not in self._peers]
        if missing:
            self._fail(f"ranks {missing} of {self.world} did not arrive within {self.timeout:.1f} s "
                       "(did every rank call iris.iris()? raise the timeout with IRIS_TIMEOUT)", missing)
        for conn in self._peers.values():
            send_msg(conn, ("ok", None))

    def _connect(self, path: str, secret: str) -> None:
        deadline = time.monotonic() + self.timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        while True:
            try:
                sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    sock.close()
                    raise BootstrapError(f"rank {self.rank}: rank 0 did not arrive within {self.timeout:.1f} s "
                                         f"(no rendezvous at {path}); did rank 0 call iris.iris()?", [0]) from None
                time.sleep(0.01)
        self._root = sock
        send_msg(sock, (self.rank, secret))
        self._answer("joining the group")

    # -- collectives -------------------------------------------------------
    def exchange(self, obj: Any, fds: Sequence[int] = (), what: str = "exchange"):
        """Every rank's object and fds. Collective. fds from peers are new fds the caller owns;
        the caller's own entry holds its own fds, not copies."""
        if self.world == 1:
            return [obj], [list(fds)]
        if self.rank != 0:
            self._send(self._root, (what, obj), fds, 0, what)
            objs, counts = self._answer(what)
            return self._split(objs, counts, fds)
        objs, all_fds = [obj] + [None] * (self.world - 1), [list(fds)] + [[] for _ in range(self.world - 1)]
        pending = dict(self._peers)
        deadline = time.monotonic() + self.timeout
        while pending:
            left = deadline - time.monotonic()
            ready = select.select(list(pending.values()), [], [], max(0, left))[0] if left > 0 else []
            if not ready:
                self._fail(f"ranks {sorted(pending)} did not arrive at {what} within {self.timeout:.1f} s", sorted(pending))
            for r in [r for r, s in pending.items() if s in ready]:
                try:
                    self._peers[r].settimeout(max(0.1, deadline - time.monotonic()))
                    (tag, objs[r]), all_fds[r] = recv_msg(self._peers[r])
                except (OSError, EOFError, ConnectionResetError):
                    self._peers.pop(r).close()
                    self._fail(f"rank {r} left the job during {what}", [r])
                if tag != what:
                    self._fail(f"rank {r} is at {tag} while rank 0 is at {what}: the ranks' collective calls "
                               "diverged (same calls, same order, same sizes on every rank)", [r], SymmetryError)
                del pending[r]
        counts = [len(f) for f in all_fds]
        for r, conn in self._peers.items():
            others = [fd for q, f in enumerate(all_fds) if q != r for fd in f]
            self._send(conn, ("ok", (objs, counts)), others, r, what)
        return objs, all_fds

    def allgather(self, obj: Any, what: str = "allgather") -> list:
        """Every rank's object, in rank order. Collective."""
        return self.exchange(obj, (), what)[0]

    def barrier(self, what: str = "barrier") -> None:
        """Returns once every rank arrived. Collective."""
        self.exchange(None, (), what)

    # -- plumbing ----------------------------------------------------------
    def _split(self, objs, counts, own):
        received, at, out = self._received, 0, []
        for r, n in enumerate(counts):
            if r == self.rank:
                out.append(list(own))
            else:
                out.append(received[at:at + n])
                at += n
        return objs, out

    def _send(self, sock, msg, fds, to, what):
        try:
            sock.settimeout(self.timeout)
            send_msg(sock, msg, fds)
        except OSError as e:
            self._fail(f"rank {to} left the job during {what} ({e})", [to])

    def _answer(self, what: str):
        # Rank 0 gives up on missing ranks after the timeout and says which they were; waiting a
        # little longer than that lets its verdict, not this rank's own clock, name them.
        wait = self.timeout * 1.1 + 2.0
        try:
            self._root.settimeout(wait)
            (tag, payload), self._received = recv_msg(self._root)
        except socket.timeout:
            raise BootstrapError(f"rank {self.rank}: no answer from rank 0 at {what} within {wait:.1f} s; "
                                 "rank 0 or a rank it waits for did not arrive", [0]) from None
        except (OSError, EOFError) as e:
            raise BootstrapError(f"rank {self.rank}: rank 0 left the job during {what} ({e})", [0]) from None
        if tag == "error":
            message, missing, kind = payload
            if kind == "SymmetryError":
                raise SymmetryError(f"rank {self.rank}: {message}")
            raise BootstrapError(f"rank {self.rank}: {message}", missing)
        return payload

    def _fail(self, message: str, missing, kind=BootstrapError) -> None:
        for conn in self._peers.values():
            try:
                conn.settimeout(1.0)
                send_msg(conn, ("error", (message, list(missing), kind.__name__)))
            except OSError:
                pass
        self.close()
        raise kind(f"rank 0: {message}") if kind is SymmetryError else kind(f"rank 0: {message}", missing)

    def close(self) -> None:
        """Drop every connection; idempotent."""
        for conn in self._peers.values():
            conn.close()
        self._peers.clear()
        if self._root is not None:
            self._root.close()
            self._root = None
