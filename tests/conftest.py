import compileall
import os
import sys

import pytest
import torch

os.environ.setdefault("IRIS_TIMEOUT", "60")

# Decides the platform, and on the host turns Triton's interpreter on, before any test module imports
# triton: a triton imported first leaves interpreted kernels failing, whichever file is collected first.
import iris  # noqa: F401,E402


def pytest_configure(config):
    """Where the environment tells Python not to write bytecode (PYTHONDONTWRITEBYTECODE, as this machine's does),
    every process the tests start (several hundred ranks, launchers and scripts) would compile iris's
    modules and the test helpers it imports from source again: compile them once, here, for all of them.
    Python checks each file's size and time against its source, so a stale one is never used."""
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):  # once, in the controller
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for folder in ("iris", "tests"):
            compileall.compile_dir(os.path.join(root, folder), quiet=2, workers=1)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Lets pytest keep the test modules it rewrites for assertions (tests/__pycache__, as compileall does
    for the plain ones above) where bytecode is otherwise not written: each worker, and each pytest that a
    test starts, would rewrite every module it collects again, about 2 s of CPU a process. Only while
    collecting: what the tests import later is left as the environment says."""
    keep, sys.dont_write_bytecode = sys.dont_write_bytecode, False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = keep


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Memory one host worker may need at its peak: a test's ranks (2-4 processes with torch and Triton
# loaded) and their heaps. The whole suite on 2 workers peaked at 2.2 GiB (PSS of the process tree),
# one worker's tree at 1.2 GiB; the rest is room for the host heap's pages and for other jobs.
WORKER_BYTES = 3 << 30


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can be had without swapping), or 0 where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return 0


def pytest_xdist_auto_num_workers(config):
    """-n auto (pyproject's addopts): on the host one worker per core, so one test's waits (timeouts,
    launches) overlap another's work, but no more than the available memory holds (WORKER_BYTES
    each), so a busy machine runs fewer workers rather than losing them to the OOM killer. One
    process with a GPU, as ranks of concurrent tests would share it and disturb each other's
    timings, and for a pytest that a test starts inside a worker."""
    if torch.cuda.is_available() or "PYTEST_XDIST_WORKER" in os.environ:
        return 0
    cores = len(os.sched_getaffinity(0))
    memory = available_bytes()
    workers = min(cores, memory // WORKER_BYTES) if memory else cores
    if workers < cores:
        print(f"conftest: {workers or 1} pytest worker(s), not {cores}: {memory / (1 << 30):.1f} GiB available, "
              f"{WORKER_BYTES >> 30} GiB per worker", flush=True)
    return max(1, workers)
