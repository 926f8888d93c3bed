"""Device tracing: kernels whose DeviceContext has tracing=True record every operation, export writes
Chrome trace JSON per rank and merged, `iris trace` draws it; a context without tracing compiles to
the same machine code as the module functions. Ranks run on the host driver here (the interpreter:
host clock, SM 0) and on GPUs (%globaltimer, %smid) where there are some."""
import json
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.tracing import EVENT_NAMES, FIELDS, TraceEvent
from iris.tracing.chrome import document, events_of, merge

# One pytest-xdist worker runs this module: its module fixture's traced ranks start once.
pytestmark = pytest.mark.xdist_group("test_tracing")

BLOCK, N = 32, 40            # two programs: 32 lanes, then 8
POISON = -7


@triton.jit
def _traced_kernel(context, src, dst, out, flags, n, rank: tl.constexpr, world: tl.constexpr,
                   BLOCK: tl.constexpr, TRACING: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world, tracing=TRACING)
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    peer = (rank + 1) % world
    x = ctx.load(src + o, peer, mask=m)
    tl.store(out + o, x, mask=m)
    ctx.store(dst + o, x + 1, peer, mask=m)
    ctx.atomic_add(flags + tl.program_id(0), 1, peer)
    h = ctx.tracing.record_event_start(iris.TraceEvent().compute, rank, out + o, pid_m=7, pid_n=9, mask=m)
    ctx.tracing.record_event_end(h)


def _launch(ctx, bufs, tracing):
    src, dst, out, flags = bufs
    _traced_kernel[(triton.cdiv(N, BLOCK),)](ctx.get_device_context(), src, dst, out, flags, N, ctx.get_rank(),
                                            ctx.get_num_ranks(), BLOCK, tracing)
    ctx.barrier()


def rank_main(directory):
    ctx = iris.iris(heap_size=1 << 22)
    try:
        r, w = ctx.get_rank(), ctx.get_num_ranks()
        src = ctx.arange(r * 1000, r * 1000 + BLOCK * 2, dtype=torch.int32)
        dst = ctx.full((BLOCK * 2,), POISON, dtype=torch.int32)
        flags = ctx.zeros(2, dtype=torch.int32)
        out = torch.full((BLOCK * 2,), POISON, dtype=torch.int32, device=ctx.get_device())
        bufs = (src, dst, out, flags)
        ctx.barrier()
        _launch(ctx, bufs, True)   # traced kernel before enable(): runs, records nothing
        before_enable = ctx.tracing.enabled, ctx.tracing.records is None
        ctx.tracing.enable(max_events=64)
        _launch(ctx, bufs, False)  # untraced kernel: records nothing
        untraced = ctx.tracing.recorded()
        _launch(ctx, bufs, True)
        rows = ctx.tracing.rows().tolist()
        counted = int(ctx.tracing.trace_counter.item())  # Iris's name for the device count
        data = {"out": out.cpu().tolist(), "dst": dst.cpu().tolist(), "flags": flags.cpu().tolist()}
        ptrs = {"src": src.data_ptr(), "dst": dst.data_ptr(), "out": out.data_ptr(), "flags": flags.data_ptr()}
        exported = ctx.tracing.export(os.path.join(directory, "trace.json"), merge=True)
        ctx.tracing.reset()
        after_reset = ctx.tracing.recorded()
        ctx.tracing.enable(max_events=3)  # too small: 8 events claimed, 3 kept
        _launch(ctx, bufs, True)
        small = ctx.tracing.export(os.path.join(directory, "small.json"))
        on_gpu = ctx.get_device().type == "cuda"
        return dict(rank=r, world=w, sms=ctx.get_cu_count() if on_gpu else 1, before_enable=before_enable,
                    untraced=untraced, rows=rows, counted=counted, data=data, ptrs=ptrs, exported=exported,
                    after_reset=after_reset, small=small)
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    directory = tmp_path_factory.mktemp("trace")
    return directory, iris.spawn(rank_main, 2, args=(str(directory),), timeout=300)


def test_event_table_matches_trace_event():
    """EVENT_NAMES (export) and TraceEvent (kernels) give the same ids (Iris's numbering)."""
    if not os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TraceEvent is a Triton aggregate outside the interpreter: read in a kernel only")
    ev = TraceEvent()
    assert {name: int(getattr(ev, name)) for name in EVENT_NAMES.values()} == {n: i for i, n in EVENT_NAMES.items()}
    assert (ev.load, ev.store, ev.get, ev.put, ev.copy, ev.atomic_add, ev.atomic_max, ev.barrier) == \
           (0, 1, 2, 3, 4, 5, 13, 3073)


