"""An Iris-style program (tests/iris_style_program.py: kernels as Iris's README writes them,
torch.distributed + torch.multiprocessing.spawn as Iris's README launches them) runs unchanged:
2 ranks on the host driver here, one per GPU on a GPU machine."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_iris_style_program_runs():
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("the program runs a rank per GPU over NCCL, as Iris's README does; NCCL refuses two ranks on "
                    "one GPU: needs 2 GPUs")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "iris_style_program.py"), str(_free_port())],
                          env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "rank 0: OK" in out and "rank 1: OK" in out, out[-3000:]


def test_iris_ccl_program_runs():
    """tests/iris_ccl_program.py: collectives called as Iris's tests/ccl call them (Config with Iris's fields,
    set at construction and after, every all_reduce variant, all_gather variants, preamble + workspace=)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "iris_ccl_program.py"), str(_free_port())],
                          env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "rank 0: OK" in out and "rank 1: OK" in out, out[-3000:]
