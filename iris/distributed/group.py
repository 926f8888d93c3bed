"""A job's private rendezvous: ranks of one host meet over AF_UNIX in a 0700 directory, and fds
travel by SCM_RIGHTS; ranks on several hosts meet over TCP, where only objects travel.

Star-shaped: every rank keeps one connection to rank 0, which gathers and broadcasts. Nothing is
unpickled before the peer is authenticated: over AF_UNIX rank 0 checks the peer's uid (SO_PEERCRED),
then both sides prove they hold the job's secret with an HMAC over fresh nonces, in fixed-size frames. The
handshakes are served concurrently, each with a short deadline, so a silent or hostile client
cannot hold up the job. Every wait has a deadline; a timeout or a departure names the ranks, and
once a peer is gone every later collective raises the same BootstrapError.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import secrets
import select
import socket
import struct
import sys
import time
from typing import Any, List, Sequence, Tuple

from .. import settings
from ..errors import BootstrapError, SpansHostsError, SymmetryError

_HEADER = struct.Struct("!QI")
MAX_FRAME = 1 << 30      # bytes in one message from an authenticated peer; larger is refused unread
MAX_FDS = 1 << 20
_FDS_PER_MSG = 250       # under the kernel's SCM_MAX_FD (253)
_NONCE = 32
_HELLO = struct.Struct(f"!i{_NONCE}s32s")  # rank, client nonce, HMAC(secret, challenge, rank)
HANDSHAKE_S = 5.0        # how long one connecting client may take to prove itself
REPORT_S = 5.0           # a rank that waits for others says so on stderr this often


def say(text: str) -> None:
    """One line of iris's own on stderr."""
    sys.stderr.write(f"iris: {text}\n")
    sys.stderr.flush()


def hostname() -> str:
    """This rank's host as peers compare it; IRIS_HOSTNAME stands in for it (tests give the ranks of
    one machine different hosts)."""
    return settings.HOSTNAME.get() or socket.gethostname()


def _mac(secret: str, *parts: bytes) -> bytes:
    return hmac.new(secret.encode(), b"".join(parts), hashlib.sha256).digest()


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


def close_fds(fds) -> None:
    """Close every fd of an iterable (received or exported fds nobody else will close)."""
    for fd in fds:
        os.close(fd)


def recv_msg(sock: socket.socket) -> Tuple[Any, List[int]]:
    """One message from an authenticated peer (only those are ever read with this)."""
    size, nfds = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > MAX_FRAME or nfds > MAX_FDS:
        raise ConnectionResetError(f"peer sent a frame of {size} bytes and {nfds} fds, over the limit")
    obj = pickle.loads(_recv_exact(sock, size))
    fds: List[int] = []
    try:
        while len(fds) < nfds:
            _, got, _, _ = socket.recv_fds(sock, 1, _FDS_PER_MSG)
            fds += got
            if not got:
                raise ConnectionResetError("peer closed the connection while sending fds")
    except BaseException:
        close_fds(fds)
        raise
    for fd in fds:
        os.set_inheritable(fd, False)
    return obj, fds


def _family(address) -> int:
    if isinstance(address, str):
        return socket.AF_UNIX
    return socket.AF_INET6 if ":" in address[0] else socket.AF_INET


