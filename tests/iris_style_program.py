"""A short program written the way Iris's README writes one: kernels that take heap_bases and call
iris.load/store/get/put/atomic_add positionally (the caller's rank first), a kernel over
iris.DeviceContext, torch.distributed initialised by the program, torch.multiprocessing.spawn.
Only the import refers to this iris. Run: python tests/iris_style_program.py PORT
"""
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import triton
import triton.language as tl

import iris

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # Iris writes "cuda"; the host driver's heap is "cpu"


@triton.jit
def store_kernel(buffer, buffer_size: tl.constexpr, block_size: tl.constexpr, heap_bases_ptr):
    pid = tl.program_id(0)
    offsets = pid * block_size + tl.arange(0, block_size)
    mask = offsets < buffer_size
    source_rank = 0
    target_rank = 1
    iris.store(buffer + offsets, offsets * 2 + 1, source_rank, target_rank, heap_bases_ptr, mask=mask)


@triton.jit
def load_get_kernel(data, loaded, got, n, cur_rank, remote_rank, heap_bases, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    values = iris.load(data + offsets, cur_rank, remote_rank, heap_bases, mask=mask)
    tl.store(loaded + offsets, values, mask=mask)
    iris.get(data + offsets, got + offsets, cur_rank, remote_rank, heap_bases, mask=mask)


@triton.jit
def put_count_kernel(data, inbox, counter, n, cur_rank, remote_rank, heap_bases, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    iris.put(data + offsets, inbox + offsets, cur_rank, remote_rank, heap_bases, mask=mask)
    iris.atomic_add(counter, 1, cur_rank, remote_rank, heap_bases, sem="release", scope="sys")


@triton.jit
def context_kernel(context_tensor, data, out, n, rank: tl.constexpr, world_size: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context_tensor, rank, world_size)
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    peer = (rank + 1) % world_size
    tl.store(out + offsets, ctx.load(data + offsets, peer, mask=mask), mask=mask)


def _worker(rank, world_size, port):
    backend = "nccl" if DEVICE == "cuda" else "gloo"
    kwargs = {"device_id": torch.device(f"cuda:{rank % torch.cuda.device_count()}")} if DEVICE == "cuda" else {}
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                            init_method=f"tcp://127.0.0.1:{port}", **kwargs)
    shmem = iris.iris(2**24)
    cur_rank, num_ranks = shmem.get_rank(), shmem.get_num_ranks()
    remote = (cur_rank + 1) % num_ranks
    heap_bases = shmem.get_heap_bases()
    n, block = 1000, 256
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)  # noqa: E731

    buffer = shmem.full((n,), -7, device=DEVICE, dtype=torch.int32)
    shmem.barrier()
    if cur_rank == 0:
        store_kernel[lambda meta: (triton.cdiv(n, meta["block_size"]),)](buffer, n, block, heap_bases)
    shmem.barrier()
    want = torch.arange(n, dtype=torch.int32) * 2 + 1 if cur_rank == 1 else torch.full((n,), -7, dtype=torch.int32)
    assert torch.equal(buffer.cpu(), want), f"rank {cur_rank} store: {buffer[:8].tolist()}"

    data = shmem.arange(n, device=DEVICE, dtype=torch.float32)
    data += 1000 * cur_rank  # in place: `data = data + ...` would be a new tensor, off the heap
    loaded = torch.full((n,), -1.0, device=DEVICE)
    got = torch.full((n,), -1.0, device=DEVICE)
    shmem.barrier()
    load_get_kernel[grid](data, loaded, got, n, cur_rank, remote, heap_bases, BLOCK_SIZE=block)
    shmem.barrier()
    theirs = torch.arange(n, dtype=torch.float32) + 1000 * remote
    assert torch.equal(loaded.cpu(), theirs), f"rank {cur_rank} load: {loaded[:8].tolist()}"
    assert torch.equal(got.cpu(), theirs), f"rank {cur_rank} get: {got[:8].tolist()}"

    inbox = shmem.full((n,), -1.0, device=DEVICE)
    counter = shmem.zeros(1, device=DEVICE, dtype=torch.int32)
    shmem.barrier()
    put_count_kernel[grid](data, inbox, counter, n, cur_rank, remote, heap_bases, BLOCK_SIZE=block)
    shmem.barrier()
    prev = (cur_rank - 1) % num_ranks
    assert torch.equal(inbox.cpu(), torch.arange(n, dtype=torch.float32) + 1000 * prev), f"put: {inbox[:8].tolist()}"
    assert counter.item() == triton.cdiv(n, block), f"rank {cur_rank} atomic_add: {counter.item()}"

    out = torch.full((n,), -1.0, device=DEVICE)
    context_kernel[grid](shmem.get_device_context(), data, out, n, cur_rank, num_ranks, BLOCK_SIZE=block)
    shmem.barrier()
    assert torch.equal(out.cpu(), theirs), f"rank {cur_rank} DeviceContext load: {out[:8].tolist()}"
    shmem.info("Iris-style program: OK")
    print(f"rank {cur_rank}: OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = 2
    mp.spawn(_worker, args=(world_size, int(sys.argv[1])), nprocs=world_size, join=True)
