"""A checkpoint onto the heap: iris's loader against safetensors and iris v1, warm and cold, with
the machine's ceilings (reading the files alone, pinned host-to-device copies) in the same run.

    python -m iris.run -n 1 benchmarks/load_weights.py [--gib 8] [--files 4] [--dir /tmp/...]

A Llama-shaped checkpoint (embedding, per layer q/k/v/o, gate/up/down, two norms; bf16) in
--files files with an index, as models ship, written once into --dir and reused. Every rank
loads all of it (sharded loads: the part it keeps). Warm: the files are in the page cache. Cold:
posix_fadvise(DONTNEED) on every file first (all ranks, then a barrier). Per path: seconds and
GB/s of the slowest rank, device bytes outside the heap at peak, pinned host bytes at peak.
"""
import argparse
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import init_torch_distributed, write_result  # noqa: E402

import iris  # noqa: E402
from iris.weights import READERS  # noqa: E402


def layout(gib: float):
    """name -> shape of a Llama-like model of about gib GiB in bf16."""
    h, vocab = (4096, 32000) if gib >= 4 else (1024, 32000) if gib >= 0.2 else (512, 8000)
    ffn = (h * 11008 // 4096) // 64 * 64
    per_layer = 2 * (4 * h * h + 3 * h * ffn + 2 * h)
    layers = max(1, int((gib * 2**30 - 2 * 2 * vocab * h) // per_layer))
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (h, h),
                       p + "self_attn.v_proj.weight": (h, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (ffn, h), p + "mlp.up_proj.weight": (ffn, h),
                       p + "mlp.down_proj.weight": (h, ffn)})
    return shapes


def write_checkpoint(folder: str, shapes: dict, nfiles: int) -> list:
    """The checkpoint in nfiles files plus model.safetensors.index.json; reused when it matches."""
    from safetensors.torch import save_file
    index_path = os.path.join(folder, "model.safetensors.index.json")
    names = list(shapes)
    files = [f"model-{k + 1:05d}-of-{nfiles:05d}.safetensors" for k in range(nfiles)]
    if os.path.exists(index_path):
        with open(index_path) as f:
            old = json.load(f)
        if old.get("metadata", {}).get("shapes") == {n: list(s) for n, s in shapes.items()}:
            return [os.path.join(folder, f) for f in files]
    os.makedirs(folder, exist_ok=True)
    pool = torch.randn(64 << 20, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    total = sum(torch.Size(s).numel() for s in shapes.values())
    weight_map, at, done = {}, 0, 0
    for k, fname in enumerate(files):
        part = {}
        while names and (done < total * (k + 1) // nfiles or k == nfiles - 1):
            n = names.pop(0)
            numel = torch.Size(shapes[n]).numel()
            half = pool.numel() // 2  # pieces of at most half the pool, from offsets in its first half
            part[n] = torch.cat([pool[(at + i) % half:][:min(numel - i, half)]
                                 for i in range(0, numel, half)]).reshape(shapes[n])
            at, done = at + 7919, done + numel
            weight_map[n] = fname
        save_file(part, os.path.join(folder, fname))
    with open(index_path, "w") as f:
        json.dump({"metadata": {"shapes": {n: list(s) for n, s in shapes.items()}}, "weight_map": weight_map}, f)
    os.sync()  # dirty pages cannot be dropped: cold runs need them on disk
    return [os.path.join(folder, f) for f in files]


def drop_cache(files) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_alone(files, threads: int = 1) -> int:
    """Read every byte into a reused buffer, nothing else: the disk's (or page cache's) speed.
    threads > 1: each thread reads its own files' share of the bytes, as iris's loader does."""
    sizes = [os.path.getsize(f) for f in files]
    spans = [(f, o, min(16 << 20, s - o)) for f, s in zip(files, sizes) for o in range(0, s, 16 << 20)]
    k = len(spans)

    def work(part):
        buf, fds = bytearray(16 << 20), {}
        for f, o, n in part:
            if f not in fds:
                fds[f] = os.open(f, os.O_RDONLY)
            fd = fds[f]
            os.preadv(fd, [memoryview(buf)[:n]], o)
        for fd in fds.values():
            os.close(fd)
    parts = [spans[i * k // threads:(i + 1) * k // threads] for i in range(threads)]
    ts = [threading.Thread(target=work, args=(p,)) for p in parts]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(sizes)


def iris_v1(ctx, files, shard=None):
    """iris's loader before the pipeline, kept as the reference: per tensor, read through
    safetensors on the CPU and copy from pageable memory into a heap tensor."""
    from safetensors import safe_open
    out = {}
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in sorted(f.keys()):
                part = f.get_slice(name)
                index = shard(name, tuple(part.get_shape())) if shard else None
                src = part[index] if index is not None else part[:]
                dst = ctx.empty(src.shape, dtype=src.dtype)
                dst.copy_(src)
                out[name] = dst
    return out


def safetensors_load(files, dev):
    """safetensors' own loader. On the host load_file maps the file and reads nothing until the
    tensors are touched, so there each tensor is cloned: the bytes are read, as on a GPU."""
    from safetensors.torch import load_file
    out = {}
    for path in files:
        got = load_file(path, device=str(dev))
        out.update(got if dev.type == "cuda" else {k: v.clone() for k, v in got.items()})
    return out


def h2d_ceiling(dev, nbytes: int = 1 << 30) -> float:
    """Pinned host to device copy speed, GB/s (on the host: a CPU memcpy of the same size)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=dev.type == "cuda").fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    best = float("inf")
    for _ in range(5):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


class Probe:
    """Device bytes torch holds above the start at peak, and pinned host bytes at peak, during a run."""

    def __init__(self, dev):
        self.dev = dev

    def __enter__(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            reset = getattr(torch.cuda.memory, "reset_peak_host_memory_stats", None)
            self.pinned0 = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) if reset else None
            if reset:
                reset()
        return self

    def __exit__(self, *exc):
        self.device_bytes, self.pinned_bytes = 0, 0
        if self.dev.type == "cuda":
            torch.cuda.synchronize()
            self.device_bytes = torch.cuda.max_memory_allocated() - self.base
            stats = torch.cuda.host_memory_stats()
            self.pinned_bytes = None if self.pinned0 is None else stats.get("allocated_bytes.peak", 0) - self.pinned0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=None, help="checkpoint size (default 8 on GPUs, 0.25 on the host)")
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--dir", default=None, help="checkpoint folder (default /tmp/iris-load-weights-...)")
    ap.add_argument("--reps", type=int, default=2, help="warm repetitions (the best is kept)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold runs (no page-cache dropping)")
    ap.add_argument("--row-by-row", action="store_true",
                    help="also load column shards with max_gap=0 (one read per row: 871k reads, 69 s for 8 GiB on an H200)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rank, world = init_torch_distributed()
    ctx = iris.iris(heap_size=1 << 40, allocator="vmem")
    dev = ctx.get_device()
    if dev.type == "cpu":
        torch.set_num_threads(1)  # torch's intra-op threads stall on a shared host and slow every torch copy
    gib = args.gib or (8 if dev.type == "cuda" else 0.25)
    shapes = layout(gib)
    folder = args.dir or f"/tmp/iris-load-weights-{os.getuid()}-{gib:g}g-{args.files}f"
    if rank == 0:
        files = write_checkpoint(folder, shapes, args.files)
    dist.barrier()
    files = write_checkpoint(folder, shapes, args.files) if rank else files
    nbytes = sum(torch.Size(s).numel() * 2 for s in shapes.values())
    ceiling = h2d_ceiling(dev)
    reference = {}

    def run(label, fn, cold):
        """Seconds of the slowest rank (best of reps when warm), bytes outside the heap, pinned bytes."""
        best = None
        for _ in range(1 if cold else args.reps):
            if cold:
                drop_cache(files)
            else:
                read_alone(files)  # everything in the page cache
            dist.barrier()
            with Probe(dev) as probe:
                t = time.perf_counter()
                out = fn()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                sec = time.perf_counter() - t
            sec = max(ctx.heap.group.allgather(sec))
            checked = None
            if isinstance(out, dict):
                if label == "safetensors load_file" and not cold:
                    reference.update(out)
                elif reference and len(out) == len(reference):
                    checked = all(torch.equal(out[n], reference[n]) for n in reference)
                stats = getattr(out, "stats", {})
                for t_ in out.values():
                    if ctx.is_symmetric(t_):
                        ctx.free(t_)
                del out
            else:
                stats = {}
            row = {"path": label, "cold": cold, "seconds": sec, "GBps": nbytes / sec / 1e9,
                   "device_bytes_outside_heap": probe.device_bytes,
                   "pinned_bytes": stats.get("pinned_bytes", probe.pinned_bytes), "checked": checked}
            if best is None or sec < best["seconds"]:
                best = row
        if dev.type == "cuda" and label != "safetensors load_file":
            torch.cuda.empty_cache()
        return best

    paths = [("read the files alone, 1 thread", lambda: read_alone(files, 1)),
             (f"read the files alone, {READERS} threads", lambda: read_alone(files, READERS)),
             ("safetensors load_file", lambda: safetensors_load(files, dev)),
             ("iris v1 (safe_open + copy per tensor)", lambda: iris_v1(ctx, files)),
             ("iris load_safetensors", lambda: ctx.load_safetensors(folder))]
    rows = [run(label, fn, False) for label, fn in paths]
    reference.clear()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    if not args.no_cold:
        rows += [run(label, fn, True) for label, fn in paths]

    # sharded: this rank's part of every matrix over max(2, world) parts, warm
    parts, me = max(2, world), rank % max(2, world)

    def rows_of(name, shape):
        return (slice(me * shape[0] // parts, (me + 1) * shape[0] // parts),)

    def cols_of(name, shape):
        return (slice(None), slice(me * shape[1] // parts, (me + 1) * shape[1] // parts)) if len(shape) == 2 else None
    sharded, whole = [], safetensors_load(files, dev)  # every shard is checked against it
    shards = [("rows", rows_of, {}), ("columns, near rows as one range", cols_of, {}),
              ("columns, covering range", cols_of, {"max_gap": 1 << 40})]
    if args.row_by_row:
        shards.append(("columns, row by row", cols_of, {"max_gap": 0}))
    for label, fn, kw in shards:
        read_alone(files)
        dist.barrier()
        t = time.perf_counter()
        out = ctx.load_safetensors(folder, shard=fn, **kw)
        sec = max(ctx.heap.group.allgather(time.perf_counter() - t))
        ok = all(torch.equal(out[n], v[fn(n, tuple(v.shape))] if fn(n, tuple(v.shape)) else v)
                 for n, v in whole.items())
        sharded.append({"shard": label, "parts": parts, "seconds": sec, "checked": ok, **out.stats})
        for t_ in out.values():
            ctx.free(t_)
        del out

    gathered = ctx.heap.group.allgather({"rows": rows, "sharded": sharded})
    if rank == 0:
        print(f"{len(shapes)} tensors, {nbytes / 2**30:.2f} GiB in {args.files} files, {world} ranks each loading all;"
              f" pinned host-to-device ceiling {ceiling:.1f} GB/s")
        print(f"{'path':>42} {'':>5} {'s':>7} {'GB/s':>7} {'dev MiB':>8} {'pinned MiB':>10} checked")
        for row in rows:
            print(f"{row['path']:>42} {'cold' if row['cold'] else 'warm':>5} {row['seconds']:7.3f} {row['GBps']:7.2f} "
                  f"{row['device_bytes_outside_heap'] / 2**20:8.0f} {(row['pinned_bytes'] or 0) / 2**20:10.0f} "
                  f"{row['checked']}")
        for s in sharded:
            print(f"shard {s['shard']:>32} 1/{s['parts']}: {s['seconds']:.3f} s, "
                  f"read {s['bytes_read'] / 2**20:.1f} MiB "
                  f"for {s['bytes_kept'] / 2**20:.1f} MiB kept in {s['reads']} reads, checked {s['checked']}")
        by = {(r["path"], r["cold"]): r["seconds"] for r in rows}
        goals = {"warm_vs_safetensors": by[("safetensors load_file", False)] / by[("iris load_safetensors", False)]}
        if not args.no_cold:
            alone = min(by[(p, True)] for p, _ in paths[:2])
            goals["cold_vs_read_alone"] = alone / by[("iris load_safetensors", True)]
        print("goals (>= 2 warm, >= 0.95 cold):", {k: round(v, 3) for k, v in goals.items()})
        print("wrote", write_result("load_weights", {
            "bytes": nbytes, "tensors": len(shapes), "files": args.files, "h2d_ceiling_GBps": ceiling,
            "readers": READERS, "goals": goals, "ranks": gathered}, args.out))
    ctx.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
