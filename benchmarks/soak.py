"""Soak: every collective and variant of ctx.ccl, the fused ops, and the torch backend (also from two
streams at once and with async_op=True and wait()), on fresh random data every call, every element
checked, eager and replayed from CUDA graphs, until --minutes run out. Then FSDP2 over "iris" against
one-process training (--fsdp runs). Writes JSON and prints a table; exits 1 on any mismatch.

    python -m iris.run -n 4 benchmarks/soak.py --minutes 10 [--fsdp 20] [--out FILE]
    python -m iris.run -n 2 benchmarks/soak.py --minutes 0.5 --max-elems 4096    # the host driver

Reductions are checked against a float64 reference: |got - ref| <= eps(dtype) |ref| + world 2^-22 sum|x|
(the kernels add in fp32 and round once); integer reductions and data movement must be exact. Every
rank draws every rank's input from one seed per call, so each computes the reference on its own.
Sizes run from 1 element to --max-elems (default 64 Mi elements: 256 MiB of fp32), odd ones included.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_result  # noqa: E402

import iris  # noqa: E402
from iris.ccl import Config, ReduceOp  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)
AR = ("one_shot", "two_shot", "one_shot_push", "two_shot_push", "ring", "atomic", "spinlock", "auto")
AG = ("pull", "persistent", "partitioned", "ring")
RS = ("two_shot", "ring_chunked")
SIZES = (1, 7, 33, 1000, 4097 * 33, (1 << 20) + 3, 3 << 20, (16 << 20) + 5, 64 << 20)


def inputs(shape, dtype, seed, world, device):
    """Every rank's input for one call, the same on every rank (one generator per source rank)."""
    out = []
    for q in range(world):
        g = torch.Generator(device=device).manual_seed(seed * 1009 + q)
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g, device=device).to(dtype))
        else:
            out.append(torch.randint(-1000, 1000, shape, generator=g, device=device, dtype=dtype))
    return out


def reduced(xs, op):
    """(float64 reference of op over xs, sum of |x|) for the tolerance."""
    acc = xs[0].double()
    for x in xs[1:]:
        acc = acc + x.double() if op == "sum" else torch.maximum(acc, x.double()) if op == "max" \
            else torch.minimum(acc, x.double())
    return acc, sum(x.double().abs() for x in xs)


def wrong(got, ref, scale, world):
    """Which elements of got are off the float64 reference (exact for integers)."""
    if not got.dtype.is_floating_point:
        return got.double() != ref
    tol = torch.finfo(got.dtype).eps * ref.abs() + world * 2.0 ** -22 * scale
    return (got.double() - ref).abs() > tol


def described(got, bad):
    """What the wrong elements hold: how many are still the poison (never written) or zero, and where
    the first and last sit (a wrong program's block shows as one run)."""
    idx = bad.reshape(-1).nonzero().view(-1)
    vals = got.reshape(-1)[idx]
    return (f"{int((vals == -7).sum())} poison, {int((vals == 0).sum())} zero, at [{int(idx[0])}, {int(idx[-1])}] "
            f"of {bad.numel()}, first {vals[:4].tolist()}")


