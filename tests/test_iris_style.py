"""Iris-style programs run unchanged (only the import names this iris): the fused ops as Iris's
tests/ops call them (tests/iris_style_ops.py) and the host calls Iris programs make
(tests/iris_style_host.py), and the collective calls where iris once differed (tests/iris_style_gaps.py). Each starts 2 ranks with torch.multiprocessing and torch.distributed
(gloo, so that both may share one GPU): on the host driver here, on one GPU on a GPU machine."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(program: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / program), str(port)], env=env, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "rank 0: OK" in out and "rank 1: OK" in out, out[-3000:]


def test_iris_style_ops():
    _run("iris_style_ops.py")


def test_iris_style_host_calls():
    _run("iris_style_host.py")


def test_iris_style_gaps():
    """reduce(root=), iris.ccl.reduce_scatter, too-small workspaces, broadcast of tensors as numpy."""
    _run("iris_style_gaps.py")


@pytest.mark.gpu
def test_iris_style_ops_gpu():
    """The same program with both ranks on the GPU: TMA operands, the GPU tile choices."""
    _run("iris_style_ops.py")


@pytest.mark.gpu
def test_iris_style_gaps_gpu():
    """The same collective calls with both ranks on the GPU."""
    _run("iris_style_gaps.py")
