"""Iris's tests/ccl broadcast, reduce, scatter, gather, send/recv (on heap tensors, and through a
mailbox: init_p2p, p2p_state=, isend/irecv, batch_isend_irecv with P2POp) and barrier tests, written
the way Iris writes them: iris.iris(heap_size) per test, tensors from shmem.zeros, Config with Iris's fields,
results compared with torch.distributed's. Only the import refers to this iris. Sizes are small so
that the host driver's interpreter runs them; the references run on gloo over CPU copies (NCCL
refuses two ranks on one GPU), and a rank's device is "cpu" on the host.
Run: python tests/iris_rooted_program.py PORT [WORLD]
"""
import gc
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import iris
from iris.ccl import Config
from iris.ccl.p2p import P2POp, irecv, isend

HEAP = 2**26


def _device(rank):
    return f"cuda:{rank % torch.cuda.device_count()}" if torch.cuda.is_available() else "cpu"


def _synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def test_broadcast(dtype, numel, src):
    heap_size = HEAP
    shmem = iris.iris(heap_size)
    rank = shmem.get_rank()
    world_size = shmem.get_num_ranks()

    if src == "mid":
        src = world_size // 2
    elif src == "last":
        src = world_size - 1

    ref_tensor = torch.zeros(numel, dtype=dtype)
    if rank == src:
        ref_tensor.fill_(float(src + 1))
    pytorch_tensor = ref_tensor.clone()
    shmem.barrier()
    dist.broadcast(pytorch_tensor, src=src)

    iris_tensor = shmem.zeros((numel,), dtype=dtype)
    if rank == src:
        iris_tensor.fill_(float(src + 1))
    shmem.barrier()
    shmem.ccl.broadcast(iris_tensor, src=src)
    _synchronize()

    atol = 1e-3 if dtype == torch.float16 else 1e-5
    max_diff = torch.abs(iris_tensor.cpu() - pytorch_tensor).max().item()
    try:
        assert torch.allclose(iris_tensor.cpu(), pytorch_tensor, atol=atol), (
            f"Max difference: {max_diff}, expected < {atol}\n"
            f"Rank {rank}: Iris broadcast doesn't match PyTorch (src={src}, numel={numel}, dtype={dtype})")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_broadcast_multidim(shape):
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    dtype = torch.float32
    src = 0
    pytorch_tensor = torch.zeros(shape, dtype=dtype)
    if rank == src:
        pytorch_tensor.fill_(42.0)
    shmem.barrier()
    dist.broadcast(pytorch_tensor, src=src)

    iris_tensor = shmem.zeros(shape, dtype=dtype)
    if rank == src:
        iris_tensor.fill_(42.0)
    shmem.barrier()
    shmem.ccl.broadcast(iris_tensor, src=src)
    _synchronize()
    try:
        assert torch.allclose(iris_tensor.cpu(), pytorch_tensor, atol=1e-5), (
            f"Rank {rank}: Iris broadcast doesn't match PyTorch for shape {shape}")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_reduce(dtype, numel, dst):
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    world_size = shmem.get_num_ranks()
    if dst == "mid":
        dst = world_size // 2
    elif dst == "last":
        dst = world_size - 1

    pytorch_tensor = torch.full((numel,), float(rank + 1), dtype=dtype)
    pytorch_ref = pytorch_tensor.clone()
    shmem.barrier()
    dist.reduce(pytorch_ref, dst=dst, op=dist.ReduceOp.SUM)

    iris_tensor = shmem.zeros((numel,), dtype=dtype)
    iris_tensor.copy_(pytorch_tensor)
    shmem.barrier()
    shmem.ccl.reduce(iris_tensor, dst=dst)
    _synchronize()

    try:
        if rank == dst:
            atol = 1e-2 if dtype == torch.float16 else 1e-4
            max_diff = torch.abs(iris_tensor.cpu() - pytorch_ref).max().item()
            assert torch.allclose(iris_tensor.cpu(), pytorch_ref, atol=atol), (
                f"Max difference: {max_diff}, expected < {atol}\n"
                f"Rank {rank}: Iris reduce doesn't match PyTorch (dst={dst}, numel={numel}, dtype={dtype})")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_reduce_multidim(shape):
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    dtype = torch.float32
    dst = 0
    pytorch_tensor = torch.full(shape, float(rank + 1), dtype=dtype)
    pytorch_ref = pytorch_tensor.clone()
    shmem.barrier()
    dist.reduce(pytorch_ref, dst=dst, op=dist.ReduceOp.SUM)

    iris_tensor = shmem.zeros(shape, dtype=dtype)
    iris_tensor.copy_(pytorch_tensor)
    shmem.barrier()
    shmem.ccl.reduce(iris_tensor, dst=dst)
    _synchronize()
    try:
        if rank == dst:
            assert torch.allclose(iris_tensor.cpu(), pytorch_ref, atol=1e-4), (
                f"Rank {rank}: Iris reduce doesn't match PyTorch for shape {shape}")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_scatter(dtype, M, N, block_size_m, block_size_n, src=0):
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    world_size = shmem.get_num_ranks()

    pytorch_output = torch.zeros(M, N, dtype=dtype)
    scatter_list = None
    if rank == src:
        scatter_list = [torch.full((M, N), float(i + 1), dtype=dtype) for i in range(world_size)]
    shmem.barrier()
    dist.scatter(pytorch_output, scatter_list, src=src)

    iris_input = shmem.zeros((world_size * M, N), dtype=dtype)
    if rank == src:
        for i in range(world_size):
            iris_input[i * M: (i + 1) * M, :].fill_(float(i + 1))
    iris_output = shmem.zeros((M, N), dtype=dtype)
    shmem.barrier()
    config = Config(block_size_m=block_size_m, block_size_n=block_size_n)
    shmem.ccl.scatter(iris_output, iris_input, src=src, config=config)
    _synchronize()

    atol = 1e-3 if dtype == torch.float16 else 1e-5
    max_diff = torch.abs(iris_output.cpu() - pytorch_output).max().item()
    try:
        assert torch.allclose(iris_output.cpu(), pytorch_output, atol=atol), (
            f"Max difference: {max_diff}, expected < {atol}\nRank {rank}: Iris output doesn't match PyTorch's scatter")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_gather(dtype, M, N, block_size_m, block_size_n, dst=0):
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    world_size = shmem.get_num_ranks()

    pytorch_input_tensor = torch.randn(M, N, dtype=dtype)
    pytorch_input_tensor.fill_(float(rank + 1))
    gather_list = [torch.zeros(M, N, dtype=dtype) for _ in range(world_size)] if rank == dst else None
    shmem.barrier()
    dist.gather(pytorch_input_tensor, gather_list, dst=dst)
    if rank == dst:
        pytorch_output = torch.cat(gather_list, dim=0)

    iris_input_tensor = shmem.zeros((M, N), dtype=dtype)
    iris_input_tensor.copy_(pytorch_input_tensor)
    iris_output_tensor = shmem.zeros((world_size * M, N), dtype=dtype)
    shmem.barrier()
    config = Config(block_size_m=block_size_m, block_size_n=block_size_n)
    shmem.ccl.gather(iris_output_tensor, iris_input_tensor, dst=dst, config=config)
    _synchronize()

    try:
        if rank == dst:
            atol = 1e-3 if dtype == torch.float16 else 1e-5
            max_diff = torch.abs(iris_output_tensor.cpu() - pytorch_output).max().item()
            assert torch.allclose(iris_output_tensor.cpu(), pytorch_output, atol=atol), (
                f"Max difference: {max_diff}, expected < {atol}\n"
                f"Rank {rank}: Iris output doesn't match torch.distributed.gather (dst={dst})")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_sendrecv_ring(dtype, M, N):
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    world_size = shmem.get_num_ranks()
    dst = (rank + 1) % world_size
    src = (rank - 1) % world_size

    send_buf = shmem.zeros((M, N), dtype=dtype)
    send_buf.fill_(float(rank + 1))
    recv_buf = shmem.zeros((M, N), dtype=dtype)
    shmem.barrier()
    config = Config(block_size_m=32, block_size_n=64)
    shmem.ccl.sendrecv(send_buf, recv_buf, dst=dst, src=src, config=config)
    _synchronize()

    expected_value = float(src + 1)
    expected = torch.full((M, N), expected_value, dtype=dtype, device=_device(rank))
    atol = 1e-3 if dtype == torch.float16 else 1e-5
    max_diff = torch.abs(recv_buf - expected).max().item()
    try:
        assert torch.allclose(recv_buf, expected, atol=atol), (
            f"Rank {rank}: max diff {max_diff}, expected value {expected_value} from rank {src}")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_send_recv_paired(dtype, M, N):
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    tensor = shmem.zeros((M, N), dtype=dtype)
    config = Config(block_size_m=32, block_size_n=64)
    shmem.barrier()
    if rank == 0:
        tensor.fill_(42.0)
        shmem.ccl.send(tensor, dst=1, config=config)
    elif rank == 1:
        shmem.ccl.recv(tensor, src=0, config=config)
    _synchronize()
    if rank == 1:
        expected = torch.full((M, N), 42.0, dtype=dtype, device=_device(rank))
        atol = 1e-3 if dtype == torch.float16 else 1e-5
        max_diff = torch.abs(tensor - expected).max().item()
        assert torch.allclose(tensor, expected, atol=atol), f"Rank 1: max diff {max_diff}, expected 42.0 from rank 0"
    shmem.barrier()
    del shmem
    gc.collect()