class Soak:
    def __init__(self, ctx, args):
        self.ctx, self.args = ctx, args
        self.r, self.w, self.dev = ctx.rank, ctx.world, ctx.get_device()
        self.stats = collections.defaultdict(lambda: [0, 0, 0])  # case -> [calls, elements, wrong]
        self.sizes = [s for s in SIZES if s <= args.max_elems] or [1]
        self.call = self.plans = 0

    def note(self, case, got, bad):
        """Count one call of case; bad: the mask of got's wrong elements."""
        s = self.stats[case]
        n = int(bad.sum())
        s[0] += 1
        s[1] += got.numel()
        s[2] += n
        plans = len(self.ctx.ccl.plans)
        new, self.plans = plans != self.plans, plans
        if n:
            print(f"rank {self.r}: MISMATCH {case} (call {self.call}{', a new plan' * new}): {n} elements; "
                  f"{described(got, bad)}", flush=True)

    def seed(self):
        self.call += 1
        return self.call

    # -- ctx.ccl ---------------------------------------------------------------------------------
    def all_reduce(self, variant, dtype, n, op, graph=False):
        if variant in ("atomic", "spinlock") and op != "sum":
            return
        cfg = Config(all_reduce_variant=variant)
        case = f"all_reduce {variant} {str(dtype)[6:]} {op}" + " graph" * graph
        red = {"sum": ReduceOp.SUM, "max": ReduceOp.MAX, "min": ReduceOp.MIN}[op]
        out = torch.empty(n, dtype=dtype, device=self.dev)
        x = torch.empty(n, dtype=dtype, device=self.dev)
        if graph:
            self.ctx.ccl.all_reduce_preamble(out, x, config=cfg, op=red)
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                self.ctx.ccl.all_reduce(out, x, op=red, config=cfg)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                self.ctx.ccl.all_reduce(out, x, op=red, config=cfg)
        for _ in range(self.reps(n)):
            xs = inputs((n,), dtype, self.seed(), self.w, self.dev)
            x.copy_(xs[self.r])
            out.fill_(-7)
            if graph:
                g.replay()
            else:
                self.ctx.ccl.all_reduce(out, x, op=red, config=cfg)
            ref, scale = reduced(xs, op)
            self.note(case, out, wrong(out, ref, scale, self.w))
        if graph:
            del g

    def moves(self, dtype, n):
        w, r, dev, ccl = self.w, self.r, self.dev, self.ctx.ccl
        for v in AG:
            cfg = Config(all_gather_variant=v, comm_sms=4 * w if v == "partitioned" else None)
            for _ in range(self.reps(n)):
                xs = inputs((n,), dtype, self.seed(), w, dev)
                out = torch.full((w * n,), -7, dtype=dtype, device=dev)
                ccl.all_gather(out, xs[r], config=cfg)
                self.note(f"all_gather {v} {str(dtype)[6:]}", out, out != torch.cat(xs))
            self.settle(w * n)
        for v in RS:
            cfg = Config(reduce_scatter_variant=v)
            for _ in range(self.reps(n)):
                xs = inputs((w * n,), dtype, self.seed(), w, dev)
                out = torch.full((n,), -7, dtype=dtype, device=dev)
                ccl.reduce_scatter(out, xs[r], config=cfg)
                ref, scale = reduced([x[r * n:(r + 1) * n] for x in xs], "sum")
                self.note(f"reduce_scatter {v} {str(dtype)[6:]}", out, wrong(out, ref, scale, w))
            self.settle(w * n)
        rows = max(1, n // 8)
        for _ in range(self.reps(n)):
            xs = inputs((rows, 8 * w), dtype, self.seed(), w, dev)
            out = torch.full((rows, 8 * w), -7, dtype=dtype, device=dev)
            ccl.all_to_all(out, xs[r])
            want = torch.cat([xs[q][:, r * 8:(r + 1) * 8] for q in range(w)], 1)
            self.note(f"all_to_all {str(dtype)[6:]}", out, out != want)
        for _ in range(self.reps(n)):
            src = self.call % w
            xs = inputs((n,), dtype, self.seed(), w, dev)
            out = torch.full((n,), -7, dtype=dtype, device=dev)
            ccl.broadcast(out, xs[r], src=src)
            self.note(f"broadcast {str(dtype)[6:]}", out, out != xs[src])

    def reps(self, n):
        return max(2, min(self.args.reps, (8 << 20) // max(n, 1)))

    # -- fused ops -------------------------------------------------------------------------------
    def fused(self):
        """ctx.ops by default dispatch, then matmul_all_reduce and matmul_reduce_scatter through the device
        tile API's collectives (FusedConfig(variant="tiles"), each all_reduce_variant)."""
        from iris.ops import FusedConfig
        w, r, dev = self.w, self.r, self.dev
        m, k, nn = 256, 128 * w, 192
        tiles = [("matmul_all_reduce", v) for v in ("one_shot", "two_shot", "spinlock", "atomic", "ring")]
        cases = [(name, None) for name in ("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul")]
        for name, variant in cases + tiles + [("matmul_reduce_scatter", "two_shot")]:
            cfg = None if variant is None else FusedConfig(block_size_m=64, block_size_n=64, block_size_k=64,
                                                            variant="tiles", all_reduce_variant=variant)
            for _ in range(max(2, self.args.reps // 4)):
                a_all = inputs((m, k), torch.float32, self.seed(), 1, dev)[0]
                b = inputs((k, nn), torch.float32, self.seed(), 1, dev)[0]
                ks = k // w
                if name == "all_gather_matmul":
                    a_loc = a_all[r * (m // w):(r + 1) * (m // w)].contiguous()
                    out = torch.full((m, nn), -7.0, device=dev)
                    self.ctx.ops.all_gather_matmul(out, a_loc, b, config=cfg)
                    ref = a_all.double() @ b.double()
                else:
                    a_loc = a_all[:, r * ks:(r + 1) * ks].contiguous()
                    b_loc = b[r * ks:(r + 1) * ks].contiguous()
                    rows = m // w if name == "matmul_reduce_scatter" else m
                    out = self.ctx.full((rows, nn), -7.0, dtype=torch.float32)
                    getattr(self.ctx.ops, name)(out, a_loc, b_loc, config=cfg)
                    ref = a_all.double() @ b.double()
                    if name == "matmul_reduce_scatter":
                        ref = ref[r * rows:(r + 1) * rows]
                    out = out.clone()
                tol = 1e-2 * (a_all.abs().double() @ b.abs().double()).max()  # tf32 products
                self.note(f"ops {name}" + f" tiles {variant}" * (variant is not None), out,
                          (out.double() - ref).abs() > tol)

    # -- the torch backend -----------------------------------------------------------------------
    def backend(self, n, dtype):
        w, r, dev = self.w, self.r, self.dev
        gpu = dev.type == "cuda"
        streams = [torch.cuda.Stream(), torch.cuda.Stream()] if gpu else []
        on = (lambda i: torch.cuda.stream(streams[i])) if gpu else (lambda i: contextlib.nullcontext())
        for _ in range(self.reps(n)):
            xs = inputs((w * n,), dtype, self.seed(), w, dev)
            ys = inputs((n,), dtype, self.seed(), w, dev)
            ag = torch.full((w * n,), -7, dtype=dtype, device=dev)
            rs = torch.full((n,), -7, dtype=dtype, device=dev)
            mine_x, mine_y = xs[r].clone(), ys[r].clone()
            for s in streams:
                s.wait_stream(torch.cuda.current_stream())
            with on(0):  # FSDP2's pattern: all-gathers on one stream ...
                w1 = dist.all_gather_into_tensor(ag, mine_y, async_op=True)
            with on(1):  # ... reduce-scatters on another, both in flight
                w2 = dist.reduce_scatter_tensor(rs, mine_x, async_op=True)
            w1.wait()
            w2.wait()
            self.note(f"backend all_gather (2 streams) {str(dtype)[6:]}", ag, ag != torch.cat(ys))
            ref, scale = reduced([x[r * n:(r + 1) * n] for x in xs], "sum")
            self.note(f"backend reduce_scatter (2 streams) {str(dtype)[6:]}", rs, wrong(rs, ref, scale, w))
            t = ys[r].clone()
            dist.all_reduce(t)
            ref, scale = reduced(ys, "sum")
            self.note(f"backend all_reduce {str(dtype)[6:]}", t, wrong(t, ref, scale, w))
            a2a_in = inputs((w * 4,), dtype, self.seed(), w, dev)
            a2a = torch.full((w * 4,), -7, dtype=dtype, device=dev)
            dist.all_to_all_single(a2a, a2a_in[r])
            want = torch.cat([a2a_in[q][r * 4:(r + 1) * 4] for q in range(w)])
            self.note(f"backend all_to_all {str(dtype)[6:]}", a2a, a2a != want)
            b = ys[r].clone()
            dist.broadcast(b, src=self.call % w)
            self.note(f"backend broadcast {str(dtype)[6:]}", b, b != ys[self.call % w])

    def round(self, k):
        """One round: a size and dtype per round, every case at it (the same choice on every rank)."""
        n = self.sizes[k % len(self.sizes)]
        dtype = DTYPES[(k // len(self.sizes)) % len(DTYPES)]
        gpu = self.dev.type == "cuda"
        for v in AR:
            for op in ("sum", "max") if v in ("one_shot", "two_shot", "ring") else ("sum",):
                self.all_reduce(v, dtype, n, op)
                self.settle(n)
        if gpu:
            for v in ("one_shot", "two_shot_push", "auto"):
                self.all_reduce(v, dtype, n, "sum", graph=True)
                self.settle(n)
        self.moves(dtype, max(1, n // self.w))
        if k % len(self.sizes) == 0:
            self.fused()
        if n <= self.args.max_backend:
            self.backend(max(1, n // self.w), dtype)
        self.settle(n)

    def settle(self, n):
        """Large workspaces go back to the heap after each case: at 4 ranks and 64M elements the
        plans of one round's cases together outgrow the heap."""
        if n >= (1 << 20):
            self.ctx.ccl.free()


def fsdp_run(ctx, mixed, seed):
    """FSDP2 over "iris" on an MLP 64-256-256-8 (GELU), SGD lr 0.05, 6 steps, 16 samples per rank, against
    the same training in one process on every rank's batch; returns the largest parameter difference."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    w, r, dev = ctx.world, ctx.rank, ctx.get_device()

    def mlp():
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                                   torch.nn.GELU(), torch.nn.Linear(256, 8)).to(dev)
    ref, model = mlp(), mlp()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    kw = {"mp_policy": policy} if policy else {}
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **kw)
    fully_shard(model, **kw)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.05), torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(6):
        batches = [inputs((16, 64), torch.float32, seed * 100 + step, 1, dev)[0] + q for q in range(w)]
        targets = [inputs((16, 8), torch.float32, seed * 100 + step + 50, 1, dev)[0] * (q + 1) for q in range(w)]
        loss = torch.nn.functional.mse_loss(model(batches[r]).float(), targets[r])
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = torch.nn.functional.mse_loss(ref(torch.cat(batches)), torch.cat(targets))
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    diff = 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        diff = max(diff, float((full.detach().float() - q.detach().float()).abs().max()))
    return diff


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--max-elems", type=int, default=64 << 20)
    p.add_argument("--max-backend", type=int, default=16 << 20, help="largest size the backend phase runs")
    p.add_argument("--reps", type=int, default=40, help="calls per case and round at small sizes")
    p.add_argument("--fsdp", type=int, default=0, help="FSDP2 runs each of fp32 and bf16 (0: none)")
    p.add_argument("--heap", type=int, default=12 << 30)
    p.add_argument("--out", help="JSON file (rank 0); default benchmarks/results/soak-<gpu|host>-<n>ranks.json")
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    ctx = iris.iris(heap_size=args.heap if torch.cuda.is_available() else min(args.heap, 1 << 28))
    from iris.torch_backend import Options
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("iris", rank=ctx.rank, world_size=ctx.world, pg_options=Options(ctx=ctx))
    soak = Soak(ctx, args)
    start, k = time.monotonic(), 0
    while time.monotonic() - start < args.minutes * 60:
        go = torch.tensor([1 if time.monotonic() - start < args.minutes * 60 else 0])
        dist.all_reduce(go.to(soak.dev), op=dist.ReduceOp.MIN)  # every rank starts the round, or none
        soak.round(k)
        k += 1
        if ctx.rank == 0:
            print(f"round {k} ({time.monotonic() - start:.0f} s): size {soak.sizes[(k - 1) % len(soak.sizes)]}",
                  flush=True)
    ctx.barrier()
    fsdp = {}
    for mixed in (False, True):
        diffs = [fsdp_run(ctx, mixed, 7) for _ in range(args.fsdp)] if soak.dev.type == "cuda" else []
        if diffs:
            fsdp["bf16" if mixed else "fp32"] = {"runs": len(diffs), "max_diff": max(diffs),
                                                 "distinct": len(set(diffs))}
    stats = {case: dict(zip(("calls", "elements", "wrong"), v)) for case, v in sorted(soak.stats.items())}
    gathered = [None] * ctx.world
    dist.all_gather_object(gathered, stats)
    total_wrong = sum(v["wrong"] for s in gathered for v in s.values())
    if ctx.rank == 0:
        calls = sum(v["calls"] for v in gathered[0].values())
        print(f"{'case':48s} {'calls':>7s} {'elements':>14s} {'wrong (all ranks)':>18s}")
        for case in sorted(gathered[0]):
            print(f"{case:48s} {gathered[0][case]['calls']:7d} {gathered[0][case]['elements']:14d} "
                  f"{sum(s[case]['wrong'] for s in gathered):18d}")
        for kind, f in fsdp.items():
            print(f"FSDP2 {kind}: {f['runs']} runs, largest parameter difference from one-process training "
                  f"{f['max_diff']:.3g}, distinct results {f['distinct']}")
        print(f"{calls} calls per rank in {time.monotonic() - start:.0f} s over {k} rounds: {total_wrong} wrong "
              "elements, 0 hangs (every call returned)")
        write_result("soak", {"minutes": args.minutes, "rounds": k, "calls_per_rank": calls, "wrong": total_wrong,
                      "cases": gathered[0], "wrong_by_rank": [sum(v["wrong"] for v in s.values()) for s in gathered],
                      "fsdp": fsdp}, args.out)
    dist.destroy_process_group()
    ctx.close()
    return 1 if total_wrong or any(f["max_diff"] > (1e-6 if k == "fp32" else 2e-2) for k, f in fsdp.items()) else 0


if __name__ == "__main__":
    sys.exit(main())
