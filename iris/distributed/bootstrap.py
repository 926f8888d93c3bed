"""Find this rank's job (iris's launcher, torch.distributed, torchrun or MPI) and form its Group.

The launcher hands every rank the private directory and the secret in its environment; with
torch.distributed or MPI, rank 0 makes them and shares them through the job's own channel.
"""
from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import tempfile
import time
from datetime import timedelta

from ..errors import BootstrapError
from .group import Group

DEFAULT_TIMEOUT = 120.0
# One rendezvous per job, reused by every group formation: a rank that gave up on one formation
# (a timeout, a failure before it connected) meets the others at the next, whatever each rank's
# history. Formations never overlap: each is collective and closes its listener before it returns.
_SOCKET = "rendezvous.sock"
_published = None  # (path, secret) that rank 0 shared over torch.distributed or MPI
_private_dir = None


def job_secret() -> str:
    return secrets.token_hex(32)


def private_dir() -> str:
    """A 0700 directory of this process, removed at exit."""
    global _private_dir
    if _private_dir is None:
        _private_dir = tempfile.mkdtemp(prefix="iris-")  # mkdtemp creates it 0700
        atexit.register(shutil.rmtree, _private_dir, True)
    return _private_dir


def timeout_from_env(timeout: float | None) -> float:
    from ..validate import timeout_seconds
    return timeout_seconds(timeout, os.environ.get("IRIS_TIMEOUT"), DEFAULT_TIMEOUT)


def _from_launcher(timeout):
    rank, world = int(os.environ["IRIS_RANK"]), int(os.environ["IRIS_WORLD_SIZE"])
    path = os.path.join(os.environ["IRIS_SOCKET_DIR"], _SOCKET)
    return Group(rank, world, path, os.environ["IRIS_JOB_SECRET"], timeout)


def _from_torch(timeout):
    global _published
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    key = "iris/rendezvous"
    if _published is not None:
        info = _published
    elif rank == 0:
        info = {"path": os.path.join(private_dir(), _SOCKET), "secret": job_secret()}
        store.set(key, json.dumps(info))
    else:
        try:
            store.wait([key], timedelta(seconds=timeout))
        except Exception as e:  # the store raises its own error types on timeout
            raise BootstrapError(f"rank {rank}: rank 0 did not publish the rendezvous within {timeout:.1f} s ({e})", [0]) from None
        info = json.loads(store.get(key))
    _published = info
    return Group(rank, world, info["path"], info["secret"], timeout)


def _from_mpi(timeout):
    global _published
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    if _published is not None:
        return Group(rank, world, _published["path"], _published["secret"], timeout)
    buf = bytearray(1024)  # nonblocking broadcast, so a missing rank 0 times out instead of hanging
    if rank == 0:
        info = json.dumps({"path": os.path.join(private_dir(), _SOCKET), "secret": job_secret()}).encode()
        buf[:len(info)] = info
    request, deadline = comm.Ibcast(buf, root=0), time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            request.Cancel()
            raise BootstrapError(f"rank {rank}: rank 0 did not publish the rendezvous over MPI within {timeout:.1f} s", [0])
        time.sleep(0.001)
    info = _published = json.loads(bytes(buf).rstrip(b"\0"))
    return Group(rank, world, info["path"], info["secret"], timeout)


def _torchrun_env() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _mpi_env() -> bool:
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"))


def connect(timeout: float | None = None) -> Group:
    """Form the Group of this job's ranks. Collective: all ranks."""
    timeout = timeout_from_env(timeout)
    if "IRIS_SOCKET_DIR" in os.environ:
        return _from_launcher(timeout)
    try:
        import torch.distributed as dist
        initialized = dist.is_available() and dist.is_initialized()
    except ImportError:
        initialized = False
    if not initialized and _torchrun_env():
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
        initialized = True
    if initialized:
        return _from_torch(timeout)
    if _mpi_env():
        return _from_mpi(timeout)
    return Group(0, 1, "", "", timeout)
