"""Fused ops called the way Iris's tests/ops call them: iris.ops.NAME(shmem, C, A, B, config=...),
shmem.ops.NAME(...), iris.ops.config.FusedConfig with Iris's fields, references from torch.matmul
and torch.distributed. Only the import refers to this iris. Outputs start as NaN, and every element
a rank owns is checked. Run: python tests/iris_style_ops.py PORT (2 ranks; gloo, so that two ranks
may share one GPU).
"""
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import iris
import iris.ops as ops
from iris.ops.config import FusedConfig


def _all_reduce(t):
    """dist.all_reduce through the host (gloo), so the reference runs wherever the ranks do."""
    c = t.float().cpu()
    dist.all_reduce(c, op=dist.ReduceOp.SUM)
    return c


def _all_gather(t, dim):
    parts = [torch.empty_like(t.cpu()) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.cpu().contiguous())
    return torch.cat(parts, dim=dim)


def _close(got, want, atol, rtol, what):
    got = got.float().cpu()
    assert not torch.isnan(got).any(), f"{what}: {int(torch.isnan(got).sum())} elements never written"
    assert torch.allclose(got, want.float(), atol=atol, rtol=rtol), \
        f"{what}: max diff {(got - want.float()).abs().max().item()}"


def test_matmul_all_reduce(shmem, dtype, atol, rtol, M, N, K, variant):
    rank = shmem.get_rank()
    A_local = torch.randn(M, K, dtype=dtype, device=shmem.device)
    B = torch.randn(K, N, dtype=dtype, device=shmem.device)
    pytorch_output = _all_reduce(torch.matmul(A_local.float(), B.float()))
    iris_A = shmem.zeros((M, K), dtype=dtype)
    iris_A.copy_(A_local)
    iris_B = shmem.zeros((K, N), dtype=dtype)
    iris_B.copy_(B)
    iris_C = shmem.full((M, N), float("nan"), dtype=dtype)
    shmem.barrier()
    config = FusedConfig(block_size_m=32, block_size_n=32, block_size_k=32, all_reduce_variant=variant)
    ws = ops.matmul_all_reduce(shmem, iris_C, iris_A, iris_B, config=config)
    shmem.barrier()
    _close(iris_C, pytorch_output, atol, rtol, f"rank {rank} matmul_all_reduce {variant} {dtype}")
    iris_C.fill_(float("nan"))  # again through the workspace it returned
    ops.matmul_all_reduce(shmem, iris_C, iris_A, iris_B, config=config, workspace=ws)
    shmem.barrier()
    _close(iris_C, pytorch_output, atol, rtol, f"rank {rank} matmul_all_reduce {variant} {dtype}, workspace=")


def test_matmul_all_reduce_unknown_variant(shmem):
    try:
        FusedConfig(block_size_m=32, block_size_n=32, block_size_k=32, all_reduce_variant="butterfly")
    except ValueError as e:
        assert "all_reduce_variant must be one of" in str(e), str(e)
    else:
        raise AssertionError("all_reduce_variant='butterfly' did not raise")


def test_matmul_all_reduce_lock_too_small(shmem):
    """As Iris's test: a workspace built for larger tiles, passed back with a config of smaller ones,
    raises on every rank before anything runs; C keeps what it held."""
    M, N, K = 96, 64, 32
    iris_A = shmem.randn((M, K), dtype=torch.float16)
    iris_B = shmem.randn((K, N), dtype=torch.float16)
    iris_C = shmem.full((M, N), 5.0, dtype=torch.float16)
    shmem.barrier()
    config_large = FusedConfig(block_size_m=64, block_size_n=64, block_size_k=32, all_reduce_variant="one_shot")
    workspace = ops.matmul_all_reduce_preamble(shmem, iris_C, iris_A, iris_B, config=config_large)
    config_small = FusedConfig(block_size_m=32, block_size_n=32, block_size_k=32, all_reduce_variant="one_shot")
    try:
        ops.matmul_all_reduce(shmem, iris_C, iris_A, iris_B, config=config_small, workspace=workspace)
    except ValueError as e:
        assert "Lock array too small: have 2 but need 6" in str(e), str(e)
    else:
        raise AssertionError("a workspace of 2 tiles passed for 6 did not raise")
    assert torch.equal(iris_C.cpu(), torch.full((M, N), 5.0, dtype=torch.float16)), "C was written"
    shmem.barrier()