def _mailbox(max_numel):
    """A fresh context and its mailbox, as every test of Iris's test_p2p starts: (ctx, p2p, rank, W, device)."""
    ctx = iris.iris(HEAP)
    p2p = ctx.ccl.init_p2p(max_numel=max_numel, dtype=torch.float32)
    ctx.barrier()
    return ctx, p2p, ctx.get_rank(), ctx.get_num_ranks(), _device(ctx.get_rank())


def test_send_recv_sizes(N):
    ctx, p2p, rank, W, device = _mailbox(2**12)
    if rank == 0:
        t = torch.arange(N, dtype=torch.float32, device=device)
        ctx.ccl.send(t, dst=1, p2p_state=p2p)
    elif rank == 1:
        t = torch.zeros(N, dtype=torch.float32, device=device)
        ctx.ccl.recv(t, src=0, p2p_state=p2p)
        expected = torch.arange(N, dtype=torch.float32, device=device)
        torch.testing.assert_close(t, expected)
    ctx.barrier()


def test_isend_irecv():
    ctx, p2p, rank, W, device = _mailbox(4096)
    N = 2048
    ref = torch.randn(N, dtype=torch.float32) if rank == 0 else torch.empty(N, dtype=torch.float32)
    dist.broadcast(ref, src=0)
    ref = ref.to(device)
    if rank == 0:
        work = ctx.ccl.isend(ref, dst=1, p2p_state=p2p)
        work.wait()
    elif rank == 1:
        out = torch.zeros(N, dtype=torch.float32, device=device)
        work = ctx.ccl.irecv(out, src=0, p2p_state=p2p)
        work.wait()
        torch.testing.assert_close(out, ref)
    ctx.barrier()


