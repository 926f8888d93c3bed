"""A tensor-parallel MLP with its communication fused into the GEMMs.

    python -m iris.run -n 2 examples/31_fused_tensor_parallel.py

The tokens x (T x d) are sharded by rows (T/world per rank). Layer 1 is column-parallel: every rank
holds d x h/world columns of W1 and needs all tokens, so it runs all_gather_matmul (the gather of x
hidden behind the GEMM). Layer 2 is row-parallel: every rank holds the matching h/world rows of W2,
so y = sum over ranks of gelu(.) @ W2_r, which is matmul_all_reduce. Checked against the same MLP on
one device, then timed against the unfused version: all_gather, torch.matmul, torch.matmul,
all_reduce, through torch.distributed (NCCL on GPUs, gloo on the host), or through iris's own
ctx.ccl where ranks share a GPU (NCCL refuses two ranks on one device). ctx.ops picks each op's
variant by shape (docs/collectives.md): on 2 GPUs the fused all_gather_matmul kernel, and for
layer 2's 4096 rows the streamed matmul_all_reduce (cuBLAS by chunks, copy-engine transfers).
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import iris


def mlp_fused(ctx, x_local, W1_r, W2_r, h, y):
    ctx.ops.all_gather_matmul(h, x_local, W1_r)
    ctx.ops.matmul_all_reduce(y, F.gelu(h), W2_r)
    return y


def mlp_unfused(comm, x_local, x_full, W1_r, W2_r):
    comm.all_gather(x_full, x_local)
    y = F.gelu(x_full @ W1_r) @ W2_r
    comm.all_reduce(y)
    return y


class TorchDistributed:
    """The unfused reference's collectives from torch.distributed: NCCL on GPUs, gloo on the host."""

    def __init__(self, ctx, dev):
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29541")
        self.name = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(self.name, rank=ctx.get_rank(), world_size=ctx.get_num_ranks(),
                                **({"device_id": dev} if dev.type == "cuda" else {}))

    all_gather = staticmethod(getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)  # the newer name
    all_reduce = staticmethod(dist.all_reduce)

    def close(self):
        dist.barrier()
        dist.destroy_process_group()


class IrisCCL:
    """The same collectives from iris's ctx.ccl, for ranks that share a GPU."""

    name = "iris ccl"

    def __init__(self, ctx, dev):
        self.ctx = ctx

    def all_gather(self, out, inp):
        self.ctx.ccl.all_gather(out, inp)

    def all_reduce(self, y):
        self.ctx.ccl.all_reduce(y, y)

    def close(self):
        pass


def timed(ctx, dev, fn, reps):
    for _ in range(2):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    ctx.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


def main() -> int:
    ctx = iris.iris(heap_size=1 << 30 if torch.cuda.is_available() else 1 << 24)
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    gpu = dev.type == "cuda"
    shared_gpu = gpu and torch.cuda.device_count() < w  # rank r runs on GPU r % device_count
    comm = (IrisCCL if shared_gpu else TorchDistributed)(ctx, dev)
    T, d, hid = (4096, 4096, 16384) if gpu else (16 * w, 32, 48)
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(0)  # every rank builds the same full weights and tokens
    x = torch.randn(T, d, generator=g).to(dtype)
    W1 = (torch.randn(d, hid, generator=g) / d ** 0.5).to(dtype)
    W2 = (torch.randn(hid, d, generator=g) / hid ** 0.5).to(dtype)
    t, c = T // w, hid // w
    x_local = x[r * t:(r + 1) * t].to(dev)
    W1_r = W1[:, r * c:(r + 1) * c].contiguous().to(dev)
    W2_r = W2[r * c:(r + 1) * c].contiguous().to(dev)
    h = torch.empty(T, c, dtype=dtype, device=dev)
    y = torch.full((T, d), float("nan"), dtype=dtype, device=dev)

    mlp_fused(ctx, x_local, W1_r, W2_r, h, y)
    ref = F.gelu(x.to(dev).float() @ W1.to(dev).float()) @ W2.to(dev).float()
    err = (y.float() - ref).abs().max().item()
    ok = err <= 0.03 * ref.abs().max().item() + 0.05
    x_full = torch.empty(T, d, dtype=dtype, device=dev)
    err_unfused = (mlp_unfused(comm, x_local, x_full, W1_r, W2_r).float() - ref).abs().max().item()
    ok = ok and err_unfused <= 0.03 * ref.abs().max().item() + 0.05

    reps = 20 if gpu else 2
    t_fused = timed(ctx, dev, lambda: mlp_fused(ctx, x_local, W1_r, W2_r, h, y), reps)
    t_unfused = timed(ctx, dev, lambda: mlp_unfused(comm, x_local, x_full, W1_r, W2_r), reps)
    if r == 0:
        print(f"MLP T={T} d={d} hidden={hid} on {w} ranks ({dev.type}): max error fused {err:.3g}, "
              f"unfused {err_unfused:.3g} -> {'OK' if ok else 'WRONG'}")
        print(f"fused {t_fused * 1e6:.0f} us, unfused ({comm.name}) {t_unfused * 1e6:.0f} us per forward "
              f"({t_unfused / t_fused:.2f}x)")
    comm.close()
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
