"""Probe: where an eager ctx.ccl.all_reduce (4 KiB) and ctx.empty + ctx.free (16 KiB) spend host time,
by launch path and by tensor maker, with cProfile listings. Kept as it ran on 2x H200 on 2026-11-22
(before and after the launch fix; results in benchmarks/results/launch_probe-gpu-2ranks.json).

    OUT=/tmp python -m iris.run -n 2 benchmarks/launch_probe.py      # writes $OUT/probe1.json (rank 0)

"_host" is Python time per call over back-to-back calls, "_eager" wall time including the final sync."""
import cProfile, io, os, pstats, statistics, sys, time
import torch
import iris

def per_call(fn, n=2000, reps=5):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n): fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return round(statistics.median(out), 2)

def host_only(fn, n=2000):
    """host time per call, device kept busy? no: just the python call time, then sync"""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return round((t1 - t0) / n * 1e6, 2)

ctx = iris.iris(heap_size=1 << 30)
r, dev = ctx.rank, ctx.device
res = {}
x = torch.randn(2048, device=dev).to(torch.bfloat16)
out = torch.empty_like(x)
ctx.ccl.all_reduce(out, x)
res["ar_eager"] = per_call(lambda: ctx.ccl.all_reduce(out, x))
res["ar_host"] = host_only(lambda: ctx.ccl.all_reduce(out, x))
res["copy_eager"] = per_call(lambda: out.copy_(x))
res["copy_host"] = host_only(lambda: out.copy_(x))
plan = ctx.ccl._last_ar.plan
lau = next(iter(plan.launchers.values()))
k = lau.last
args = plan.args
stream = torch._C._cuda_getCurrentRawStream(dev.index)
g_ = lau.grid
res["krun_host"] = host_only(lambda: k.run(g_[0], g_[1], g_[2], stream, k.function, k.packed_metadata, None, None, None, *args))
res["getstream_host"] = host_only(lambda: torch._C._cuda_getCurrentRawStream(dev.index))
res["launch_trusted_host"] = host_only(lambda: lau.launch_trusted(args))
# graph of one all_reduce
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    ctx.ccl.all_reduce(out, x)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    ctx.ccl.all_reduce(out, x)
torch.cuda.synchronize(); ctx.barrier()
res["graph_replay_eager"] = per_call(g.replay)
res["graph_replay_host"] = host_only(g.replay)
try:
    from cuda.bindings import driver as cu
    ex = cu.CUgraphExec(g.raw_cuda_graph_exec())
    st = cu.CUstream(stream)
    res["cuGraphLaunch_eager"] = per_call(lambda: cu.cuGraphLaunch(ex, st))
    res["cuGraphLaunch_host"] = host_only(lambda: cu.cuGraphLaunch(ex, st))
    from cuda.bindings import runtime as rt
    res["cudaGraphLaunch_host"] = host_only(lambda: rt.cudaGraphLaunch(g.raw_cuda_graph_exec(), stream))
except Exception as e:
    res["cuGraphLaunch_err"] = repr(e)
# verify correctness after graph launches
xs = x.float() * 0 + (r + 1)
x.copy_(xs.to(torch.bfloat16)); out.fill_(-7)
torch.cuda.synchronize(); ctx.barrier()
cu.cuGraphLaunch(ex, st); torch.cuda.synchronize()
res["graph_result_ok"] = bool((out.float() == sum(q + 1 for q in range(ctx.world))).all().item())
ctx.barrier()
# profile of eager all_reduce
pr = cProfile.Profile(); pr.enable()
for _ in range(3000): ctx.ccl.all_reduce(out, x)
pr.disable(); torch.cuda.synchronize()
sio = io.StringIO(); pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(12)
prof_ar = sio.getvalue()
ctx.barrier()
# allocation: torch.empty vs ctx.empty+free vs tensor makers
nb = 16 << 10
def te(): t = torch.empty(nb, dtype=torch.uint8, device=dev); del t
res["torch_empty_del"] = host_only(te, 20000)
def ie(): t = ctx.empty(nb, dtype=torch.uint8); ctx.free(t)
res["ctx_empty_free"] = host_only(ie, 20000)
from iris.heap.views import cuda_tensor_at
base = ctx.empty(nb, dtype=torch.uint8); ptr = base.data_ptr()
res["as_tensor_cai"] = host_only(lambda: cuda_tensor_at(ptr, (nb // 2,), torch.bfloat16, dev, None), 20000)
mk = torch._C._construct_storage_from_data_pointer
res["construct_storage"] = host_only(lambda: mk(ptr, dev, nb), 20000)
res["empty0_set_"] = host_only(lambda: torch.empty(0, dtype=torch.bfloat16, device=dev).set_(mk(ptr, dev, nb), 0, (nb // 2,), (1,)), 20000)
tmpl = torch.empty(0, dtype=torch.bfloat16, device=dev)
res["new_empty0_set_"] = host_only(lambda: tmpl.new_empty(0).set_(mk(ptr, dev, nb), 0, (nb // 2,), (1,)), 20000)
class O: pass
def full():
    st = mk(ptr, dev, nb); st.owner = O()
    return torch.empty(0, dtype=torch.bfloat16, device=dev).set_(st, 0, (nb // 2,), (1,))
res["storage_owner_set_"] = host_only(full, 20000)
pr = cProfile.Profile(); pr.enable()
for _ in range(20000): ie()
pr.disable()
sio = io.StringIO(); pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(14)
prof_alloc = sio.getvalue()
ctx.barrier()
print(f"rank {r}: {res}", flush=True)
if r == 0:
    print(prof_ar[-3500:]); print(prof_alloc[-3500:])
    import json; os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
    json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe1.json"), "w"), indent=1)
ctx.close()
