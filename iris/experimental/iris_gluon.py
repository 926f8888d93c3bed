"""Iris's older import path for the Gluon device context: `from iris.experimental.iris_gluon import
IrisDeviceCtx`, and `iris_gluon.iris(heap_size)` for the host context (iris's own: its device context
tensor is the one IrisDeviceCtx reads)."""
from ..context import iris  # noqa: F401
from ..gluon import IrisDeviceCtx  # noqa: F401
