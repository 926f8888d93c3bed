"""What a put or get through iris costs to a direct peer in a job without indirect peers (plain), to a
direct peer from a kernel of a job with one (mixed: the same kernel carries NVSHMEM's path), and to an
indirect peer (NVSHMEM's device API), with NVSHMEM's host-side stream put (putmem_on_stream) as the
reference; eager and in a CUDA graph; writes every number and the ratios as JSON.

    python benchmarks/indirect.py [--max-mib 256] [--out PATH]

It runs two jobs of 2 ranks over allocator='nvshmem', one after the other: plain (no indirect peer),
then mixed (IRIS_INDIRECT_PEERS=all: heap_bases has 0 for the peer, so iris reaches it through NVSHMEM;
a second table built from nvshmem_ptr reaches the same peer by loads and stores from the same compiled
kernel). Rank 0 puts to and gets from rank 1, 4 KiB to max-mib; eager: median of CUDA-event-timed
launches; graph: median of replays of a graph of CALLS launches, per launch. Every element of a whole
put and a whole get is checked through each table; a graph of NVSHMEM's stream puts counts only where
its replay moved the data. The mixed job also times the form a tuned kernel takes (declared_run: tiles
declared one run with hint=BLOCK, 4 programs per SM of 16 warps), with NVSHMEM's block put called
directly on the same tiles as the control, and launch shapes at 16 and 256 MiB (launch_shapes).
The mixed job then runs ctx.ccl's all_reduce (4 KiB
to ccl-max-mib) and one all_gather through its put kernel on every rank, reaching the peer indirectly
and directly, beside the load/store kernel a job without indirect peers runs; each result is checked
element by element before it is timed. With both ranks on one GPU the collectives' kernels take turns
on it: compare the columns with each other, not with NVLink figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import captured, sync, timed, write_result  # noqa: E402

import iris  # noqa: E402
from iris.ccl import Config, ReduceOp, builders  # noqa: E402
from iris.device import nvshmem as nv  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
BLOCK, CALLS = 4096, 10
JOBS = {"plain": "", "mixed": "all"}  # job -> IRIS_INDIRECT_PEERS


@triton.jit
def copy_kernel(src, dst, n, me, peer, heap_bases, BLOCK: tl.constexpr, PUT: tl.constexpr, HINT: tl.constexpr = None):
    """Grid-stride loop over whole tiles: PUT writes my src into peer's dst; else reads peer's src into my dst.
    HINT: each tile one aligned run of HINT elements, declared to iris and on the kernel's own pointers."""
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        o = start + tl.arange(0, BLOCK)
        s, d = src + o, dst + o
        if HINT is not None:
            s, d = tl.max_contiguous(tl.multiple_of(s, HINT), HINT), tl.max_contiguous(tl.multiple_of(d, HINT), HINT)
        if PUT:
            iris.put(s, d, me, peer, heap_bases, hint=HINT)
        else:
            iris.get(s, d, me, peer, heap_bases, hint=HINT)


@triton.jit
def nvshmem_put_kernel(src, dst, n, peer, BLOCK: tl.constexpr):
    """The control: NVSHMEM's block put of each tile called directly, without iris's device functions."""
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        nv.putmem_block((dst + start).to(tl.int64), (src + start).to(tl.int64), tl.full([], BLOCK * 4, tl.int64),
                        tl.cast(peer, tl.int32))


def _graph_us(dev, fn, reps, check=None):
    """Median µs per call of fn from replays of a CUDA graph of CALLS calls; the error where capture fails.
    check(replay): whether one replay moved the data (a call that escapes the capture leaves none)."""
    try:
        graph = captured(fn, CALLS)
        if check is not None and not check(graph.replay):
            return "not captured: a replay of the graph left the destination as it was"
        return statistics.median(timed(dev, graph.replay, reps)) * 1e6 / CALLS
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        return f"capture failed: {type(e).__name__}: {str(e)[:200]}"


