"""iris.do_bench: Iris's benchmark helper (same arguments and result, milliseconds).

triton.testing.do_bench times fn alone with no hook between repetitions, so it cannot put a
cross-rank barrier outside the timed region; this does (barrier_fn around every run, untimed),
with CUDA events on GPUs and the host clock where there are none.
"""
import statistics
import time

import torch

_FLUSH_BYTES = 256 << 20  # more than any GPU's L2: each run starts with a cold cache, as Triton's


def _summary(times, quantiles, return_mode):
    if quantiles is not None:  # linear interpolation between samples, as Triton's and Iris's
        out = torch.tensor(times, dtype=torch.float64).quantile(torch.tensor(quantiles, dtype=torch.float64)).tolist()
        return out[0] if len(out) == 1 else out
    modes = {"all": list, "min": min, "max": max, "mean": statistics.mean, "median": statistics.median}
    if return_mode not in modes:
        raise ValueError(f"return_mode must be one of {sorted(modes)}, got {return_mode!r}")
    return modes[return_mode](times)


def do_bench(fn, barrier_fn=lambda: None, preamble_fn=lambda: None, n_warmup: int = 25, n_repeat: int = 100,
             quantiles=None, return_mode: str = "mean"):
    """Time fn() in milliseconds: n_warmup untimed runs, then n_repeat timed ones. barrier_fn (e.g.
    ctx.barrier; then collective: all ranks) runs before and after each, preamble_fn before each,
    neither timed. Returns the mean (or return_mode "min"/"max"/"median"/"all", or the quantiles)."""
    cuda = torch.cuda.is_available()
    flush = torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if cuda else None
    barrier_fn()
    preamble_fn()
    fn()
    barrier_fn()
    times = []
    for i in range(n_warmup + n_repeat):
        barrier_fn()
        preamble_fn()
        if flush is not None:
            flush.zero_()
        barrier_fn()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    barrier_fn()
    if cuda:
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in times]
    return _summary(times[n_warmup:], quantiles, return_mode)
