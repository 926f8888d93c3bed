"""Collectives of ctx.ccl against NCCL (torch.distributed) and PyTorch's symmetric-memory kernels, in
one run, eager and replayed from a CUDA graph; bf16, 1 KiB to 256 MiB. Writes JSON.

    python -m iris.run -n 2 benchmarks/collectives.py [--out FILE] [--max-bytes N]
    python -m iris.run -n 2 benchmarks/collectives.py --dry-run        # host: tiny sizes, gloo, no graphs
    python -m iris.run -n 2 benchmarks/collectives.py --rank-check both   # the rank check's cost: on / off
    python -m iris.run -n 2 benchmarks/collectives.py --wait-bound both   # the bounded waits' cost: on / off
    python -m iris.run -n 2 benchmarks/collectives.py --moves-only --min-bytes 1048576 --pull-segments 4,16

A time is the median over samples of (one sample: `calls` back-to-back calls timed by CUDA events) /
calls, the slowest rank's: "eager" launches every call from Python (host cost included where it is
the bottleneck), "graph" replays those calls captured in one CUDA graph. all_reduce: iris auto,
one-shot and two-shot; NCCL all_reduce; torch.ops.symm_mem one_shot_all_reduce and
two_shot_all_reduce_ (multicast off). all_gather, reduce_scatter (sizes are per rank's input / output)
and all_to_all (size: one rank's whole input) against NCCL's all_gather_into_tensor,
reduce_scatter_tensor and all_to_all_single; all_gather, all_to_all and reduce_scatter also in both
forms of their kernel at every size, one exchange (Config.pull_segments=1) and pipelined
(builders.SEGMENTS, and any --pull-segments), whatever the default picks there. Every iris result is
checked once per size: data movement against NCCL's, exactly; a sum against NCCL's at 2 ranks, past 2
within the rounding any order of addition may make (sum_and_bound).

    python -m iris.run -n 2 benchmarks/collectives.py --sweep-variants [--sizes 4K,64K,1M,16M,64M]

times every variant of every collective (see sweep_variants) and works with ranks sharing one GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (RANK_CHECK_HELP, WAIT_BOUND_HELP, both_ways, init_torch_distributed, nccl_unusable,  # noqa: E402
                    write_result)

import iris  # noqa: E402
from iris.ccl import Config, ReduceOp, builders  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
ONE, TWO = Config(all_reduce_variant="one_shot"), Config(all_reduce_variant="two_shot")
AR_FORMS_FROM = 4 * MiB  # all_reduce two_shot_push is also timed in both its forms from this size


def slowest(x):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, x)
    vals = [v for v in out if v is not None]
    return max(vals) if vals else None


class Timer:
    def __init__(self, ctx, gpu, samples, warmup=3):
        self.ctx, self.gpu, self.samples, self.warmup = ctx, gpu, samples, warmup

    def calls_for(self, nbytes):
        return max(3, min(200, (64 * MiB) // max(nbytes, 1)))

    def eager(self, fn, calls):
        for _ in range(self.warmup):
            fn()
        self.sync()
        if not self.gpu:
            import time
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            return slowest((time.perf_counter() - t) / calls)
        per = []
        for _ in range(self.samples):
            self.sync()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls):
                fn()
            b.record()
            b.synchronize()
            per.append(a.elapsed_time(b) / 1e3 / calls)
        return slowest(statistics.median(per))

    def graph(self, fn, calls):
        if not self.gpu:
            return None
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        self.sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        g.replay()
        per = []
        for _ in range(self.samples):
            self.sync()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            per.append(a.elapsed_time(b) / 1e3 / calls)
        del g
        return slowest(statistics.median(per))

    def sync(self):
        if self.gpu:
            torch.cuda.synchronize()
        dist.barrier()

    def nccl(self, row, name, fn, calls):
        """both() for an NCCL reference; not run where ranks share a GPU (the group is then gloo, which NCCL's
        rows would mislabel, and whose capture fails and leaves the process unable to allocate)."""
        why = self.gpu and nccl_unusable(dist.get_world_size())
        if why:
            row[f"{name}_error"] = f"not run: {why}"
            return
        self.both(row, name, fn, calls)

    def both(self, row, name, fn, calls):
        """Eager and graph times of fn into row[name_eager_us], row[name_graph_us]; errors recorded."""
        for mode, how in (("eager", self.eager), ("graph", self.graph)):
            try:
                t = how(fn, calls)
                row[f"{name}_{mode}_us"] = None if t is None else t * 1e6
            except Exception as e:  # a reference that cannot run at this size: say why, keep going
                row[f"{name}_{mode}_error"] = f"{type(e).__name__}: {e}"[:200]
                self.sync()


def sum_and_bound(x, world, gpu, scatter=False):
    """(exact, bound) for a sum over the ranks of bf16 x: the sum in float64 through torch.distributed
    (exact for bf16 terms), all_reduce's or reduce_scatter's share of it, and how far any summation
    order may round it: world * u * sum of |x| (the bound on recursive summation; u = 2^-8 for bf16
    rounded to nearest, twice that for the interpreter, which truncates). Past 2 ranks iris and NCCL add
    in different orders, so they are checked against this, not against each other."""
    got, d = [], x.double()
    for t in (d, d.abs()):
        if scatter:
            r = torch.empty(t.numel() // world, dtype=torch.float64, device=t.device)
            dist.reduce_scatter_tensor(r, t)
        else:
            r = t
            dist.all_reduce(r)
        got.append(r)
    return got[0], world * 2.0 ** (-8 if gpu else -7) * got[1]


def within(y, exact, bound) -> bool:
    """Every element of y within bound of exact."""
    return bool(((y.double() - exact).abs() <= bound).all())


def all_reduce_rows(ctx, timer, sizes, gpu):
    rows = []
    group = dist.group.WORLD
    symm = None
    shared = gpu and nccl_unusable(ctx.world)  # ranks share a GPU: symm_mem's CUDA backend needs one per rank,
    if gpu and not shared:  # and a capture of its ops there fails and leaves the process unable to allocate
        import torch.distributed._symmetric_memory as symm_mem
        symm = symm_mem
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group.group_name)
    for nbytes in sizes:
        n = nbytes // 2
        calls = timer.calls_for(nbytes)
        row = {"bytes": nbytes, "calls_per_sample": calls}
        x = torch.randn(n, device=ctx.device).to(torch.bfloat16)
        y = torch.empty_like(x)
        ref = x.clone()
        dist.all_reduce(ref)
        exact, bound = sum_and_bound(x, ctx.world, gpu)
        row["iris_checked"] = True
        xh, yh = ctx.empty(n, dtype=torch.bfloat16).copy_(x), ctx.empty(n, dtype=torch.bfloat16)
        variants = [("iris", None, x, y), ("iris_two_shot", TWO, x, y), ("iris_heap", None, xh, yh)] + (
            [("iris_one_shot", ONE, x, y)] if nbytes <= 16 * MiB else [])
        if nbytes >= AR_FORMS_FROM and ctx.world > 1:  # two_shot_push in one exchange and pipelined, plain and heap
            variants += [(f"iris_push_{form}{where}", dataclasses.replace(cfg, all_reduce_variant="two_shot_push"),
                          *tensors) for form, cfg in pull_forms()[:2]
                         for where, tensors in (("", (x, y)), ("_heap", (xh, yh)))]
        for name, cfg, x_, y_ in variants:
            y_.fill_(-1)
            ctx.ccl.all_reduce(y_, x_, config=cfg)
            torch.cuda.synchronize() if gpu else None
            # bf16 sums of 2 ranks are exact in any order; more ranks may round differently from NCCL
            err = (y_.float() - ref.float()).abs().max().item()
            row[f"{name}_max_abs_diff_vs_nccl"] = err
            row["iris_checked"] &= within(y_, exact, bound) and (err == 0 or ctx.world > 2 or not gpu)
            timer.both(row, name, lambda: ctx.ccl.all_reduce(y_, x_, config=cfg), calls)
        ctx.ccl.all_reduce(y, x)
        row["variant_auto"] = ctx.ccl.recent["all_reduce"].plan.variant
        timer.nccl(row, "nccl", lambda: dist.all_reduce(y), calls)
        if shared:
            row["symm_error"] = f"not run: {shared}"
        if symm is not None:
            try:
                t = symm.empty(n, dtype=torch.bfloat16, device=ctx.device)
                symm.rendezvous(t, group.group_name)
                t.copy_(x)
                out = torch.empty_like(t)
                ops = torch.ops.symm_mem
                one = ((lambda: ops.one_shot_all_reduce_out(t, "sum", group.group_name, out))
                       if hasattr(ops, "one_shot_all_reduce_out") else
                       (lambda: ops.one_shot_all_reduce(t, "sum", group.group_name)))
                timer.both(row, "symm_one_shot", one, calls)
                timer.both(row, "symm_two_shot",
                           lambda: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group.group_name), calls)
                del t, out
            except Exception as e:
                row["symm_error"] = f"{type(e).__name__}: {e}"[:200]
        ctx.ccl.free()
        ctx.free(yh)
        ctx.free(xh)
        rows.append(row)
        if ctx.rank == 0:
            print(f"all_reduce {nbytes:>10}: " + ", ".join(f"{k[:-3]}={v:.1f}" for k, v in row.items()
                                                           if k.endswith("_us") and v), flush=True)
    return rows


def pull_forms(segments=()):
    """(name, Config) of the two forms of all_gather pull, all_to_all and reduce_scatter: one exchange,
    and pipelined with the default most segments per program, then with each count in segments."""
    return [("one_exchange", Config(pull_segments=1)), ("pipelined", Config(pull_segments=builders.SEGMENTS))] + [
        (f"pipelined_s{k}", Config(pull_segments=k)) for k in segments if k != builders.SEGMENTS]


def _form(ctx, mode):
    """Which of pull_forms' forms the one plan of `mode` built so far runs: "one_exchange" or "pipelined"."""
    return ",".join(sorted({{"one_shot": "one_exchange", "two_shot": "one_exchange"}.get(p.variant, p.variant)
                            for k, p in ctx.ccl.plans.items() if k[0] == mode}))


