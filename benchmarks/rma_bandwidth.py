"""Put/get bandwidth and signal/barrier latency of iris's device functions, against the copy engine
and NCCL measured in the same run; writes every number and the ratios as JSON.

    python -m iris.run -n 2 benchmarks/rma_bandwidth.py --out benchmarks/results/rma_h200x2.json
    torchrun --nproc-per-node 4 benchmarks/rma_bandwidth.py --out benchmarks/results/rma_h200x4.json
    python -m iris.run -n 2 benchmarks/rma_bandwidth.py --dry-run     # tiny sizes on the host, no GPU
    python -m iris.run -n 2 benchmarks/rma_bandwidth.py --rank-check both --skip all_pairs   # the check's cost

Point to point (ranks 0 and 1, 4 KiB..1 GiB): iris put (0 writes 1's heap) and get (0 reads 1's
heap) against the copy engine (the faster of torch copy_ from cuda:0 to cuda:1 in one process and
copy_ into rank 1's heap as mapped in rank 0) and against NCCL send/recv; put again through a lean path
(block shrunk so that the grid covers every SM, arguments built once, Launcher.launch_trusted), timed
per launch like the rest and on the device alone ("queued": back-to-back launches behind a sleeping
kernel, so host launch cost is hidden) against the peer-map copy queued the same way. All pairs: every rank puts
a chunk to every other at once, against NCCL all_to_all_single. Latency: a signal's one-way time
(half a ping-pong between ranks 0 and 1) and device_barrier (eager launches, and replayed from a CUDA
graph) against NCCL all_reduce of one int. Times are medians of CUDA-event-timed repetitions
(perf_counter on the host); GB/s is 1e9 bytes/s.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")                 # no NVLink multicast (shared machines)
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RANK_CHECK_HELP, WAIT_BOUND_HELP, both_ways, command_line, nccl_unusable, timed  # noqa: E402

import iris  # noqa: E402
from iris.ccl.launch import Launcher  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


# -- kernels ---------------------------------------------------------------------------------------------
@triton.jit
def copy_kernel(src, dst, n, me, peer, heap_bases, BLOCK: tl.constexpr, MASKED: tl.constexpr, PUT: tl.constexpr):
    """Grid-stride loop: PUT writes my src[0:n] into peer's dst[0:n]; else reads peer's src into my dst."""
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        o = start + tl.arange(0, BLOCK)
        mask = o < n if MASKED else None
        if PUT:
            iris.put(src + o, dst + o, me, peer, heap_bases, mask=mask)
        else:
            iris.get(src + o, dst + o, me, peer, heap_bases, mask=mask)


@triton.jit
def all_pairs_kernel(src, dst, chunk, me, world, heap_bases, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    """Row r of my src into row me of rank r's dst, for every other rank r; blocks spread over programs."""
    blocks = tl.cdiv(chunk, BLOCK)
    for t in range(tl.program_id(0), (world - 1) * blocks, tl.num_programs(0)):
        peer = (me + 1 + t // blocks) % world
        o = (t % blocks) * BLOCK + tl.arange(0, BLOCK)
        if MASKED:
            iris.put(src + peer * chunk + o, dst + me * chunk + o, me, peer, heap_bases, mask=o < chunk)
        else:
            iris.put(src + peer * chunk + o, dst + me * chunk + o, me, peer, heap_bases)


@triton.jit
def ping_pong_kernel(flag, me, peer, heap_bases, rounds):
    """Rank 0 sets rank 1's flag to i + 1 and waits for its own; rank 1 answers."""
    for i in range(rounds):
        if me == 0:
            iris.signal(flag, i + 1, me, peer, heap_bases)
            iris.wait(flag, i + 1, me, me, heap_bases, cmp="ge")
        else:
            iris.wait(flag, i + 1, me, me, heap_bases, cmp="ge")
            iris.signal(flag, i + 1, me, peer, heap_bases)


# -- plumbing --------------------------------------------------------------------------------------------
def init_distributed(gpu: bool) -> tuple[int, int]:
    """torch.distributed for the references: NCCL on GPUs, gloo on the host. Under iris.run the ranks
    have IRIS_RANK/IRIS_WORLD_SIZE only, so MASTER_ADDR/PORT are made here (the port from the job's
    socket directory, the same on every rank)."""
    if "IRIS_RANK" in os.environ and "RANK" not in os.environ:
        os.environ["RANK"], os.environ["WORLD_SIZE"] = os.environ["IRIS_RANK"], os.environ["IRIS_WORLD_SIZE"]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        job = os.environ.get("IRIS_SOCKET_DIR", "")
        os.environ.setdefault("MASTER_PORT", str(20000 + sum(map(ord, job)) * 7919 % 20000))
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    if gpu:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl" if gpu and not nccl_unusable(world) else "gloo", rank=rank, world_size=world)
    return rank, world


def median(xs):
    return statistics.median(xs) if xs else None


def gather(obj) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds else None


def fmt(v):
    return f"{v:9.1f}" if v else f"{'-':>9}"


def ratio(a, b):
    return a / b if a and b else None


def reps_for(nbytes: int, dry: bool) -> int:
    return 3 if dry else int(min(200, max(10, (2 * GiB) // nbytes)))


def grid_for(n, block, programs):
    return (max(1, min(programs, triton.cdiv(n, block))),)


# -- measurements ----------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args):
        self.args, self.dry = args, args.dry_run
        self.gpu = torch.cuda.is_available() and not self.dry
        self.rank, self.world = init_distributed(self.gpu)
        # the collective references: NCCL's, gloo's on the host, none where ranks share a GPU
        self.no_nccl = nccl_unusable(self.world) if self.gpu else None
        self.ctx = iris.iris(heap_size=args.heap_mib * MiB)
        self.dev, self.hb = self.ctx.get_device(), self.ctx.get_heap_bases()
        self.sms = torch.cuda.get_device_properties(self.dev).multi_processor_count if self.gpu else 1
        small = dict(block=1024, num_warps=4, programs=4)  # for the interpreter; tune() picks the GPU's
        self.config = {"put": dict(small), "get": dict(small)}
        self.launchers = {}
        self.log = print if self.rank == 0 else (lambda *a, **k: None)

    def launch(self, kind, src, dst, n, peer, cfg=None):
        """One copy_kernel launch through iris.ccl.launch.Launcher (compiled once per grid and config, then
        launched directly: the JIT's per-call cost would dominate small sizes)."""
        cfg = cfg or self.config[kind]
        grid = grid_for(n, cfg["block"], cfg["programs"])
        key = (kind, grid, cfg["block"], cfg["num_warps"])
        launcher = self.launchers.get(key)
        if launcher is None:
            launcher = self.launchers[key] = Launcher(copy_kernel, grid, num_warps=cfg["num_warps"])
        launcher(src, dst, n, self.rank, peer, self.hb, cfg["block"], n % cfg["block"] != 0, kind == "put")

    def lean(self, src, dst, n, peer):
        """A put of n elements as a zero-argument call: the tuned block shrunk (not below 1024) until the
        grid reaches every SM (a 1 MiB put at the tuned 64 KiB block ran on 16 programs), its Launcher
        and argument tuple built once, then launch_trusted (no per-call specialization check)."""
        cfg = dict(self.config["put"])
        while cfg["block"] > 1024 and triton.cdiv(n, cfg["block"]) < self.sms:
            cfg["block"] //= 2
        launcher = Launcher(copy_kernel, grid_for(n, cfg["block"], cfg["programs"]), num_warps=cfg["num_warps"])
        args = (src, dst, n, self.rank, peer, self.hb, cfg["block"], n % cfg["block"] != 0, True)
        launcher(*args)  # compiles; later calls go straight to the compiled kernel
        return (lambda: launcher.launch_trusted(args)), cfg

    def queued(self, fn, reps):
        """Device seconds per call of reps back-to-back calls, enqueued behind a sleeping kernel so that the
        host's launch cost is hidden (it is in the per-launch times); also whether the host kept ahead."""
        import time
        if not self.gpu:
            return median(timed(self.dev, fn, reps)), True
        fn()
        torch.cuda.synchronize(self.dev)
        slept, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        slept.record()
        torch.cuda._sleep(int(reps * 100_000))  # ~50 us of cycles per call to enqueue
        start.record()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        end.record()
        host = time.perf_counter() - t
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps, host < slept.elapsed_time(start) / 1e3

    def tune(self, src, dst):
        """Pick block, warps and programs for put and get at one large size (rank 0 to rank 1)."""
        if self.dry:
            return []
        n, tried = min(self.args.max_bytes, 256 * MiB) // 4, []
        for kind in ("put", "get"):
            best = None
            for block in (4096, 8192, 16384):
                for warps in (8, 16):
                    for waves in (1, 2, 4):
                        cfg = dict(block=block, num_warps=warps, programs=self.sms * waves)
                        self.ctx.barrier()
                        t = median(timed(self.dev, lambda: self.launch(kind, src, dst, n, 1, cfg), 10)) \
                            if self.rank == 0 else None
                        self.ctx.barrier()
                        if self.rank == 0:
                            tried.append(dict(kind=kind, bytes=4 * n, GBps=gbps(4 * n, t), **cfg))
                            if best is None or t < best[0]:
                                best = (t, cfg)
            self.config[kind] = gather(best[1] if self.rank == 0 else None)[0]
            if best:
                self.log(f"tuned {kind}: {self.config[kind]} ({gbps(4 * n, best[0]):.1f} GB/s at {4 * n} bytes)")
        return tried

    def point_to_point(self):
        sizes = [1 << p for p in range(12, 17 if self.dry else 31) if (1 << p) <= self.args.max_bytes]
        top = max(sizes) // 4
        ctx, me, dev = self.ctx, self.rank, self.dev
        src = ctx.arange(top, dtype=torch.int32).add_(7 * me)   # in place: stays on the heap
        dst = ctx.full((top,), -1, dtype=torch.int32)
        tuning = self.tune(src, dst)
        two_gpus = self.gpu and torch.cuda.device_count() >= 2
        ce_dst = torch.empty(top, dtype=torch.int32, device="cuda:1") if two_gpus and me == 0 else None
        peer_dst = ctx.peer_view(dst, 1)
        rows = []
        self.log(f"{'bytes':>12} {'put':>9} {'get':>9} {'copy_xdev':>9} {'copy_map':>9} {'nccl':>9} {'put_lean':>9} "
                 f"{'put_devq':>9} {'copy_devq':>9}  GB/s (devq: device time, launches queued behind a sleep)")
        for nbytes in sizes:
            n, reps, row = nbytes // 4, reps_for(nbytes, self.dry), {"bytes": nbytes}
            # iris put and get, issued by rank 0; checked on the rank that received
            for kind in ("put", "get"):
                dst.fill_(-1)
                ctx.barrier()
                t = median(timed(dev, lambda: self.launch(kind, src, dst, n, 1), reps)) if me == 0 else None
                ctx.barrier()
                receiver = 1 if kind == "put" else 0
                ok = bool(torch.equal(dst[:n], torch.arange(n, dtype=torch.int32, device=dev) + 7 * (1 - receiver))
                          and (n == top or bool((dst[n:n + 1] == -1).all()))) if me == receiver else None
                both = gather((t, ok))
                row[f"{kind}_s"], row[f"{kind}_checked"] = both[0][0], both[receiver][1]
            # the copy engine: one process, cuda:0 -> cuda:1; and copy_ into rank 1's heap mapping. The
            # reference is the faster of the two (on the H200 pair: the mapping, ~395 GB/s vs ~240)
            row["copy_cross_device_s"] = gather(median(timed(dev, lambda: ce_dst[:n].copy_(src[:n]), reps))
                                          if ce_dst is not None else None)[0]
            ctx.barrier()
            row["copy_peer_map_s"] = gather(median(timed(dev, lambda: peer_dst[:n].copy_(src[:n]), reps))
                                            if me == 0 else None)[0]
            ctx.barrier()
            # NCCL (gloo on the host) send/recv, 0 -> 1: the slower side's median
            if me in (0, 1) and not self.no_nccl:
                op = (lambda: dist.send(src[:n], 1)) if me == 0 else (lambda: dist.recv(dst[:n], 0))
                t = median(timed(dev, op, reps))
            else:
                t = None
            row["nccl_sendrecv_s"] = max((x for x in gather(t) if x), default=None)
            row["copy_engine_s"] = min((x for x in (row["copy_cross_device_s"], row["copy_peer_map_s"]) if x),
                                       default=None)
            # put through the lean path (size-aware grid, prebuilt arguments): per launch as above, and on
            # the device alone (queued) against the copy engine's peer-map copy queued the same way
            dst.fill_(-1)
            ctx.barrier()
            lean = {}
            if me == 0:
                put, lean["cfg"] = self.lean(src, dst, n, 1)
                lean["put_lean_s"] = median(timed(dev, put, reps))
                lean["put_lean_queued_s"], lean["put_queue_held"] = self.queued(put, reps)
                lean["copy_peer_map_queued_s"], lean["copy_queue_held"] = self.queued(
                    lambda: peer_dst[:n].copy_(src[:n]), reps)
            ctx.barrier()
            ok = bool(torch.equal(dst[:n], torch.arange(n, dtype=torch.int32, device=dev))) if me == 1 else None
            both = gather((lean, ok))
            row.update(both[0][0])
            row["put_lean_checked"] = both[1][1] if self.world > 1 else None
            for key in ("put_lean", "put_lean_queued", "copy_peer_map_queued"):
                row[f"{key}_GBps"] = gbps(nbytes, row.get(f"{key}_s"))
            for key in ("put", "get", "copy_engine", "copy_cross_device", "copy_peer_map", "nccl_sendrecv"):
                row[f"{key}_GBps"] = gbps(nbytes, row[f"{key}_s"])
            for kind in ("put", "get"):
                row[f"{kind}_vs_copy_engine"] = ratio(row[f"{kind}_GBps"], row["copy_engine_GBps"])
                row[f"{kind}_vs_nccl"] = ratio(row[f"{kind}_GBps"], row["nccl_sendrecv_GBps"])
            row["put_lean_vs_copy_engine"] = ratio(row["put_lean_GBps"], row["copy_engine_GBps"])
            row["put_lean_queued_vs_copy_queued"] = ratio(row["put_lean_queued_GBps"], row["copy_peer_map_queued_GBps"])
            rows.append(row)
            self.log(f"{nbytes:>12} {fmt(row['put_GBps'])} {fmt(row['get_GBps'])} {fmt(row['copy_cross_device_GBps'])} "
                     f"{fmt(row['copy_peer_map_GBps'])} {fmt(row['nccl_sendrecv_GBps'])} {fmt(row['put_lean_GBps'])} "
                     f"{fmt(row['put_lean_queued_GBps'])} {fmt(row['copy_peer_map_queued_GBps'])}"
                     + ("" if row["put_checked"] and row["get_checked"] and row["put_lean_checked"] else "  DATA WRONG"))
        del ce_dst, peer_dst
        ctx.free(dst)
        ctx.free(src)
        return rows, tuning

    def all_pairs(self):
        chunks = [1 << p for p in range(12, 15 if self.dry else 29) if (1 << p) * self.world <= self.args.max_bytes]
        top, w, me, dev = max(chunks) // 4, self.world, self.rank, self.dev
        src = self.ctx.arange(w * top, dtype=torch.int32).add_(100 * me)
        dst = self.ctx.full((w * top,), -1, dtype=torch.int32)
        cfg, rows = self.config["put"], []
        self.log(f"{'bytes/pair':>12} {'iris':>9} {'nccl a2a':>9}  aggregate GB/s ({w} ranks)")
        for nbytes in chunks:
            n, reps = nbytes // 4, reps_for(nbytes * w, self.dry)
            send, recv = src[:w * n], dst[:w * n]   # row r of send goes to rank r, row r of recv came from it
            recv.fill_(-1)
            self.ctx.barrier()

            def iris_all_pairs():
                all_pairs_kernel[grid_for((w - 1) * n, cfg["block"], cfg["programs"])](
                    send, recv, n, me, w, self.hb, BLOCK=cfg["block"], MASKED=n % cfg["block"] != 0,
                    num_warps=cfg["num_warps"])
                self.ctx.device_barrier()  # every rank's puts have landed before the next round

            t_iris = max(gather(median(timed(dev, iris_all_pairs, reps))))
            self.ctx.barrier()
            base = torch.arange(n, dtype=torch.int32, device=dev)
            ok = all(torch.equal(recv[r * n:(r + 1) * n], base + me * n + 100 * r) for r in range(w) if r != me)
            t_nccl = None if self.no_nccl else max(gather(median(timed(dev, lambda: dist.all_to_all_single(recv, send),
                                                                         reps))))
            moved = w * (w - 1) * nbytes  # NCCL also copies each rank's own chunk; not counted
            row = {"bytes_per_pair": nbytes, "iris_s": t_iris, "nccl_all_to_all_s": t_nccl,
                   "iris_GBps": gbps(moved, t_iris), "nccl_all_to_all_GBps": gbps(moved, t_nccl),
                   "iris_checked": all(gather(ok))}
            row["iris_vs_nccl"] = ratio(row["iris_GBps"], row["nccl_all_to_all_GBps"])
            rows.append(row)
            self.log(f"{nbytes:>12} {fmt(row['iris_GBps'])} {fmt(row['nccl_all_to_all_GBps'])}"
                     + ("" if row["iris_checked"] else "  DATA WRONG"))
        self.ctx.free(dst)
        self.ctx.free(src)
        return rows

    def latency(self):
        ctx, me, dev, out = self.ctx, self.rank, self.dev, {}
        rounds = 20 if self.dry else self.args.latency_rounds
        flag = ctx.zeros(1, dtype=torch.int32)
        samples = []
        for r in [1] + [rounds] * (3 if self.dry else 5):  # the first compiles the kernel
            flag.zero_()
            ctx.barrier()
            if me in (0, 1):
                samples.append(timed(dev, lambda: ping_pong_kernel[(1,)](flag, me, 1 - me, self.hb, r, num_warps=1),
                                     1, warmup=0)[0])
            ctx.barrier()
        t = gather(median(samples[1:]) if me == 0 else None)[0]
        out["signal_one_way_us"] = t / (2 * rounds) * 1e6
        ctx.free(flag)
        ctx.device_barrier()  # allocates the flags before any timing or capture
        one = torch.ones(1, dtype=torch.int32, device=dev)
        k = 10 if self.dry else 200

        def loop(fn):
            return lambda: [fn() for _ in range(k)]

        refs = [] if self.no_nccl else [("nccl_all_reduce_int", lambda: dist.all_reduce(one))]
        for name, fn in [("device_barrier", ctx.device_barrier)] + refs:
            ctx.barrier()
            out[f"{name}_eager_us"] = max(gather(median(timed(dev, loop(fn), 5)) / k * 1e6))
            if self.gpu:
                try:
                    out[f"{name}_graph_us"] = max(gather(self.graph_time(loop(fn)) / k * 1e6))
                except Exception as e:  # report, keep the rest of the run
                    out[f"{name}_graph_error"] = f"{type(e).__name__}: {e}"[:300]
        for mode in ("eager", "graph"):
            out[f"device_barrier_vs_nccl_all_reduce_{mode}"] = ratio(out.get(f"device_barrier_{mode}_us"),
                                                                    out.get(f"nccl_all_reduce_int_{mode}_us"))
        return out

    def graph_time(self, fn) -> float:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        self.ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        self.ctx.barrier()
        return median(timed(self.dev, graph.replay, 5, warmup=1))


def goals(p2p):
    big = [r for r in p2p if r["bytes"] >= 64 * MiB]

    def every(key, floor):
        vals = [r.get(key) for r in big]
        return bool(vals) and all(v is not None and v >= floor for v in vals)

    small = [r for r in p2p if r["bytes"] in (MiB, 8 * MiB)]
    return {"put_lean_ge_90pct_copy_engine_at_1_and_8MiB": bool(small) and all(
                (r.get("put_lean_vs_copy_engine") or 0) >= 0.9 for r in small),
            "put_ge_95pct_copy_engine_from_64MiB": every("put_vs_copy_engine", 0.95),
            "get_ge_95pct_copy_engine_from_64MiB": every("get_vs_copy_engine", 0.95),
            "put_ahead_of_nccl_from_64MiB": every("put_vs_nccl", 1.0),
            "get_ahead_of_nccl_from_64MiB": every("get_vs_nccl", 1.0)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="JSON file to write (rank 0); default benchmarks/results/rma_bandwidth-"
                                      "<device>-<ranks>r-<date>.json, none for --dry-run")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, host timers, gloo: checks the script runs")
    parser.add_argument("--max-bytes", type=int, default=GiB, help="largest point-to-point size (default 1 GiB)")
    parser.add_argument("--heap-mib", type=int, default=None, help="heap per rank (default: 3 x max-bytes + 64 MiB)")
    parser.add_argument("--latency-rounds", type=int, default=10000, help="ping-pong round trips per sample")
    parser.add_argument("--skip", default="", help="comma list of sections to skip: p2p,all_pairs,latency")
    parser.add_argument("--rank-check", choices=("both",), help=RANK_CHECK_HELP)
    parser.add_argument("--wait-bound", choices=("both",), help=WAIT_BOUND_HELP)
    args = parser.parse_args(argv)
    for what in ("rank_check", "wait_bound"):
        if getattr(args, what) == "both":
            return both_ways(os.path.abspath(__file__), sys.argv[1:] if argv is None else argv, args.out,
                             "rma_bandwidth", what)
    if args.dry_run:
        args.max_bytes = min(args.max_bytes, 64 * KiB)
    if args.heap_mib is None:
        args.heap_mib = (3 * args.max_bytes) // MiB + 64
    skip = set(filter(None, args.skip.split(",")))

    b = Bench(args)
    if b.world < 2:
        print("needs at least 2 ranks: python -m iris.run -n 2 benchmarks/rma_bandwidth.py", file=sys.stderr)
        return 2
    result = {"benchmark": "rma_bandwidth", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "command": command_line(),
              "ranks": b.world, "dry_run": args.dry_run, "allocator": b.ctx.allocator_name,
              "rank_check": iris.settings.RANK_CHECK.get(),
              "spin_limit": iris.settings.SPIN_LIMIT.get(),
              "device": torch.cuda.get_device_name(b.dev) if b.gpu else "host (Triton interpreter)",
              "gpus_visible": torch.cuda.device_count() if b.gpu else 0,
              "multiprocessors": b.sms, "versions": {"torch": torch.__version__, "triton": triton.__version__,
                                                     "cuda": torch.version.cuda,
                                                     "nccl": ".".join(map(str, torch.cuda.nccl.version()))
                                                     if b.gpu else None},
              "units": {"*_s": "seconds, median", "*_GBps": "1e9 bytes per second", "*_us": "microseconds"},
              "notes": ["each repetition is one launch timed by its own CUDA events, so small sizes include the "
                        "host's launch cost; put/get launch through iris.ccl.launch.Launcher (the compiled kernel, "
                        "directly, after the first call)",
                        "all_pairs counts world*(world-1) chunks; NCCL's all_to_all also copies each rank's own",
                        "eager latencies include a launch per call; *_graph_* ones replay a captured CUDA graph"]}
    if b.no_nccl:
        result["references_skipped"] = {"NCCL": b.no_nccl}
    if "p2p" not in skip:
        result["point_to_point"], result["tuning"] = b.point_to_point()
        result["kernel_config"] = b.config
        result["goals"] = goals(result["point_to_point"])
    if "all_pairs" not in skip:
        result["all_pairs"] = b.all_pairs()
    if "latency" not in skip:
        result["latency"] = b.latency()
        b.log("latency: " + ", ".join(f"{k}={v:.2f}" for k, v in result["latency"].items() if isinstance(v, float)))
    if b.rank == 0:
        out = args.out
        if out is None and not args.dry_run:
            name = result["device"].replace(" ", "_")
            out = f"benchmarks/results/rma_bandwidth-{name}-{b.world}r-{datetime.date.today()}.json"
        if out:
            os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
            with open(out, "w") as f:
                json.dump(result, f, indent=1)
            print(f"wrote {out}")
        if "goals" in result:
            print("goals: " + json.dumps(result["goals"]))
    ok = all(r["put_checked"] and r["get_checked"] for r in result.get("point_to_point", [])) and \
        all(r["iris_checked"] for r in result.get("all_pairs", []))
    b.ctx.barrier()
    b.ctx.close()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
