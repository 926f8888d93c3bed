"""Collectives of ctx.ccl against NCCL (torch.distributed) and PyTorch's symmetric-memory kernels, in
one run, eager and replayed from a CUDA graph; bf16, 1 KiB to 256 MiB. Writes JSON.

    python -m iris.run -n 2 benchmarks/collectives.py [--out FILE] [--max-bytes N]
    python -m iris.run -n 2 benchmarks/collectives.py --dry-run        # host: tiny sizes, gloo, no graphs

A time is the median over samples of (one sample: `calls` back-to-back calls timed by CUDA events) /
calls, the slowest rank's: "eager" launches every call from Python (host cost included where it is
the bottleneck), "graph" replays those calls captured in one CUDA graph. all_reduce: iris auto,
one-shot and two-shot; NCCL all_reduce; torch.ops.symm_mem one_shot_all_reduce and
two_shot_all_reduce_ (multicast off). all_gather, reduce_scatter (sizes are per rank's input / output)
and all_to_all (size: one rank's whole input) against NCCL's all_gather_into_tensor,
reduce_scatter_tensor and all_to_all_single. Every iris result is checked against NCCL's once per size.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import init_torch_distributed, write_result  # noqa: E402

import iris  # noqa: E402
from iris.ccl import Config, ReduceOp  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
ONE, TWO = Config(all_reduce_variant="one_shot"), Config(all_reduce_variant="two_shot")


def slowest(x):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, x)
    vals = [v for v in out if v is not None]
    return max(vals) if vals else None


class Timer:
    def __init__(self, ctx, gpu, samples):
        self.ctx, self.gpu, self.samples = ctx, gpu, samples

    def calls_for(self, nbytes):
        return max(3, min(200, (64 * MiB) // max(nbytes, 1)))

    def eager(self, fn, calls):
        for _ in range(3):
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
            for _ in range(3):
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

    def both(self, row, name, fn, calls):
        """Eager and graph times of fn into row[name_eager_us], row[name_graph_us]; errors recorded."""
        for mode, how in (("eager", self.eager), ("graph", self.graph)):
            try:
                t = how(fn, calls)
                row[f"{name}_{mode}_us"] = None if t is None else t * 1e6
            except Exception as e:  # a reference that cannot run at this size: say why, keep going
                row[f"{name}_{mode}_error"] = f"{type(e).__name__}: {e}"[:200]
                self.sync()


def all_reduce_rows(ctx, timer, sizes, gpu):
    rows = []
    group = dist.group.WORLD
    symm = None
    if gpu:
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
        xh, yh = ctx.empty(n, dtype=torch.bfloat16).copy_(x), ctx.empty(n, dtype=torch.bfloat16)
        variants = [("iris", None, x, y), ("iris_two_shot", TWO, x, y), ("iris_heap", None, xh, yh)] + (
            [("iris_one_shot", ONE, x, y)] if nbytes <= 16 * MiB else [])
        for name, cfg, x_, y_ in variants:
            y_.fill_(-1)
            ctx.ccl.all_reduce(y_, x_, config=cfg)
            torch.cuda.synchronize() if gpu else None
            # bf16 sums of 2 ranks are exact in any order; more ranks may round differently from NCCL
            err = (y_.float() - ref.float()).abs().max().item()
            row[f"{name}_max_abs_diff_vs_nccl"] = err
            timer.both(row, name, lambda: ctx.ccl.all_reduce(y_, x_, config=cfg), calls)
        ctx.ccl.all_reduce(y, x)
        row["variant_auto"] = ctx.ccl._last_ar.plan.variant
        timer.both(row, "nccl", lambda: dist.all_reduce(y), calls)
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


def move_rows(ctx, timer, sizes, gpu):
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
        dist.reduce_scatter_tensor(ref_p, big)
        ctx.ccl.reduce_scatter(part, big)
        # bf16 sums of 2 ranks round alike on GPUs; NCCL may add more ranks in another order, and the
    # interpreter rounds fp32 to bf16 by truncation
        ok = torch.equal(gathered, ref_g) and (torch.equal(part, ref_p) if w == 2 and gpu else
                                               torch.allclose(part.float(), ref_p.float(), rtol=2e-2, atol=1e-2))
        timer.both(row, "iris_all_gather", lambda: ctx.ccl.all_gather(gathered, x), calls)
        timer.both(row, "nccl_all_gather", lambda: dist.all_gather_into_tensor(ref_g, x), calls)
        timer.both(row, "iris_reduce_scatter", lambda: ctx.ccl.reduce_scatter(part, big), calls)
        timer.both(row, "nccl_reduce_scatter", lambda: dist.reduce_scatter_tensor(ref_p, big), calls)
        if a2a_in is not None:
            m = a2a_in.shape[0]
            a2a_out, ref_a = torch.empty_like(a2a_in), torch.empty(w, m, cols, dtype=x.dtype, device=ctx.device)
            ctx.ccl.all_to_all(a2a_out, a2a_in)
            # NCCL's chunks are along dim 0: hand it the column chunks as rows, then compare
            dist.all_to_all_single(ref_a, a2a_in.view(m, w, cols).transpose(0, 1).contiguous())
            ok = ok and torch.equal(a2a_out.view(m, w, cols).transpose(0, 1), ref_a)
            flat_in, flat_out = torch.empty(n, dtype=x.dtype, device=ctx.device), torch.empty(n, dtype=x.dtype,
                                                                                              device=ctx.device)
            timer.both(row, "iris_all_to_all", lambda: ctx.ccl.all_to_all(a2a_out, a2a_in), calls)
            timer.both(row, "nccl_all_to_all", lambda: dist.all_to_all_single(flat_out, flat_in), calls)
        row["checked_vs_nccl"] = bool(ok)
        ctx.ccl.free()
        rows.append(row)
        if ctx.rank == 0:
            print(f"moves {nbytes:>10}: " + ", ".join(f"{k[:-3]}={v:.1f}" for k, v in row.items()
                                                      if k.endswith("_us") and v) + ("" if ok else " DATA WRONG"),
                  flush=True)
    return rows


def host_costs(ctx, timer, gpu):
    """Where eager time goes: host microseconds per call (perf_counter over back-to-back calls, one
    sync at the end) of a 1 KiB all_reduce through ctx.ccl, of the same kernel launched through
    Triton's JIT (kernel[grid](...): the control for iris.ccl.launch.Launcher), and of torch copy_."""
    import time
    x = torch.randn(512, device=ctx.device).to(torch.bfloat16)
    y = torch.empty_like(x)
    ctx.ccl.all_reduce(y, x)
    plan = ctx.ccl._last_ar.plan
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
    launchers = list(plan.launchers.values())
    out["direct_launch_used"] = all(lc.last is not None for lc in launchers) if gpu else False
    out["fallback"] = [lc.fallback for lc in launchers if lc.fallback]
    ctx.ccl.free()
    if ctx.rank == 0:
        print("host cost per call: " + ", ".join(f"{k}={v}" for k, v in out.items()), flush=True)
    return out


