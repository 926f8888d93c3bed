"""A GEMM that all-reduces (then one that reduce-scatters) its own output tiles as they finish, from
inside the kernel, with the tile API: a row-parallel layer, C = sum over ranks of A_r @ B_r.

    python -m iris.run -n 2 examples/33_fused_gemm_tile_all_reduce.py

Each program of a persistent grid walks the output tiles; per tile it multiplies, publishes the
tile in this rank's heap (partial) and raises the tile's lock there, then calls
ctx.all_reduce_two_shot: the tile's owner rank waits for every peer's lock, sums the partials and
writes the sum into C on every rank, while the other programs go on multiplying. The reduce-scatter
kernel calls ctx.reduce_scatter instead: each rank keeps the sum of its own rows. The same tile
calls serve any kernel that produces tiles (iris/device/tile_collectives.py says what each needs);
ctx.ops.matmul_all_reduce(..., config=FusedConfig(variant="tiles")) packages this one.
"""
import os
import sys

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def gemm_reduce_kernel(A, B, C, partial, locks, context, M, N, K, RANK: tl.constexpr, WORLD: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SCATTER: tl.constexpr,
                       F32_DOT: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, RANK, WORLD)
    out = iris.make_tensor_view(C, M, N, N, 1)
    mine = iris.make_tensor_view(partial, M, N, N, 1)
    num_n = tl.cdiv(N, BN)
    for t in range(tl.program_id(0), tl.cdiv(M, BM) * num_n, tl.num_programs(0)):
        pid_m = t // num_n
        pid_n = t % num_n
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            a = tl.load(A + rm[:, None] * K + (k + rk)[None, :], mask=(rm[:, None] < M) & (k + rk < K)[None, :],
                        other=0.0)
            b = tl.load(B + (k + rk)[:, None] * N + rn[None, :], mask=(k + rk < K)[:, None] & (rn < N)[None, :],
                        other=0.0)
            if F32_DOT:  # the interpreter's bfloat16 dot is not exact: multiply in float32 there
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)
        tile = iris.Tile(pid_m, pid_n, BM, BN, acc.to(C.dtype.element_ty))
        p, mask = mine.tile_ptr(tile)
        tl.store(p, tile.data, mask=mask)
        tl.debug_barrier()  # the whole tile is stored before its lock says so
        ctx.signal(locks + t, 1, RANK)  # release, sys scope: peers that see 1 see the tile
        if SCATTER:
            ctx.reduce_scatter(tile, mine, out, locks)
        else:
            ctx.all_reduce_two_shot(tile, mine, out, locks)


def run(ctx, A, B, C, partial, locks, scatter, blocks, programs):
    (M, K), N = A.shape, B.shape[1]
    locks.zero_()
    C.fill_(float("nan"))
    ctx.barrier()  # every rank's locks are zero before any rank raises one
    gemm_reduce_kernel[(programs,)](A, B, C, partial, locks, ctx.get_device_context(), M, N, K, ctx.get_rank(),
                                    ctx.get_num_ranks(), *blocks, SCATTER=scatter,
                                    F32_DOT=os.environ.get("TRITON_INTERPRET") == "1")
    ctx.barrier()  # two-shot: the owners' stores into this rank's C are done


def main() -> int:
    ctx = iris.iris(heap_size=1 << 30 if torch.cuda.is_available() else 1 << 22)
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    gpu = dev.type == "cuda"
    M, N, K = (2048, 2048, 1024) if gpu else (16 * w, 40, 32)  # N: edge tiles
    # a program waits on peers' programs: the grid must fit on the device at once (one program per SM)
    blocks = (128, 128, 64) if gpu else (16, 16, 16)
    programs = torch.cuda.get_device_properties(dev).multi_processor_count if gpu else 2
    g = torch.Generator().manual_seed(0)  # every rank builds every rank's inputs
    ins = [((torch.randn(M, K, generator=g) / K ** 0.5).to(torch.bfloat16), torch.randn(K, N, generator=g)
            .to(torch.bfloat16)) for _ in range(w)]
    want = sum((a.float() @ b.float()).to(torch.bfloat16).float() for a, b in ins)  # bf16 partials, summed
    A, B = ins[r][0].to(dev), ins[r][1].to(dev)
    C, partial = ctx.empty(M, N, dtype=torch.bfloat16), ctx.empty(M, N, dtype=torch.bfloat16)
    locks = ctx.zeros(triton.cdiv(M, blocks[0]) * triton.cdiv(N, blocks[1]), dtype=torch.int32)
    tol = 0.02 * want.abs().max().item()  # bf16 partials: rounding differs from torch's by an ulp or so
    rows = slice(r * (M // w), (r + 1) * (M // w))  # this rank's rows: whole tiles (M/w is a multiple of BM)
    ok = True
    for scatter in (False, True):
        run(ctx, A, B, C, partial, locks, scatter, blocks, programs)
        got, ref = (C[rows], want[rows]) if scatter else (C, want)
        err = (got.float().cpu() - ref).abs().max().item()  # NaN (a tile never written) fails too
        good = err <= tol
        ok = ok and good
        print(f"rank {r}/{w}: GEMM {M}x{N}x{K} with {'reduce_scatter' if scatter else 'all_reduce_two_shot'} per "
              f"tile: max error {err:.3g} -> {'ok' if good else 'WRONG'}", flush=True)
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
