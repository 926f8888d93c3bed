"""Run under a launcher (iris.run or torchrun): every collective of torch.distributed on the "iris"
backend against gloo on the same random data, then DDP training and DTensor tensor parallelism.
argv: [cpu|cuda] [sections, comma separated: adopt,ops,p2p,sub,ddp,tp,graph; default all but adopt];
graph (CUDA only): every collective and send/recv captured in a CUDA graph and replayed on new data.
Prints "rank R: ok" when every element matched."""
import os
import sys
import warnings

import torch
import torch.distributed as dist

import iris
from iris.torch_backend import Options

warnings.simplefilter("ignore", FutureWarning)
import faulthandler  # noqa: E402
faulthandler.dump_traceback_later(int(os.environ.get("TB_DUMP", "0")) or 10 ** 6, exit=True)
DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
PARTS = set((sys.argv[2] if len(sys.argv) > 2 else "ops,p2p,sub,ddp,tp,graph").split(","))
# mpiexec sets MPI's variables only: rank and size from them (MASTER_ADDR/MASTER_PORT come from the caller)
MPI = {} if "RANK" in os.environ or "OMPI_COMM_WORLD_RANK" not in os.environ else {
    "rank": int(os.environ["OMPI_COMM_WORLD_RANK"]), "world_size": int(os.environ["OMPI_COMM_WORLD_SIZE"])}
OPTIONS = Options(heap_size=1 << 25, mailbox_bytes=1 << 18)
if "adopt" in PARTS:  # a context the program made first (under iris.run), adopted by the backend
    OPTIONS = Options(ctx=iris.iris(heap_size=1 << 25), mailbox_bytes=1 << 18)
dist.init_process_group("iris", pg_options=OPTIONS, **MPI)
R, W = dist.get_rank(), dist.get_world_size()
DEV = torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")
GLOO = dist.new_group(backend="gloo")
ctx = iris.torch_backend.context()
failures = []
if "adopt" in PARTS and ctx is not OPTIONS.ctx:
    failures.append("Options(ctx=...) was not adopted")


def same(name, got, want):
    if os.environ.get("TB_DUMP"):
        print(R, name, flush=True)
    got, want = got.cpu(), want.cpu()
    if got.shape != want.shape or not torch.equal(got, want):
        bad = (got != want).nonzero()[:3].tolist() if got.shape == want.shape else "shape"
        failures.append(f"{name}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()} at {bad}")


def data(shape, dtype, seed):
    g = torch.Generator().manual_seed(1000 * seed + R)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool().to(DEV)
    return torch.randint(-8, 8, shape, generator=g).to(dtype).to(DEV)


def both(fn, *tensors):
    """fn(group, *copies) on iris then on gloo (gloo on CPU copies), the tensors after each."""
    a = [t.clone() for t in tensors]
    b = [t.cpu().clone() for t in tensors]
    fn(None, *a)
    fn(GLOO, *b)
    return a, b


def poison(t):
    return t.fill_(True) if t.dtype == torch.bool else t.fill_(-77)


