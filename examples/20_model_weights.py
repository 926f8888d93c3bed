"""Model weights on the heap: save a small transformer as safetensors, load it onto the heap on
every rank, and run a tensor-parallel linear layer whose kernel reads the peer's weight shard
with iris.load. Checked against the same model on one device.

    python -m iris.run -n 2 examples/20_model_weights.py
"""
import os
import tempfile

import torch
import triton
import triton.language as tl

import iris

try:
    from safetensors.torch import save_file
except ImportError:
    raise SystemExit("this example writes its checkpoint with safetensors: pip install 'iris-shmem[weights]'") from None

CONFIG = {"vocab": 256, "dim": 64, "heads": 4, "ffn": 256, "layers": 2, "seed": 0}


class Block(torch.nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.up, self.down = torch.nn.Linear(dim, ffn), torch.nn.Linear(ffn, dim)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab, dim, heads, ffn, layers, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


@triton.jit
def tp_linear_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, shard_rows, rank, heap_bases,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y = x @ W.T + b where rank r's heap holds rows [r*shard_rows, (r+1)*shard_rows) of W and b."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    owner = (pid_n * BLOCK_N) // shard_rows          # the rank holding these output features
    local = cols - owner * shard_rows                # row of W in the owner's shard
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        w = iris.load(w_ptr + local[None, :] * K + ks[:, None], rank, owner, heap_bases,
                      mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, w, input_precision="ieee")
    acc += iris.load(bias_ptr + local, rank, owner, heap_bases, mask=cols < N, other=0.0)[None, :]
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


def main():
    ctx = iris.iris(heap_size=1 << 26, allocator="vmem")
    r, w = ctx.get_rank(), ctx.get_num_ranks()
    dev = ctx.get_device()
    ref = TinyTransformer(**CONFIG).to(dev).eval()
    path = os.path.join(tempfile.gettempdir(), f"iris-tiny-transformer-{os.getuid()}-{os.environ.get('IRIS_SOCKET_DIR', '').replace('/', '_')}.safetensors")
    if r == 0:
        save_file({k: v.detach().cpu().contiguous() for k, v in ref.state_dict().items()}, path)
    ctx.barrier()

    # 1. The whole checkpoint on the heap, on every rank, then the model's parameters moved onto it.
    weights = ctx.load_safetensors(path)
    assert all(ctx.is_symmetric(t) for t in weights.values())
    model = TinyTransformer(**CONFIG).to(dev).eval()
    model.load_state_dict(weights)
    ctx.module_to_heap(model, copy=True)
    tokens = torch.randint(0, CONFIG["vocab"], (2, 16), generator=torch.Generator().manual_seed(1)).to(dev)
    with torch.no_grad():
        full_ok = torch.allclose(model(tokens), ref(tokens), atol=1e-5)

    # 2. Tensor parallel: each rank loads its shard of the first block's up-projection.
    ffn, dim = CONFIG["ffn"], CONFIG["dim"]
    rows = ffn // w
    shard = ctx.load_safetensors(path, names=["blocks.0.up.weight", "blocks.0.up.bias"],
                                 shard=lambda name, shape: (slice(r * rows, (r + 1) * rows),))
    ctx.barrier()
    with torch.no_grad():
        x = ref.blocks[0].norm2(ref.embed(tokens)).reshape(-1, dim).contiguous()
        expect = ref.blocks[0].up(x)
    y = torch.full((x.shape[0], ffn), float("nan"), device=dev)
    BLOCK_N = 32
    grid = (triton.cdiv(x.shape[0], 16), triton.cdiv(ffn, BLOCK_N))
    tp_linear_kernel[grid](x, shard["blocks.0.up.weight"], shard["blocks.0.up.bias"], y, x.shape[0], ffn, dim, rows,
                           r, ctx.get_heap_bases(), BLOCK_M=16, BLOCK_N=BLOCK_N, BLOCK_K=32)
    err = float((y - expect).abs().max())
    tp_ok = not torch.isnan(y).any() and err < 1e-4
    ctx.barrier()
    print(f"rank {r}: full model on the heap matches the reference: {full_ok}; "
          f"tensor-parallel up-projection ({w} shards, peer shard read with iris.load) max error {err:.2e}: {tp_ok}")
    ctx.close()
    if r == 0:
        os.unlink(path)
    if not (full_ok and tp_ok):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
