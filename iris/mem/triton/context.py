"""iris.mem.triton.context: the device context at Iris's module path, as Context (Iris's name) and
DeviceContext (iris/device/context.py)."""
from ...device.context import DeviceContext

Context = DeviceContext

__all__ = ["Context", "DeviceContext"]
