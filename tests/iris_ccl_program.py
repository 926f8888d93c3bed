"""Collective tests written the way Iris's tests/ccl writes them: iris.iris(heap_size), Config with Iris's
fields (set at construction and after it), all_reduce_preamble then all_reduce(..., workspace=), the
ring all_gather through all_gather_preamble and workspace=, reduce_scatter's variants,
results compared with torch.distributed's, reduce_scatter's tiles located with Config's block sizes
and swizzle_size. Only the import refers to this iris. Sizes are small so that
the host driver's interpreter runs them; the reference runs on gloo over CPU copies (NCCL refuses two
ranks on one GPU). Run: python tests/iris_ccl_program.py PORT [WORLD]
"""
import gc
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import iris
from iris.ccl import Config

HEAP = 2**26


def _device(rank):
    return f"cuda:{rank % torch.cuda.device_count()}" if torch.cuda.is_available() else "cpu"


def test_all_reduce(variant, dtype, M, N):
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    pytorch_input_tensor = torch.randn(M, N, dtype=dtype, device=_device(rank))
    pytorch_input_tensor.fill_(float(rank + 1))
    pytorch_output_tensor = pytorch_input_tensor.clone().cpu()
    shmem.barrier()
    dist.all_reduce(pytorch_output_tensor, op=dist.ReduceOp.SUM)

    iris_input_tensor = shmem.zeros((M, N), dtype=dtype)
    iris_input_tensor.copy_(pytorch_input_tensor)
    iris_output_tensor = shmem.zeros((M, N), dtype=dtype)

    shmem.barrier()
    config = Config(all_reduce_variant=variant)
    if variant == "two_shot":
        config.all_reduce_distribution = 0
    if variant == "ring":
        config.all_reduce_num_rings = min(2, config.comm_sms)
    workspace = shmem.ccl.all_reduce_preamble(iris_output_tensor, iris_input_tensor, config=config)
    shmem.barrier()
    shmem.ccl.all_reduce(iris_output_tensor, iris_input_tensor, config=config, workspace=workspace)
    shmem.barrier()

    atol = 1e-3 if dtype == torch.float16 else 1e-5
    max_diff = torch.abs(iris_output_tensor.cpu() - pytorch_output_tensor).max().item()
    try:
        assert torch.allclose(iris_output_tensor.cpu(), pytorch_output_tensor, atol=atol), (
            f"Max difference: {max_diff}, expected < {atol}\n"
            f"Rank {rank}: Iris output doesn't match PyTorch's all_reduce (variant={variant})")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_all_reduce_two_shot_distribution(distribution, dtype=torch.float32, M=64, N=32):
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    pytorch_input_tensor = torch.randn(M, N, dtype=dtype, device=_device(rank))
    pytorch_input_tensor.fill_(float(rank + 1))
    pytorch_output_tensor = pytorch_input_tensor.clone().cpu()
    shmem.barrier()
    dist.all_reduce(pytorch_output_tensor, op=dist.ReduceOp.SUM)

    iris_input_tensor = shmem.zeros((M, N), dtype=dtype)
    iris_input_tensor.copy_(pytorch_input_tensor)
    iris_output_tensor = shmem.zeros((M, N), dtype=dtype)
    shmem.barrier()
    config = Config(all_reduce_variant="two_shot", all_reduce_distribution=distribution)
    workspace = shmem.ccl.all_reduce_preamble(iris_output_tensor, iris_input_tensor, config=config)
    shmem.barrier()
    shmem.ccl.all_reduce(iris_output_tensor, iris_input_tensor, config=config, workspace=workspace)
    shmem.barrier()
    try:
        assert torch.allclose(iris_output_tensor.cpu(), pytorch_output_tensor, atol=1e-5), (
            f"Rank {rank}: Iris two-shot output doesn't match PyTorch (distribution={distribution})")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_all_gather(dtype, M, N, block_size_m, block_size_n, variant=None):
    """Iris's test_all_gather (None: the default variant, persistent, partitioned) and test_all_gather_ring
    (ring, through all_gather_preamble and workspace=), with the ring test's input pattern."""
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    world_size = shmem.get_num_ranks()
    arange_vals = torch.arange(M * N, dtype=torch.float32, device=_device(rank)).reshape(M, N)
    pytorch_input_tensor = ((arange_vals % 1000) * rank + rank).to(dtype)
    pytorch_output_tensor = torch.zeros(world_size * M, N, dtype=dtype)
    shmem.barrier()
    dist.all_gather_into_tensor(pytorch_output_tensor, pytorch_input_tensor.cpu())

    iris_input_tensor = shmem.zeros((M, N), dtype=dtype)
    iris_input_tensor.copy_(pytorch_input_tensor)
    iris_output_tensor = shmem.zeros((world_size * M, N), dtype=dtype)
    shmem.barrier()
    if variant == "partitioned":
        comm_sms = 64  # a multiple of the world size, as Iris's test picks it
        config = Config(block_size_m=block_size_m, block_size_n=block_size_n, all_gather_variant="partitioned",
                        comm_sms=comm_sms)
    elif variant is not None:
        config = Config(block_size_m=block_size_m, block_size_n=block_size_n, all_gather_variant=variant)
    else:
        config = Config(block_size_m=block_size_m, block_size_n=block_size_n)
    if variant == "ring":
        workspace = shmem.ccl.all_gather_preamble(iris_output_tensor, iris_input_tensor, config=config)
        shmem.barrier()
        shmem.ccl.all_gather(iris_output_tensor, iris_input_tensor, config=config, workspace=workspace)
    else:
        shmem.ccl.all_gather(iris_output_tensor, iris_input_tensor, config=config)
    shmem.barrier()
    try:
        assert torch.equal(iris_output_tensor.cpu(), pytorch_output_tensor), (
            f"Rank {rank}: Iris output ({variant}) doesn't match PyTorch's all_gather_into_tensor")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_all_to_all(dtype, M, N):
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    world_size = shmem.get_num_ranks()
    pytorch_input_tensor = torch.randn(M, N, dtype=dtype, device=_device(rank))
    pytorch_input_tensor.fill_(float(rank))
    pytorch_output_list = [torch.zeros(M, N, dtype=dtype) for _ in range(world_size)]
    shmem.barrier()
    # every rank sends the same (M, N) block to every rank, so all_to_all's answer is an all_gather of
    # those blocks (some gloo builds have no alltoall)
    dist.all_gather(pytorch_output_list, pytorch_input_tensor.cpu())
    pytorch_output_concat = torch.zeros(M, N * world_size, dtype=dtype)
    for target_rank in range(world_size):
        pytorch_output_concat[:, target_rank * N: (target_rank + 1) * N] = pytorch_output_list[target_rank]

    iris_input_concat = shmem.zeros((M, N * world_size), dtype=dtype)
    for target_rank in range(world_size):
        iris_input_concat[:, target_rank * N: (target_rank + 1) * N] = pytorch_input_tensor
    iris_output_concat = shmem.zeros((M, N * world_size), dtype=dtype)
    shmem.barrier()
    config = Config()
    shmem.ccl.all_to_all(iris_output_concat, iris_input_concat, config=config)
    shmem.barrier()
    try:
        assert torch.allclose(iris_output_concat.cpu(), pytorch_output_concat, atol=1e-5), (
            f"Rank {rank}: Iris output doesn't match PyTorch's all_to_all")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def _swizzle_tile_to_pid(tile_id, num_pid_m, num_pid_n, group_size_m):
    num_pid_in_group = group_size_m * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * group_size_m
    actual_group_size_m = min(num_pid_m - first_pid_m, group_size_m)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % actual_group_size_m)
    pid_n = (tile_id % num_pid_in_group) // actual_group_size_m
    return pid_m, pid_n


