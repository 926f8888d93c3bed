"""ctx.device_barrier(): a barrier that runs on the device, in stream order, with no host round
trip. Each round every rank writes its slot on every rank, meets the others, and reads all slots.

    python -m iris.run -n 2 examples/05_device_barrier.py
"""
import sys
import time

import torch
import triton

import iris


@triton.jit
def announce_kernel(slots, value, me, world, heap_bases):
    for r in range(world):
        iris.store(slots + me, value, me, r, heap_bases)


def main() -> int:
    ctx = iris.iris(heap_size=1 << 24)
    me, world, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    rounds = 20 if dev.type == "cpu" else 1000
    slots = ctx.full((world,), -1, dtype=torch.int64)
    ctx.device_barrier()  # the first call allocates the barrier's flags (collective)
    wrong = 0
    for i in range(rounds):
        announce_kernel[(1,)](slots, i * world + me, me, world, ctx.get_heap_bases())
        ctx.device_barrier()
        want = torch.arange(world, device=dev) + i * world
        wrong += int(not torch.equal(slots, want))  # waits for the device only, not for the peers
        ctx.device_barrier()  # nobody overwrites a slot before every rank has read it

    if dev.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(rounds):
        ctx.device_barrier()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    per = (time.perf_counter() - start) / rounds * 1e6
    print(f"rank {me}: {rounds} rounds of write / device_barrier / read, {wrong} wrong: "
          f"{'ok' if wrong == 0 else 'WRONG'}; {per:.1f} us per device_barrier", flush=True)
    ctx.close()
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