def sweep(ctx, timer, gpu):
    """Two-shot kernel parameters at 16 and 64 MiB (heap tensors, graph): the data behind the defaults."""
    if not gpu or timer.max_bytes < 64 * MiB:
        return []
    rows = []
    for nbytes in (16 * MiB, 64 * MiB):
        n = nbytes // 2
        x, y = ctx.empty(n, dtype=torch.bfloat16).normal_(), ctx.empty(n, dtype=torch.bfloat16)
        for block, warps, sms in ((4096, 8, 0), (8192, 8, 0), (8192, 16, 0), (16384, 16, 0), (8192, 8, 64),
                                  (4096, 4, 0)):
            cfg = Config(block_size=block, num_warps=warps or None, comm_sms=sms or None,
                         all_reduce_variant="two_shot")
            row = {"bytes": nbytes, "block_size": block, "num_warps": warps, "comm_sms": sms}
            timer.both(row, "two_shot_heap", lambda: ctx.ccl.all_reduce(y, x, config=cfg), 20)
            row.pop("two_shot_heap_eager_us", None)
            rows.append(row)
            ctx.ccl.free()
        ctx.free(y)
        ctx.free(x)
    if ctx.rank == 0:
        print("sweep: " + "; ".join(f"{r['bytes'] >> 20}MiB b{r['block_size']} w{r['num_warps']} s{r['comm_sms']}: "
                                    f"{r.get('two_shot_heap_graph_us', 0):.1f}" for r in rows), flush=True)
    return rows


SWEEP_SETTINGS = ((0, 0, 0), (16384, 16, 0), (4096, 8, 0), (32768, 16, 0), (8192, 8, 264))  # block, warps, programs


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