def test_reduce_scatter(distribution, variant="two_shot", dtype=torch.float32, M=96, N=256, block_size_m=None,
                        block_size_n=None):
    """Iris's test_reduce_scatter (variants two_shot and ring_chunked, block sizes given) and
    test_reduce_scatter_two_shot_distribution (Config's block sizes), in one."""
    ctx = iris.iris(HEAP)
    rank = ctx.get_rank()
    world_size = ctx.get_num_ranks()
    pytorch_input_tensor = torch.full((M, N), float(rank + 1), dtype=dtype, device=_device(rank))
    iris_input_tensor = ctx.zeros((M, N), dtype=dtype)
    iris_input_tensor.copy_(pytorch_input_tensor)
    iris_output_tensor = ctx.zeros((M, N), dtype=dtype)
    ctx.barrier()
    sizes = {} if block_size_m is None else dict(block_size_m=block_size_m, block_size_n=block_size_n)
    config = Config(reduce_scatter_variant=variant, all_reduce_distribution=distribution, **sizes)
    ctx.ccl.reduce_scatter(iris_output_tensor, iris_input_tensor, config=config)
    ctx.barrier()

    expected_sum = sum(float(r + 1) for r in range(world_size))
    block_size_m = config.block_size_m
    block_size_n = config.block_size_n
    num_pid_m = (M + block_size_m - 1) // block_size_m
    num_pid_n = (N + block_size_n - 1) // block_size_n
    total_tiles = num_pid_m * num_pid_n
    tiles_per_rank = (total_tiles + world_size - 1) // world_size
    if distribution == 0:
        assigned_tiles = list(range(rank, total_tiles, world_size))
    else:
        start_tile = rank * tiles_per_rank
        remaining = max(total_tiles - start_tile, 0)
        num_assigned = min(tiles_per_rank, remaining)
        assigned_tiles = list(range(start_tile, start_tile + num_assigned))
    try:
        for tile_id in assigned_tiles:
            pid_m, pid_n = _swizzle_tile_to_pid(tile_id, num_pid_m, num_pid_n, config.swizzle_size)
            m_start = pid_m * block_size_m
            m_end = min(m_start + block_size_m, M)
            n_start = pid_n * block_size_n
            n_end = min(n_start + block_size_n, N)
            tile_data = iris_output_tensor[m_start:m_end, n_start:n_end]
            expected_tile = torch.full_like(tile_data, expected_sum)
            atol = 1e-3 if dtype in (torch.float16, torch.bfloat16) else 1e-5
            assert torch.allclose(tile_data, expected_tile, atol=atol, rtol=0), (
                f"Rank {rank}, tile {tile_id}, variant={variant}, distribution={distribution}: "
                f"Expected {expected_sum}, got max={tile_data.max().item()}, min={tile_data.min().item()}")
    finally:
        ctx.barrier()
        del ctx
        gc.collect()