def move_rows(ctx, timer, sizes, gpu, segments=()):
    rows, w = [], ctx.world
    for nbytes in sizes:
        n = nbytes // 2
        calls = timer.calls_for(nbytes * w)
        row = {"bytes": nbytes, "calls_per_sample": calls}
        x = torch.randn(n, device=ctx.device).to(torch.bfloat16)
        big = torch.randn(w * n, device=ctx.device).to(torch.bfloat16)
        gathered, ref_g = torch.empty(w * n, dtype=x.dtype, device=ctx.device), torch.empty(w * n, dtype=x.dtype,
                                                                                            device=ctx.device)
        part, ref_p = torch.empty_like(x), torch.empty_like(x)
        cols = min(1024, n // w)  # all_to_all: (M, cols * world), cols per rank
        a2a_in = big[:n].view(n // (w * cols), w * cols) if cols and n % (w * cols) == 0 else None
        dist.all_gather_into_tensor(ref_g, x)
        ctx.ccl.all_gather(gathered, x)
        row["all_gather_auto"] = _form(ctx, "ag")
        dist.reduce_scatter_tensor(ref_p, big)
        ctx.ccl.reduce_scatter(part, big)
        row["reduce_scatter_auto"] = _form(ctx, "rs")
        # bf16 sums of 2 ranks round alike on GPUs; past 2 NCCL adds in another order (sum_and_bound)
        row["all_gather_checked"] = torch.equal(gathered, ref_g)
        bound = sum_and_bound(big, w, gpu, scatter=True)
        row["reduce_scatter_checked"] = within(part, *bound) and (torch.equal(part, ref_p) or w > 2 or not gpu)
        ok = row["all_gather_checked"] and row["reduce_scatter_checked"]
        timer.both(row, "iris_all_gather", lambda: ctx.ccl.all_gather(gathered, x), calls)
        timer.nccl(row, "nccl_all_gather", lambda: dist.all_gather_into_tensor(ref_g, x), calls)
        timer.both(row, "iris_reduce_scatter", lambda: ctx.ccl.reduce_scatter(part, big), calls)
        timer.nccl(row, "nccl_reduce_scatter", lambda: dist.reduce_scatter_tensor(ref_p, big), calls)
        if a2a_in is not None:
            m = a2a_in.shape[0]
            a2a_out, ref_a = torch.empty_like(a2a_in), torch.empty(w, m, cols, dtype=x.dtype, device=ctx.device)
            ctx.ccl.all_to_all(a2a_out, a2a_in)
            row["all_to_all_auto"] = _form(ctx, "a2a")
            # NCCL's chunks are along dim 0: hand it the column chunks as rows, then compare
            dist.all_to_all_single(ref_a, a2a_in.view(m, w, cols).transpose(0, 1).contiguous())
            row["all_to_all_checked"] = torch.equal(a2a_out.view(m, w, cols).transpose(0, 1), ref_a)
            ok = ok and row["all_to_all_checked"]
            flat_in, flat_out = torch.empty(n, dtype=x.dtype, device=ctx.device), torch.empty(n, dtype=x.dtype,
                                                                                              device=ctx.device)
            timer.both(row, "iris_all_to_all", lambda: ctx.ccl.all_to_all(a2a_out, a2a_in), calls)
            timer.nccl(row, "nccl_all_to_all", lambda: dist.all_to_all_single(flat_out, flat_in), calls)
        ctx.ccl.free()
        for form, cfg in pull_forms(segments) if w > 1 else ():  # one rank has no peers: one exchange only
            gathered.fill_(-1)
            ctx.ccl.all_gather(gathered, x, config=cfg)
            row[f"all_gather_{form}_checked"] = torch.equal(gathered, ref_g)
            ok = ok and row[f"all_gather_{form}_checked"]
            timer.both(row, f"iris_all_gather_{form}", lambda c=cfg: ctx.ccl.all_gather(gathered, x, config=c), calls)
            if a2a_in is not None:
                a2a_out.fill_(-1)
                ctx.ccl.all_to_all(a2a_out, a2a_in, config=cfg)
                row[f"all_to_all_{form}_checked"] = torch.equal(a2a_out.view(m, w, cols).transpose(0, 1), ref_a)
                ok = ok and row[f"all_to_all_{form}_checked"]
                timer.both(row, f"iris_all_to_all_{form}", lambda c=cfg: ctx.ccl.all_to_all(a2a_out, a2a_in, config=c),
                           calls)
            part.fill_(-1)
            ctx.ccl.reduce_scatter(part, big, config=cfg)
            row[f"reduce_scatter_{form}_checked"] = within(part, *bound) and (torch.equal(part, ref_p) or w > 2
                                                                              or not gpu)
            ok = ok and row[f"reduce_scatter_{form}_checked"]
            timer.both(row, f"iris_reduce_scatter_{form}", lambda c=cfg: ctx.ccl.reduce_scatter(part, big, config=c),
                       calls)
            ctx.ccl.free()  # one form's workspaces at a time: the heap holds 8 of the largest size per rank
        row["checked_vs_nccl"] = bool(ok)
        rows.append(row)
        if ctx.rank == 0:
            print(f"moves {nbytes:>10}: " + ", ".join(f"{k[:-3]}={v:.1f}" for k, v in row.items()
                                                      if k.endswith("_us") and v) + ("" if ok else " DATA WRONG"),
                  flush=True)
    return rows


def host_costs(ctx, timer, gpu):
    """Where eager time goes: host microseconds per call (perf_counter over back-to-back calls, one
    sync at the end) of a 1 KiB all_reduce through ctx.ccl, of the same kernel launched through
    Triton's JIT (kernel[grid](...): the control for iris.ccl.launch.Launcher), and of torch copy_.
    On GPUs also what the one device order across streams costs: the same all_reduce called from
    one stream, and from two streams in turn (each call then waits for the other stream), timed by
    CUDA events (microseconds per call) and on the host."""
    import time
    x = torch.randn(512, device=ctx.device).to(torch.bfloat16)
    y = torch.empty_like(x)
    ctx.ccl.all_reduce(y, x)
    plan = ctx.ccl.recent["all_reduce"].plan
    args = list(plan.args)
    args[0], args[1] = x, y
    calls = 2000 if gpu else 5

    def per_call(fn):
        timer.sync()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - t) / calls
        timer.sync()
        return slowest(host * 1e6)

    out = {"iris_all_reduce_host_us": per_call(lambda: ctx.ccl.all_reduce(y, x)),
           "jit_launch_same_kernel_host_us": per_call(lambda: plan.fn[plan.grid](*args, **plan.options)),
           "iris_all_reduce_host_us_again": per_call(lambda: ctx.ccl.all_reduce(y, x)),
           "torch_copy_host_us": per_call(lambda: y.copy_(x))}
    if gpu:  # the one device order across streams (iris/ccl/order.py): a call from the other stream each time
        other = torch.cuda.Stream(ctx.device)

        def alternate():
            with torch.cuda.stream(other):
                ctx.ccl.all_reduce(y, x)
            ctx.ccl.all_reduce(y, x)

        calls_ = timer.calls_for(x.nbytes)
        out["stream_order"] = {
            "same_stream_us": timer.eager(lambda: ctx.ccl.all_reduce(y, x), calls_) * 1e6,
            "alternating_streams_us": timer.eager(alternate, calls_) / 2 * 1e6,
            "same_stream_host_us": per_call(lambda: ctx.ccl.all_reduce(y, x)),
            "alternating_streams_host_us": per_call(alternate) / 2}
    launchers = list(plan.launchers.values())
    out["direct_launch_used"] = all(lc.last is not None for lc in launchers) if gpu else False
    out["fallback"] = [lc.fallback for lc in launchers if lc.fallback]
    ctx.ccl.free()
    if ctx.rank == 0:
        print("host cost per call: " + ", ".join(f"{k}={v}" for k, v in out.items()), flush=True)
    return out


SWEEP_BLOCKS = (1024, 2048, 4096, 8192, 16384)  # elements a step (bf16: 2 to 32 KiB)
SWEEP_WARPS = (4, 8, 16)


SMALL_SWEEP = (16 * KiB, 64 * KiB, 256 * KiB)  # one_shot's sizes swept (where it trails symm_mem at 4 ranks)
SMALL_BLOCKS = (1024, 2048, 4096, 8192)  # elements a step at those sizes (bf16: 2 to 16 KiB)


def sweep(ctx, timer, gpu):
    """The data behind the all_reduce defaults (iris/ccl/builders.py), on plain tensors, graph-replayed, over
    elements a step and warps: one_shot and one_shot_push at 16 to 256 KiB (what "auto" runs up to
    one_shot_max_bytes), two_shot_push at 1 to 64 MiB (above it); each size's last row is the default."""
    if not gpu:
        return []
    rows = []
    cases = [(n, "one_shot", b, w) for n in SMALL_SWEEP for b in SMALL_BLOCKS for w in (4, 8)]
    cases += [(n, "one_shot_push", b, w) for n in SMALL_SWEEP for b in SMALL_BLOCKS for w in (4, 8)]
    cases += [(n, "two_shot_push", b, w) for n in (MiB, 4 * MiB, 16 * MiB, 64 * MiB) for b in SWEEP_BLOCKS
              for w in SWEEP_WARPS]
    sizes = sorted({n for n, *_ in cases if n <= timer.max_bytes})
    for nbytes in sizes:
        x = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=ctx.device)
        y = torch.empty_like(x)
        for n, variant, block, warps in cases:
            if n == nbytes:
                cfg = Config(block_size=block, num_warps=warps, all_reduce_variant=variant)
                row = {"bytes": nbytes, "variant": variant, "block_size": block, "num_warps": warps}
                row["graph_us"] = timer.graph(lambda: ctx.ccl.all_reduce(y, x, config=cfg), 20) * 1e6
                rows.append(row)
                ctx.ccl.free()
        row = {"bytes": nbytes, "variant": "auto", "block_size": 0, "num_warps": 0}  # the default
        row["graph_us"] = timer.graph(lambda: ctx.ccl.all_reduce(y, x), 20) * 1e6
        rows.append(row)
        ctx.ccl.free()
    if ctx.rank == 0:
        for nbytes in sizes:
            mine = [r for r in rows if r["bytes"] == nbytes]
            best = min(mine, key=lambda r: r["graph_us"])
            print(f"sweep {nbytes >> 10} KiB: best {best['variant']} block {best['block_size']} warps "
                  f"{best['num_warps']} {best['graph_us']:.1f} us; default {mine[-1]['graph_us']:.1f} us; all: "
                  + " ".join(f"{r['variant']}:b{r['block_size']}w{r['num_warps']}={r['graph_us']:.1f}"
                             for r in mine[:-1]), flush=True)
    return rows