if "ops" in PARTS:
    seed = 0
    # all_reduce: every op, several dtypes (ctx.ccl's and gathered ones), heap and plain tensors, odd sizes
    O = dist.ReduceOp
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.int8):
        for op in (O.SUM, O.MAX, O.MIN, O.PRODUCT, O.AVG, O.BAND, O.BOR, O.BXOR):
            if op == O.AVG or (op in (O.BAND, O.BOR, O.BXOR) and dtype.is_floating_point):
                continue  # gloo has no AVG; bitwise ops need integers (iris refuses both the same way)
            seed += 1
            x = data((37, 3), dtype, seed)
            a, b = both(lambda g, t: dist.all_reduce(t, op=op, group=g), x)
            same(f"all_reduce {dtype} {op}", a[0], b[0])
    x = data((1000,), torch.float32, 99)
    h = ctx.empty(1000, dtype=torch.float32)
    h.copy_(x)
    dist.all_reduce(h)  # zero copy: in place on the heap
    want = x.cpu().clone()
    dist.all_reduce(want, group=GLOO)
    same("all_reduce heap tensor", h, want)
    # heap tensors in place (zero copy): broadcast of 2-D and 16-bit data, all_to_all twice on the same
    # tensors (the second call reuses their word views), reduce_scatter and all_gather
    for shape, dtype in (((9, 2), torch.float32), ((10,), torch.bfloat16)):
        h = ctx.empty(shape, dtype=dtype)
        h.copy_(data(shape, dtype, 95))
        want = h.cpu().clone()
        dist.broadcast(h, W - 1)
        dist.broadcast(want, W - 1, group=GLOO)
        same(f"broadcast heap {dtype}", h, want)
    for root in range(W):  # in place on the heap: the root reads every member's tensor where it is
        for op in (O.SUM, O.MAX):
            x = data((9, 2), torch.float32, 94 + root)
            h = ctx.empty(9, 2)
            h.copy_(x)
            want = x.cpu().clone()
            dist.reduce(h, root, op=op)
            dist.reduce(want, root, op=op, group=GLOO)
            same(f"reduce heap {op} to {root}", h, want if R == root else x)
    hi, ho = ctx.empty(4 * W, 3), ctx.empty(4 * W, 3)
    for k in range(2):
        x = data((4 * W, 3), torch.float32, 93 + k)
        hi.copy_(x)
        poison(ho)
        dist.all_to_all_single(ho, hi)
        want = torch.empty(4 * W, 3)
        dist.all_to_all_single(want, x.cpu(), group=GLOO)
        same(f"all_to_all_single heap call {k}", ho, want)
    hi, ho = ctx.empty(6 * W), ctx.empty(6)
    hi.copy_(data((6 * W,), torch.float32, 92))
    poison(ho)
    dist.reduce_scatter_tensor(ho, hi)
    want = torch.empty(6)
    dist.reduce_scatter_tensor(want, hi.cpu(), group=GLOO)
    same("reduce_scatter_tensor heap", ho, want)
    hi, ho = ctx.empty(7), ctx.empty(7 * W)
    hi.copy_(data((7,), torch.float32, 91))
    poison(ho)
    dist.all_gather_into_tensor(ho, hi)
    want = torch.empty(7 * W)
    dist.all_gather_into_tensor(want, hi.cpu(), group=GLOO)
    same("all_gather_into_tensor heap", ho, want)
    avg = data((64,), torch.float32, 98)
    want = avg.cpu().clone()
    dist.all_reduce(want, group=GLOO)
    dist.all_reduce(avg, op=O.AVG)
    same("all_reduce AVG", avg, want / W)
    try:
        dist.all_reduce(data((4,), torch.int32, 1), op=O.AVG)
        failures.append("AVG on int32 was not refused")
    except RuntimeError as e:
        assert "all_reduce" in str(e) and "AVG" in str(e), e
    coal = [data((5,), torch.float32, 97), data((7, 2), torch.float32, 96)]
    a, b = both(lambda g, *ts: dist.all_reduce_coalesced(list(ts), group=g), *coal)
    for i in range(2):
        same(f"all_reduce_coalesced {i}", a[i], b[i])

    for dtype in (torch.float32, torch.bfloat16, torch.uint8, torch.bool):
        seed += 1
        x = data((13, 3), dtype, seed)
        out = poison(torch.empty((13 * W, 3), dtype=dtype, device=DEV))
        a, b = both(lambda g, o, t: dist.all_gather_into_tensor(o, t, group=g), out, x)
        same(f"all_gather_into_tensor {dtype}", a[0], b[0])
        outs_i = [poison(torch.empty((13, 3), dtype=dtype, device=DEV)) for _ in range(W)]
        outs_g = [o.cpu().clone() for o in outs_i]
        dist.all_gather(outs_i, x)
        dist.all_gather(outs_g, x.cpu(), group=GLOO)
        for r in range(W):
            same(f"all_gather {dtype} [{r}]", outs_i[r], outs_g[r])
        for op in (O.SUM, O.MAX, O.MIN) if dtype != torch.bool else ():
            big = data((6 * W, 5), dtype, seed + 500)
            out = poison(torch.empty((6, 5), dtype=dtype, device=DEV))
            a, b = both(lambda g, o, t: dist.reduce_scatter_tensor(o, t, op=op, group=g), out, big)
            same(f"reduce_scatter_tensor {dtype} {op}", a[0], b[0])
        seed += 1
        x = data((4 * W, 3), dtype, seed)
        out = poison(torch.empty_like(x))
        a, b = both(lambda g, o, t: dist.all_to_all_single(o, t, group=g), out, x)
        same(f"all_to_all_single {dtype}", a[0], b[0])
        ins_split = [(R + r) % 3 + 1 for r in range(W)]  # rows this rank sends to each
        outs_split = [(r + R) % 3 + 1 for r in range(W)]  # rows each rank sends here
        x = data((sum(ins_split), 2), dtype, seed + 1)
        out = poison(torch.empty((sum(outs_split), 2), dtype=dtype, device=DEV))
        a, b = both(lambda g, o, t: dist.all_to_all_single(o, t, outs_split, ins_split, group=g), out, x)
        same(f"all_to_all_single uneven {dtype}", a[0], b[0])
        for root in range(W) if dtype == torch.float32 else (W - 1,):
            x = data((9, 2), dtype, seed + 2 + root)
            a, b = both(lambda g, t: dist.broadcast(t, root, group=g), x)
            same(f"broadcast {dtype} from {root}", a[0], b[0])
            if dtype != torch.bool:
                x = data((9, 2), dtype, seed + 20 + root)
                a, b = both(lambda g, t: dist.reduce(t, root, group=g), x)
                if R == root:
                    same(f"reduce {dtype} to {root}", a[0], b[0])
            x = data((4, 2), dtype, seed + 40 + root)
            gi = [poison(torch.empty_like(x)) for _ in range(W)] if R == root else None
            gg = [poison(torch.empty_like(x)).cpu() for _ in range(W)] if R == root else None
            dist.gather(x, gi, dst=root)
            dist.gather(x.cpu(), gg, dst=root, group=GLOO)
            if R == root:
                for r in range(W):
                    same(f"gather {dtype} to {root} [{r}]", gi[r], gg[r])
            chunks = [data((4, 2), dtype, seed + 60 + r) for r in range(W)] if R == root else None
            si, sg = poison(torch.empty((4, 2), dtype=dtype, device=DEV)), poison(torch.empty((4, 2), dtype=dtype))
            dist.scatter(si, chunks, src=root)
            dist.scatter(sg, [c.cpu() for c in chunks] if chunks else None, src=root, group=GLOO)
            same(f"scatter {dtype} from {root}", si, sg)