def _worker(rank, world_size, port):
    gc.freeze()  # the imports live as long as the rank: each test's gc.collect() then walks only its own objects
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}")
    for variant in ("atomic", "ring", "two_shot", "one_shot", "spinlock"):
        for dtype in (torch.float16, torch.float32, torch.bfloat16):
            test_all_reduce(variant, dtype, 16, 24)
    for distribution in (0, 1):
        test_all_reduce_two_shot_distribution(distribution)
    for variant in (None, "persistent", "partitioned", "ring"):
        test_all_gather(torch.float32, 16, 8, 32, 64, variant)
        test_all_gather(torch.bfloat16, 8, 16, 32, 16, variant)
    test_all_to_all(torch.float32, 8, 6)
    for distribution in (0, 1):
        test_reduce_scatter(distribution)
    for variant in ("two_shot", "ring_chunked"):
        for dtype in (torch.float16, torch.bfloat16):
            test_reduce_scatter(1, variant, dtype, 40, 64, 8, 16)
    print(f"rank {rank}: OK", flush=True)
    dist.destroy_process_group()
    gc.unfreeze()  # collected at exit as usual, so Triton's bindings see their objects freed


if __name__ == "__main__":
    world_size = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    mp.spawn(_worker, args=(world_size, int(sys.argv[1])), nprocs=world_size, join=True)
