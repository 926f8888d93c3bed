"""iris.mem: Iris's module path for the device side. iris.mem.triton holds the device context
(Context, also DeviceContext), the device functions and the tile types; the code lives in
iris/device/."""
