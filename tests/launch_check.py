"""Run under any launcher: make a heap, write into the next rank's copy, check what the previous wrote."""
import sys

import torch

import iris

ctx = iris.iris(heap_size=1 << 22, allocator=sys.argv[1] if len(sys.argv) > 1 else "vmem", timeout=60)
r, w = ctx.get_rank(), ctx.get_num_ranks()
x = ctx.full((4096,), -1.0)
ctx.barrier()
ctx.peer_view(x, (r + 1) % w).copy_(torch.arange(4096, dtype=torch.float32, device=x.device) + 10_000 * r)
ctx.barrier()
ok = torch.equal(x.cpu(), torch.arange(4096, dtype=torch.float32) + 10_000 * ((r - 1) % w))
print(f"rank {r} of {w}: {'ok' if ok else 'WRONG'}", flush=True)
ctx.close()
sys.exit(0 if ok and w > 1 else 1)