def _interleaved(dev, fns, rounds=10, reps=3):
    """{name_eager_us, name_graph_us}: medians of rounds x reps timings of each fn, eager and as a replay of
    a graph of CALLS calls (per call), the fns taking turns each round so that drift hits them alike."""
    graphs = {name: captured(fn, CALLS) for name, fn in fns.items()}
    eager, graph = {name: [] for name in fns}, {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            eager[name] += timed(dev, fn, reps, warmup=1)
            graph[name] += timed(dev, graphs[name].replay, reps, warmup=1)
    return {**{f"{n}_eager_us": statistics.median(t) * 1e6 for n, t in eager.items()},
            **{f"{n}_graph_us": statistics.median(t) * 1e6 / CALLS for n, t in graph.items()}}


def _landed(launch, src, dst, n, replay):
    """Whether replay() writes src[:n] into the peer's dst: poisons it there, replays, reads it back, each
    through launch(put, n, a, b) (copy_kernel over loads and stores; whole tiles)."""
    m = -(-n // BLOCK) * BLOCK
    launch(True, m, torch.full((m,), -7.0, device=src.device), dst)
    replay()
    back = torch.full((m,), -9.0, device=src.device)
    launch(False, m, dst, back)
    return bool(torch.equal(back[:n], src[:n]))


def _plans(ctx, kind, out, x, direct, cfg):
    """ctx.ccl's plans of one call shape: its put kernel reaching every peer through the heap's table
    (indirect where the entry is 0) and through the direct table, and the load/store kernel that a job
    without indirect peers runs, on the direct table. Built from ccl's plan builders, outside its cache."""
    ccl, sum_ = ctx.ccl, ReduceOp.SUM

    def build():
        if kind == "ar":
            return builders.all_reduce(ccl, out, x, sum_, cfg)
        return builders.whole(ccl, "ag", out, x, sum_, cfg)

    plans = {"put_indirect": build(), "put_direct": build()}
    ccl.puts = False
    try:
        plans["loadstore_direct"] = build()
    finally:
        ccl.puts = True
    for how in ("put_direct", "loadstore_direct"):
        plan = plans[how]
        plan.args[plan.at["heap_bases"]] = direct
    return plans


def ccl_rows(ctx, direct, sizes, ag_bytes, reps) -> list:
    """all_reduce at each size and one all_gather (ag_bytes per rank), fp32, every rank: each plan's
    result checked element by element, then timed (µs, median of this rank's calls)."""
    me, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    cfg = Config()
    rows = []
    for kind, nbytes in [("ar", b) for b in sizes] + [("ag", ag_bytes)]:
        n = nbytes // 4
        x = ctx.empty(n, dtype=torch.float32)
        x.copy_((torch.arange(n, device=dev) % 1000 + me).float())
        out = torch.empty(n * (w if kind == "ag" else 1), dtype=torch.float32, device=dev)
        if kind == "ar":
            want = (torch.arange(n, device=dev) % 1000).float() * w + w * (w - 1) // 2
        else:
            want = torch.cat([(torch.arange(n, device=dev) % 1000 + q).float() for q in range(w)])
        row = {"collective": "all_reduce" if kind == "ar" else "all_gather", "bytes": nbytes}
        for how, plan in _plans(ctx, kind, out, x, direct, cfg).items():
            out.fill_(float("nan"))
            plan(x, out)
            sync(dev)
            row[f"{how}_exact"] = bool(torch.equal(out, want))
            secs = timed(dev, lambda: plan(x, out), reps=reps)
            row[f"{how}_us"] = statistics.median(secs) * 1e6
            row[f"{how}_kernel"] = plan.fn.__name__
            for t in plan.workspace:  # the plans are outside ccl's cache: give their heap buffers back now
                if ctx.is_symmetric(t):
                    ctx.free(t)
        row["put_indirect_over_put_direct"] = row["put_indirect_us"] / row["put_direct_us"]
        row["put_indirect_over_loadstore"] = row["put_indirect_us"] / row["loadstore_direct_us"]
        rows.append(row)
        if me == 0:
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        ctx.free(x)
    return rows


def _job(name, max_mib, ccl_max_mib=0, reps=20):
    """One job's rank: rank 0 times every size through each table and returns its numbers."""
    from iris.experimental import nvshmem_runtime
    t0 = time.perf_counter()
    # put/get buffers, then a collective's input and its plans' buffers (at most 4x its size each)
    ctx = iris.iris(heap_size=(2 * max_mib + 8 * ccl_max_mib + 64) * MiB, allocator="nvshmem")
    me, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    peer, n_max = 1 - me, max_mib * MiB // 4
    print(f"{time.strftime('%H:%M:%S')} {name} rank {me}: heap ready in {time.perf_counter() - t0:.1f} s", flush=True)
    src, dst = ctx.empty(n_max, dtype=torch.float32), ctx.full((n_max,), -1.0, dtype=torch.float32)
    src.copy_(torch.arange(n_max, device=dev, dtype=torch.float32) + 1000 * me)
    hb = ctx.get_heap_bases()
    if (hb[peer].item() == 0) != (name == "mixed"):
        raise RuntimeError(f"{name} job: heap_bases[{peer}] = {hb[peer].item():#x}, IRIS_INDIRECT_PEERS="
                           f"{os.environ.get('IRIS_INDIRECT_PEERS')!r}")
    tables = {"direct": hb}
    if name == "mixed":
        base = ctx.heap.alloc.base
        tables = {"direct": torch.tensor([nvshmem_runtime.peer_ptr(base, r) for r in range(w)], dtype=torch.int64,
                                         device=dev), "indirect": hb}
    grid = (torch.cuda.get_device_properties(dev).multi_processor_count,)
    out = {"tables": list(tables), "kernels": {}, "checks": {}, "rows": []}

    def launch(table, put, n, a=src, b=dst):
        return copy_kernel[grid](a, b, n, me, peer, table, BLOCK=BLOCK, PUT=put)

    ctx.barrier()
    for how, table in tables.items():  # every element of a whole put (checked on the peer) and a whole get
        for op, put in (("put", True), ("get", False)):
            dst.fill_(-1.0)
            torch.cuda.synchronize()
            ctx.barrier()
            if me == 0:
                t = time.perf_counter()
                k = launch(table, put, n_max)
                torch.cuda.synchronize()
                if op not in out["kernels"]:
                    out["kernels"][op] = {"first_launch_s": time.perf_counter() - t, "registers": k.n_regs,
                                          "spills": k.n_spills, "shared_bytes": k.metadata.shared,
                                          "nvshmem_in_code": "nvshmem" in k.asm["ptx"]}
            ctx.barrier()
            holder, origin = (1, 0) if put else (0, 1)  # who holds the result, whose src it is
            if me == holder:
                want = torch.arange(n_max, device=dev, dtype=torch.float32) + 1000 * origin
                out["checks"][f"{how}_{op}_exact"] = bool(torch.equal(dst, want))
    ctx.barrier()
    print(f"{time.strftime('%H:%M:%S')} {name} rank {me}: compiled and checked {out['checks']}", flush=True)
    if me == 0:
        on_stream = nvshmem_runtime.load()[1].putmem_on_stream

        def put_on_stream(d, s, b, pe):  # the stream current at the call: a graph's capture stream
            on_stream(d, s, b, pe, torch.cuda.current_stream(dev).cuda_stream)
        nbytes = 4 * KiB
        while nbytes <= max_mib * MiB:
            n, reps = nbytes // 4, 10 if nbytes >= 64 * MiB else 30
            row = {"bytes": nbytes}
            for how, table in tables.items():
                for op, put in (("put", True), ("get", False)):
                    fn = (lambda t=table, p=put, c=n: launch(t, p, c))
                    row[f"{how}_{op}_eager_us"] = statistics.median(timed(dev, fn, reps)) * 1e6
                    row[f"{how}_{op}_graph_us"] = _graph_us(dev, fn, reps)
            if name == "plain":
                fn = (lambda b=nbytes: put_on_stream(dst.data_ptr(), src.data_ptr(), b, peer))
                row["nvshmem_stream_put_eager_us"] = statistics.median(timed(dev, fn, reps)) * 1e6
            out["rows"].append(row)
            print(f"{time.strftime('%H:%M:%S')} {name}: " + ", ".join(
                f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
            nbytes *= 4
        if name == "mixed":  # the launch shape: NVSHMEM's block copy keeps one 16-byte store per thread in flight
            out["shapes"] = _shapes(ctx, src, dst, tables, grid[0], max_mib)
            out["declared"] = _declared(ctx, src, dst, tables, grid[0], max_mib)
        for row in out["rows"] if name == "plain" else ():  # last: a failed capture must not cost the rest
            fn = (lambda b=row["bytes"]: put_on_stream(dst.data_ptr(), src.data_ptr(), b, peer))
            row["nvshmem_stream_put_graph_us"] = _graph_us(dev, fn, 3 if row["bytes"] >= 64 * MiB else 6,
                                                           check=lambda r, c=row["bytes"] // 4: _landed(
                                                               lambda p, m, a, b: launch(hb, p, m, a, b), src, dst, c, r))
            if isinstance(row["nvshmem_stream_put_graph_us"], str):
                break
    ctx.barrier()
    if ccl_max_mib and name == "mixed" and ctx.ccl.puts:  # every rank: ctx.ccl runs its put kernel here
        sizes = [4 * KiB << (2 * i) for i in range(12) if 4 * KiB << (2 * i) <= ccl_max_mib * MiB]
        out["collectives"] = ccl_rows(ctx, tables["direct"], sizes, MiB, reps)
    ctx.barrier()
    ctx.close()
    return out


def _declared(ctx, src, dst, tables, sms, max_mib, per_sm=4, warps=16):
    """A put and a get of 1 MiB and up as a program that declares its tiles one run writes them
    (hint=BLOCK, 4 programs per SM of 16 warps), tiles of 2048, 4096 and 16384 fp32: µs through each
    table, and of NVSHMEM's block put called directly on the same tiles (the control), eager and from a
    CUDA graph, taking turns (medians of 30), with each kernel's registers (4 programs of 16 warps fit
    an SM at 32 or fewer)."""
    me, dev, rows, nbytes = ctx.get_rank(), ctx.get_device(), [], MiB
    grid, peer = (sms * per_sm,), 1 - me
    while nbytes <= max_mib * MiB:
        for block in (BLOCK // 2, BLOCK, 4 * BLOCK):
            row = {"bytes": nbytes, "block": block, "programs_per_sm": per_sm, "num_warps": warps}
            fns = {f"{how}_{op}": (lambda t=table, p=(op == "put"), b=nbytes, k=block: copy_kernel[grid](
                src, dst, b // 4, me, peer, t, BLOCK=k, PUT=p, HINT=k, num_warps=warps))
                for how, table in tables.items() for op in ("put", "get")}
            fns["nvshmem_block_put"] = (lambda b=nbytes, k=block: nvshmem_put_kernel[grid](
                src, dst, b // 4, peer, BLOCK=k, num_warps=warps))
            row.update(_interleaved(dev, fns))
            for name, fn in fns.items():
                row[f"{name}_registers"] = fn().n_regs
            for mode in ("eager", "graph"):
                for op in ("put", "get"):
                    row[f"indirect_over_direct_{op}_{mode}"] = _ratio(row[f"indirect_{op}_{mode}_us"],
                                                                      row[f"direct_{op}_{mode}_us"])
                row[f"indirect_over_nvshmem_block_put_{mode}"] = _ratio(row[f"indirect_put_{mode}_us"],
                                                                        row[f"nvshmem_block_put_{mode}_us"])
            rows.append(row)
            print(f"{time.strftime('%H:%M:%S')} declared run: " + ", ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
        nbytes *= 4
    return rows


def _shapes(ctx, src, dst, tables, sms, max_mib):
    """Eager µs of a put through each table at large sizes, by programs per SM and warps per program, and
    of the same tiles moved by NVSHMEM's block put called directly (the control: what NVSHMEM itself costs),
    and through iris.put with hint=BLOCK (the tile declared one run: only the mask is tested)."""
    me, dev, rows = ctx.get_rank(), ctx.get_device(), []
    for nbytes in (b for b in (16 * MiB, 256 * MiB) if b <= max_mib * MiB):
        for per_sm in (1, 4, 16):
            for warps in (4, 16):
                row = {"bytes": nbytes, "programs_per_sm": per_sm, "num_warps": warps}
                for how, table in tables.items():
                    fn = (lambda t=table: copy_kernel[(sms * per_sm,)](src, dst, nbytes // 4, me, 1 - me, t, BLOCK=BLOCK,
                                                                      PUT=True, num_warps=warps))
                    row[f"{how}_put_eager_us"] = statistics.median(timed(dev, fn, 10)) * 1e6
                fn = (lambda: copy_kernel[(sms * per_sm,)](src, dst, nbytes // 4, me, 1 - me, tables["indirect"],
                                                           BLOCK=BLOCK, PUT=True, HINT=BLOCK, num_warps=warps))
                row["indirect_put_hint_block_eager_us"] = statistics.median(timed(dev, fn, 10)) * 1e6
                fn = (lambda: nvshmem_put_kernel[(sms * per_sm,)](src, dst, nbytes // 4, 1 - me, BLOCK=BLOCK,
                                                                  num_warps=warps))
                row["nvshmem_block_put_eager_us"] = statistics.median(timed(dev, fn, 10)) * 1e6
                rows.append(row)
                print(f"{time.strftime('%H:%M:%S')} shape: " + ", ".join(
                    f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    return rows


def _ratio(a, b):
    return a / b if isinstance(a, float) and isinstance(b, float) else None


def merge(plain, mixed):
    """One row per size: every number of both jobs under names that say which job and peer, and the ratios."""
    rows = []
    for p, m in zip(plain["rows"], mixed["rows"]):
        row = {"bytes": p["bytes"]}
        row.update({k.replace("direct_", "direct_plain_", 1) if k.startswith("direct_") else k: v
                    for k, v in p.items() if k != "bytes"})
        row.update({k.replace("direct_", "direct_mixed_", 1) if k.startswith("direct_") else k: v
                    for k, v in m.items() if k != "bytes"})
        for op in ("put", "get"):
            for mode in ("eager", "graph"):
                plain_us = row.get(f"direct_plain_{op}_{mode}_us")
                row[f"direct_mixed_over_plain_{op}_{mode}"] = _ratio(row.get(f"direct_mixed_{op}_{mode}_us"), plain_us)
                row[f"indirect_over_direct_{op}_{mode}"] = _ratio(row.get(f"indirect_{op}_{mode}_us"), plain_us)
        for mode in ("eager", "graph"):
            row[f"indirect_put_over_nvshmem_stream_put_{mode}"] = _ratio(row.get(f"indirect_put_{mode}_us"),
                                                                        row.get(f"nvshmem_stream_put_{mode}_us"))
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-mib", type=int, default=256)
    p.add_argument("--timeout", type=float, default=150.0, help="seconds each job may take")
    p.add_argument("--ccl-max-mib", type=int, default=64, help="largest all_reduce; 0 leaves the collectives out")
    p.add_argument("--reps", type=int, default=20, help="timed calls of each collective")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    results = {}
    for name, setting in JOBS.items():
        os.environ["IRIS_INDIRECT_PEERS"] = setting  # read by the ranks when they import iris
        results[name] = iris.spawn(_job, 2, args=(name, args.max_mib, args.ccl_max_mib, args.reps), timeout=args.timeout)
    checks = {f"{name}_{k}": v for name, ranks in results.items() for r in ranks for k, v in r["checks"].items()}
    rows = merge(results["plain"][0], results["mixed"][0])
    path = write_result("indirect", {
        "world_size": 2,
        "kernel": f"copy_kernel: grid = SM count, tiles of {BLOCK} fp32, iris.put/iris.get per tile",
        "graph_calls": CALLS,
        "kernels": {name: ranks[0]["kernels"] for name, ranks in results.items()},
        "checks": checks, "all_exact": all(checks.values()),
        "rows": rows,
        "launch_shapes": results["mixed"][0].get("shapes", []),
        "declared_run": results["mixed"][0].get("declared", []),
        "collectives": results["mixed"][0].get("collectives", []),
        "note": "plain: a job without indirect peers; mixed: IRIS_INDIRECT_PEERS=all, the kernel carries NVSHMEM's "
                "path; direct_mixed: that kernel with a table from nvshmem_ptr (loads and stores); indirect: the "
                "same kernel with heap_bases (nvshmemx_putmem_block/getmem_block, NVSHMEM's peer-to-peer path: "
                "both ranks share one GPU); ratios against direct_plain"}, args.out)
    for row in rows:
        print(f"{row['bytes'] >> 10:>8} KiB  direct in a mixed job / plain: " + " ".join(
            f"{k[len('direct_mixed_over_plain_'):]} {row[k]:.2f}" for k in row
            if k.startswith("direct_mixed_over_plain_") and row[k]) + "   indirect / direct: " + " ".join(
            f"{k[len('indirect_over_direct_'):]} {row[k]:.2f}" for k in row
            if k.startswith("indirect_over_direct_") and row[k]), flush=True)
    print("wrote", path, "all exact" if all(checks.values()) else f"NOT EXACT: {checks}", flush=True)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