def test_kernel_results_unchanged_by_tracing(traced):
    _, per_rank = traced
    for res in per_rank:
        r, w = res["rank"], res["world"]
        peer, prev = (r + 1) % w, (r - 1) % w
        assert res["data"]["out"] == [peer * 1000 + i for i in range(N)] + [POISON] * (2 * BLOCK - N)
        # prev stored its x + 1 (x: this rank's src) here; every launch stores the same values
        assert res["data"]["dst"] == [r * 1000 + i + 1 for i in range(N)] + [POISON] * (2 * BLOCK - N)
        assert res["data"]["flags"] == [3, 3], f"rank {prev}'s three launches before the read, one add each"


def test_records_every_operation(traced):
    _, per_rank = traced
    for res in per_rank:
        r, w, ptrs = res["rank"], res["world"], res["ptrs"]
        peer = (r + 1) % w
        assert res["before_enable"] == (False, True) and res["untraced"] == 0
        rows = [dict(zip(FIELDS, row)) for row in res["rows"]]
        assert len(rows) == 8 and res["counted"] == 8, (rows, res["counted"])
        seen = {}
        for row in rows:
            name, pid = EVENT_NAMES[row["event"]], row["program_id"]
            seen[name, pid] = seen.get((name, pid), 0) + 1
            lanes = min(BLOCK, N - pid * BLOCK)
            expect = {"load": (peer, ptrs["src"] + 4 * pid * BLOCK, 4 * lanes, 0, 0),
                      "store": (peer, ptrs["dst"] + 4 * pid * BLOCK, 4 * lanes, 0, 0),
                      "atomic_add": (peer, ptrs["flags"] + 4 * pid, 4, 0, 0),
                      "compute": (r, ptrs["out"] + 4 * pid * BLOCK, 4 * lanes, 7, 9)}[name]
            assert (row["target_rank"], row["address"], row["payload_bytes"], row["pid_m"], row["pid_n"]) == expect, row
            assert row["cur_rank"] == r and 0 <= row["sm_id"] < res["sms"], row  # the interpreter: SM 0
            assert 0 < row["start_ns"] <= row["end_ns"], row
        assert seen == {(n, p): 1 for n in ("load", "store", "atomic_add", "compute") for p in (0, 1)}
        assert res["after_reset"] == 0


def test_export_per_rank_and_merged(traced):
    directory, per_rank = traced
    for res in per_rank:
        r = res["rank"]
        with open(directory / f"trace_rank{r}.json") as f:
            doc = json.load(f)
        events = [e for e in doc["traceEvents"] if e["ph"] != "M"]
        assert len(events) == 8 and all(e["pid"] == r and e["ph"] == "X" and e["cat"] == "iris" for e in events)
        assert min(e["ts"] for e in events) == 0 and all(e["dur"] >= 0 for e in events)
        assert doc["metadata"]["rank"] == r and doc["metadata"]["world_size"] == 2
        names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
        assert names == {f"rank {r}"}
    assert per_rank[1]["exported"] == {}
    merged = per_rank[0]["exported"]
    with open(directory / "trace.json") as f:
        assert json.load(f) == merged
    events = [e for e in merged["traceEvents"] if e["ph"] != "M"]
    assert sorted({e["pid"] for e in events}) == [0, 1] and len(events) == 16
    assert min(e["ts"] for e in events) == 0
    assert [m["rank"] for m in merged["metadata"]["ranks"]] == [0, 1]
    for m in merged["metadata"]["ranks"]:
        assert 0 <= m["clock_uncertainty_ns"] < 10_000_000, m  # half a probe kernel's round trip
        if m["device"].startswith("host"):  # the interpreter stamps with the host clock itself
            assert abs(m["clock_offset_ns"]) <= m["clock_uncertainty_ns"] + 1_000_000, m


def test_overflow_keeps_max_events_and_counts_the_rest(traced):
    _, per_rank = traced
    for res in per_rank:
        small = res["small"]
        assert len([e for e in small["traceEvents"] if e["ph"] != "M"]) == 3
        assert small["metadata"]["dropped_events"] == 5 and small["metadata"]["max_events"] == 3