def tcp_listener(address) -> socket.socket:
    """A listening TCP socket at (host, port); port 0 picks a free one (read it off getsockname)."""
    listener = socket.socket(_family(address), socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the next formation rebinds the port
        listener.bind(tuple(address))
        listener.listen(128)
    except OSError as e:
        listener.close()
        raise BootstrapError(f"rank 0 cannot listen for the job's ranks at {address[0]}:{address[1]} ({e}); "
                             "set IRIS_ADDR to an address of this host that every rank can reach", []) from None
    return listener


def _ranks(ranks) -> str:
    """[0, 1, 2, 5] as '0-2, 5'."""
    runs, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(runs)


class Group:
    """Collective channel among `world` ranks. Collective: all ranks, same order.

    address is an AF_UNIX path (ranks of one host) or (host, port) of rank 0 over TCP; listener, on
    rank 0, an already listening socket at that address. hosts[r] is rank r's host: given by the
    bootstrap where it learnt them, otherwise exchanged once the group is formed."""

    def __init__(self, rank: int, world: int, address, secret: str, timeout: float, hosts=None, listener=None):
        self.rank, self.world, self.timeout = rank, world, timeout
        self.tcp = not isinstance(address, str)
        self._peers: dict[int, socket.socket] = {}
        self._root: socket.socket | None = None
        self._broken: tuple | None = None  # (message, missing, kind) once a peer is gone
        self._closed = False
        self.collectives = 0  # host collectives made (every one is an exchange): what a loop's cost counts
        if world > 1:
            if rank == 0:
                self._accept(address, secret, listener)
            else:
                self._connect(address, secret)
        elif listener is not None:
            listener.close()
        self.hosts = list(hosts) if hosts is not None else self.allgather(hostname(), "hosts")
        mine = self.hosts[rank]
        self.local_ranks = [r for r, h in enumerate(self.hosts) if h == mine]  # ranks of this host, in order
        self.local_rank = self.local_ranks.index(rank)

    def ranks_by_host(self) -> dict:
        """host -> its ranks, hosts in the order of their first rank."""
        out: dict = {}
        for r, h in enumerate(self.hosts):
            out.setdefault(h, []).append(r)
        return out

    def require_one_host(self, what: str, fix: str) -> None:
        """Raise SpansHostsError (the same on every rank) where the job's ranks are on several hosts."""
        by_host = self.ranks_by_host()
        if len(by_host) > 1:
            where = "; ".join(f"{h}: ranks {_ranks(rs)}" for h, rs in by_host.items())
            raise SpansHostsError(f"{what} works within one host, but this job's {self.world} ranks are on "
                                  f"{len(by_host)} hosts ({where}). {fix}")

    # -- forming the group -------------------------------------------------
    def _accept(self, address, secret: str, listener=None) -> None:
        start = time.monotonic()
        deadline, report = start + self.timeout, start + REPORT_S
        pending: dict[socket.socket, list] = {}  # client -> [deadline, bytes so far, challenge]
        if listener is None and self.tcp:
            listener = tcp_listener(address)
        elif listener is None:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                try:
                    os.unlink(address)  # left by a rank 0 that died (the directory is the job's own)
                except FileNotFoundError:
                    pass
                listener.bind(address)
                os.chmod(address, 0o600)
                listener.listen(max(16, 2 * self.world))
            except BaseException:
                listener.close()
                raise
        try:
            while len(self._peers) < self.world - 1:
                now = time.monotonic()
                for conn in [c for c, st in pending.items() if st[0] <= now]:
                    pending.pop(conn).close()  # too slow to prove itself: not one of ours
                if now >= deadline:
                    break
                if now >= report and now + 0.5 < deadline:
                    report += REPORT_S
                    self._waiting([r for r in range(1, self.world) if r not in self._peers],
                                  "joining the job (iris.iris())", now - start)
                wait = min([deadline - now, report - now] + [st[0] - now for st in pending.values()])
                for conn in select.select([listener, *pending], [], [], wait)[0]:
                    if conn is listener:
                        self._greet(listener, pending)
                    else:
                        self._hear(conn, pending, secret)
        finally:
            for conn in pending:
                conn.close()
            listener.close()
            if not self.tcp:
                try:
                    os.unlink(address)
                except FileNotFoundError:
                    pass
        missing = [r for r in range(1, self.world) if r not in self._peers]
        if missing:
            self._fail(f"ranks {missing} of {self.world} did not arrive within {self.timeout:.1f} s "
                       "(did every rank call iris.iris()? raise the timeout with IRIS_TIMEOUT)", missing)
        for r, conn in self._peers.items():
            self._send(conn, ("ok", None), (), r, "joining the group")

    def _greet(self, listener, pending) -> None:
        """A new client: same uid as ours (AF_UNIX), then a challenge it must answer within HANDSHAKE_S."""
        conn, _ = listener.accept()
        try:
            if self.tcp:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                if struct.unpack("3i", creds)[1] != os.getuid():
                    raise ConnectionRefusedError("another user")
            conn.setblocking(False)
            challenge = secrets.token_bytes(_NONCE)
            if conn.send(challenge) != _NONCE:
                raise ConnectionRefusedError("short send")
        except OSError:
            conn.close()
            return
        pending[conn] = [time.monotonic() + min(HANDSHAKE_S, self.timeout), b"", challenge]

    def _hear(self, conn, pending, secret: str) -> None:
        """More of a client's fixed-size answer; once complete, it joins or is dropped."""
        state = pending[conn]
        try:
            part = conn.recv(_HELLO.size - len(state[1]))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            part = b""
        if not part:
            pending.pop(conn).close()
            return
        state[1] += part
        if len(state[1]) < _HELLO.size:
            return
        del pending[conn]
        rank, nonce, mac = _HELLO.unpack(state[1])
        ok = (hmac.compare_digest(mac, _mac(secret, b"join", state[2], struct.pack("!i", rank)))
              and 0 < rank < self.world and rank not in self._peers)
        if not ok:
            conn.close()  # not of this job, or a rank already here: it learns nothing
            return
        try:
            conn.setblocking(True)
            conn.settimeout(min(HANDSHAKE_S, self.timeout))
            conn.sendall(_mac(secret, b"root", nonce, state[2]))
        except OSError:
            conn.close()
            return
        self._peers[rank] = conn

    def _connect(self, address, secret: str) -> None:
        start = time.monotonic()
        deadline, report = start + self.timeout, start + REPORT_S
        path = address if not self.tcp else f"{address[0]}:{address[1]}"
        while True:
            sock = socket.socket(_family(address), socket.SOCK_STREAM)
            try:
                sock.settimeout(max(0.1, min(HANDSHAKE_S, deadline - time.monotonic())))
                sock.connect(address if not self.tcp else tuple(address))
                if self.tcp:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                challenge = _recv_exact(sock, _NONCE)
                break
            except (FileNotFoundError, ConnectionError, socket.timeout):
                sock.close()  # no rendezvous yet, or one that ended before we were heard: try again
                now = time.monotonic()
                if now > deadline:
                    raise BootstrapError(f"rank {self.rank}: rank 0 did not arrive within {self.timeout:.1f} s "
                                         f"(no rendezvous at {path}); did rank 0 call iris.iris()?", [0]) from None
                if now >= report and now + 0.5 < deadline:
                    report += REPORT_S
                    say(f"rank {self.rank} has waited {now - start:.0f} s for rank 0 to open the job's rendezvous "
                        f"({path}); it gives up after {self.timeout:.0f} s (IRIS_TIMEOUT)")
                time.sleep(0.01)
        nonce = secrets.token_bytes(_NONCE)
        try:
            sock.sendall(_HELLO.pack(self.rank, nonce, _mac(secret, b"join", challenge, struct.pack("!i", self.rank))))
            proof = _recv_exact(sock, 32)
        except OSError:
            sock.close()
            raise BootstrapError(f"rank {self.rank}: rank 0 refused this rank at {path}: another process joined "
                                 f"as rank {self.rank}, or this rank holds another job's secret", [0]) from None
        if not hmac.compare_digest(proof, _mac(secret, b"root", nonce, challenge)):
            sock.close()
            raise BootstrapError(f"rank {self.rank}: the process listening at {path} does not hold this job's "
                                 "secret; start every rank with one launcher", [0])
        self._root = sock
        self._answer("joining the group")

    # -- collectives -------------------------------------------------------
    def exchange(self, obj: Any, fds: Sequence[int] = (), what: str = "exchange"):
        """Every rank's object and fds. Collective: all ranks, same order, same sizes. fds from
        peers are new fds the caller owns; the caller's own entry holds its own fds, not copies.
        fds travel only over AF_UNIX: a group over TCP refuses them."""
        self.collectives += 1
        self._check(what)
        if fds and self.tcp:
            raise SpansHostsError(f"rank {self.rank}: {what} sends file descriptors, which travel only between "
                                  "ranks of one host, but this job's group spans hosts (over TCP)")
        if self.world == 1:
            return [obj], [list(fds)]
        if self.rank != 0:
            self._send(self._root, (what, obj), fds, 0, what)
            objs, counts = self._answer(what)
            return self._split(objs, counts, fds)
        objs, all_fds = [obj] + [None] * (self.world - 1), [list(fds)] + [[] for _ in range(self.world - 1)]
        try:
            self._gather(objs, all_fds, what)
        except BaseException:
            close_fds(fd for f in all_fds[1:] for fd in f)  # a rank that sent its fds before another failed
            raise
        counts = [len(f) for f in all_fds]
        for r, conn in self._peers.items():
            others = [fd for q, f in enumerate(all_fds) if q != r for fd in f]
            self._send(conn, ("ok", (objs, counts)), others, r, what)
        return objs, all_fds

    def _gather(self, objs, all_fds, what: str) -> None:
        """Rank 0: every peer's message of this exchange into objs and all_fds."""
        pending = dict(self._peers)
        start = time.monotonic()
        deadline, report = start + self.timeout, start + REPORT_S
        while pending:
            now = time.monotonic()
            if now >= report and now + 0.5 < deadline:
                self._waiting(sorted(pending), what, now - start)
            if now >= report:
                report += REPORT_S
            left = deadline - now
            ready = select.select(list(pending.values()), [], [], min(left, report - now))[0] if left > 0 else []
            if not ready and left <= 0:
                self._fail(f"ranks {sorted(pending)} did not arrive at {what} within {self.timeout:.1f} s", sorted(pending))
            for r in [r for r, s in pending.items() if s in ready]:
                try:
                    self._peers[r].settimeout(max(0.1, deadline - time.monotonic()))
                    (tag, objs[r]), all_fds[r] = recv_msg(self._peers[r])
                except (OSError, EOFError, pickle.UnpicklingError, ValueError):
                    self._fail(f"rank {r} left the job during {what}", [r])
                if tag == "abort":
                    self._fail(f"rank {r} failed during {what}: {objs[r]}", [r])
                if tag != what:
                    self._fail(f"rank {r} is at {tag} while rank 0 is at {what}: the ranks' collective calls "
                               "diverged (same calls, same order, same sizes on every rank)", [r], SymmetryError)
                del pending[r]

    def _waiting(self, missing: list, what: str, waited: float) -> None:
        """Rank 0, still waiting: say which ranks are missing, and tell those that arrived that rank 0
        is alive (they wait on for its verdict rather than give up on their own clock)."""
        hosts = getattr(self, "hosts", None)
        where = "" if not hosts or len(set(hosts)) == 1 else " (" + ", ".join(f"{r} on {hosts[r]}" for r in missing) + ")"
        say(f"rank 0 has waited {waited:.0f} s at {what} for {'rank' if len(missing) == 1 else 'ranks'} "
            f"{_ranks(missing)}{where}; it gives up after {self.timeout:.0f} s (IRIS_TIMEOUT)")
        for r, conn in list(self._peers.items()):
            if r not in missing:
                try:
                    conn.settimeout(1.0)
                    send_msg(conn, ("waiting", (what, missing)))
                except OSError:
                    pass

    def allgather(self, obj: Any, what: str = "allgather") -> list:
        """Every rank's object, in rank order. Collective: all ranks, same order."""
        return self.exchange(obj, (), what)[0]

    def barrier(self, what: str = "barrier") -> None:
        """Returns once every rank arrived. Collective: all ranks, same order."""
        self.exchange(None, (), what)

    def abort(self, reason: str) -> None:
        """Leave the job after a local failure, telling the others why (instead of just vanishing)."""
        if self._closed or self.world == 1:
            return self.close()
        message = f"rank {self.rank} failed: {reason}"
        if self.rank == 0:
            self._broadcast_error(message, [0], BootstrapError)
        else:
            try:
                self._root.settimeout(1.0)
                send_msg(self._root, ("abort", reason))
            except OSError:
                pass
        self._broken = self._broken or (message, [self.rank], BootstrapError)
        self.close()

    # -- plumbing ----------------------------------------------------------
    def _check(self, what: str) -> None:
        if self._broken is not None:
            message, missing, kind = self._broken
            self._raise(f"cannot {what}: {message}", missing, kind)
        if self._closed:
            raise BootstrapError(f"rank {self.rank}: cannot {what}: this rank's group is closed", [])

    def _raise(self, message: str, missing, kind) -> None:
        # from None: the socket error that revealed a departure is named in message; its chain is noise
        if kind is SymmetryError:
            raise SymmetryError(f"rank {self.rank}: {message}") from None
        raise BootstrapError(f"rank {self.rank}: {message}", missing) from None

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
            if self.rank != 0:
                self._lost(*(self._last_word() or (f"rank 0 left the job during {what} ({e})", [0])))
            self._fail(f"rank {to} left the job during {what} ({e})", [to])

    def _answer(self, what: str, wait: float | None = None):
        # Rank 0 gives up on missing ranks after the timeout and says which they were; while it waits
        # it says so every REPORT_S, and this rank waits on for its verdict. A rank 0 that is silent
        # (it has not arrived, or hangs) is named every REPORT_S and given up on after this rank's own
        # timeout. A message is read only once it has begun to arrive, so no wait cuts one in half.
        wait = self.timeout + 0.5 if wait is None else wait
        start = time.monotonic()
        deadline, report = start + wait, start + REPORT_S + 1.0  # after rank 0's own first report
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    raise socket.timeout
                if not select.select([self._root], [], [], min(deadline, report) - now)[0]:
                    now = time.monotonic()
                    if now >= report:
                        report += REPORT_S
                        if now + 0.5 < deadline:
                            say(f"rank {self.rank} has waited {now - start:.0f} s at {what} for rank 0, which has "
                                f"not answered; it gives up after {self.timeout:.0f} s (IRIS_TIMEOUT)")
                    continue
                self._root.settimeout(max(0.01, deadline - time.monotonic()))
                (tag, payload), self._received = recv_msg(self._root)
                if tag != "waiting":
                    break
                now = time.monotonic()  # rank 0 is alive and speaks for the job
                deadline, report = max(deadline, now + REPORT_S + 1.0), now + REPORT_S + 1.0
        except socket.timeout:
            self._lost(f"no answer from rank 0 at {what} within {wait:.1f} s; rank 0 or a rank it waits for "
                       "did not arrive", [0])
        except (OSError, EOFError, pickle.UnpicklingError, ValueError) as e:
            self._lost(f"rank 0 left the job during {what} ({e})", [0])
        if tag == "error":
            message, missing, kind = payload
            self._lost(message, missing, SymmetryError if kind == "SymmetryError" else BootstrapError)
        return payload

    def _last_word(self):
        """The error rank 0 sent before it closed our connection, if it sent one."""
        try:
            self._root.settimeout(1.0)
            tag = "waiting"
            while tag == "waiting":
                (tag, payload), _ = recv_msg(self._root)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError):
            return None
        if tag != "error":
            return None
        message, missing, kind = payload
        return message, missing, SymmetryError if kind == "SymmetryError" else BootstrapError

    def _lost(self, message: str, missing, kind=BootstrapError) -> None:
        """Remember why the group broke (later collectives raise it again), drop it, raise."""
        self._broken = self._broken or (message, list(missing), kind)
        self.close()
        self._raise(message, missing, kind)

    def _broadcast_error(self, message: str, missing, kind) -> None:
        for conn in self._peers.values():
            try:
                conn.settimeout(1.0)
                send_msg(conn, ("error", (message, list(missing), kind.__name__)))
            except OSError:
                pass

    def _fail(self, message: str, missing, kind=BootstrapError) -> None:
        self._broadcast_error(message, missing, kind)
        self._lost(message, missing, kind)

    def close(self) -> None:
        """Drop every connection; idempotent."""
        self._closed = True
        for conn in self._peers.values():
            conn.close()
        self._peers.clear()
        if self._root is not None:
            self._root.close()
            self._root = None
