"""iris's own launcher: `python -m iris.run -n N script.py` and iris.spawn(fn, nprocs) for tests."""
from __future__ import annotations

import collections
import gc
import multiprocessing as mp
from multiprocessing import reduction
import pickle
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, List, Sequence

from .. import settings
from ..errors import BootstrapError
from .bootstrap import job_secret


def torch_port() -> str:
    """The port torch.distributed's env:// rendezvous uses in a job of this launcher: MASTER_PORT where
    the caller set one, else a free one of this host."""
    if os.environ.get("MASTER_PORT"):
        return os.environ["MASTER_PORT"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def job_env(rank: int, world: int, socket_dir: str, secret: str, port: str = "") -> dict:
    """A rank's environment: iris's own variables, and torch.distributed's env:// ones (one host), so
    `dist.init_process_group(...)` needs no arguments under this launcher as under torchrun."""
    env = {settings.RANK.name: str(rank), settings.WORLD_SIZE.name: str(world), settings.LOCAL_RANK.name: str(rank),
           settings.SOCKET_DIR.name: socket_dir, settings.JOB_SECRET.name: secret}
    if port:
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR=os.environ.get("MASTER_ADDR") or "127.0.0.1", MASTER_PORT=port)
    from ..platform import detect
    if detect() == "host" and not settings.INTERPRET.is_set():  # the interpreter, unless the caller says otherwise
        env[settings.INTERPRET.name] = "1"
    return env


def _check_nprocs(nprocs) -> int:
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive int, got {nprocs!r}")
    return nprocs


def how_it_ended(returncode: int) -> str:
    """'exited with code 3' or 'was killed by SIGKILL'."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


class Relay:
    """Copies the ranks' stdout to ours and their stderr to ours, a whole line per write.

    A rank's print reaches its pipe in pieces (text, then the newline, when unbuffered), so ranks
    writing straight to a shared stream splice each other's lines. Here each rank has its own pipes,
    lines are read whole, and one lock covers both of our streams, so no line is cut by another even
    where stdout and stderr go to one file. With prefix, each line starts `[rankN]:`, as torchrun's.
    """

    def __init__(self, prefix: bool = False):
        self.prefix, self.lock, self.closed = prefix, threading.Lock(), set()

    def write(self, name: str, data: bytes) -> None:
        """data (whole lines) to sys.stdout or sys.stderr; a reader that went away is not an error."""
        with self.lock:
            if name in self.closed:
                return
            stream = getattr(sys, name)
            try:
                if hasattr(stream, "buffer"):
                    stream.flush()
                    stream.buffer.write(data)
                    stream.buffer.flush()
                else:
                    stream.write(data.decode(errors="replace"))
                    stream.flush()
            except (OSError, ValueError):  # a closed pipe (`| head`) or stream: keep draining the ranks
                self.closed.add(name)

    def say(self, text: str) -> None:
        """iris.run's own message to stderr, between whole lines of the ranks'."""
        self.write("stderr", (text + "\n").encode())

    def pump(self, rank: int, pipe, name: str, tail=None) -> None:
        """Relay one rank's pipe line by line until it closes, keeping its last lines in tail."""
        tag = f"[rank{rank}]:".encode() if self.prefix else b""
        for line in iter(pipe.readline, b""):
            if not line.endswith(b"\n"):  # the last line of a rank that ended without a newline
                line += b"\n"
            self.write(name, tag + line)
            if tail is not None:
                tail.append(line[:-1].decode(errors="replace"))
        pipe.close()


def launch(argv: Sequence[str], nprocs: int, grace: float = 5.0, tail_lines: int = 20, prefix: bool = False) -> int:
    """Run `python argv...` as nprocs ranks, relaying their output by whole lines (prefix: tag each
    line `[rankN]:`); if one fails, stop the rest and say which rank ended, how, and its last lines
    of stderr. Returns the job's exit code (128 + signal for a killed rank)."""
    nprocs = _check_nprocs(nprocs)
    socket_dir, secret, port = tempfile.mkdtemp(prefix="iris-job-"), job_secret(), torch_port()
    procs, tails, pumps = [], [collections.deque(maxlen=tail_lines) for _ in range(nprocs)], []
    relay = Relay(prefix)
    try:
        for r in range(nprocs):
            env = dict(os.environ, **job_env(r, nprocs, socket_dir, secret, port))
            env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the relay as they are printed
            procs.append(subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE))
            for pipe, name, tail in ((procs[-1].stdout, "stdout", None), (procs[-1].stderr, "stderr", tails[r])):
                pumps.append(threading.Thread(target=relay.pump, args=(r, pipe, name, tail), daemon=True))
                pumps[-1].start()
        failed = None
        while any(p.poll() is None for p in procs):
            failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if failed is not None:
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                    time.sleep(0.05)
                for p in procs:
                    if p.poll() is None:
                        relay.say(f"iris.run: stopping pid {p.pid} after a rank failed")
                        p.send_signal(signal.SIGTERM)
                break
            time.sleep(0.05)
        for p in procs:
            p.wait()
        for t in pumps:
            t.join(timeout=5)
        if failed is None:
            failed = next((r for r, p in enumerate(procs) if p.returncode), None)
        if failed is None:
            return 0
        code = procs[failed].returncode
        lines = "\n".join("  | " + line for line in tails[failed]) or "  (nothing)"
        relay.say(f"iris.run: rank {failed} (pid {procs[failed].pid}) {how_it_ended(code)}; the last lines of its "
                  f"stderr:\n{lines}")
        others = [f"rank {r} {how_it_ended(p.returncode)}" for r, p in enumerate(procs) if r != failed and p.returncode]
        if others:
            relay.say("iris.run: then " + ", ".join(others))
        return 128 - code if code < 0 else code
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(socket_dir, ignore_errors=True)


