"""Collective calls as Iris's tests/ccl make them, where iris once differed: reduce with root= and its
preamble, Config(reduce_variant=...), reduce_scatter through the module path iris.ccl.reduce_scatter,
workspaces too small for a config's tiles (all_reduce spinlock and ring, reduce_scatter ring_chunked)
raising ValueError with Iris's words, and broadcast of a tensor returning a numpy array. Only the
import refers to this iris. References run on gloo over CPU copies; outputs start as NaN and every
element is checked. Run: python tests/iris_style_gaps.py PORT (2 ranks).
"""
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import iris
from iris.ccl import Config


def _raises(fn, match):
    try:
        fn()
    except ValueError as e:
        assert match in str(e), str(e)
    else:
        raise AssertionError(f"no ValueError ({match})")


def _summed(shmem, M, N):
    """A random heap input of this rank, its sum over the ranks (gloo), and a NaN heap output."""
    x = torch.randn(M, N)
    want = x.clone()
    dist.all_reduce(want)
    inp = shmem.zeros((M, N))
    inp.copy_(x)
    out = shmem.full((M, N), float("nan"))
    shmem.barrier()
    return inp, want, out


def test_reduce_root(shmem, variant, root, dtype, M, N):
    rank = shmem.get_rank()
    pytorch_input_tensor = torch.randn(M, N, dtype=dtype)
    pytorch_output_tensor = pytorch_input_tensor.float().clone()
    dist.reduce(pytorch_output_tensor, dst=root, op=dist.ReduceOp.SUM)
    iris_input_tensor = shmem.zeros((M, N), dtype=dtype)
    iris_input_tensor.copy_(pytorch_input_tensor)
    iris_output_tensor = shmem.full((M, N), float("nan"), dtype=dtype)
    shmem.barrier()
    config = Config(reduce_variant=variant, block_size_m=16, block_size_n=16)
    workspace = shmem.ccl.reduce_preamble(iris_output_tensor, iris_input_tensor, root=root, config=config)
    shmem.barrier()
    shmem.ccl.reduce(iris_output_tensor, iris_input_tensor, root=root, config=config, workspace=workspace)
    shmem.barrier()
    got = iris_output_tensor.float().cpu()
    if rank == root:
        assert torch.allclose(got, pytorch_output_tensor, atol=2e-2, rtol=1e-2), \
            f"rank {rank} reduce root={root}: max diff {(got - pytorch_output_tensor).abs().max().item()}"
    else:
        assert torch.isnan(got).all(), f"rank {rank}: reduce wrote a non-root's output"


def test_reduce_scatter_module_path(shmem, M, N, bm, bn):
    from iris.ccl.reduce_scatter import reduce_scatter
    rank, world = shmem.get_rank(), shmem.get_num_ranks()
    inp, want, out = _summed(shmem, M, N)
    config = Config(block_size_m=bm, block_size_n=bn, swizzle_size=1, all_reduce_distribution=1)
    reduce_scatter(out, inp, shmem, config=config)
    shmem.barrier()
    tiles_n = -(-N // bn)
    total = -(-M // bm) * tiles_n
    per = -(-total // world)
    mine = torch.zeros(M, N, dtype=torch.bool)
    for t in range(rank * per, min(total, (rank + 1) * per)):
        mine[(t // tiles_n) * bm:(t // tiles_n + 1) * bm, (t % tiles_n) * bn:(t % tiles_n + 1) * bn] = True
    got = out.cpu()
    assert mine.any() and torch.allclose(got[mine], want[mine], atol=1e-5), f"rank {rank}: its tiles"
    assert torch.isnan(got[~mine]).all(), f"rank {rank}: reduce_scatter wrote other ranks' tiles"


def test_workspace_too_small(shmem):
    """Iris's tests: a preamble's workspace for 32x32 tiles passed back with a 16x16 config raises on
    every rank before anything runs; passed with its own config it reduces correctly."""
    M = N = 64
    iris_input, want, iris_output = _summed(shmem, M, N)
    for variant, words in (("spinlock", "Lock array too small: have 4 but need 16"),
                           ("ring", "Flags array too small: have 4 but need 16")):
        config_large = Config(all_reduce_variant=variant, block_size_m=32, block_size_n=32)
        workspace = shmem.ccl.all_reduce_preamble(iris_output, iris_input, config=config_large)
        config_small = Config(all_reduce_variant=variant, block_size_m=16, block_size_n=16)
        _raises(lambda: shmem.ccl.all_reduce(iris_output, iris_input, config=config_small, workspace=workspace), words)
        assert torch.isnan(iris_output.cpu()).all(), f"{variant}: out written by a refused call"
        shmem.ccl.all_reduce(iris_output, iris_input, config=config_large, workspace=workspace)
        shmem.barrier()
        assert torch.allclose(iris_output.cpu(), want, atol=1e-5), f"{variant} with its own workspace"
        iris_output.fill_(float("nan"))
        shmem.barrier()

    from iris.ccl.reduce_scatter import ReduceScatterWorkspace, _prepare_ring_workspace
    workspace = _prepare_ring_workspace(shmem, M, N, torch.float32, 4, ReduceScatterWorkspace())
    config_small = Config(reduce_scatter_variant="ring_chunked", block_size_m=16, block_size_n=16)
    _raises(lambda: shmem.ccl.reduce_scatter(iris_output, iris_input, config=config_small, workspace=workspace),
            "Flags array too small: have 4 but need 16")
    assert torch.isnan(iris_output.cpu()).all(), "reduce_scatter: out written by a refused call"
    shmem.barrier()


def test_broadcast_tensor(shmem):
    rank = shmem.get_rank()
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        value = (torch.arange(12, dtype=dtype).reshape(3, 4) * 3 - 5) if rank == 1 else None
        result = shmem.broadcast(value, source_rank=1)
        assert isinstance(result, np.ndarray), type(result)
        assert result.shape == (3, 4) and result.dtype == (np.float32 if dtype == torch.bfloat16 else
                                                           torch.empty((), dtype=dtype).numpy().dtype), result.dtype
        np.testing.assert_array_equal(result, np.arange(12).reshape(3, 4) * 3 - 5)


def _worker(rank, world_size, port):
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}")
    torch.manual_seed(11 + rank)
    shmem = iris.iris(1 << 24)
    for variant, root in (("one_shot", 0), ("two_shot", 1)):
        test_reduce_root(shmem, variant, root, torch.float32, 24, 16)
    test_reduce_root(shmem, "one_shot", 1, torch.float16, 8, 32)
    test_reduce_scatter_module_path(shmem, 32, 48, 16, 16)
    test_workspace_too_small(shmem)
    test_broadcast_tensor(shmem)
    shmem.barrier()
    print(f"rank {rank}: OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_worker, args=(2, int(sys.argv[1])), nprocs=2, join=True)
