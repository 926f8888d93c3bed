"""Trace event ids, numbered as Iris numbers them: 0-1023 iris's own operations, 1024-2047 user data
movement, 2048-3071 user compute, 3072-4095 synchronization. EVENT_NAMES names them in exports;
TraceEvent gives kernels the same ids as constexprs (`TraceEvent().put`); tests/test_tracing.py
checks that the two agree."""
import triton
import triton.language as tl

from ..device.aggregate import aggregate

EVENT_NAMES = {
    0: "load", 1: "store", 2: "get", 3: "put", 4: "copy",
    5: "atomic_add", 6: "atomic_sub", 7: "atomic_cas", 8: "atomic_xchg", 9: "atomic_xor",
    10: "atomic_and", 11: "atomic_or", 12: "atomic_min", 13: "atomic_max",
    14: "wg_fetch", 15: "wg_gemm", 16: "wg_gemm_wait", 17: "wg_sdma",
    1024: "fetch", 2048: "compute", 2049: "reduce", 3072: "wait", 3073: "barrier",
}


@aggregate
class TraceEvent:
    """Event ids as constexprs: ctx.tracing.record_event_start(TraceEvent().compute, ...)."""
    load: tl.constexpr
    store: tl.constexpr
    get: tl.constexpr
    put: tl.constexpr
    copy: tl.constexpr
    atomic_add: tl.constexpr
    atomic_sub: tl.constexpr
    atomic_cas: tl.constexpr
    atomic_xchg: tl.constexpr
    atomic_xor: tl.constexpr
    atomic_and: tl.constexpr
    atomic_or: tl.constexpr
    atomic_min: tl.constexpr
    atomic_max: tl.constexpr
    wg_fetch: tl.constexpr
    wg_gemm: tl.constexpr
    wg_gemm_wait: tl.constexpr
    wg_sdma: tl.constexpr
    fetch: tl.constexpr
    compute: tl.constexpr
    reduce: tl.constexpr
    wait: tl.constexpr
    barrier: tl.constexpr

    @triton.constexpr_function
    def __init__(self):
        self.load, self.store, self.get, self.put, self.copy = (tl.constexpr(i) for i in range(5))
        self.atomic_add, self.atomic_sub, self.atomic_cas = tl.constexpr(5), tl.constexpr(6), tl.constexpr(7)
        self.atomic_xchg, self.atomic_xor, self.atomic_and = tl.constexpr(8), tl.constexpr(9), tl.constexpr(10)
        self.atomic_or, self.atomic_min, self.atomic_max = tl.constexpr(11), tl.constexpr(12), tl.constexpr(13)
        self.wg_fetch, self.wg_gemm, self.wg_gemm_wait = tl.constexpr(14), tl.constexpr(15), tl.constexpr(16)
        self.wg_sdma, self.fetch = tl.constexpr(17), tl.constexpr(1024)
        self.compute, self.reduce = tl.constexpr(2048), tl.constexpr(2049)
        self.wait, self.barrier = tl.constexpr(3072), tl.constexpr(3073)