class _Inherited:
    """One of the caller's file descriptors, handed to a rank forked by the fork server (which
    started with the descriptors of its own first caller)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):  # reduction.DupFd works only while the process is being started
        return _Inherited._opened, (reduction.DupFd(self.fd),)

    @staticmethod
    def _opened(dup) -> int:
        return dup.detach()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _child(payload, env, streams, rank, world, socket_dir, secret, results, port=""):
    """One rank: the caller's environment and stdout/stderr, then fn(*args), unpickled only now so
    that every module it imports sees that environment, as in a fresh process."""
    gc.freeze()  # what the fork server imported lives as long as the rank: collections need not walk it
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(job_env(rank, world, socket_dir, secret, port))
    for fd, inherited in streams.items():
        os.dup2(inherited, fd)
        os.close(inherited)
    try:
        fn, args = pickle.loads(payload)
        value = fn(*args)
        pickle.dumps(value)  # fails here, with a traceback, rather than silently in the queue's thread
        results.put((rank, True, value))
    except BaseException as e:  # report every failure to the parent, then exit non-zero
        results.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise SystemExit(1)


def spawn(fn: Callable, nprocs: int, args: tuple = (), timeout: float = 600.0) -> List:
    """Run fn(*args) on nprocs ranks in fresh processes; returns each rank's result in rank order.

    fn must be importable (defined at module level). A rank that raises or dies fails the whole call.
    Ranks are forked from multiprocessing's fork server, which has imported torch once (nothing that
    touches a GPU), and take this process's environment, working directory and stdout/stderr.
    """
    nprocs = _check_nprocs(nprocs)
    try:
        payload = pickle.dumps((fn, args))
    except Exception as e:
        raise TypeError(f"iris.spawn sends fn and args to fresh processes, so they must be picklable: {e}. "
                        "Define fn at module level (not a lambda or a nested function) and pass plain data "
                        "in args") from None
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])  # read when the server starts: once per calling process
    socket_dir, secret, port = tempfile.mkdtemp(prefix="iris-job-"), job_secret(), torch_port()
    results = ctx.Queue()
    sys.stdout.flush()
    sys.stderr.flush()
    streams = {fd: _Inherited(fd) for fd in (1, 2) if _is_open(fd)}
    procs = [ctx.Process(target=_child, args=(payload, dict(os.environ), streams, r, nprocs, socket_dir, secret,
                                              results, port), daemon=True)
             for r in range(nprocs)]
    out, errors = {}, []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while len(out) + len(errors) < nprocs:
            try:
                rank, ok, value = results.get(timeout=0.2)
                (out.__setitem__(rank, value) if ok else errors.append((rank, value)))
                continue
            except queue.Empty:
                pass
            dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in out
                    and all(r != e[0] for e in errors)]
            if dead and results.empty():
                time.sleep(0.5)  # a result may still be in flight
                if results.empty():
                    errors += [(r, f"{how_it_ended(procs[r].exitcode)} without reporting a result") for r in dead]
            if time.monotonic() > deadline:
                missing = [r for r in range(nprocs) if r not in out and all(r != e[0] for e in errors)]
                errors.sort()
                raise BootstrapError(f"iris.spawn: ranks {missing} did not finish within {timeout:.0f} s"
                                     + "".join(f"\nrank {r} failed: {msg}" for r, msg in errors), missing)
        if errors:
            errors.sort()
            raise RuntimeError("iris.spawn: " + "\n".join(f"rank {r} failed: {msg}" for r, msg in errors))
        return [out[r] for r in range(nprocs)]
    finally:
        for p in [p for p in procs if p.pid is not None]:  # those that started
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
        results.join_thread()
        shutil.rmtree(socket_dir, ignore_errors=True)