def test_matmul_reduce_scatter_lock_too_small(shmem):
    """As Iris's test: the preamble again with smaller tiles, passed the workspace a preamble of larger
    ones made, raises on every rank (and so does the op); C keeps what it held."""
    M, N, K = 128, 128, 32
    iris_A = shmem.randn((M, K), dtype=torch.float16)
    iris_B = shmem.randn((K, N), dtype=torch.float16)
    iris_C = shmem.full((M, N), 5.0, dtype=torch.float16)
    shmem.barrier()
    config_large = FusedConfig(block_size_m=64, block_size_n=64, block_size_k=32)
    workspace = ops.matmul_reduce_scatter_preamble(shmem, iris_C, iris_A, iris_B, config=config_large)
    config_small = FusedConfig(block_size_m=32, block_size_n=32, block_size_k=32)
    for call in (ops.matmul_reduce_scatter_preamble, ops.matmul_reduce_scatter):
        try:
            call(shmem, iris_C, iris_A, iris_B, config=config_small, workspace=workspace)
        except ValueError as e:
            assert "Lock array too small: have 4 but need 16" in str(e), str(e)
        else:
            raise AssertionError(f"{call.__name__}: a workspace of 4 tiles passed for 16 did not raise")
    assert torch.equal(iris_C.cpu(), torch.full((M, N), 5.0, dtype=torch.float16)), "C was written"
    shmem.barrier()


def test_matmul_reduce_scatter(shmem, dtype, atol, rtol, M, N, K):
    rank, world_size = shmem.get_rank(), shmem.get_num_ranks()
    A = torch.randn(M, K, dtype=dtype, device=shmem.device)
    B = torch.randn(K, N, dtype=dtype, device=shmem.device)
    C_reduced = _all_reduce(torch.matmul(A.float(), B.float()))
    config = ops.FusedConfig(block_size_m=32, block_size_n=32, block_size_k=32)
    num_pid_m = (M + config.block_size_m - 1) // config.block_size_m
    num_pid_n = (N + config.block_size_n - 1) // config.block_size_n
    total_tiles = num_pid_m * num_pid_n
    tiles_per_rank = total_tiles // world_size
    start_tile = rank * tiles_per_rank
    if rank == world_size - 1:
        tiles_per_rank = total_tiles - start_tile
    iris_A = shmem.zeros((M, K), dtype=dtype)
    iris_A.copy_(A)
    iris_B = shmem.zeros((K, N), dtype=dtype)
    iris_B.copy_(B)
    iris_C = shmem.full((M, N), float("nan"), dtype=dtype)
    shmem.barrier()
    workspace = ops.matmul_reduce_scatter(shmem, iris_C, iris_A, iris_B, config=config,
                                          workspace=ops.FusedWorkspace())
    assert isinstance(workspace, ops.FusedWorkspace)
    shmem.barrier()
    owned = torch.zeros(M, N, dtype=torch.bool)
    for local_tile_idx in range(tiles_per_rank):
        tile_id = start_tile + local_tile_idx
        pid_m, pid_n = tile_id // num_pid_n, tile_id % num_pid_n
        m_start, n_start = pid_m * config.block_size_m, pid_n * config.block_size_n
        m_end, n_end = min(m_start + config.block_size_m, M), min(n_start + config.block_size_n, N)
        _close(iris_C[m_start:m_end, n_start:n_end], C_reduced[m_start:m_end, n_start:n_end], atol, rtol,
               f"rank {rank} matmul_reduce_scatter {dtype} tile {tile_id}")
        owned[m_start:m_end, n_start:n_end] = True
    assert torch.equal(iris_C.cpu()[~owned], torch.zeros(int((~owned).sum()), dtype=dtype)), \
        f"rank {rank}: tiles other ranks own are not zero, as Iris leaves them"


