"""A traced all-gather: every rank puts its rows into every rank's output with a DeviceContext built
with tracing=True; ctx.tracing records each put (rank, SM, start and end, bytes) and export() writes
Chrome/Perfetto JSON, per rank and merged on rank 0 on one clock, to the path given or else into a
new temporary folder (the working directory is left as it was); rank 0 prints where.

    python -m iris.run -n 2 examples/32_trace_all_gather.py [trace.json]
    iris trace trace.json        # a PNG timeline per rank and SM; or open trace.json in ui.perfetto.dev
"""
import os
import sys
import tempfile

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def all_gather_kernel(context, inp, out, rows, cols, rank: tl.constexpr, world: tl.constexpr,
                      BLOCK: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world, tracing=True)
    block = tl.program_id(0)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    mask = offs < rows * cols
    for peer in range(world):  # my rows land at rows [rank * rows, (rank + 1) * rows) of everyone's out
        ctx.put(inp + offs, out + rank * rows * cols + offs, peer, mask=mask)


def main() -> int:
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    if len(sys.argv) > 1:
        filename = sys.argv[1]
    else:  # one folder for every rank's file: rank 0 makes it
        folder = ctx.broadcast(tempfile.mkdtemp(prefix="iris-trace-") if rank == 0 else None)
        filename = os.path.join(folder, "trace.json")
    on_gpu = ctx.get_device().type == "cuda"
    rows, cols, block = (1024, 1024, 4096) if on_gpu else (8, 64, 128)  # the interpreter is slow
    inp = ctx.full((rows, cols), float(rank + 1), dtype=torch.float32)
    out = ctx.full((world * rows, cols), -1.0, dtype=torch.float32)
    ctx.tracing.enable(max_events=100_000)
    ctx.barrier()
    grid = (triton.cdiv(rows * cols, block),)
    all_gather_kernel[grid](ctx.get_device_context(), inp, out, rows, cols, rank, world, BLOCK=block)
    ctx.barrier()

    want = torch.arange(1, world + 1, dtype=torch.float32, device=out.device).repeat_interleave(rows)
    ok = torch.equal(out, want[:, None].expand(-1, cols))
    events = ctx.tracing.recorded()
    ctx.tracing.export(filename, merge=True)
    print(f"rank {rank}: all-gather {'ok' if ok else 'WRONG'}; {events} puts traced", flush=True)
    if rank == 0:
        print(f"rank 0: wrote {filename} (all ranks) and per-rank files; `iris trace {filename}` draws it", flush=True)
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
