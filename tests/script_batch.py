"""Runs scripts one after another, each as `python SCRIPT` runs it, in a process forked from this one.

    python tests/script_batch.py BATCH TIMEOUT                     a job of one rank, as `python SCRIPT`
    python -m iris.run -n N tests/script_batch.py BATCH TIMEOUT    every rank of one job, as `-n N SCRIPT`

This process imports torch and nothing else of weight (neither triton nor iris), then forks once per
script: a script starts without paying torch's import (over a second of CPU per process on the host,
most of a short script's cost) and otherwise as in a fresh interpreter: its own __main__ globals,
sys.argv and sys.path[0], its working directory, stdout and stderr, and the interpreter's full exit
(atexit, finalisation), which gives its exit code. What it imports (iris, triton) it imports itself,
in its own order. A script's ranks are not the launcher's children, so a script that names its parent
(os.getppid(), which a job's ranks share) runs alone instead (run_alone).

BATCH/scripts holds one line per script: its path, a tab, the folder to run it in. Rank r writes what
script k printed to BATCH/k.r.out and BATCH/k.r.err and its exit code to BATCH/k.r.code. Every rank
runs the scripts in the same order and the ranks meet between scripts, so one script's ranks never
meet the next's. As iris.run stops a job, when a rank's script fails the others' get GRACE seconds to
end on their own and are then stopped; a script that runs past TIMEOUT seconds is stopped (-9).
"""
import gc
import os
import signal
import subprocess
import sys
import time
import traceback
import types
from typing import List, NamedTuple, Sequence, Tuple

import torch  # noqa: F401  what every script imports: once, here

GRACE, POLL = 5.0, 0.02


def become(script: str, cwd: str, out: str, err: str) -> None:
    """In the forked process: run script as its __main__, then exit as the interpreter does after it."""
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = [script]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` sets it
    main = types.ModuleType("__main__")
    main.__file__ = script
    sys.modules["__main__"] = main
    try:
        with open(script) as f:
            code = compile(f.read(), script, "exec")
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException:  # as Python reports an uncaught exception
        traceback.print_exc()
        raise SystemExit(1)
    raise SystemExit(0)  # through the interpreter's own exit: atexit, finalisation


def codes(batch: str, k: int, world: int) -> dict:
    """rank -> script k's exit code, for the ranks that have finished it."""
    out = {}
    for q in range(world):
        try:
            with open(os.path.join(batch, f"{k}.{q}.code")) as f:
                out[q] = int(f.read())
        except (OSError, ValueError):
            pass
    return out


def run_one(batch: str, k: int, script: str, cwd: str, rank: int, world: int, timeout: float) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    name = os.path.join(batch, f"{k}.{rank}")
    pid = os.fork()
    if pid == 0:
        become(script, cwd, name + ".out", name + ".err")
    start, stop_at = time.monotonic(), None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        now = time.monotonic()
        if stop_at is None and any(c != 0 for c in codes(batch, k, world).values()):
            stop_at = now + GRACE  # a peer's script failed: this one may fail on its own, or wait for ever
        if now - start > timeout or (stop_at is not None and now > stop_at):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            code = -signal.SIGKILL
            break
        time.sleep(POLL)
    with open(name + ".tmp", "w") as f:
        f.write(str(code))
    os.replace(name + ".tmp", name + ".code")


def main() -> int:
    batch, timeout = os.path.abspath(sys.argv[1]), float(sys.argv[2])
    rank, world = int(os.environ.get("IRIS_RANK", 0)), int(os.environ.get("IRIS_WORLD_SIZE", 1))
    with open(os.path.join(batch, "scripts")) as f:
        scripts = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    gc.freeze()  # torch lives as long as each script: the collections at its exit need not walk torch's objects
    for k, (script, cwd) in enumerate(scripts):
        run_one(batch, k, script, cwd, rank, world, timeout)
        deadline = time.monotonic() + timeout + GRACE
        while len(codes(batch, k, world)) < world:  # the ranks meet before the next script
            if time.monotonic() > deadline:
                print(f"script_batch: rank {rank}: the other ranks did not finish script {k}", file=sys.stderr)
                return 1
            time.sleep(POLL)
    return 0


# -- the test's side ---------------------------------------------------------------------------------
class Ran(NamedTuple):
    """One script's run: code (0, or a failing rank's exit code, one that was not stopped where there is
    one; negative: killed by that signal),
    stdout and stderr (with a batch, each rank's in rank order, every line ended as iris.run relays it)."""
    code: int
    out: str
    err: str


def _launcher(ranks: int) -> list:
    return [sys.executable, "-m", "iris.run", "-n", str(ranks)] if ranks else [sys.executable]


def _text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text + "\n" if text and not text.endswith("\n") else text


def run(batch: str, scripts: Sequence[Tuple[str, str]], ranks: int, env: dict, cwd: str,
        timeout: float) -> List[Ran]:
    """Run scripts ((path, folder to run it in), in order) in one batch: under `python -m iris.run -n
    ranks` where ranks > 0, else alone as `python SCRIPT`; returns each script's Ran. batch: a new folder."""
    os.makedirs(batch)
    with open(os.path.join(batch, "scripts"), "w") as f:
        f.writelines(f"{script}\t{folder}\n" for script, folder in scripts)
    proc = subprocess.run([*_launcher(ranks), os.path.abspath(__file__), batch, str(timeout)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=len(scripts) * (timeout + GRACE) + 120)
    out, world = [], max(ranks, 1)
    for k in range(len(scripts)):
        found = codes(batch, k, world)
        if len(found) < world:
            out.append(Ran(-1, "", f"the batch ended (exit {proc.returncode}) before script {k} ran on every rank"
                                   f"\n{proc.stdout}{proc.stderr}"))
            continue
        failed = [c for c in found.values() if c]
        out.append(Ran(next((c for c in failed if c != -signal.SIGKILL), failed[0] if failed else 0),
                       *("".join(_text(os.path.join(batch, f"{k}.{q}.{s}")) for q in range(world))
                         for s in ("out", "err"))))
    return out


def run_alone(script: str, ranks: int, env: dict, cwd: str, timeout: float) -> Ran:
    """Run one script as the docs say, `python -m iris.run -n ranks SCRIPT` (ranks > 0) or `python SCRIPT`,
    every rank a fresh interpreter and a child of the launcher."""
    proc = subprocess.run([*_launcher(ranks), script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return Ran(proc.returncode, proc.stdout, proc.stderr)


if __name__ == "__main__":
    sys.exit(main())
