"""The persistent GEMM the fused ops are built from: tile order, one tile's K loop, the epilogue.

One program per SM walks the tiles in grouped order (group_size_m row blocks share B's columns
while they are in L2). Operands are read with TMA tensor descriptors on Hopper and later (wgmma
through tl.dot); elsewhere, under the interpreter, and for strides TMA cannot take, with masked
pointer loads. Both paths take transposed operands: a TMA operand stored column-major is read as
its transpose's descriptor and flipped in registers (tl.trans), which wgmma consumes for free.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import settings
from ..ccl.kernels.common import _tile_mn
from ..ccl.launch import Launcher
from .config import FusedConfig

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SMEM_BYTES = 200 * 1024  # shared memory the pipeline's stages may take (H100/H200 have 227 KiB per block)
_INTERPRETED = tl.constexpr(settings.INTERPRET.get())


@triton.jit
def _dot_tile(a, b, off_m, off_n, M, N, K, sam, sak, sbk, sbn, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, TMA: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr, STAGES: tl.constexpr):
    """fp32 [BM, BN] = A[off_m:, :] @ B[:, off_n:]. a, b: tensor descriptors where TMA (A_T/B_T: the
    descriptor is over the transpose, column-major storage), else pointers with element strides.
    Under the interpreter the pointer path multiplies in fp32: its bf16 tl.dot returns garbage."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if TMA:
        for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES):
            if A_T:
                av = a.load([k * BK, off_m]).T
            else:
                av = a.load([off_m, k * BK])
            if B_T:
                bv = b.load([off_n, k * BK]).T
            else:
                bv = b.load([k * BK, off_n])
            acc = tl.dot(av, bv, acc)
    else:
        rm = off_m + tl.arange(0, BM)
        rn = off_n + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        pa = a + rm[:, None].to(tl.int64) * sam + rk[None, :] * sak
        pb = b + rk[:, None] * sbk + rn[None, :].to(tl.int64) * sbn
        for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES):
            kk = k * BK + rk
            av = tl.load(pa, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            bv = tl.load(pb, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
            if _INTERPRETED:
                av = av.to(tl.float32)
                bv = bv.to(tl.float32)
            acc = tl.dot(av, bv, acc)
            pa += BK * sak
            pb += BK * sbk
    return acc


@triton.jit
def _tile_ptrs(c, off_m, off_n, M, N, scm, scn, BM: tl.constexpr, BN: tl.constexpr):
    """Pointers and in-bounds mask of the [BM, BN] tile at (off_m, off_n) of an M x N matrix."""
    rm = off_m + tl.arange(0, BM)
    rn = off_n + tl.arange(0, BN)
    return c + rm[:, None].to(tl.int64) * scm + rn[None, :] * scn, (rm[:, None] < M) & (rn[None, :] < N)


@triton.jit
def _matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, TMA: tl.constexpr,
                   A_T: tl.constexpr, B_T: tl.constexpr, STAGES: tl.constexpr, FLATTEN: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _tile_mn(tile, num_m, num_n, GROUP_M)
        acc = _dot_tile(a, b, pid_m * BM, pid_n * BN, M, N, K, sam, sak, sbk, sbn, BM, BN, BK, TMA, A_T, B_T,
                        STAGES)
        if TMA:
            c.store([pid_m * BM, pid_n * BN], acc.to(c.dtype))
        else:
            p, mask = _tile_ptrs(c, pid_m * BM, pid_n * BN, M, N, scm, scn, BM, BN)
            tl.store(p, acc.to(c.dtype.element_ty), mask=mask)


def interpreted() -> bool:
    return settings.INTERPRET.get()


def tma_ok(*ts: torch.Tensor) -> bool:
    """Whether TMA can read these 2-D operands: Hopper or later, 16-byte aligned base and rows, one unit stride."""
    if interpreted() or not all(t.is_cuda for t in ts):
        return False
    if torch.cuda.get_device_capability(ts[0].device)[0] < 9:
        return False
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:  # Triton before 3.4
        return False
    for t in ts:
        e = t.element_size()
        if t.data_ptr() % 16 or not (t.stride(1) == 1 and t.stride(0) * e % 16 == 0 or
                                     t.stride(0) == 1 and t.stride(1) * e % 16 == 0):
            return False
    return True


def operand(t: torch.Tensor, block: tuple, tma: bool):
    """(what the kernel gets, transposed?) for a 2-D operand read in [block] tiles: a descriptor where tma
    (over t.T when t is column-major), else t itself (its strides go separately)."""
    if not tma:
        return t, False
    from triton.tools.tensor_descriptor import TensorDescriptor
    if not operand_transposed(t):
        return TensorDescriptor.from_tensor(t, list(block)), False
    return TensorDescriptor.from_tensor(t.t(), [block[1], block[0]]), True


def operand_transposed(t: torch.Tensor) -> bool:
    """Whether TMA reads t through its transpose (t is column-major)."""
    return not (t.stride(1) == 1 and (t.stride(0) != 1 or t.shape[1] == 1 or t.is_contiguous()))


def tile_args(A: torch.Tensor, B: torch.Tensor, t: "Tiles", *more: torch.Tensor, row_step: int = 0) -> tuple:
    """(a, b, kw) for a fused kernel: A and B as it takes them (TMA descriptors where TMA can read A, B
    and the tensors in more, else the tensors themselves) and t's tile constexprs and launch options
    by name (launch() passes those the kernel has). row_step: the kernel also starts A's tiles at
    multiples of that many rows; a column-major A is then read by TMA only where that is a 16-byte
    step (a TMA read's innermost coordinate must be 16-byte aligned, or the GPU stops at an illegal
    instruction)."""
    tma = tma_ok(A, B, *more) and not (row_step * A.element_size() % 16 and operand_transposed(A))
    a, a_t = operand(A, (t.bm, t.bk), tma)
    b, b_t = operand(B, (t.bk, t.bn), tma)
    return a, b, dict(BM=t.bm, BN=t.bn, BK=t.bk, GROUP_M=t.group_m, TMA=tma, A_T=a_t, B_T=b_t, STAGES=t.stages,
                      num_warps=t.warps, num_stages=t.stages)


def num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2


@dataclass(frozen=True)
class Tiles:
    """Resolved launch parameters."""
    bm: int
    bn: int
    bk: int
    group_m: int
    stages: int
    warps: int
    sms: int


def tiles_for(M: int, N: int, device: torch.device, config: FusedConfig | None, elem: int = 2) -> Tiles:
    """The config with its None fields chosen for an M x N output on device: 128 x 256 tiles, narrower
    where that leaves an SM without one (config=None: all of them so chosen, with 8 row blocks per group).
    Stages are cut to what fits in shared memory for elem-byte operands. One H200, N = 8192, graph us
    (gemm_comm-gemm-gpu-1ranks-shards.json): 128 x 256 took 48 / 92 / 175 / 352 where 128 x 128 took
    52 / 101 / 193 / 392 at M x K = 1024 x 2048, 2048 x 2048, 2048 x 4096, 2048 x 8192 (cuBLAS 47 / 91 /
    173 / 339)."""
    cfg = config or FusedConfig(block_size_m=None, block_size_n=None, block_size_k=None, group_size_m=8)
    if interpreted() or device.type != "cuda":
        bm, bn, bk, stages, warps = 16, 16, 16, 1, 4
    elif M <= 128:
        bm, bn, bk, stages, warps = 128, 64, 64, 4, 4
    elif M <= 2048 and triton.cdiv(M, 128) * triton.cdiv(N, 256) < num_sms(device):
        bm, bn, bk, stages, warps = 128, 128, 64, 4, 8
    else:
        bm, bn, bk, stages, warps = 128, 256, 64, 3, 8
    bm, bn, bk = cfg.block_size_m or bm, cfg.block_size_n or bn, cfg.block_size_k or bk
    stages = max(1, min(cfg.num_stages or stages, SMEM_BYTES // ((bm + bn) * bk * elem)))
    return Tiles(bm, bn, bk, cfg.group_size_m, stages, cfg.num_warps or warps, cfg.num_sms or num_sms(device))


def launch(ws: dict, kernel, tensors: tuple, build) -> None:
    """kernel[grid](*args, **kw) with (grid, args, kw) = build(), remembered in ws while the same tensors
    (addresses and strides) come back: an eager call then skips rebuilding descriptors and arguments,
    and launches through iris.ccl.launch.Launcher (direct, then a replayed graph). The remembered arguments
    keep those tensors alive until other ones are passed."""
    key = tuple((t.data_ptr(), t.stride()) for t in tensors)
    plan = ws.get("plan")
    if plan is None or plan[0] != key:
        grid, args, kw = build()
        options = {k: kw.pop(k) for k in ("num_warps", "num_stages") if k in kw}
        params = list(inspect.signature(kernel.fn).parameters.values())[len(args):]
        args = tuple(args) + tuple(kw[p.name] if p.name in kw else p.default for p in params)
        plan = ws["plan"] = (key, Launcher(kernel, grid, **options), args)
    plan[1].launch_trusted(plan[2], key)


def check_operands(name: str, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None) -> None:
    """Raise on dtypes, devices and ranks that no kernel here takes (shapes are each op's own check)."""
    for what, t in (("A", A), ("B", B)) + ((("output", out),) if out is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {what} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name}: {what} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name}: {what} has dtype {t.dtype}; use torch.bfloat16, torch.float16 or torch.float32")
        if t.device != A.device:
            raise ValueError(f"{name}: {what} is on {t.device} but A is on {A.device}; put all operands on one device")
    if B.dtype != A.dtype or (out is not None and out.dtype != A.dtype):
        raise TypeError(f"{name}: A, B{' and output' if out is not None else ''} must share a dtype, got "
                        f"{A.dtype}, {B.dtype}{'' if out is None else ', ' + str(out.dtype)}")


def matmul(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None,
           config: FusedConfig | None = None) -> torch.Tensor:
    """out (M x N) = A (M x K) @ B (K x N) with the persistent kernel; bf16 or fp16, any strides."""
    check_operands("matmul", A, B, out)
    (M, K), (K2, N) = A.shape, B.shape
    if K2 != K:
        raise ValueError(f"matmul: A is {M}x{K} but B is {K2}x{N}; B needs {K} rows")
    if out is None:
        out = torch.empty(M, N, dtype=A.dtype, device=A.device)
    elif tuple(out.shape) != (M, N):
        raise ValueError(f"matmul: out must be {M}x{N}, got {tuple(out.shape)}")
    if M == 0 or N == 0:
        return out
    grid, args, kw = matmul_args(A, B, out, config)
    _matmul_kernel[grid](*args, **kw)
    return out


def matmul_args(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor, config: FusedConfig | None) -> tuple:
    """(grid, args, kw) of _matmul_kernel for out = A @ B, checked operands: what launch() remembers, so
    that an op repeating its GEMM on the same tensors skips the descriptors and the JIT's launch."""
    (M, K), N = A.shape, B.shape[1]
    t = tiles_for(M, N, A.device, config, A.element_size())
    tma = tma_ok(A, B) and out.stride(1) == 1 and tma_ok(out)
    a, a_t = operand(A, (t.bm, t.bk), tma)
    b, b_t = operand(B, (t.bk, t.bn), tma)
    c = operand(out, (t.bm, t.bn), tma)[0]
    grid = min(t.sms, triton.cdiv(M, t.bm) * triton.cdiv(N, t.bn))
    return ((grid,), (a, b, c, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1), out.stride(0),
                      out.stride(1)),
            dict(BM=t.bm, BN=t.bn, BK=t.bk, GROUP_M=t.group_m, NUM_SMS=grid, TMA=tma, A_T=a_t, B_T=b_t,
                 STAGES=t.stages, FLATTEN=tma, num_warps=t.warps, num_stages=t.stages))
