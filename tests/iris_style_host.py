"""Host calls as Iris programs and tests make them: ctx.heap.allocate, ctx.device compared with
str(ctx.get_device()), iris.logger, broadcast(value, source_rank=...), allocator_type="vmem_chunked",
zeros(()), pin_memory=True. Only the import refers to this iris. Run: python tests/iris_style_host.py
PORT (2 ranks; gloo).
"""
import logging
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
    shmem.barrier()
    print(f"rank {cur_rank}: OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_worker, args=(2, int(sys.argv[1])), nprocs=2, join=True)