# functional collectives (DTensor's path, through torch's C++ ops) and the coalescing manager (FSDP's)
if "ops" in PARTS:
    import torch.distributed._functional_collectives as fc

    x = data((6, 4), torch.float32, 80)
    calls = {"fc all_reduce": lambda g, t: fc.all_reduce(t, "sum", g),
             "fc all_gather_tensor": lambda g, t: fc.all_gather_tensor(t, 0, g),
             "fc reduce_scatter_tensor": lambda g, t: fc.reduce_scatter_tensor(t.repeat(W, 1), "max", 0, g),
             "fc all_to_all_single": lambda g, t: fc.all_to_all_single(t.repeat(W, 1), None, None, g),
             "fc broadcast": lambda g, t: fc.broadcast(t, W - 1, g)}
    for name, fn in calls.items():
        same(name, fn(dist.group.WORLD, x.clone()).wait(), fn(GLOO, x.cpu().clone()).wait())
    got = fc.all_gather_into_tensor_coalesced([x, x[0]], dist.group.WORLD)
    want = fc.all_gather_into_tensor_coalesced([x.cpu(), x[0].cpu()], GLOO)
    for i, (a, b) in enumerate(zip(got, want)):
        same(f"fc all_gather_into_tensor_coalesced {i}", a.wait(), b.wait())
    lists = [[poison(torch.empty(6, 4, device=DEV)), poison(torch.empty(4, device=DEV))] for _ in range(W)]
    dist.all_gather_coalesced(lists, [x, x[2]])
    for r in range(W):
        mine = torch.randint(-8, 8, (6, 4), generator=torch.Generator().manual_seed(80000 + r)).float()
        same(f"all_gather_coalesced [{r}]", lists[r][0], mine)
        same(f"all_gather_coalesced [{r}] row", lists[r][1], mine[2])
    outs = [poison(torch.empty(6 * W, 4, device=DEV)), poison(torch.empty(W * 4, device=DEV))]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], x)
        dist.all_gather_into_tensor(outs[1], x[1])
    cm.wait()
    wants = [torch.empty(6 * W, 4), torch.empty(W * 4)]
    dist.all_gather_into_tensor(wants[0], x.cpu(), group=GLOO)
    dist.all_gather_into_tensor(wants[1], x[1].cpu(), group=GLOO)
    for i in range(2):
        same(f"coalescing manager all_gather {i}", outs[i], wants[i])

