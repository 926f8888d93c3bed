"""A two-layer MLP split over the ranks (tensor parallel), its output reduced with ctx.ccl.all_reduce.

    python -m iris.run -n 2 examples/30_tensor_parallel_mlp.py

Layer 1 is column-parallel (each rank holds a slice of the hidden features: rows of w1), layer 2
row-parallel (the matching columns of w2), so each rank computes a partial output and one all_reduce
sums them. Rank 0 writes the weights to a safetensors file; every rank loads only its shard onto the
heap with ctx.load_safetensors. The result is checked against the unsplit MLP on one device.
"""
import os
import tempfile

import torch

import iris

try:
    from safetensors.torch import save_file
except ImportError:
    raise SystemExit("this example writes its checkpoint with safetensors: pip install 'iris-shmem[weights]'") from None

BATCH, DIM, HIDDEN = 8, 64, 256


def main():
    ctx = iris.iris(heap_size=1 << 26)
    r, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    if HIDDEN % w:
        raise SystemExit(f"HIDDEN={HIDDEN} must split evenly over {w} ranks")
    g = torch.Generator().manual_seed(0)
    full = {"w1": torch.randn(HIDDEN, DIM, generator=g) / DIM ** 0.5,
            "w2": torch.randn(DIM, HIDDEN, generator=g) / HIDDEN ** 0.5}
    x = torch.randn(BATCH, DIM, generator=g).to(dev)

    # one file for the job: rank 0 names and writes it, the others learn its name from rank 0
    path = ctx.group.allgather(os.path.join(tempfile.mkdtemp(), "mlp.safetensors") if r == 0 else None)[0]
    if r == 0:
        save_file(full, path)
    ctx.barrier()

    part = HIDDEN // w
    rows = slice(r * part, (r + 1) * part)
    shard = {"w1": (rows, slice(None)), "w2": (slice(None), rows)}
    weights = ctx.load_safetensors(path, shard=lambda name, shape: shard[name])

    h = torch.nn.functional.gelu(x @ weights["w1"].T)   # (BATCH, HIDDEN / w): column-parallel
    y = h @ weights["w2"].T                              # (BATCH, DIM): this rank's partial sum
    ctx.ccl.all_reduce(y, y)                             # in place: the full output on every rank

    ref = torch.nn.functional.gelu(x @ full["w1"].to(dev).T) @ full["w2"].to(dev).T
    err = (y - ref).abs().max().item()
    ok = torch.allclose(y, ref, rtol=1e-4, atol=1e-5)
    print(f"rank {r}/{w}: tensor-parallel MLP output {tuple(y.shape)}, max |diff| vs one device {err:.2e}: "
          f"{'ok' if ok else 'WRONG'}")
    ctx.barrier()
    if r == 0:
        os.remove(path)
        os.rmdir(os.path.dirname(path))
    ctx.close()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
