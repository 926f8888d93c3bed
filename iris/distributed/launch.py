"""iris's own launcher: `python -m iris.run -n N script.py` and iris.spawn(fn, nprocs) for tests."""
from __future__ import annotations

import collections
import gc
import json
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


RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_script.py")
# Signals that a rank of an iris program takes, most often, from a device function that reached
# memory outside the heap (SIGABRT: the C library finding its own memory overwritten).
_MEMORY_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT}
CRASH_HINT = ("in iris that is most often a device function reaching outside the heap: a pointer into a tensor "
              "that is not on the heap (torch.zeros where ctx.zeros was meant), or a rank outside [0, world) with "
              "IRIS_RANK_CHECK=0; rerun with IRIS_DEBUG=1, which checks every device function's ranks and pointers")


def _ranks_text(ranks) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _indent(text: str) -> str:
    return "\n".join("  | " + line for line in text.rstrip("\n").splitlines())


def _records(socket_dir: str, world: int) -> dict:
    """rank -> the error record rank_script.py wrote for its uncaught exception."""
    out = {}
    for r in range(world):
        try:
            with open(os.path.join(socket_dir, f"rank{r}.error.json")) as f:
                out[r] = json.load(f)
        except (OSError, ValueError):
            pass
    return out


def given_up_on(records: dict) -> set:
    """Ranks that another rank gave up waiting for (IRIS_TIMEOUT) or saw leave, and that raised
    nothing themselves: named missing by a BootstrapError, with no error of their own. Such a rank is
    stuck or gone, so waiting for it to end on its own only delays the job's exit."""
    return {m for rec in records.values() for m in rec.get("missing", ())} - set(records)


def _crash_stack(path: str) -> str:
    """The frames outside libraries from a rank's fault handler dump, innermost last."""
    try:
        with open(path) as f:
            dump = f.read()
    except OSError:
        return ""
    frames = []
    for line in dump.splitlines():
        line = line.strip()
        if line.startswith("File ") and "site-packages" not in line and "<frozen" not in line \
                and RANK_SCRIPT not in line:
            name, _, where = line[len("File "):].partition(", line ")
            number, _, fn = where.partition(" in ")
            frames.append(f"{fn} ({name.strip(chr(34))}:{number})")
        elif line.startswith("Current thread") and frames:
            break  # the crashing thread's stack comes first; other threads follow
    return " <- ".join(frames)


def failure_report(first: int, codes: list, records: dict, tails: list, stopped: set, crashes: dict = None,
                   pids: list = None) -> List[str]:
    """What the launcher says about a failed job: each distinct error once with the ranks it
    happened on and one traceback, ranks killed by one signal in one line (with what usually causes
    a memory signal in iris), and the ranks it stopped. first: the rank that failed first; codes:
    every rank's returncode; records: rank -> its uncaught exception (rank_script.py); tails: each
    rank's last lines of stderr; crashes: rank -> its Python stack when a signal killed it."""
    crashes = crashes or {}
    lines: List[str] = []
    groups: dict = {}
    timed = sorted((r for r in records if r != first), key=lambda r: records[r]["time"])
    for r in [first] + timed + [r for r in range(len(codes)) if r != first and r not in records]:
        if r in records:
            groups.setdefault(("error", records[r]["summary"]), []).append(r)
        elif codes[r] and r not in stopped:
            groups.setdefault(("code", codes[r]), []).append(r)
    for n, ((kind, key), ranks) in enumerate(groups.items()):
        then = "then " if n else ""
        if kind == "error":
            rec = records[ranks[0]]
            line = f"iris.run: {then}{_ranks_text(sorted(ranks))} failed: {key}"
            if rec["traceback"] and not (n and rec["type"] == "BootstrapError"):
                line += ("" if len(ranks) == 1 else f" (the traceback of rank {ranks[0]})") + \
                    f"\n{_indent(rec['traceback'])}"
        else:
            how = how_it_ended(key)
            who = _ranks_text(sorted(ranks)) + (f" (pid {pids[ranks[0]]})" if pids and len(ranks) == 1 else "")
            line = f"iris.run: {then}{who} {how if len(ranks) == 1 else how.replace('was ', 'were ')}"
            if key < 0 and -key in _MEMORY_SIGNALS:
                stack = crashes.get(ranks[0])
                line += f" (rank {ranks[0]} in {stack})" if stack else ""
                line += f"; {CRASH_HINT}"
            tail = list(tails[ranks[0]])
            if not n:
                line += ("; the last lines of its stderr:\n" + _indent("\n".join(tail))) if tail else \
                    "; its stderr was empty"
        lines.append(line)
    if stopped:
        lines.append(f"iris.run: stopped {_ranks_text(sorted(stopped))} after rank {first} failed")
    return lines