def sweep_variants(ctx, timer, gpu, args, dump):
    """all_reduce bf16 at 1, 16, 64, 256 MiB for each variant (pull one/two-shot, push one/two-shot) and
    kernel setting, heap and plain tensors, eager and graph; NCCL and symm_mem two_shot_all_reduce_ in
    the same run. Each (size, variant, setting, residence) is checked once before it is timed: out
    poisoned with NaN, every element equal to NCCL's result (inputs are small integers, so every sum
    is exact in any order). Kernels run with Config.spin_limit, so a variant that deadlocks gives up,
    is recorded as failed and the sweep goes on; the watchdog covers the rest."""
    rows, group = [], dist.group.WORLD
    symm = None
    if gpu:
        import torch.distributed._symmetric_memory as symm_mem
        symm = symm_mem
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group.group_name)
    sizes = [int(m) * MiB for m in args.sizes.split(",")] if args.sizes else (
        [s for s in (MiB, 16 * MiB, 64 * MiB, 256 * MiB) if s <= args.max_bytes] or [args.max_bytes])
    for nbytes in sizes:
        n = nbytes // 2
        calls = max(5, min(50, (256 * MiB) // nbytes)) if gpu else 2
        g = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
        x = torch.randint(-16, 16, (n,), device=ctx.device, generator=g).to(torch.bfloat16)
        ref = x.clone()
        dist.all_reduce(ref)
        base = {"bytes": nbytes, "calls_per_sample": calls}
        ref_row = dict(base, variant="reference")
        dump.tick(f"references {nbytes}")
        y = torch.empty_like(x)
        timer.both(ref_row, "nccl", lambda: dist.all_reduce(y), calls)
        if symm is not None:
            try:
                t = symm.empty(n, dtype=torch.bfloat16, device=ctx.device)
                symm.rendezvous(t, group.group_name)
                t.copy_(x)
                timer.both(ref_row, "symm_two_shot",
                           lambda: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group.group_name), calls)
                del t
            except Exception as e:
                ref_row["symm_error"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(ref_row)
        dump.save(rows)
        xh, yh = ctx.empty(n, dtype=torch.bfloat16).copy_(x), ctx.empty(n, dtype=torch.bfloat16)
        tensors = {"plain": (x, y), "heap": (xh, yh)}
        variants = [v for v, top in (("one_shot", 16 * MiB), ("two_shot", None), ("one_shot_push", 64 * MiB),
                                     ("two_shot_push", None), ("atomic", 64 * MiB), ("spinlock", 16 * MiB),
                                     ("ring", None)) if (top is None or nbytes <= top)
                    and (not args.variants or v in args.variants.split(","))]
        for variant in variants:
            for block, warps, programs in SWEEP_SETTINGS[:args.settings] if gpu else SWEEP_SETTINGS[:2]:
                cfg = Config(block_size=block, num_warps=warps or None, comm_sms=programs or None,
                             all_reduce_variant=variant, spin_limit=args.spin_limit)
                for where, (x_, y_) in tensors.items():
                    row = dict(base, variant=variant, block_size=block, num_warps=warps, comm_sms=programs,
                               tensors=where)
                    dump.tick(f"{variant} {nbytes} {block}/{warps}/{programs} {where}")
                    row["ok"] = check_once(ctx, cfg, x_, y_, ref, row, gpu)
                    if not row["ok"] and row["gave_up"]:  # maybe a peer still compiling: once more, fresh plan
                        ctx.ccl.free()
                        row["first_try"] = {k: row.pop(k) for k in ("wrong_elements", "gave_up", "error") if k in row}
                        row["ok"] = check_once(ctx, cfg, x_, y_, ref, row, gpu)
                    if row["ok"]:
                        timer.both(row, "iris", lambda: ctx.ccl.all_reduce(y_, x_, config=cfg), calls)
                        row["gave_up_while_timed"] = gave_up(ctx, cfg, x_, y_)
                    rows.append(row)
                ctx.ccl.free()
                dump.save(rows)
            if ctx.rank == 0:
                done = [r for r in rows if r["bytes"] == nbytes and r.get("variant") == variant]
                print(f"sweep {_size(nbytes)} {variant}: " + "; ".join(
                    f"{r['block_size']}/{r['num_warps']}/{r['comm_sms']} {r['tensors']} "
                    + (f"{r.get('iris_graph_us') or 0:.1f}" if r["ok"] else "FAILED") for r in done), flush=True)
        ctx.free(yh)
        ctx.free(xh)
    return rows


def gave_up(ctx, cfg, x, y):
    """Whether a program of this call's plan gave up waiting (Config.spin_limit), on any rank."""
    plan = ctx.ccl.plans.get(("ar", ReduceOp.SUM, x.shape, y.shape, x.dtype, cfg.key()))
    mine = bool(plan is not None and (plan.args[plan.at["flags"]] < 0).any().item())
    return bool(slowest(int(mine)))


def check_once(ctx, cfg, x, y, ref, row, gpu):
    """One call into a NaN-poisoned out, compared with NCCL's result element by element; True where every
    rank got it right. A host error is recorded; every rank makes the same collective calls either way."""
    try:
        y.fill_(float("nan"))
        ctx.ccl.all_reduce(y, x, config=cfg)
        torch.cuda.synchronize() if gpu else None
        row["wrong_elements"] = int((y != ref).sum().item())  # NaN != anything: a poisoned element left counts
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    row["gave_up"] = gave_up(ctx, cfg, x, y)
    return not slowest(int("error" in row or row["wrong_elements"] > 0 or row["gave_up"]))


def _size(nbytes):
    return f"{nbytes >> 20}M" if nbytes >= MiB else f"{nbytes >> 10}K"


def sweep_table(rows):
    """One line per (size, variant, setting): graph / eager us for plain and heap tensors."""
    def f(v):
        return f"{v:7.1f}" if v else f"{'-':>7}"
    lines = ["all_reduce bf16 variant sweep, us per call: plain graph/eager | heap graph/eager",
             f"{'size':>5} {'variant':<14} {'blk/warps/progs':<16} {'plain':>15} | {'heap':>15}"]
    keyed = {}
    for r in rows:
        if r["variant"] == "reference":
            lines.append(f"{_size(r['bytes']):>5} {'nccl':<14} {'':<16} {f(r.get('nccl_graph_us'))}/"
                         f"{f(r.get('nccl_eager_us'))} | symm_mem two-shot {f(r.get('symm_two_shot_graph_us'))}/"
                         f"{f(r.get('symm_two_shot_eager_us'))}")
            continue
        keyed.setdefault((r["bytes"], r["variant"], r["block_size"], r["num_warps"], r["comm_sms"]), {})[r["tensors"]] = r
    for (nbytes, variant, b, w, p), by in keyed.items():
        cells = []
        for where in ("plain", "heap"):
            r = by.get(where)
            cells.append("FAILED" if r is None or not r["ok"] else
                         f"{f(r.get('iris_graph_us'))}/{f(r.get('iris_eager_us'))}")
        lines.append(f"{_size(nbytes):>5} {variant:<14} {f'{b}/{w}/{p}':<16} {cells[0]:>15} | {cells[1]:>15}")
    return "\n".join(lines)


class Dump:
    """Rank 0 rewrites the sweep's JSON after every step, so a run ended early keeps what it measured."""

    def __init__(self, rank, args):
        self.rank, self.args, self.rows, self.watchdog = rank, args, [], None

    def tick(self, step):
        if self.watchdog is not None:
            self.watchdog.tick(step)

    def save(self, rows, note=None):
        self.rows = rows
        if self.rank != 0:
            return None
        payload = {"dtype": "bfloat16", "units": "microseconds per call, median", "sweep": rows,
                   "settings": "block_size/num_warps/comm_sms, 0 = default (8192 bf16 elements, 8 warps, one "
                               "program per SM)", "spin_limit": self.args.spin_limit,
                   "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
                   "table": sweep_table(rows).splitlines()}
        if note:
            payload["note"] = note
        if torch.cuda.is_available() and torch.cuda.device_count() < dist.get_world_size():
            payload["caveat"] = (f"{dist.get_world_size()} ranks on {torch.cuda.device_count()} GPU(s): the ranks' "
                                 "kernels time-slice one GPU and their peer traffic never crosses NVLink, so these "
                                 "times compare variants' synchronisation and host costs, not bandwidth between GPUs")
        return write_result("collectives_variants", payload, self.args.out)

    def __call__(self, note):
        self.save(self.rows, note)


def table(ar, moves):
    def f(v):
        return f"{v:8.1f}" if v else f"{'-':>8}"
    lines = ["all_reduce bf16, us per call (eager / graph)",
             f"{'bytes':>10} {'iris':>17} {'1-shot':>17} {'2-shot':>17} {'heap':>17} {'nccl':>17} {'symm 1-shot':>17} "
             f"{'symm 2-shot':>17}"]
    for r in ar:
        cells = [f"{f(r.get(k + '_eager_us'))}/{f(r.get(k + '_graph_us'))}"
                 for k in ("iris", "iris_one_shot", "iris_two_shot", "iris_heap", "nccl", "symm_one_shot",
                           "symm_two_shot")]
        lines.append(f"{r['bytes']:>10} " + " ".join(cells) + f"  auto={r['variant_auto']}")
    lines.append("all_gather / reduce_scatter / all_to_all bf16, graph us: iris vs nccl (eager in JSON)")
    for r in moves:
        cells = [f"{f(r.get(f'iris_{k}_graph_us'))}/{f(r.get(f'nccl_{k}_graph_us'))}"
                 for k in ("all_gather", "reduce_scatter", "all_to_all")]
        lines.append(f"{r['bytes']:>10} " + " ".join(cells) + ("" if r["checked_vs_nccl"] else " DATA WRONG"))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON file (rank 0); default benchmarks/results/collectives-<gpu|host>-<n>ranks.json")
    p.add_argument("--max-bytes", type=int, default=256 * MiB)
    p.add_argument("--samples", type=int, default=7)
    p.add_argument("--dry-run", action="store_true", help="host: tiny sizes, gloo, no graphs")
    p.add_argument("--sweep-variants", action="store_true",
                   help="only the all_reduce variant/setting sweep (1, 16, 64, 256 MiB; JSON collectives_variants-*)")
    p.add_argument("--sizes", default="", help="--sweep-variants: comma list of sizes in MiB (default 1,16,64,256)")
    p.add_argument("--variants", default="", help="--sweep-variants: comma list of variants (default all)")
    p.add_argument("--settings", type=int, default=None, help="--sweep-variants: only the first N kernel settings")
    p.add_argument("--spin-limit", type=int, default=1 << 24,
                   help="--sweep-variants: Config.spin_limit of every kernel (polls before a program gives up)")
    p.add_argument("--watchdog", type=float, default=120.0,
                   help="--sweep-variants: seconds without progress before a rank dumps its results and ends")
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.dry_run
    if args.dry_run:
        args.max_bytes = min(args.max_bytes, KiB)
    rank, world = init_torch_distributed()
    if args.sweep_variants:
        return main_sweep(args, gpu, rank, world)
    ctx = iris.iris(heap_size=(8 * args.max_bytes * world + 256 * MiB) if gpu else 1 << 26)
    sizes = [1 << p for p in range(10, 29, 2) if (1 << p) <= args.max_bytes]
    if gpu and args.max_bytes >= MiB and MiB not in sizes:
        sizes = sorted(sizes + [MiB])
    timer = Timer(ctx, gpu, args.samples if gpu else 1)
    timer.max_bytes = args.max_bytes
    host = host_costs(ctx, timer, gpu)
    tuning = sweep(ctx, timer, gpu)
    ar = all_reduce_rows(ctx, timer, sizes, gpu)
    moves = move_rows(ctx, timer, [s for s in sizes if s >= 4 * KiB or not gpu], gpu)
    if rank == 0:
        text = table(ar, moves)
        path = write_result("collectives", {"dtype": "bfloat16", "units": "microseconds per call, median",
                                            "host_costs": host, "two_shot_sweep": tuning, "all_reduce": ar,
                                            "moves": moves,
                                            "env": {k: os.environ.get(k) for k in
                                                    ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
                                            "table": text.splitlines()}, args.out)
        print(text)
        print(f"wrote {path}")
    ok = all(r["checked_vs_nccl"] for r in moves) and all(
        r.get("iris_max_abs_diff_vs_nccl", 0) == 0 for r in ar) if world == 2 and gpu else True
    ctx.barrier()
    ctx.close()
    dist.destroy_process_group()
    return 0 if ok else 1


def main_sweep(args, gpu, rank, world) -> int:
    ctx = iris.iris(heap_size=(6 * args.max_bytes + 512 * MiB) if gpu else 1 << 26)
    timer = Timer(ctx, gpu, args.samples if gpu else 1)
    dump = Dump(rank, args)
    dump.watchdog = Watchdog(args.watchdog, dump)
    rows = sweep_variants(ctx, timer, gpu, args, dump)
    path = dump.save(rows)
    if rank == 0:
        print(sweep_table(rows))
        print(f"wrote {path}")
    ok = all(r["ok"] for r in rows if r["variant"] in ("one_shot", "two_shot"))  # the measured kernels
    ctx.barrier()
    ctx.close()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
