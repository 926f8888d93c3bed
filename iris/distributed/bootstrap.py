"""Find this rank's job (iris's launcher, torch.distributed, torchrun or MPI) and form its Group.

The launcher hands every rank the private directory and the secret in its environment; with
torch.distributed or MPI, every rank first says which host it is on through the job's own channel,
then rank 0 makes the rendezvous and shares it there: a path in its private directory where all
ranks share its host, otherwise a TCP address of rank 0 (IRIS_ADDR chooses it).
"""
from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from datetime import timedelta

from .. import settings
from ..errors import BootstrapError
from .group import REPORT_S, Group, hostname, say, tcp_listener

DEFAULT_TIMEOUT = settings.TIMEOUT.default
# One rendezvous per job, reused by every group formation: a rank that gave up on one formation
# (a timeout, a failure before it connected) meets the others at the next, whatever each rank's
# history. Formations never overlap: each is collective and closes its listener before it returns.
_SOCKET = "rendezvous.sock"
_published = None  # the rendezvous rank 0 shared over torch.distributed or MPI: path or tcp, secret, hosts
_listener = None  # rank 0's TCP listener made to learn its port, handed to the first formation
_private_dir = None
_alone_said = False  # the single-rank notice, once per process


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
    return timeout_seconds(settings.TIMEOUT.get() if timeout is None else timeout)


def _from_launcher(timeout):
    rank, world = settings.RANK.get(), settings.WORLD_SIZE.get()
    path = os.path.join(settings.SOCKET_DIR.get(), _SOCKET)
    return Group(rank, world, path, settings.JOB_SECRET.get(), timeout)


def _advertised_address() -> str:
    """An address of this host that the other hosts can reach: IRIS_ADDR, else the one this host
    routes MASTER_ADDR through (no packet is sent), else what the host name resolves to."""
    address = settings.ADDR.get()
    if address:
        return address
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "1"))))
                return s.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _new_rendezvous(hosts) -> dict:
    """Rank 0: the rendezvous of a job whose rank r runs on hosts[r]."""
    global _listener
    info = {"secret": job_secret(), "hosts": list(hosts)}
    if len(set(hosts)) == 1:
        info["path"] = os.path.join(private_dir(), _SOCKET)
    else:
        _listener = tcp_listener((_advertised_address(), settings.PORT.get()))
        info["tcp"] = list(_listener.getsockname()[:2])
    return info


def _group(rank: int, world: int, info: dict, timeout: float) -> Group:
    global _listener
    listener, _listener = _listener, None
    address = info["path"] if "path" in info else tuple(info["tcp"])
    return Group(rank, world, address, info["secret"], timeout, hosts=info["hosts"], listener=listener)


def _from_torch(timeout):
    global _published
    import torch.distributed as dist
    if _published is None:
        _published = _rendezvous_over(dist.distributed_c10d._get_default_store(), dist.get_rank(),
                                      dist.get_world_size(), timeout)
    return _group(dist.get_rank(), dist.get_world_size(), _published, timeout)


def _rendezvous_over(store, rank: int, world: int, timeout: float) -> dict:
    """The rendezvous rank 0 makes, shared through a torch.distributed store: every rank says which
    host it is on first. Collective: all ranks."""
    store.set(f"iris/host/{rank}", hostname())
    if rank == 0:
        _store_wait(store, [f"iris/host/{r}" for r in range(world)], timeout, rank, "say which host it is on")
        info = _new_rendezvous([store.get(f"iris/host/{r}").decode() for r in range(world)])
        store.set("iris/rendezvous", json.dumps(info))
        return info
    _store_wait(store, ["iris/rendezvous"], timeout, rank, "publish the rendezvous")
    return json.loads(store.get("iris/rendezvous"))


def from_store(store, rank: int, world: int, timeout: float | None = None) -> Group:
    """The Group of ranks 0..world-1 that meet through a torch.distributed store (the one torch hands a
    process-group backend while the default group is being made). Collective: all ranks."""
    timeout = timeout_from_env(timeout)
    return _group(rank, world, _rendezvous_over(store, rank, world, timeout), timeout)


def _store_wait(store, keys, timeout, rank, what) -> None:
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception as e:  # the store raises its own error types on timeout
        late = [int(k.rsplit("/", 1)[1]) for k in keys if k.startswith("iris/host/")] or [0]
        raise BootstrapError(f"rank {rank}: ranks did not {what} through torch.distributed's store within "
                             f"{timeout:.1f} s ({e})", late if rank == 0 else [0]) from None


def _mpi_wait(request, deadline, rank, what, timeout) -> None:
    """Wait for a nonblocking MPI call, so a missing rank times out instead of hanging."""
    while not request.Test():
        if time.monotonic() > deadline:
            request.Cancel()
            raise BootstrapError(f"rank {rank}: ranks did not {what} over MPI within {timeout:.1f} s", [0])
        time.sleep(0.001)


def _from_mpi(timeout):
    global _published
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    if _published is None:
        deadline, width = time.monotonic() + timeout, 256
        mine, hosts = bytearray(width), bytearray(width * world)
        name = hostname().encode()[:width]
        mine[:len(name)] = name
        _mpi_wait(comm.Iallgather(mine, hosts), deadline, rank, "say which host they are on", timeout)
        names = [bytes(hosts[r * width:(r + 1) * width]).rstrip(b"\0").decode() for r in range(world)]
        buf = bytearray(1024 + width * world)
        if rank == 0:
            info = json.dumps(_new_rendezvous(names)).encode()
            buf[:len(info)] = info
        _mpi_wait(comm.Ibcast(buf, root=0), deadline, rank, "receive rank 0's rendezvous", timeout)
        _published = json.loads(bytes(buf).rstrip(b"\0"))
    return _group(rank, world, _published, timeout)


def _torchrun_env() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _mpi_env() -> bool:
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"))


def connect(timeout: float | None = None) -> Group:
    """Form the Group of this job's ranks. Collective: all ranks."""
    timeout = timeout_from_env(timeout)
    if settings.SOCKET_DIR.is_set():
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
    global _alone_said
    if not _alone_said:
        _alone_said = True
        say("no launcher found (python -m iris.run, torchrun, mpirun): this process runs as a single rank")
    return Group(0, 1, "", "", timeout)