class Watchdog:
    """Ends this rank (after dumping what was measured, on rank 0) if a step makes no progress for `limit`
    seconds: a kernel that never returns must not hold the device call until its time runs out."""

    def __init__(self, limit, dump):
        import threading
        import time
        self.limit, self.dump, self.last, self.step = limit, dump, time.monotonic(), "start"
        threading.Thread(target=self._watch, daemon=True).start()

    def tick(self, step):
        import time
        self.last, self.step = time.monotonic(), step

    def _watch(self):
        import time
        while True:
            time.sleep(2)
            if time.monotonic() - self.last > self.limit:
                print(f"watchdog: no progress for {self.limit:.0f} s in {self.step}; ending this rank", flush=True)
                try:
                    self.dump(f"stopped by the watchdog in {self.step}")
                finally:
                    os._exit(3)


# -- the variant sweep (--sweep-variants) -------------------------------------------------------------
SWEEP_SIZES = "4K,64K,1M,16M,64M"
POISON = -77.0  # bf16-exact, and no sum of the inputs (small integers) reaches it
COLS = 256  # columns of every 2-D tensor of the sweep (a multiple of the ranks for all_to_all)
# every variant a Config names, per collective ("gluon": Config(use_gluon=True), heap out)
VARIANTS = {"all_reduce": ("auto", "one_shot", "two_shot", "one_shot_push", "two_shot_push", "atomic", "spinlock",
                           "ring"),
            "all_gather": ("pull", "persistent", "partitioned", "ring", "gluon"),
            "reduce_scatter": ("two_shot", "ring_chunked"),
            "reduce_scatter_tiles": ("two_shot", "ring_chunked"),
            "all_to_all": ("default", "gluon")}
