"""Device-side tracing (Iris's API): ctx.tracing.enable(), kernels whose DeviceContext is initialized
with tracing=True record their operations, ctx.tracing.export() writes Chrome/Perfetto JSON, and
`iris trace trace.json` draws it."""
from .device import FIELDS, DeviceTracing
from .events import EVENT_NAMES, TraceEvent
from .host import Tracing

__all__ = ["EVENT_NAMES", "FIELDS", "DeviceTracing", "TraceEvent", "Tracing"]
