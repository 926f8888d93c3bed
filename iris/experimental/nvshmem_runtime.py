"""NVSHMEM's host runtime, importable here as before: it lives in iris.platform.nvshmem, below the
allocator that builds on it."""
from ..platform.nvshmem import *  # noqa: F401,F403