FIELD = {"all_reduce": "all_reduce_variant", "all_gather": "all_gather_variant",
         "reduce_scatter": "reduce_scatter_variant", "reduce_scatter_tiles": "reduce_scatter_variant",
         "all_to_all": "all_to_all_variant"}


def _bytes(text):
    """'4K', '1M', '4096' -> bytes."""
    text = text.strip().upper()
    return int(text[:-1]) * {"K": KiB, "M": MiB}[text[-1]] if text[-1] in "KM" else int(text)


def _size(nbytes):
    return f"{nbytes >> 20}M" if nbytes >= MiB else f"{nbytes >> 10}K"


def _inputs(ctx, shape, rank, nbytes, tag):
    """Rank `rank`'s input: small integers in bf16, the same on every process (seeded), so any rank can
    build every rank's and every sum is exact in any order."""
    import zlib
    g = torch.Generator(device=ctx.device).manual_seed(zlib.crc32(f"{rank} {nbytes} {tag}".encode()))
    return torch.randint(-8, 9, shape, device=ctx.device, generator=g).to(torch.bfloat16)


def _owned_tiles(m, n, cfg, rank, world, device):
    """Where rank's tiles lie in an (m, n) tensor for reduce_scatter in Iris's layout (Config's tiles,
    swizzle_size tile rows per group, dealt by all_reduce_distribution)."""
    bm, bn, group = cfg.block_size_m, cfg.block_size_n, cfg.swizzle_size
    grid_m, grid_n = -(-m // bm), -(-n // bn)
    tiles, mask = grid_m * grid_n, torch.zeros(m, n, dtype=torch.bool, device=device)
    share = -(-tiles // world)
    for t in range(tiles):
        if (t % world == rank) if cfg.all_reduce_distribution == 0 else (t // share == rank):
            first = (t // (group * grid_n)) * group
            rows = min(grid_m - first, group)
            pm, pn = first + (t % (group * grid_n)) % rows, (t % (group * grid_n)) // rows
            mask[pm * bm:(pm + 1) * bm, pn * bn:(pn + 1) * bn] = True
    return mask


def _problem(ctx, name, nbytes):
    """(inp, out, want, rows) of one collective at nbytes (all_reduce, all_gather, all_to_all: one rank's
    input; reduce_scatter: one rank's output, its input world times that): bf16, COLS columns."""
    r, w, dev = ctx.rank, ctx.world, ctx.device
    rows = max(1, nbytes // (2 * COLS))
    if name in ("all_reduce", "all_gather", "all_to_all"):
        xs = [_inputs(ctx, (rows, COLS), q, nbytes, name) for q in range(w)]
    else:
        xs = [_inputs(ctx, (w * rows, COLS), q, nbytes, name) for q in range(w)]
    total = sum(x.float() for x in xs).to(torch.bfloat16) if name.startswith(("all_reduce", "reduce")) else None
    if name == "all_reduce":
        want = total
    elif name == "all_gather":
        want = torch.cat(xs)
    elif name == "reduce_scatter":
        want = total[r * rows:(r + 1) * rows]
    elif name == "reduce_scatter_tiles":
        want = torch.where(_owned_tiles(w * rows, COLS, Config(), r, w, dev), total,
                           torch.full_like(total, POISON))
    else:
        c = COLS // w
        want = torch.cat([x[:, r * c:(r + 1) * c] for x in xs], dim=1)
    return xs[r], torch.empty_like(want), want, rows


def _iris_call(ctx, name, variant, inp, out, spin):
    """The call of one iris variant (a heap out for the Gluon kernels, which store into the peers' out)."""
    if variant == "gluon":
        cfg = Config(use_gluon=True, spin_limit=spin)
        out = ctx.empty(out.shape, dtype=out.dtype)
    else:
        cfg = Config(spin_limit=spin, **{FIELD[name]: variant})
    call = getattr(ctx.ccl, name.replace("_tiles", ""))
    return (lambda: call(out, inp, config=cfg)), out


def _references(ctx, gpu, world):
    """NCCL's group and torch symmetric memory where they can run, else why not: {name: group or reason}."""
    if not gpu:
        return {"nccl": "not run: the host has no GPU", "symm_mem": "not run: the host has no GPU"}
    gpus = torch.cuda.device_count()
    if gpus < world:
        why = (f"not run: {world} ranks share {gpus} GPU(s); NCCL refuses two ranks on one GPU (\"Duplicate GPU "
               "detected\") and torch symmetric memory's CUDA backend needs one GPU per rank")
        return {"nccl": why, "symm_mem": why}
    refs = {}
    try:
        refs["nccl"] = dist.new_group(backend="nccl")
        t = torch.ones(1, device=ctx.device)
        dist.all_reduce(t, group=refs["nccl"])
    except Exception as e:  # say why in the JSON and go on without it
        refs["nccl"] = f"failed: {type(e).__name__}: {e}"[:300]
    try:
        import torch.distributed._symmetric_memory as symm_mem
        group = refs["nccl"] if not isinstance(refs["nccl"], str) else dist.group.WORLD
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group.group_name)
        t = symm_mem.empty(16, dtype=torch.bfloat16, device=ctx.device)
        symm_mem.rendezvous(t, group.group_name)
        refs["symm_mem"] = (symm_mem, group)
    except Exception as e:
        refs["symm_mem"] = f"failed: {type(e).__name__}: {e}"[:300]
    return refs


def _reference_calls(name, inp, out, refs):
    """(name, call) of the references that run for this collective."""
    calls = []
    nccl = refs.get("nccl")
    if nccl is not None and not isinstance(nccl, str):
        y = inp.clone()
        calls.append(("nccl", {"all_reduce": lambda: dist.all_reduce(y, group=nccl),
                               "all_gather": lambda: dist.all_gather_into_tensor(out, inp, group=nccl),
                               "reduce_scatter": lambda: dist.reduce_scatter_tensor(out, inp, group=nccl),
                               "all_to_all": lambda: dist.all_to_all_single(y, inp, group=nccl)}.get(name)))
    symm = refs.get("symm_mem")
    if name == "all_reduce" and symm is not None and not isinstance(symm, str):
        symm_mem, group = symm
        t = symm_mem.empty(inp.numel(), dtype=inp.dtype, device=inp.device)
        symm_mem.rendezvous(t, group.group_name)
        t.copy_(inp.flatten())
        calls.append(("symm_mem_one_shot", lambda: torch.ops.symm_mem.one_shot_all_reduce(t, "sum",
                                                                                           group.group_name)))
        calls.append(("symm_mem_two_shot", lambda: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum",
                                                                                            group.group_name)))
    return [(n, c) for n, c in calls if c is not None]


def _once(ctx, fn, gpu):
    """Seconds of one call, the slowest rank's."""
    import time
    if gpu:
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if gpu:
        torch.cuda.synchronize()
    return slowest(time.perf_counter() - t)


def _timed(ctx, timer, row, name, fn, gpu, slow):
    """One call to find its cost, then eager and graph times with as many calls per sample as fit in
    about 40 ms; nothing when one call takes more than slow seconds (row says so)."""
    one = _once(ctx, fn, gpu)
    row[f"{name}_one_call_s"] = round(one, 6)
    if one > slow:
        row[f"{name}_skipped"] = f"one call took {one:.3f} s (over {slow} s)"
        return False
    calls = max(1, min(50, int(0.04 / max(one, 1e-6))))
    row[f"{name}_calls_per_sample"] = calls
    timer.both(row, name, fn, calls)
    return True


def sweep_variants(ctx, timer, gpu, args, dump):
    """Every variant of all_reduce, all_gather, reduce_scatter (torch's layout and Iris's tiles) and
    all_to_all, bf16, at each size, eager and replayed from a CUDA graph; NCCL and torch symmetric
    memory in the same run where they can run (the JSON says why not otherwise). Each variant is
    checked once per size before it is timed (out poisoned, every element compared with the sum or
    copy built from every rank's seeded input). Kernels run with Config.spin_limit, so a variant that
    deadlocks gives up and is recorded as failed; a variant that fails, or whose call takes more than
    --slow seconds, is not run at larger sizes; no new step starts after --budget seconds, and rank 0
    rewrites the JSON after every step."""
    import time
    t0 = time.monotonic()
    refs = _references(ctx, gpu, ctx.world)
    dump.meta["references"] = {k: v if isinstance(v, str) else "run" for k, v in refs.items()}
    if not gpu:
        dump.meta["gluon"] = "not run: Gluon kernels need a GPU"
    rows, dropped = [], {}
    only = set(args.variants.split(",")) if args.variants else None
    for nbytes in [_bytes(x) for x in args.sizes.split(",")]:
        for name, variants in VARIANTS.items():
            if slowest(time.monotonic() - t0) > args.budget:
                dump.meta["stopped"] = f"time budget of {args.budget:.0f} s spent before {_size(nbytes)} {name}"
                return rows
            dump.tick(f"{name} {nbytes}")
            inp, out, want, _ = _problem(ctx, name, nbytes)
            for variant in variants:
                if (only and variant not in only) or (name, variant) in dropped or (variant == "gluon" and not gpu):
                    continue
                row = {"collective": name, "variant": variant, "bytes": nbytes}
                dump.tick(f"{name} {variant} {nbytes}")
                try:
                    fn, o = _iris_call(ctx, name, variant, inp, out, args.spin_limit)
                    o.fill_(POISON)
                    fn()  # builds the plan, compiles
                    if gpu:
                        torch.cuda.synchronize()
                    wrong = int((o != want).sum().item())
                except Exception as e:  # every rank makes the same calls either way
                    row["error"], wrong, fn = f"{type(e).__name__}: {e}"[:300], -1, None
                row["wrong_elements"] = wrong
                row["ok"] = not slowest(int(wrong != 0))
                if not row["ok"] or not _timed(ctx, timer, row, "iris", fn, gpu, args.slow):
                    dropped[(name, variant)] = nbytes  # a failed or slow variant costs time at every size
                    dump.meta.setdefault("dropped", {})[f"{name} {variant}"] = (
                        f"not run above {_size(nbytes)}: " + (row.get("iris_skipped") or "wrong data or an error"))
                rows.append(row)
                ctx.ccl.free()
                if variant == "gluon" and fn is not None:
                    ctx.free(o)
                dump.save(rows)
            for ref, fn in _reference_calls(name, inp, out, refs):
                row = {"collective": name, "variant": ref, "bytes": nbytes, "ok": None}
                dump.tick(f"{name} {ref} {nbytes}")
                _timed(ctx, timer, row, "ref", fn, gpu, args.slow)
                rows.append(row)
                dump.save(rows)
            if ctx.rank == 0:
                done = [r for r in rows if r["bytes"] == nbytes and r["collective"] == name]
                print(f"{_size(nbytes):>4} {name}: " + "; ".join(
                    f"{r['variant']} " + (_cell(r) if r["ok"] is not False else "FAILED") for r in done), flush=True)
            del inp, out, want
    return rows


def _cell(r):
    """'graph/eager' microseconds of a row, '-' where not measured."""
    def f(v):
        return f"{v:.1f}" if v else "-"
    k = "iris" if r["ok"] is not None else "ref"
    return f"{f(r.get(f'{k}_graph_us'))}/{f(r.get(f'{k}_eager_us'))}"


def sweep_table(rows):
    """One line per (collective, variant): graph / eager us at each size."""
    sizes = sorted({r["bytes"] for r in rows})
    lines = ["bf16, us per call, graph/eager (FAILED: wrong data or an error; -: not run)",
             f"{'collective':<21} {'variant':<18}" + "".join(f"{_size(s):>16}" for s in sizes)]
    keyed = {}
    for r in rows:
        keyed.setdefault((r["collective"], r["variant"]), {})[r["bytes"]] = r
    for (name, variant), by in keyed.items():
        cells = [("FAILED" if by[s]["ok"] is False else _cell(by[s])) if s in by else "-" for s in sizes]
        lines.append(f"{name:<21} {variant:<18}" + "".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


class Dump:
    """Rank 0 rewrites the sweep's JSON after every step, so a run ended early keeps what it measured."""

    def __init__(self, rank, args):
        self.rank, self.args, self.rows, self.watchdog, self.meta = rank, args, [], None, {}

    def tick(self, step):
        if self.watchdog is not None:
            self.watchdog.tick(step)

    def save(self, rows, note=None):
        self.rows = rows
        if self.rank != 0:
            return None
        payload = {"dtype": "bfloat16", "units": "microseconds per call, median of samples, slowest rank",
                   "sizes": "all_reduce, all_gather, all_to_all: one rank's input; reduce_scatter: one rank's "
                            "output (its input is world times that); reduce_scatter_tiles: Iris's layout, input and "
                            "output world times the size", "sweep": rows, "spin_limit": self.args.spin_limit,
                   "budget_s": self.args.budget, **self.meta,
                   "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
                   "table": sweep_table(rows).splitlines()}
        if note:
            payload["note"] = note
        if torch.cuda.is_available() and torch.cuda.device_count() < dist.get_world_size():
            payload["caveat"] = (f"{dist.get_world_size()} ranks on {torch.cuda.device_count()} GPU(s): the ranks' "
                                 "kernels time-slice one GPU and their peer traffic never crosses NVLink, so these "
                                 "times compare variants' synchronisation and host costs, not bandwidth between GPUs")
        return write_result("collectives_sweep", payload, self.args.out)

    def __call__(self, note):
        self.save(self.rows, note)


def table(ar, moves):
    def f(v):
        return f"{v:8.1f}" if v else f"{'-':>8}"
    lines = ["all_reduce bf16, us per call (eager / graph)",
             f"{'bytes':>10} {'iris':>17} {'1-shot':>17} {'2-shot':>17} {'heap':>17} {'nccl':>17} {'symm 1-shot':>17} "
             f"{'symm 2-shot':>17}"] if ar else []
    for r in ar:
        cells = [f"{f(r.get(k + '_eager_us'))}/{f(r.get(k + '_graph_us'))}"
                 for k in ("iris", "iris_one_shot", "iris_two_shot", "iris_heap", "nccl", "symm_one_shot",
                           "symm_two_shot")]
        lines.append(f"{r['bytes']:>10} " + " ".join(cells) + f"  auto={r['variant_auto']}")
    formed = [r for r in ar if r.get("iris_push_pipelined_graph_us")]
    if formed:
        lines.append("all_reduce two_shot_push by form, graph us: one exchange / pipelined, plain; the same, heap")
        for r in formed:
            lines.append(f"{r['bytes']:>10}   " + "   ".join(
                "/".join(f(r.get(f"iris_push_{form}{where}_graph_us")).strip()
                         for form in ("one_exchange", "pipelined")) for where in ("", "_heap")))
    lines.append("all_gather / reduce_scatter / all_to_all bf16, graph us: iris vs nccl (eager in JSON)")
    for r in moves:
        cells = [f"{f(r.get(f'iris_{k}_graph_us'))}/{f(r.get(f'nccl_{k}_graph_us'))}"
                 for k in ("all_gather", "reduce_scatter", "all_to_all")]
        lines.append(f"{r['bytes']:>10} " + " ".join(cells) + ("" if r["checked_vs_nccl"] else " DATA WRONG"))
    forms = [k[len("iris_all_gather_"):-len("_graph_us")] for k in (moves[0] if moves else {})
             if k.startswith("iris_all_gather_") and k.endswith("_graph_us") and k != "iris_all_gather_graph_us"]
    if forms:
        lines.append("all_gather, reduce_scatter, all_to_all bf16 by form, graph us: " + " / ".join(forms) + " / nccl "
                     "(auto: the form the default ran)")
        for r in moves:
            cells = ["/".join(f(r.get(f"iris_{k}_{form}_graph_us")).strip() for form in forms)
                     + f"/{f(r.get(f'nccl_{k}_graph_us')).strip()} auto={r.get(k + '_auto', '-')}"
                     for k in ("all_gather", "reduce_scatter", "all_to_all")]
            lines.append(f"{r['bytes']:>10}   " + "   ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON file (rank 0); default benchmarks/results/collectives-<gpu|host>-<n>ranks.json")
    p.add_argument("--max-bytes", type=int, default=256 * MiB)
    p.add_argument("--min-bytes", type=int, default=KiB, help="the smallest size timed (a power of 4 times 1 KiB, "
                                                               "or 1 MiB)")
    p.add_argument("--moves-only", action="store_true",
                   help="only all_gather, reduce_scatter and all_to_all (no host costs, two_shot_push sweep, all_reduce)")
    p.add_argument("--all-reduce-only", action="store_true",
                   help="only all_reduce (no host costs, two_shot_push sweep, moves)")
    p.add_argument("--pull-segments", default="",
                   help="comma list: all_gather, all_to_all and reduce_scatter also pipelined with at most these "
                        "segments per program")
    p.add_argument("--samples", type=int, default=7)
    p.add_argument("--dry-run", action="store_true", help="host: tiny sizes, gloo, no graphs")
    p.add_argument("--sweep-variants", action="store_true",
                   help="only the sweep of every variant of every collective (JSON collectives_sweep-*)")
    p.add_argument("--sizes", default=SWEEP_SIZES, help=f"--sweep-variants: comma list, K/M suffixes ({SWEEP_SIZES})")
    p.add_argument("--variants", default="", help="--sweep-variants: comma list of variants (default all)")
    p.add_argument("--spin-limit", type=int, default=1 << 22,
                   help="--sweep-variants: Config.spin_limit of every kernel (polls before a program gives up)")
    p.add_argument("--watchdog", type=float, default=60.0,
                   help="--sweep-variants: seconds without progress before a rank dumps its results and ends")
    p.add_argument("--budget", type=float, default=150.0,
                   help="--sweep-variants: seconds after which no new step starts")
    p.add_argument("--slow", type=float, default=0.25,
                   help="--sweep-variants: a variant whose call takes longer is not timed, nor run at larger sizes")
    p.add_argument("--rank-check", choices=("both",), help=RANK_CHECK_HELP)
    p.add_argument("--wait-bound", choices=("both",), help=WAIT_BOUND_HELP)
    args = p.parse_args(argv)
    for what in ("rank_check", "wait_bound"):
        if getattr(args, what) == "both":
            return both_ways(os.path.abspath(__file__), sys.argv[1:] if argv is None else argv, args.out,
                             "collectives", what)
    gpu = torch.cuda.is_available() and not args.dry_run
    if args.dry_run:
        args.max_bytes = min(args.max_bytes, KiB)
    if args.sweep_variants:  # gloo between the ranks: they may share a GPU, which NCCL refuses
        return main_sweep(args, gpu, *init_torch_distributed("gloo"))
    rank, world = init_torch_distributed()
    ctx = iris.iris(heap_size=(8 * args.max_bytes * world + 256 * MiB) if gpu else 1 << 26)
    sizes = [1 << p for p in range(10, 29, 2) if (1 << p) <= args.max_bytes]
    if gpu and args.max_bytes >= MiB and MiB not in sizes:
        sizes = sorted(sizes + [MiB])
    sizes = [s for s in sizes if s >= args.min_bytes] or sizes[-1:]
    timer = Timer(ctx, gpu, args.samples if gpu else 1)
    timer.max_bytes = args.max_bytes
    segments = [int(k) for k in args.pull_segments.split(",") if k.strip()]
    only = args.moves_only or args.all_reduce_only
    host = None if only else host_costs(ctx, timer, gpu)
    tuning = [] if only else sweep(ctx, timer, gpu)
    ar = [] if args.moves_only else all_reduce_rows(ctx, timer, sizes, gpu)
    moves = [] if args.all_reduce_only else move_rows(ctx, timer, [s for s in sizes if s >= 4 * KiB or not gpu],
                                                        gpu, segments)
    if rank == 0:
        text = table(ar, moves)
        path = write_result("collectives", {"dtype": "bfloat16", "units": "microseconds per call, median",
                                            "rank_check": iris.settings.RANK_CHECK.get(),
                                            "pipeline_bytes": builders.PIPELINE_BYTES,
                                            "spin_limit": iris.settings.SPIN_LIMIT.get(),
                                            "host_costs": host, "all_reduce_sweep": tuning, "all_reduce": ar,
                                            "moves": moves,
                                            "env": {k: os.environ.get(k) for k in
                                                    ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
                                            "table": text.splitlines()}, args.out)
        print(text)
        print(f"wrote {path}")
    ok = all(r["checked_vs_nccl"] for r in moves) and all(r["iris_checked"] for r in ar)
    ctx.barrier()
    ctx.close()
    dist.destroy_process_group()
    return 0 if ok else 1


def main_sweep(args, gpu, rank, world) -> int:
    if not gpu:
        args.sizes = ",".join(x for x in args.sizes.split(",") if _bytes(x) <= 4 * KiB) or "4K"
    biggest = max(_bytes(x) for x in args.sizes.split(","))
    ctx = iris.iris(heap_size=(12 * world * biggest + 512 * MiB) if gpu else 1 << 26)
    timer = Timer(ctx, gpu, args.samples if gpu else 1, warmup=1)
    dump = Dump(rank, args)
    dump.watchdog = Watchdog(args.watchdog, dump)
    rows = sweep_variants(ctx, timer, gpu, args, dump)
    path = dump.save(rows)
    if rank == 0:
        print(sweep_table(rows))
        print(f"wrote {path}")
    ok = all(r["ok"] is not False for r in rows)  # every variant checked gave the right data
    ctx.barrier()
    ctx.close()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