def _first_failure(seen: int, codes: list, records: dict, stopped: set) -> int:
    """The rank whose failure started it: a rank that raised something other than BootstrapError
    (which says that another rank left), earliest first; else the first rank seen to fail. A rank
    the launcher stopped is none of them."""
    causes = [r for r, c in enumerate(codes) if c and r not in stopped
              and not (r in records and records[r]["type"] == "BootstrapError")]
    timed = [r for r in causes if r in records]
    if seen in causes or not causes:
        return seen
    return min(timed, key=lambda r: records[r]["time"]) if timed else causes[0]


def check_job_env() -> None:
    """Raise (ValueError or an IrisError) for a job setting no rank could start with, such as an
    IRIS_PLATFORM that is not a platform: said once by the launcher, not by every rank."""
    from ..platform import detect
    detect()


def launch(argv: Sequence[str], nprocs: int, grace: float = 5.0, tail_lines: int = 20, prefix: bool = False) -> int:
    """Run `python argv...` as nprocs ranks, relaying their output by whole lines (prefix: tag each
    line `[rankN]:`); if one fails, stop the rest and say which rank ended, how, and why: each
    distinct uncaught exception once with the ranks it happened on, or a killed rank's last lines of
    stderr. Ctrl-C stops every rank with one line. Returns the job's exit code (128 + signal for a
    killed rank, 130 after Ctrl-C)."""
    nprocs = _check_nprocs(nprocs)
    check_job_env()
    socket_dir, secret, port = tempfile.mkdtemp(prefix="iris-job-"), job_secret(), torch_port()
    procs, tails, pumps = [], [collections.deque(maxlen=tail_lines) for _ in range(nprocs)], []
    relay = Relay(prefix)
    wrapped = argv and not str(argv[0]).startswith("-")  # a script, not -m/-c
    try:
        try:
            for r in range(nprocs):
                env = dict(os.environ, **job_env(r, nprocs, socket_dir, secret, port))
                env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the relay as they are printed
                wrapper = [RANK_SCRIPT, os.path.join(socket_dir, f"rank{r}")] if wrapped else []
                procs.append(subprocess.Popen([sys.executable, *wrapper, *argv], env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE))
                for pipe, name, tail in ((procs[-1].stdout, "stdout", None),
                                         (procs[-1].stderr, "stderr", tails[r])):
                    pumps.append(threading.Thread(target=relay.pump, args=(r, pipe, name, tail), daemon=True))
                    pumps[-1].start()
            failed, stopped = None, set()
            while any(p.poll() is None for p in procs):
                failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
                if failed is not None:
                    # the others may fail on their own (their errors are worth showing): wait for
                    # them, but not for one that another rank already gave up on
                    deadline = time.monotonic() + grace
                    while time.monotonic() < deadline:
                        running = {r for r, p in enumerate(procs) if p.poll() is None}
                        if not running - given_up_on(_records(socket_dir, nprocs)):
                            break
                        time.sleep(0.05)
                    for r, p in enumerate(procs):
                        if p.poll() is None:
                            stopped.add(r)
                            p.send_signal(signal.SIGTERM)
                    break
                time.sleep(0.05)
            for p in procs:
                p.wait()
        except KeyboardInterrupt:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while the ranks stop
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    p.kill()
            relay.say(f"iris.run: interrupted (Ctrl-C); stopped the job's {nprocs} ranks")
            return 130
        for t in pumps:
            t.join(timeout=5)
        if failed is None:
            failed = next((r for r, p in enumerate(procs) if p.returncode), None)
        if failed is None:
            return 0
        records = _records(socket_dir, nprocs)
        stopped = {r for r in stopped if procs[r].returncode == -signal.SIGTERM}
        failed = _first_failure(failed, [p.returncode for p in procs], records, stopped)
        code = procs[failed].returncode
        crashes = {r: _crash_stack(os.path.join(socket_dir, f"rank{r}.crash")) for r in range(nprocs)}
        for line in failure_report(failed, [p.returncode for p in procs], records,
                                   [list(t) for t in tails], stopped, crashes, [p.pid for p in procs]):
            relay.say(line)
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
        results.put((rank, True, value, ()))
    except BaseException as e:  # report every failure to the parent, then exit non-zero
        message = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        results.put((rank, False, message, tuple(getattr(e, "missing", ()) or ())))
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
    out, errors, given_up = {}, [], set()
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while len(out) + len(errors) < nprocs:
            try:
                rank, ok, value, missing = results.get(timeout=0.2)
                (out.__setitem__(rank, value) if ok else errors.append((rank, value)))
                given_up.update(missing)
                running = [r for r in range(nprocs) if r not in out and all(r != e[0] for e in errors)]
                if running and set(running) <= given_up:  # stuck or gone (see given_up_on): stop them now
                    errors += [(r, "stuck: stopped after another rank gave up waiting for it") for r in running]
                    for r in running:
                        procs[r].kill()
                    continue
                if not ok and running:  # the others may wait on this rank (a flag on the device): say why now
                    print(f"iris.spawn: rank {rank} failed ({value.splitlines()[0]}); waiting up to "
                          f"{max(0.0, deadline - time.monotonic()):.0f} s for {_ranks_text(running)}",
                          file=sys.stderr, flush=True)
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
