"""A torch.distributed program on the "iris" backend: DDP training, then a tensor-parallel MLP (DTensor).

    python -m iris.run -n 2 examples/40_torch_distributed.py
    torchrun --nproc_per_node 2 examples/40_torch_distributed.py

The program speaks only torch.distributed; `import iris` registers the backend and
`dist.init_process_group("iris")` is the one word that changes. DDP averages the gradients of a small
model over the ranks for a few steps; every rank must end with the same weights. Then
parallelize_module splits an MLP column- and row-wise over a DeviceMesh, and its output must equal
the unsharded MLP's. The heap under the backend is reachable as iris.torch_backend.context().
"""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

import iris
from iris.torch_backend import Options

STEPS, DIM, HIDDEN = 5, 16, 32


def train(device):
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(dist.get_rank())  # each rank its own batches
    for step in range(STEPS):
        x, y = torch.randn(32, DIM, generator=g).to(device), torch.randn(32, 1, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, flat)
    if not all(torch.equal(c, flat) for c in copies):
        raise SystemExit(f"rank {dist.get_rank()}: DDP left the ranks with different weights")
    return loss.item()


def tensor_parallel(device):
    w = dist.get_world_size()
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN * w), torch.nn.ReLU(), torch.nn.Linear(HIDDEN * w, DIM))
    mlp = mlp.to(device)
    x = torch.randn(4, DIM, generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        want = mlp(x)
        mesh = init_device_mesh(device.type, (w,))
        tp = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        got = tp(x)
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
        raise SystemExit(f"rank {dist.get_rank()}: the tensor-parallel MLP differs from the unsharded one by "
                         f"{(got - want).abs().max().item()}")


def main():
    dist.init_process_group("iris", pg_options=Options(heap_size=1 << 26))
    ctx = iris.torch_backend.context()
    device = ctx.get_device()
    loss = train(device)
    tensor_parallel(device)
    print(f"rank {dist.get_rank()}/{dist.get_world_size()}: DDP {STEPS} steps (last loss {loss:.4f}), "
          f"weights equal on every rank; tensor-parallel MLP equals the unsharded one: ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
