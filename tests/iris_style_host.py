"""Host calls as Iris programs and tests make them: ctx.heap.allocate, ctx.device compared with
str(ctx.get_device()), iris.logger, broadcast(value, source_rank=...), allocator_type="vmem_chunked",
zeros(()), pin_memory=True, out= refused in Iris's words, memory formats, iris.ccl.utils.extract_group_info
over torch groups, iris.tensor_creation, IrisFormatter, tracing.trace_counter. Only the import refers to
this iris. Run: python tests/iris_style_host.py PORT (2 ranks; gloo).
"""
import io
import logging
import re
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import triton
import triton.language as tl

import iris


@triton.jit
def read_remote(buffer, out, n, cur_rank, remote_rank, heap_bases, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    tl.store(out + offsets, iris.load(buffer + offsets, cur_rank, remote_rank, heap_bases, mask=mask), mask=mask)


def _raises(fn, pattern):
    try:
        fn()
    except RuntimeError as e:
        assert re.search(pattern, str(e)), str(e)
    else:
        raise AssertionError(f"no RuntimeError ({pattern})")


@triton.jit
def traced_load(context_tensor, buffer, out, cur_rank: tl.constexpr, num_ranks: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context_tensor, cur_rank, num_ranks, tracing=True)
    offsets = tl.arange(0, 16)
    tl.store(out + offsets, ctx.load(buffer + offsets, (cur_rank + 1) % num_ranks))


def _iris_unittests(shmem):
    """Calls as Iris's tests/unittests and tests/ccl make them, where iris once differed."""
    from iris import tensor_creation
    from iris.ccl.utils import extract_group_info
    from iris.host.logging.logging import IrisFormatter
    cur_rank, num_ranks = shmem.get_rank(), shmem.get_num_ranks()

    _raises(lambda: shmem.zeros(3, 3, out=shmem.heap.allocate(4, torch.float32)),
            "The output tensor has 4 elements, but 9 are required")
    _raises(lambda: shmem.zeros(3, 3, dtype=torch.float32, out=shmem.heap.allocate(9, torch.int32)),
            "The output tensor has dtype torch.int32, but torch.float32 is required")
    _raises(lambda: shmem.zeros(3, 3, out=torch.zeros(3, 3)), "The output tensor is not on the symmetric heap")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert shmem.empty(3, 3, memory_format=torch.channels_last).shape == (3, 3)
    result_5d = shmem.zeros_like(shmem.full((2, 3, 4, 5, 6), 1, dtype=torch.float32),
                                 memory_format=torch.channels_last_3d)
    assert result_5d.stride() == torch.empty(2, 3, 4, 5, 6, memory_format=torch.channels_last_3d).stride()
    _raises(lambda: tensor_creation.throw_if_invalid_output_tensor(shmem.heap, shmem.heap.allocate(4, torch.float32),
                                                                   9, torch.float32), "4 elements, but 9 are required")
    assert torch.all(tensor_creation.zeros(shmem.heap, shmem.get_device(), (2, 3), dtype=torch.float32) == 0)

    assert extract_group_info(None, shmem) == (cur_rank, cur_rank, num_ranks, 0, 1)
    groups = [dist.new_group([r]) for r in range(num_ranks)]  # collective: every rank makes every group
    assert extract_group_info(groups[cur_rank], shmem) == (0, cur_rank, 1, cur_rank, 1)
    everyone = dist.new_group(list(range(num_ranks)))
    assert extract_group_info(everyone, shmem) == (cur_rank, cur_rank, num_ranks, 0, 1)

    log_capture = io.StringIO()
    handler = logging.StreamHandler(log_capture)
    handler.setFormatter(IrisFormatter())
    original = iris.logger.handlers[:]
    iris.logger.handlers = [handler]
    try:
        iris.logger.info("Test info message")
    finally:
        iris.logger.handlers = original
    assert "[Iris] Test info message" in log_capture.getvalue(), log_capture.getvalue()

    shmem.tracing.enable(max_events=1000)
    buffer = shmem.full((16,), 1.0 + cur_rank)
    out = torch.zeros(16, device=shmem.device)
    shmem.barrier()
    traced_load[(1,)](shmem.get_device_context(), buffer, out, cur_rank, num_ranks)
    shmem.barrier()
    assert shmem.tracing.trace_counter.item() >= 1
    assert torch.equal(out.cpu(), torch.full((16,), 1.0 + (cur_rank + 1) % num_ranks))


def _worker(rank, world_size, port):
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}")
    shmem = iris.iris(1 << 24, allocator_type="vmem_chunked")
    cur_rank, num_ranks = shmem.get_rank(), shmem.get_num_ranks()

    device = shmem.get_device()
    assert str(device) == shmem.device, (str(device), shmem.device)
    assert shmem.device.startswith(device.type) and device.index == shmem.device.index
    assert isinstance(device, torch.device) and shmem.device == device

    n = 1000
    buffer = shmem.heap.allocate(n, torch.float32)
    assert buffer.shape == (n,) and buffer.dtype == torch.float32 and shmem.is_symmetric(buffer)
    buffer.copy_(torch.arange(n, dtype=torch.float32) + 1000 * cur_rank)
    out = torch.full((n,), -1.0, device=shmem.device)
    shmem.barrier()
    remote = (cur_rank + 1) % num_ranks
    read_remote[(triton.cdiv(n, 256),)](buffer, out, n, cur_rank, remote, shmem.get_heap_bases(), BLOCK_SIZE=256)
    shmem.barrier()
    assert torch.equal(out.cpu(), torch.arange(n, dtype=torch.float32) + 1000 * remote), out[:4].tolist()

    assert isinstance(iris.logger, logging.Logger)
    iris.logger.setLevel(logging.INFO)
    shmem.info("logging through iris.logger")

    assert shmem.broadcast(1234 + 7 * cur_rank, source_rank=1) == 1241
    assert shmem.broadcast({"step": cur_rank}, src=0) == {"step": 0}

    scalar = shmem.zeros(())
    assert scalar.shape == () and scalar.item() == 0 and shmem.is_symmetric(scalar)
    scalar.fill_(3.5)
    assert scalar.item() == 3.5

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pinned = shmem.randn(8, pin_memory=True)
    assert shmem.is_symmetric(pinned) and any("pin_memory" in str(w.message) for w in caught)

    r = shmem.randint(0, 10, (3, 3), device=shmem.device)
    assert str(r.device) == str(shmem.get_device()) and shmem.is_symmetric(r)

    _iris_unittests(shmem)
    shmem.barrier()
    print(f"rank {cur_rank}: OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_worker, args=(2, int(sys.argv[1])), nprocs=2, join=True)
