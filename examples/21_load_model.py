"""A model's whole path: write a small Llama-style transformer's checkpoint (two safetensors files
and an index, as models ship), load it onto the heap sharded over the ranks (Megatron-style:
q/k/v, gate/up and the LM head split by output rows, o and down by input columns), and run the
forward pass: each rank computes its partial products in a Triton kernel that stores them into
every rank's heap with iris.store (an all-reduce or all-gather without a host round trip for
the data), then a barrier. Checked against the unsharded model on one device.

    python -m iris.run -n 2 examples/21_load_model.py
"""
import json
import os
import shutil
import tempfile

import torch
import triton
import triton.language as tl

import iris

try:
    from safetensors.torch import save_file
except ImportError:
    raise SystemExit("this example writes its checkpoint with safetensors: pip install 'iris-shmem[weights]'") from None

CONFIG = {"vocab": 512, "dim": 64, "heads": 4, "ffn": 128, "layers": 2}
BLOCK_M, BLOCK_N, BLOCK_K = 16, 32, 32


def init_weights(vocab, dim, heads, ffn, layers, seed=0):
    """name -> tensor, with the names Llama checkpoints use."""
    g = torch.Generator().manual_seed(seed)
    w = {"model.embed_tokens.weight": torch.randn(vocab, dim, generator=g),
         "model.norm.weight": 1 + 0.1 * torch.randn(dim, generator=g),
         "lm_head.weight": torch.randn(vocab, dim, generator=g) / dim ** 0.5}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("q", "k", "v", "o"):
            w[p + f"self_attn.{n}_proj.weight"] = torch.randn(dim, dim, generator=g) / dim ** 0.5
        w[p + "mlp.gate_proj.weight"] = torch.randn(ffn, dim, generator=g) / dim ** 0.5
        w[p + "mlp.up_proj.weight"] = torch.randn(ffn, dim, generator=g) / dim ** 0.5
        w[p + "mlp.down_proj.weight"] = torch.randn(dim, ffn, generator=g) / ffn ** 0.5
        w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(dim, generator=g)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(dim, generator=g)
    return w


def write_checkpoint(folder, weights):
    names = sorted(weights)
    weight_map = {}
    for k, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        fname = f"model-{k + 1:05d}-of-00002.safetensors"
        save_file({n: weights[n] for n in part}, os.path.join(folder, fname))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def attention(q, k, v, heads):
    """Causal attention over `heads` heads of q, k, v (tokens, heads * head_dim)."""
    t = q.shape[0]
    q, k, v = (z.view(t, heads, -1).transpose(0, 1) for z in (q, k, v))
    s = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(0, 1).reshape(t, -1)


def reference(w, tokens, cfg):
    """The unsharded model, plain torch, on one device."""
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"])
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        x = x + attention(q, k, v, cfg["heads"]) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"])
        a = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + a @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


@triton.jit
def matmul_to_all_kernel(a_ptr, w_ptr, out_ptr, M, N, K, out_stride, out_col, out_slot, rank, world, heap_bases,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C = A (M x K) @ W (N x K).T, tile by tile, stored into every rank's heap with iris.store at
    out + rank * out_slot + row * out_stride + out_col + col: with out_slot = M * N a slot per
    rank (the partial sums of an all-reduce), with out_col = rank * N a column block per rank
    (an all-gather)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, w, input_precision="ieee")
    dst = out_ptr + rank * out_slot + rows[:, None] * out_stride + out_col + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    for peer in range(world):
        iris.store(dst, acc, rank, peer, heap_bases, mask=mask)