def test_batch(all_pairs):
    """Iris's test_ring (rank i -> i + 1) and test_all_pairs (every rank to every other) by batch_isend_irecv."""
    ctx, p2p, rank, W, device = _mailbox(1024)
    N = 1024
    peers = [p for p in range(W) if p != rank] if all_pairs else [(rank + 1) % W]
    send_bufs, recv_bufs, ops = {}, {}, []
    for peer in peers:
        s = torch.full((N,), float(rank * 100 + peer), dtype=torch.float32, device=device)
        src = peer if all_pairs else (rank - 1 + W) % W
        r = torch.zeros(N, dtype=torch.float32, device=device)
        send_bufs[peer], recv_bufs[src] = s, r
        ops.append(P2POp(op=isend, tensor=s, peer=peer))
        ops.append(P2POp(op=irecv, tensor=r, peer=src))
    works = ctx.ccl.batch_isend_irecv(ops, p2p)
    for w in works:
        w.wait()
    for src, r in recv_bufs.items():
        torch.testing.assert_close(r, torch.full((N,), float(src * 100 + rank), dtype=torch.float32, device=device))
    ctx.barrier()


def test_multiple_sends_and_pingpong():
    ctx, p2p, rank, W, device = _mailbox(1024)
    N = 512
    for i in range(3):
        if rank == 0:
            t = torch.full((N,), float(i), dtype=torch.float32, device=device)
            ctx.ccl.send(t, dst=1, p2p_state=p2p)
        elif rank == 1:
            t = torch.zeros(N, dtype=torch.float32, device=device)
            ctx.ccl.recv(t, src=0, p2p_state=p2p)
            torch.testing.assert_close(t, torch.full((N,), float(i), dtype=torch.float32, device=device))
    data = torch.randn(N, dtype=torch.float32) if rank == 0 else torch.empty(N, dtype=torch.float32)
    dist.broadcast(data, src=0)
    data = data.to(device)
    if rank == 0:
        ctx.ccl.send(data, dst=1, p2p_state=p2p)
        echo = torch.zeros(N, dtype=torch.float32, device=device)
        ctx.ccl.recv(echo, src=1, p2p_state=p2p)
        torch.testing.assert_close(echo, data)
    elif rank == 1:
        buf = torch.zeros(N, dtype=torch.float32, device=device)
        ctx.ccl.recv(buf, src=0, p2p_state=p2p)
        ctx.ccl.send(buf, dst=0, p2p_state=p2p)
    ctx.barrier()