def test_all_gather_matmul(shmem, dtype, atol, rtol, M, K_local, N):
    rank, world_size = shmem.get_rank(), shmem.get_num_ranks()
    K = K_local * world_size
    torch.manual_seed(42 + rank)
    A_sharded = torch.randn(M, K_local, dtype=dtype, device=shmem.device)
    torch.manual_seed(123)
    B = torch.randn(K, N, dtype=dtype, device=shmem.device)
    ref_output = torch.matmul(_all_gather(A_sharded, 1).float(), B.float().cpu())
    A_sharded_shmem = shmem.zeros((M, K_local), dtype=dtype)
    A_sharded_shmem.copy_(A_sharded)
    B_shmem = shmem.zeros((K, N), dtype=dtype)
    B_shmem.copy_(B)
    output = shmem.full((M, N), float("nan"), dtype=dtype)
    shmem.barrier()
    config = FusedConfig(block_size_m=32, block_size_n=32, block_size_k=32)
    ws = ops.all_gather_matmul_preamble(shmem, A_sharded_shmem, B_shmem, config)
    shmem.ops.all_gather_matmul(output, A_sharded_shmem, B_shmem, config=config, workspace=ws)
    shmem.barrier()
    _close(output, ref_output, atol, rtol, f"rank {rank} all_gather_matmul {dtype}")


def test_matmul_all_gather(shmem, dtype, atol, rtol, M, N, K):
    rank, world_size = shmem.get_rank(), shmem.get_num_ranks()
    M_local = M // world_size
    A_local = shmem.randn((M_local, K), dtype=dtype)
    B = shmem.randn((K, N), dtype=dtype)
    B.copy_(torch.from_numpy(shmem.broadcast(B.float().cpu(), source_rank=0)))  # B replicated (numpy, as Iris)
    output = shmem.full((M, N), float("nan"), dtype=dtype)
    pytorch_output = _all_gather(torch.matmul(A_local.float(), B.float()), 0)
    shmem.barrier()
    config = FusedConfig(block_size_m=32, block_size_n=32, block_size_k=32)
    shmem.ops.matmul_all_gather(output, A_local, B, config=config)
    shmem.barrier()
    _close(output, pytorch_output, atol, rtol, f"rank {rank} matmul_all_gather {dtype}")


def _worker(rank, world_size, port):
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}")
    shmem = iris.iris(2**26)
    torch.manual_seed(7 + rank)
    test_matmul_all_reduce(shmem, torch.float16, 0.2, 0.01, 96, 64, 32, "one_shot")
    test_matmul_all_reduce(shmem, torch.float32, 0.3, 0.01, 96, 64, 32, "two_shot")
    for variant in ("atomic", "spinlock", "ring"):  # through the device tile API
        # the interpreter's float16 atomic add is atomic within a process only: float32 where ranks are processes
        dtype = torch.float32 if variant == "atomic" and iris.settings.INTERPRET.get() else torch.float16
        test_matmul_all_reduce(shmem, dtype, 0.2, 0.01, 96, 64, 32, variant)
    for dtype, atol, rtol in ((torch.float16, 2e-1, 1e-2), (torch.float32, 1e-1, 1e-2)):
        test_matmul_reduce_scatter(shmem, dtype, atol, rtol, 96, 96, 32)
    test_matmul_all_reduce_unknown_variant(shmem)
    test_matmul_all_reduce_lock_too_small(shmem)
    test_matmul_reduce_scatter_lock_too_small(shmem)
    test_all_gather_matmul(shmem, torch.float16, 1e-2, 1e-2, 64, 32, 64)
    test_matmul_all_gather(shmem, torch.bfloat16, 0.5, 0.01, 64, 64, 32)
    shmem.barrier()
    print(f"rank {rank}: OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_worker, args=(2, int(sys.argv[1])), nprocs=2, join=True)