if "p2p" in PARTS:
    # send/recv around the ring (every rank sends first: the mailbox lets sends go ahead), odd byte counts too
    for n, dtype in ((1000, torch.float32), (3, torch.uint8), (300_000, torch.int32)):
        x = data((n,), dtype, 7)
        got = poison(torch.empty((n,), dtype=dtype, device=DEV))
        reqs = [dist.isend(x, (R + 1) % W), dist.irecv(got, (R - 1) % W)]  # larger than the mailbox too
        for q in reqs:
            q.wait()
        want = torch.empty((n,), dtype=dtype)
        reqs = [dist.isend(x.cpu(), (R + 1) % W, group=GLOO), dist.irecv(want, (R - 1) % W, group=GLOO)]
        for q in reqs:
            q.wait()
        same(f"send/recv {n} {dtype}", got, want)
    ops = [dist.P2POp(dist.isend, data((8,), torch.float32, 5), (R + 1) % W),
           dist.P2POp(dist.irecv, poison(torch.empty(8, device=DEV)), (R - 1) % W)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    prev = torch.Generator().manual_seed(5000 + (R - 1) % W)
    same("batch_isend_irecv", ops[1].tensor, torch.randint(-8, 8, (8,), generator=prev).float())

    # async_op: the Work's future holds the tensors
    x = data((16,), torch.float32, 3)
    want = x.cpu().clone()
    dist.all_reduce(want, group=GLOO)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    same("all_reduce async", work.get_future().wait()[0], want)
    dist.barrier()

# a sub-group of "iris" (the first and last rank), against the same sub-group on gloo
if "sub" in PARTS and W > 2:
    members = [0, W - 1]
    sub, sub_gloo = dist.new_group(members, backend="iris"), dist.new_group(members, backend="gloo")
    if R in members:
        x = data((33,), torch.float32, 11)
        want = x.cpu().clone()
        dist.all_reduce(x, group=sub)
        dist.all_reduce(want, group=sub_gloo)
        same("sub-group all_reduce", x, want)
        out = poison(torch.empty(66, device=DEV))
        want = poison(torch.empty(66))
        dist.all_gather_into_tensor(out, data((33,), torch.float32, 12), group=sub)
        dist.all_gather_into_tensor(want, data((33,), torch.float32, 12).cpu(), group=sub_gloo)
        same("sub-group all_gather", out, want)
        x = data((5,), torch.float32, 13)
        want = x.cpu().clone()
        dist.broadcast(x, W - 1, group=sub)
        dist.broadcast(want, W - 1, group=sub_gloo)
        same("sub-group broadcast", x, want)
        dist.barrier(group=sub)

# DDP: the same model, data and steps on "iris" and on gloo give equal losses
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def train(group, device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    ddp = DDP(model, process_group=group, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(R)
    losses = []
    for _ in range(4):
        x, y = torch.randn(16, 8, generator=g).to(device), torch.randn(16, 1, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    return torch.stack(losses), [p.detach().cpu() for p in model.parameters()]


if "ddp" in PARTS:
    li, pi = train(None, DEV)
    lg, pg = train(GLOO, torch.device("cpu"))
    if DEV.type == "cpu" and W == 2:  # two gradients sum alike in either order: equal to the bit
        same("DDP losses", li, lg)
        for i, (a, b) in enumerate(zip(pi, pg)):
            same(f"DDP parameter {i}", a, b)
    else:  # on GPUs, or 3+ terms (gloo's ring adds them in another order): last-bit differences
        for name, a, b in [("losses", li, lg)] + [(f"parameter {i}", a, b) for i, (a, b) in enumerate(zip(pi, pg))]:
            if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
                failures.append(f"DDP {name} {a.flatten()[:8].tolist()} vs gloo {b.flatten()[:8].tolist()}")

# DTensor tensor parallelism: a column- then row-parallel MLP equals the unsharded one
if "tp" in PARTS:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 8 * W), torch.nn.ReLU(), torch.nn.Linear(8 * W, 16)).to(DEV)
    x = torch.randint(-4, 4, (5, 16), generator=torch.Generator().manual_seed(3)).float().to(DEV)
    want = mlp(x).detach()
    mesh = init_device_mesh(DEV.type, (W,))
    tp = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    got = tp(x).detach()
    got = got.full_tensor() if hasattr(got, "full_tensor") else got
    if not torch.allclose(got.cpu(), want.cpu(), rtol=1e-5, atol=1e-5):
        failures.append(f"TP MLP differs by {(got.cpu() - want.cpu()).abs().max().item()}")

# CUDA graphs: a step (a matmul, then all_reduce of a plain tensor and of a heap tensor) captured once
# replays with new inputs and gives the eager results
if "graph" in PARTS and DEV.type == "cuda":
    lin = torch.nn.Linear(32, 32, device=DEV)
    x = torch.empty(8, 32, device=DEV)
    h = ctx.empty(8, 32)

    def step():
        y = lin(x)
        dist.all_reduce(y)
        h.copy_(y)
        dist.all_reduce(h, op=dist.ReduceOp.MAX)
        return y

    with torch.no_grad():
        x.copy_(data((8, 32), torch.float32, 70))
        step()  # builds ctx.ccl's plans outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.cuda.graph(graph):
                y_graph = step()
        torch.cuda.current_stream().wait_stream(side)
        for k in range(3):
            x.copy_(data((8, 32), torch.float32, 71 + k))
            graph.replay()
            got_y, got_h = y_graph.clone(), h.clone()
            want_y = lin(x).cpu()
            dist.all_reduce(want_y, group=GLOO)
            want_h = want_y.clone()
            dist.all_reduce(want_h, op=dist.ReduceOp.MAX, group=GLOO)
            if not torch.allclose(got_y.cpu(), want_y, rtol=1e-5, atol=1e-4):
                failures.append(f"graph replay {k}: all_reduce differs by {(got_y.cpu() - want_y).abs().max()}")
            if not torch.allclose(got_h.cpu(), want_h, rtol=1e-5, atol=1e-4):
                failures.append(f"graph replay {k}: heap MAX differs by {(got_h.cpu() - want_h).abs().max()}")

# CUDA graphs, each collective: captured once on plain tensors, replayed on new inputs, equal to gloo's
if "graph" in PARTS and DEV.type == "cuda":
    n = 96 * W
    captured = {
        "all_reduce": ((n,), (n,), lambda o, i, g: dist.all_reduce(i, group=g), "inp"),
        "all_gather_into_tensor": ((n,), (n * W,), lambda o, i, g: dist.all_gather_into_tensor(o, i, group=g), "out"),
        "reduce_scatter_tensor": ((n,), (n // W,), lambda o, i, g: dist.reduce_scatter_tensor(o, i, group=g), "out"),
        "all_to_all_single": ((n,), (n,), lambda o, i, g: dist.all_to_all_single(o, i, group=g), "out"),
        "broadcast": ((n,), (n,), lambda o, i, g: dist.broadcast(i, W - 1, group=g), "inp"),
    }
    for name, (shape_in, shape_out, call, result) in captured.items():
        inp, out = torch.empty(shape_in, device=DEV), torch.empty(shape_out, device=DEV)
        inp.copy_(data(shape_in, torch.float32, 90))
        call(out, inp, None)  # builds ctx.ccl's plan for this size class outside capture
        torch.cuda.synchronize()
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.cuda.graph(graph):
            call(out, inp, None)
        torch.cuda.current_stream().wait_stream(side)
        for k in range(2):
            fresh = data(shape_in, torch.float32, 91 + k)
            inp.copy_(fresh)
            poison(out)
            graph.replay()
            torch.cuda.synchronize()
            want_in, want_out = fresh.cpu(), torch.empty(shape_out)
            call(want_out, want_in, GLOO)
            same(f"graph {name} replay {k}", inp if result == "inp" else out, want_in if result == "inp" else want_out)



def graphed(fn):
    """fn run once outside capture (it builds ctx.ccl's plans for these shapes), then captured in a graph."""
    fn()
    torch.cuda.synchronize()
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    return graph


def replayed(graph):
    graph.replay()
    torch.cuda.synchronize()  # every rank's replay is done before the gloo reference (a host collective) runs


# CUDA graphs of the rooted collectives and send/recv: captured once, replayed on new inputs (outputs
# poisoned first), every element equal to gloo's on the same data; the root is the last rank
if "graph" in PARTS and DEV.type == "cuda":
    root = W - 1
    for name, t in (("plain", torch.empty(37, 3, device=DEV)), ("heap", ctx.empty(37, 3))):
        graph = graphed(lambda: dist.reduce(t, root))
        for k in range(2):
            fresh = data((37, 3), torch.float32, 200 + k)
            t.copy_(fresh)
            replayed(graph)
            want = fresh.cpu().clone()
            dist.reduce(want, root, group=GLOO)
            same(f"graph reduce {name} replay {k}", t, want if R == root else fresh)

    for name, b in (("plain", torch.empty(41, device=DEV)), ("heap", ctx.empty(41))):
        graph = graphed(lambda: dist.broadcast(b, root))
        for k in range(2):
            fresh = data((41,), torch.float32, 210 + k)
            if R != root:  # poisoned before any rank replays: the root may store into the others' heap copy
                poison(b)
            torch.cuda.synchronize()
            dist.barrier(group=GLOO)
            if R == root:
                b.copy_(fresh)
            replayed(graph)
            want = fresh.cpu().clone()
            dist.broadcast(want, root, group=GLOO)
            same(f"graph broadcast {name} replay {k}", b, want)

    x = torch.empty(5, 3, device=DEV)
    gathered = [torch.empty(5, 3, device=DEV) for _ in range(W)] if R == root else None
    graph = graphed(lambda: dist.gather(x, gathered, dst=root))
    for k in range(2):
        fresh = data((5, 3), torch.float32, 220 + k)
        x.copy_(fresh)
        for o in gathered or ():
            poison(o)
        replayed(graph)
        want = [torch.empty(5, 3) for _ in range(W)] if R == root else None
        dist.gather(fresh.cpu(), want, dst=root, group=GLOO)
        for r in range(W) if R == root else ():
            same(f"graph gather replay {k} [{r}]", gathered[r], want[r])

    out = torch.empty(5, 3, device=DEV)
    chunks = [torch.empty(5, 3, device=DEV) for _ in range(W)] if R == root else None
    graph = graphed(lambda: dist.scatter(out, chunks, src=root))
    for k in range(2):
        fresh = [data((5, 3), torch.float32, 230 + 10 * k + r) for r in range(W)]
        for c, f in zip(chunks or (), fresh):
            c.copy_(f)
        poison(out)
        replayed(graph)
        want = torch.empty(5, 3)
        dist.scatter(want, [f.cpu() for f in fresh] if R == root else None, src=root, group=GLOO)
        same(f"graph scatter replay {k}", out, want)

    # send/recv around the ring, whole words, odd bytes (a padded copy) and more than the mailbox (pieces)
    for n, dtype in ((1000, torch.float32), (3, torch.uint8), (300_000, torch.int32)):
        x = torch.empty((n,), dtype=dtype, device=DEV)
        got = torch.empty((n,), dtype=dtype, device=DEV)

        def ring():
            for q in [dist.isend(x, (R + 1) % W), dist.irecv(got, (R - 1) % W)]:
                q.wait()

        graph = graphed(ring)
        for k in range(2):
            fresh = data((n,), dtype, 240 + k)
            x.copy_(fresh)
            poison(got)
            replayed(graph)
            want = torch.empty((n,), dtype=dtype)
            for q in [dist.isend(fresh.cpu(), (R + 1) % W, group=GLOO), dist.irecv(want, (R - 1) % W, group=GLOO)]:
                q.wait()
            same(f"graph send/recv {n} {dtype} replay {k}", got, want)

    # uneven all_to_all agrees its chunk size on the host, dist.barrier blocks the host: capturing either
    # is refused by name, with the fix
    ins_split = [(R + r) % 3 + 1 for r in range(W)]
    outs_split = [(r + R) % 3 + 1 for r in range(W)]
    x = data((sum(ins_split), 2), torch.float32, 250)
    out = torch.empty((sum(outs_split), 2), device=DEV)
    dist.all_to_all_single(out, x, outs_split, ins_split)
    torch.cuda.synchronize()

    def refused(name, call, *words):
        """Capturing call raises RuntimeError naming the op and the fix (words); the stream is usable after."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side), torch.cuda.graph(torch.cuda.CUDAGraph()):
                call()
            failures.append(f"{name} was captured")
        except RuntimeError as e:
            if not all(w in str(e) for w in words):
                failures.append(f"{name} capture raised {e!r}")
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    refused("uneven all_to_all_single", lambda: dist.all_to_all_single(out, x, outs_split, ins_split),
            "all_to_all_single", "without split sizes")
    refused("dist.barrier", dist.barrier, "barrier", "ccl.barrier()")
    # the job goes on after the refusals: the same call runs eagerly
    poison(out)
    dist.all_to_all_single(out, x, outs_split, ins_split)
    want = torch.empty((sum(outs_split), 2))
    dist.all_to_all_single(want, x.cpu(), outs_split, ins_split, group=GLOO)
    same("uneven all_to_all_single after the refused capture", out, want)

for f in failures:
    print(f"rank {R}: FAIL {f}", flush=True)
print(f"rank {R}: {'ok' if not failures else 'WRONG'}", flush=True)
dist.destroy_process_group()
sys.exit(1 if failures else 0)