def test_barrier_multiple_calls():
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    data = shmem.zeros((1,), dtype=torch.float32)
    try:
        for i in range(5):
            data[0] = float(rank + i)
            shmem.ccl.barrier()
            _synchronize()
            assert data[0].item() == float(rank + i), f"Rank {rank}: value wrong after barrier iteration {i}"
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def test_barrier_with_all_reduce():
    shmem = iris.iris(HEAP)
    rank = shmem.get_rank()
    world_size = shmem.get_num_ranks()
    M, N = 128, 64
    config = Config(all_reduce_variant="two_shot", block_size_m=32, block_size_n=64)
    try:
        input1 = shmem.zeros((M, N), dtype=torch.float32)
        input1.fill_(float(rank + 1))
        output1 = shmem.zeros((M, N), dtype=torch.float32)
        workspace = shmem.ccl.all_reduce_preamble(output1, input1, config=config)
        shmem.barrier()
        shmem.ccl.all_reduce(output1, input1, config=config, workspace=workspace)
        _synchronize()
        expected_sum1 = sum(range(1, world_size + 1))

        shmem.ccl.barrier()

        input2 = shmem.zeros((M, N), dtype=torch.float32)
        input2.fill_(float(rank + 10))
        output2 = shmem.zeros((M, N), dtype=torch.float32)
        workspace2 = shmem.ccl.all_reduce_preamble(output2, input2, config=config)
        shmem.barrier()
        shmem.ccl.all_reduce(output2, input2, config=config, workspace=workspace2)
        _synchronize()
        expected_sum2 = sum(range(10, world_size + 10))

        assert torch.allclose(output1, torch.full_like(output1, expected_sum1), atol=1e-5), (
            f"Rank {rank}: first all-reduce failed after barrier")
        assert torch.allclose(output2, torch.full_like(output2, expected_sum2), atol=1e-5), (
            f"Rank {rank}: second all-reduce failed after barrier")
    finally:
        shmem.barrier()
        del shmem
        gc.collect()


def _worker(rank, world_size, port):
    gc.freeze()  # the imports live as long as the rank: each test's gc.collect() then walks only its own objects
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}")
    for dtype in (torch.float16, torch.float32, torch.bfloat16):
        for numel in (1, 1000):
            for root in (0, "last"):
                test_broadcast(dtype, numel, root)
                test_reduce(dtype, numel, root)
    for shape in ((12, 8), (4, 6, 3)):
        test_broadcast_multidim(shape)
        test_reduce_multidim(shape)
    for dtype in (torch.float16, torch.float32, torch.bfloat16):
        for M, N, bm, bn in ((16, 8, 32, 64), (8, 24, 32, 16)):
            test_scatter(dtype, M, N, bm, bn)
            test_gather(dtype, M, N, bm, bn)
        test_scatter(dtype, 8, 8, 32, 64, src=world_size - 1)
        test_gather(dtype, 8, 8, 32, 64, dst=world_size - 1)
        test_sendrecv_ring(dtype, 16, 8)
        test_send_recv_paired(dtype, 8, 16)
    test_sendrecv_ring(torch.float32, 1, 1)
    for N in (1, 64, 1024):
        test_send_recv_sizes(N)
    test_isend_irecv()
    test_batch(all_pairs=False)
    test_batch(all_pairs=True)
    test_multiple_sends_and_pingpong()
    test_barrier_multiple_calls()
    test_barrier_with_all_reduce()
    print(f"rank {rank}: OK", flush=True)
    dist.destroy_process_group()
    gc.unfreeze()  # collected at exit as usual, so Triton's bindings see their objects freed


if __name__ == "__main__":
    world_size = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    mp.spawn(_worker, args=(world_size, int(sys.argv[1])), nprocs=world_size, join=True)
