"""What making a heap tensor costs: ways to put a torch tensor over an address, against
torch.empty + del, iris's view with ctx.free's detach (the least the pair does), and ctx.empty +
ctx.free on both allocators, all in one process and one run.

    python benchmarks/tensor_at_cost.py [--reps 20000] [--rounds 7]

Each case is timed in rounds of reps calls (the tensor made and dropped), rounds interleaved
across cases so that all see the same machine load; reported per call: the lowest round and the
median round. Before timing, each way is checked: its tensor aliases the address, and the object
riding on it dies with the last view, not before. The ctx.empty + ctx.free loop calls no collective
point itself: freed blocks come back at the points the heap passes when it is full or would grow,
whose cost is part of the figure. Writes benchmarks/results/.
"""
import argparse
import gc
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write_result  # noqa: E402

import iris  # noqa: E402
from iris.heap.lifetime import detach  # noqa: E402
from iris.heap.views import device_tensor_at, host_tensor_at  # noqa: E402

NBYTES = 16 << 10


class _Owner:
    __slots__ = ("died", "__weakref__")

    def __init__(self, died=None):
        self.died = died

    def __del__(self):
        if self.died is not None:
            self.died.append(True)


def as_tensor_at(ptr, device, owner):
    """What iris does on GPUs: torch.as_tensor over the CUDA array interface, the owner riding on it."""
    return device_tensor_at(ptr, (NBYTES,), torch.uint8, device, owner, NBYTES)


def set_at(ptr, device, owner):
    """A non-owning storage with the owner on it, set_ into a fresh empty tensor."""
    s = torch._C._construct_storage_from_data_pointer(ptr, device, NBYTES)
    s.owner = owner
    return torch.empty(0, dtype=torch.uint8, device=device).set_(s, 0, (NBYTES,))


_template = {}


def storage_at(ptr, device, owner):
    """A non-owning storage with the owner on it, template.new(storage) (tried, slower on an H200)."""
    st = torch._C._construct_storage_from_data_pointer(ptr, device, NBYTES)
    st.owner = owner
    if device not in _template:
        _template[device] = torch.empty(0, dtype=torch.uint8, device=device)
    return _template[device].new(st)


def host_at(ptr, device, owner):
    """What iris does now on the host: frombuffer (as before)."""
    return host_tensor_at(ptr, (NBYTES,), torch.uint8, device, owner, NBYTES)


def _check(make, ptr, device):
    """The tensor aliases ptr, and its owner outlives a slice and a dtype view, then dies."""
    died = []
    t = make(ptr, device, _Owner(died))
    ok = t.data_ptr() == ptr and t.numel() == NBYTES and t.device == device
    views = [t[5:], t.view(torch.int32)]
    del t
    gc.collect()
    ok = ok and not died
    views.clear()
    gc.collect()
    return ok and died == [True]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    backing = torch.empty(NBYTES, dtype=torch.uint8, device=device)
    ptr, owner = backing.data_ptr(), _Owner()
    makers = {"storage + template.new": storage_at, "storage + empty(0).set_": set_at}
    if cuda:
        makers["as_tensor, CUDA array interface (iris, GPU)"] = as_tensor_at
    else:
        makers["frombuffer (iris, host)"] = host_at
    checks = {name: _check(make, ptr, device) for name, make in makers.items()}
    cases = {"torch.empty + del": lambda: torch.empty(NBYTES, dtype=torch.uint8, device=device)}
    for name, make in makers.items():
        cases[name] = lambda make=make: make(ptr, device, owner)
    iris_view, dead = (as_tensor_at if cuda else host_at), torch.empty(0, dtype=torch.uint8, device=device)

    def view_detached():  # the least a ctx.empty + ctx.free pair does: iris's view, then ctx.free's detach
        t = iris_view(ptr, device, _Owner())
        detach(t, dead)
        return t
    cases["iris's view + detach (the pair's floor)"] = view_detached
    ctxs = {a: iris.iris(heap_size=1 << 26, allocator=a) for a in ("torch", "vmem")}
    for a, ctx in ctxs.items():
        ctx.free(ctx.empty(NBYTES, dtype=torch.uint8))  # back the block the timed calls use

        def pair(ctx=ctx):
            t = ctx.empty(NBYTES, dtype=torch.uint8)
            ctx.free(t)
            return t
        cases[f"ctx.empty + ctx.free ({a})"] = pair
    times = {name: [] for name in cases}
    gc.disable()
    for _ in range(args.rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(args.reps):
                fn()
            times[name].append((time.perf_counter() - t0) / args.reps)
    gc.enable()
    ref = statistics.median(times["torch.empty + del"])
    rows = [{"case": name, "min_us": 1e6 * min(v), "median_us": 1e6 * statistics.median(v),
             "ratio_to_torch_median": statistics.median(v) / ref, "checked": checks.get(name)}
            for name, v in times.items()]
    for ctx in ctxs.values():
        ctx.close()
    print(f"{'case':>48} {'min us':>8} {'median':>8} {'x torch':>8} checked")
    for r in rows:
        print(f"{r['case']:>48} {r['min_us']:8.2f} {r['median_us']:8.2f} {r['ratio_to_torch_median']:8.2f} {r['checked']}")
    print("wrote", write_result("tensor_at_cost", {"bytes": NBYTES, "reps": args.reps, "rounds": args.rounds,
                                                   "rows": rows}, args.out))


if __name__ == "__main__":
    main()