BAD_MAX_EVENTS = (0, -1, 2.5, True, 1 << 31)


def _bad_enable():
    ctx = iris.iris(heap_size=1 << 20)
    try:
        out = []
        for bad in BAD_MAX_EVENTS:
            try:
                ctx.tracing.enable(max_events=bad)
                out.append((bad, None, ctx.tracing.records is None))
            except ValueError as e:
                out.append((bad, str(e), ctx.tracing.records is None))
        return out
    finally:
        ctx.close()


def test_enable_rejects_bad_max_events():
    """Each bad max_events raises naming the argument and a good value, before anything is allocated."""
    for bad, message, nothing_allocated in iris.spawn(_bad_enable, 1)[0]:
        assert message and "max_events" in message and "1_000_000" in message and nothing_allocated, bad


# -- pure parts: JSON ----------------------------------------------------------------------------------
def _row(event, pid, sm, start, end, target=1, addr=4096, payload=128, rank=0):
    values = dict(event=event, program_id=pid, pid_m=0, pid_n=0, cur_rank=rank, target_rank=target, sm_id=sm,
                  start_ns=start, end_ns=end, address=addr, payload_bytes=payload)
    return [values[f] for f in FIELDS]


def test_chrome_document_units_and_instant_events():
    rows = [_row(3, 0, 5, 10_000, 12_500), _row(0, 1, 7, 11_000, 0)]
    doc = document(events_of(rows, rank=0), {"world_size": 1})
    x, i = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    assert (x["name"], x["ph"], x["ts"], x["dur"], x["tid"]) == ("put", "X", 0.0, 2.5, 5)
    assert (i["name"], i["ph"], i["ts"], i["s"]) == ("load", "i", 1.0, "t")
    assert x["args"]["address"] == "0x1000" and x["args"]["payload_bytes"] == 128
    assert doc["metadata"]["time_origin_ns"] == 10_000
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {(0, 5): "SM 5", (0, 7): "SM 7"}


def test_merge_shifts_each_rank_onto_the_host_clock():
    a = events_of([_row(1, 0, 0, 1_000, 2_000, rank=0)], 0)
    b = events_of([_row(1, 0, 0, 50_000, 51_000, rank=1)], 1)
    doc = document(merge([(a, 100_000), (b, 52_000)]), {})
    ts = {e["pid"]: e["ts"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert ts == {0: 0.0, 1: 1.0}  # 101_000 and 102_000 ns on the common clock


# -- drawing -------------------------------------------------------------------------------------------
def test_iris_trace_draws_png(tmp_path):
    pytest.importorskip("matplotlib", reason="iris trace draws with matplotlib: pip install matplotlib")
    from iris.cli.trace import main
    rows = [_row(e, p, sm, 1_000 * k, 1_000 * k + 700, rank=0) for k, (e, p, sm) in
            enumerate([(0, 0, 3), (3, 1, 4), (5, 0, 3), (2048, 2, 9)])]
    doc = document(events_of(rows, 0) + events_of([_row(1, 0, 2, 500, 900, rank=1)], 1), {"world_size": 2})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    assert main([str(path), "-o", str(tmp_path / "t.png")]) == 0
    png = (tmp_path / "t.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    assert main([str(tmp_path / "missing.json")]) == 2


# -- no cost without tracing --------------------------------------------------------------------------
def test_untraced_context_compiles_to_the_module_functions(tmp_path):
    """Tracing is a constexpr: ctx.load/store/put/get/copy/atomics of a context built without it
    compile (for sm_90, with the ptxas and nvdisasm Triton ships) to the same SASS as the module
    functions they wrap; benchmarks/tracing_cost.py compares them."""
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not all(os.path.exists(os.path.join(bindir, t)) for t in ("ptxas", "nvdisasm")):
        pytest.skip(f"Triton's NVIDIA tools (ptxas, nvdisasm) are not in {bindir}")
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                          "tracing_cost.py")
    out = tmp_path / "tracing_cost.json"
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run([sys.executable, script, "--sass-only", "--arch", "90", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    result = json.loads(out.read_text())["sass"]
    assert result["identical"] and result["instructions_context"] > 100, result
    assert result["instructions_context_traced"] > result["instructions_context"], "tracing=True records nothing?"
