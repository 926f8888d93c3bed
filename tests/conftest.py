import os

import pytest
import torch

os.environ.setdefault("IRIS_TIMEOUT", "60")

# Decides the platform, and on the host turns Triton's interpreter on, before any test module imports
# triton: a triton imported first leaves interpreted kernels failing, whichever file is collected first.
import iris  # noqa: F401,E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_xdist_auto_num_workers(config):
    """-n auto (pyproject's addopts): on the host one worker per core, so one test's waits (timeouts,
    launches) overlap another's work. One process with a GPU, as ranks of concurrent tests would
    share it and disturb each other's timings, and for a pytest that a test starts inside a worker."""
    if torch.cuda.is_available() or "PYTEST_XDIST_WORKER" in os.environ:
        return 0
    return len(os.sched_getaffinity(0))
