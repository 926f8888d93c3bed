"""The ceiling of SM-driven copies over NVLink: hand-written CUDA (16-byte loads and stores, and
Hopper's bulk copy engine, TMA) against the copy engine, between two GPUs, in one run. It shows
whether iris's Triton put/get (benchmarks/rma_bandwidth.py) leave bandwidth on the table.

    python -m iris.run -n 2 benchmarks/sm_copy_ceiling.py     # GPUs only; compiles with CuPy (NVRTC)

CuPy is not a dependency of iris: this benchmark alone uses it, to compile plain CUDA C.
"""
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import timed, write_result  # noqa: E402

import iris  # noqa: E402

CODE = r'''
extern "C" __global__ void copy_v4(const uint4* __restrict__ src, uint4* __restrict__ dst, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a; dst[i + stride] = b; dst[i + 2 * stride] = c; dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}
extern "C" __global__ void bulk_copy(const char* __restrict__ src, char* __restrict__ dst, unsigned long long nbytes, unsigned int chunk) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar;
  if (threadIdx.x != 0) return;
  unsigned int sbar = (unsigned int)__cvta_generic_to_shared(&bar);
  unsigned int sbuf = (unsigned int)__cvta_generic_to_shared(smem);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sbar));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  unsigned int phase = 0;
  for (unsigned long long off = (unsigned long long)blockIdx.x * chunk; off < nbytes; off += (unsigned long long)gridDim.x * chunk) {
    unsigned long long left = nbytes - off;
    unsigned int n = left < chunk ? (unsigned int)left : chunk;
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(sbar), "r"(n) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(sbuf), "l"(src + off), "r"(n), "r"(sbar) : "memory");
    unsigned int done = 0;
    while (!done) {
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(sbar), "r"(phase) : "memory");
    }
    phase ^= 1;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" :: "l"(dst + off), "r"(sbuf), "r"(n) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
'''


def main():
    ctx = iris.iris(heap_size=1 << 40, allocator="vmem")
    me, dev = ctx.get_rank(), ctx.get_device()
    if dev.type != "cuda" or ctx.get_num_ranks() != 2:
        sys.exit("needs two ranks on GPUs: python -m iris.run -n 2 benchmarks/sm_copy_ceiling.py")
    n_max = 1 << 30
    src = ctx.empty(n_max, dtype=torch.uint8)
    src.copy_(torch.arange(n_max, device=dev, dtype=torch.int32).to(torch.uint8) + me)
    dst = ctx.full((n_max,), 0xAB, dtype=torch.uint8)
    ctx.barrier()
    rows, checked = [], {}
    if me == 0:
        import cupy as cp
        cp.cuda.Device(dev.index).use()
        mod = cp.RawModule(code=CODE, options=("-std=c++17",))
        copy_v4, bulk = mod.get_function("copy_v4"), mod.get_function("bulk_copy")
        bulk.max_dynamic_shared_size_bytes = 200 * 1024
        peer_dst, peer_src = ctx.peer_view(dst, 1), ctx.peer_view(src, 1)

        def row(method, direction, config, fn, nbytes):
            g = nbytes / statistics.median(timed(dev, fn, 20)) / 1e9
            rows.append({"method": method, "direction": direction, "config": config, "bytes": nbytes, "GBps": g})
            print(f"{method:>10} {direction} {config:>16} {nbytes >> 20:6d} MiB {g:7.1f} GB/s", flush=True)

        def P(t):
            return np.uint64(t.data_ptr())
        for nbytes in (256 << 20, n_max):
            row("copy_", "put", "", lambda: peer_dst[:nbytes].copy_(src[:nbytes]), nbytes)
            row("copy_", "get", "", lambda: dst[:nbytes].copy_(peer_src[:nbytes]), nbytes)
            for blocks, threads in ((132, 512), (264, 512), (528, 256), (1056, 256), (132, 1024)):
                cfg = f"g{blocks} t{threads}"
                row("cuda v4", "put", cfg, lambda: copy_v4((blocks,), (threads,), (P(src), P(peer_dst), np.uint64(nbytes // 16))), nbytes)
                row("cuda v4", "get", cfg, lambda: copy_v4((blocks,), (threads,), (P(peer_src), P(dst), np.uint64(nbytes // 16))), nbytes)
            for chunk, per_sm in ((16384, 8), (32768, 4), (32768, 6), (65536, 3), (98304, 2), (196608, 1)):
                g, cfg = 132 * per_sm, f"c{chunk} g{132 * per_sm}"
                row("tma bulk", "put", cfg, lambda: bulk((g,), (32,), (P(src), P(peer_dst), np.uint64(nbytes), np.uint32(chunk)), shared_mem=chunk), nbytes)
                row("tma bulk", "get", cfg, lambda: bulk((g,), (32,), (P(peer_src), P(dst), np.uint64(nbytes), np.uint32(chunk)), shared_mem=chunk), nbytes)
            row("copy_", "put", "again", lambda: peer_dst[:nbytes].copy_(src[:nbytes]), nbytes)
        # the copies happened: every byte of one get of each kind
        for name, launch in (("tma bulk", lambda: bulk((264,), (32,), (P(peer_src), P(dst), np.uint64(n_max), np.uint32(32768)), shared_mem=32768)),
                             ("cuda v4", lambda: copy_v4((264,), (512,), (P(peer_src), P(dst), np.uint64(n_max // 16))))):
            dst.fill_(0xAB)
            torch.cuda.synchronize()
            launch()
            torch.cuda.synchronize()
            checked[name] = bool(torch.equal(dst, peer_src))
        print("checked:", checked)
        top = [r for r in rows if r["bytes"] == n_max]
        best = {f"{m} {d}": max(r["GBps"] for r in top if r["method"] == m and r["direction"] == d)
                for m in ("copy_", "cuda v4", "tma bulk") for d in ("put", "get")}
        summary = {k: {"GBps": v, "vs_copy_engine": v / best[f"copy_ {k.split()[-1]}"]} for k, v in best.items()}
        print(write_result("sm_copy_ceiling", {"rows": rows, "checked": checked, "best_at_1GiB": summary}))
    ctx.barrier()
    ctx.close()


if __name__ == "__main__":
    main()