class TensorParallel:
    """The forward pass over this rank's shards; partial products meet through the heap."""

    def __init__(self, ctx, weights, cfg, tokens):
        self.ctx, self.w, self.cfg = ctx, weights, cfg
        self.rank, self.world = ctx.get_rank(), ctx.get_num_ranks()
        t, dim = tokens.numel(), cfg["dim"]
        # one output buffer per exchange, allocated up front (collective), so no rank overwrites a
        # buffer a peer is still reading: 2 all-reduces per layer, then the logits' all-gather
        self.reduce = [ctx.empty(self.world, t, dim) for _ in range(2 * cfg["layers"])]
        self.logits = ctx.empty(t, cfg["vocab"])
        for b in self.reduce + [self.logits]:
            b.fill_(float("nan"))  # poison: every element must be written by some rank
        ctx.barrier()
        self.used = 0

    def _launch(self, a, w, out, out_stride, out_col, out_slot):
        a = a.contiguous()
        m, k, n = a.shape[0], a.shape[1], w.shape[0]
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
        matmul_to_all_kernel[grid](a, w, out, m, n, k, out_stride, out_col, out_slot, self.rank, self.world,
                                   self.ctx.get_heap_bases(), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
        self.ctx.barrier()  # every rank's stores have landed everywhere

    def all_reduce_matmul(self, a, w):
        """sum over ranks of a @ w.T (w: this rank's column shard)."""
        out = self.reduce[self.used]
        self.used += 1
        self._launch(a, w, out, out.shape[2], 0, out.shape[1] * out.shape[2])
        return out.sum(0)

    def all_gather_matmul(self, a, w):
        """a @ W.T with W's rows split over the ranks (w: this rank's rows), gathered by columns."""
        self._launch(a, w, self.logits, self.logits.shape[1], self.rank * w.shape[0], 0)
        return self.logits

    def forward(self, tokens):
        w, cfg = self.w, self.cfg
        x = w["model.embed_tokens.weight"][tokens]
        for i in range(cfg["layers"]):
            p = f"model.layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"])
            q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")  # this rank's heads
            local = attention(q, k, v, cfg["heads"] // self.world)
            x = x + self.all_reduce_matmul(local, w[p + "self_attn.o_proj.weight"])
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"])
            a = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
            x = x + self.all_reduce_matmul(a, w[p + "mlp.down_proj.weight"])
        return self.all_gather_matmul(rms_norm(x, w["model.norm.weight"]), w["lm_head.weight"])


def shard_for(rank, world):
    """Which part of each tensor this rank keeps: rows of column-parallel layers, columns of
    row-parallel ones, all of the embedding and the norms."""
    def shard(name, shape):
        part = lambda n: slice(rank * n // world, (rank + 1) * n // world)  # noqa: E731
        if any(s in name for s in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head")):
            return (part(shape[0]),)
        if "o_proj" in name or "down_proj" in name:
            return (slice(None), part(shape[1]))
        return None
    return shard


def main():
    ctx = iris.iris(heap_size=1 << 26, allocator="vmem")
    r, world = ctx.get_rank(), ctx.get_num_ranks()
    if CONFIG["heads"] % world or CONFIG["ffn"] % world or CONFIG["vocab"] % world:
        raise SystemExit(f"run with a number of ranks that divides {CONFIG['heads']} heads")
    dev = ctx.get_device()
    weights = init_weights(**CONFIG)
    folder = os.path.join(tempfile.gettempdir(), f"iris-21-{os.getuid()}-{os.getppid()}")
    if r == 0:
        os.makedirs(folder, exist_ok=True)
        write_checkpoint(folder, weights)
    ctx.barrier()

    shards = ctx.load_safetensors(folder, shard=shard_for(r, world))
    ctx.barrier()
    kept, total = sum(t.numel() for t in shards.values()), sum(t.numel() for t in weights.values())
    tokens = torch.randint(0, CONFIG["vocab"], (16,), generator=torch.Generator().manual_seed(1)).to(dev)
    tp = TensorParallel(ctx, shards, CONFIG, tokens)
    with torch.no_grad():
        logits = tp.forward(tokens).clone()
        expect = reference({k: v.to(dev) for k, v in weights.items()}, tokens, CONFIG)
    err = float((logits - expect).abs().max())
    ok = not torch.isnan(logits).any() and err < 1e-3
    print(f"rank {r}: kept {kept}/{total} weights ({shards.stats['bytes_read']} bytes read), "
          f"{world}-way tensor-parallel logits vs the unsharded model: max error {err:.2e}: {'ok' if ok else 'WRONG'}")
    ctx.barrier()
    ctx.close()
    if r == 0:
        shutil.rmtree(folder, ignore_errors=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
