"""Read `iris bench`'s JSON files back: one table of iris against its reference, and a bandwidth plot.

Each benchmark has its own reader, written against the JSON its script writes. A benchmark may
also carry a "summary" list of {measure, iris, reference, reference_value, unit, higher_is_better}
rows; that list is used as it is, so a new benchmark needs no reader here. Readers tolerate
missing keys: a number that a run did not produce (no second GPU, no NCCL on the host) shows as "-".
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ..errors import pip_install


def _size(n) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n} B"


def row(benchmark: str, measure: str, unit: str, iris: Optional[float], reference: str,
        ref_value: Optional[float], higher_is_better: bool, compare: bool = True) -> dict:
    """One line of the table; 'speedup' > 1 means iris does better than the reference. compare=False:
    the two figures are shown but their ratio means nothing (a kernel in Triton's interpreter against
    a CPU copy). A figure at or below zero (extra memory that a noisy host measured as freed) gets no
    ratio either."""
    speedup = None
    if compare and iris and ref_value and iris > 0 and ref_value > 0:
        speedup = iris / ref_value if higher_is_better else ref_value / iris
    return {"benchmark": benchmark, "measure": measure, "unit": unit, "iris": iris, "reference": reference,
            "reference_value": ref_value, "speedup": speedup}


def _skipped(data: dict, name: str, label: str) -> str:
    """label, or why the benchmark could not run that reference here (the JSON's references_skipped)."""
    why = (data.get("references_skipped") or {}).get(name)
    return f"- ({name} skipped: {why})" if why else label


def _host(data: dict) -> bool:
    return bool(data.get("dry_run")) or "host" in str(data.get("device", "")).lower()


# -- one reader per benchmark ------------------------------------------------------------------
def rma_bandwidth(data: dict) -> List[dict]:
    # on the host every iris figure is a kernel in Triton's interpreter: shown, never compared
    host = _host(data)
    out, coll, gpu = [], "gloo" if host else "NCCL", not host
    copy = "CPU copy (torch copy_)" if host else "copy engine (torch copy_)"
    p2p = data.get("point_to_point") or []
    if p2p:
        top = p2p[-1]
        at = _size(top["bytes"])
        for kind in ("put", "get"):
            out.append(row("rma_bandwidth", f"{kind} bandwidth, {at}", "GB/s", top.get(f"{kind}_GBps"),
                           copy, top.get("copy_engine_GBps"), True, gpu))
            out.append(row("rma_bandwidth", f"{kind} bandwidth, {at}", "GB/s", top.get(f"{kind}_GBps"),
                           _skipped(data, "NCCL", f"{coll} send/recv"), top.get("nccl_sendrecv_GBps"), True, gpu))
    pairs = data.get("all_pairs") or []
    if pairs:
        top = pairs[-1]
        out.append(row("rma_bandwidth", f"all-pairs put, {_size(top['bytes_per_pair'])} per pair", "GB/s",
                       top.get("iris_GBps"), _skipped(data, "NCCL", f"{coll} all_to_all"),
                       top.get("nccl_all_to_all_GBps"), True, gpu))
    lat = data.get("latency") or {}
    if "signal_one_way_us" in lat:
        out.append(row("rma_bandwidth", "signal, one way", "us", lat["signal_one_way_us"], "-", None, False))
    for mode in ("eager", "graph"):
        if lat.get(f"device_barrier_{mode}_us"):
            out.append(row("rma_bandwidth", f"barrier ({mode})", "us", lat[f"device_barrier_{mode}_us"],
                           _skipped(data, "NCCL", f"{coll} all_reduce of one int"),
                           lat.get(f"nccl_all_reduce_int_{mode}_us"), False, gpu))
    return out


def alloc_cost(data: dict) -> List[dict]:
    rows = data.get("rows") or []
    ref = {r["n"]: r["mean_us"] for r in rows if r.get("allocator") == "torch symm_mem"}
    mine = [r for r in rows if r.get("allocator") != "torch symm_mem"]
    if not mine:
        return []
    top = max(r["n"] for r in mine)
    size = _size(data.get("bytes_per_allocation", 0))
    return [row("alloc_cost", f"{size} allocation, {r['allocator']} heap, {r['case']}, N={top}", "us/alloc",
                r["mean_us"], "torch symm_mem empty+rendezvous" if top in ref else
                _skipped(data, "torch symm_mem", "- (symm_mem needs GPUs)"),
                ref.get(top), False) for r in mine if r["n"] == top]


def import_weights(data: dict) -> List[dict]:
    ranks = data.get("ranks") or []
    if not ranks:
        return []
    by = {r["method"]: r for r in ranks[0]}  # rank 0's view; every rank's is in the JSON
    zero, copy = by.get("iris as_symmetric zero copy, one batched call"), by.get("iris copy into heap")
    symm = next((r for m, r in by.items() if m.startswith("torch symm_mem") and "ms" in r), None)
    why = next((r["reason"] for r in by.values() if "reason" in r), None)
    none = f"- (torch symm_mem skipped: {why})" if why else "- (symm_mem needs GPUs)"
    what = f"{_size(data.get('bytes_per_rank', 0))} of weights made symmetric"
    out = []
    if zero:
        out.append(row("import_weights", what, "ms", zero["ms"], "iris copy into heap", copy and copy["ms"], False))
        out.append(row("import_weights", what, "ms", zero["ms"],
                       "torch symm_mem + copy" if symm else none, symm and symm["ms"], False))
        ref = symm or copy
        if ref:
            memory = "memory" if _host(data) else "device memory"
            r = row("import_weights", f"extra {memory}, {what}", "MiB", zero["extra_bytes"] / (1 << 20),
                    "torch symm_mem + copy" if symm else "iris copy into heap", ref["extra_bytes"] / (1 << 20), False)
            out.append(r)
    return out


def collectives(data: dict) -> List[dict]:
    """Each collective at each size against NCCL in the same run: the CUDA graph's time per call
    where there is one, else the eager one (the JSON has both)."""
    coll = "gloo" if _host(data) else "NCCL"
    out = []

    def one(name, size, r, mine, theirs):
        mode = "graph" if r.get(f"{mine}_graph_us") else "eager"
        out.append(row("collectives", f"{name} {_size(size)}, {mode}", "us/call", r.get(f"{mine}_{mode}_us"),
                       f"{coll} {name}", r.get(f"{theirs}_{mode}_us"), False, not _host(data)))

    for r in data.get("all_reduce") or []:
        one("all_reduce", r["bytes"], r, "iris", "nccl")
    for name in ("all_gather", "reduce_scatter", "all_to_all"):
        for r in data.get("moves") or []:
            if f"iris_{name}_eager_us" in r or f"iris_{name}_graph_us" in r:
                one(name, r["bytes"], r, f"iris_{name}", f"nccl_{name}")
    return out


READERS: Dict[str, Callable[[dict], List[dict]]] = {
    "rma_bandwidth": rma_bandwidth, "alloc_cost": alloc_cost, "import_weights": import_weights,
    "collectives": collectives}


def table_rows(name: str, data: dict) -> List[dict]:
    if isinstance(data.get("summary"), list):
        return [row(name, s.get("measure", "?"), s.get("unit", ""), s.get("iris"), s.get("reference", "-"),
                    s.get("reference_value"), s.get("higher_is_better", True)) for s in data["summary"]]
    reader = READERS.get(name)
    return reader(data) if reader else []


# -- the plot ------------------------------------------------------------------------------------
def plot_bandwidth(data: dict, path: Path) -> Optional[str]:
    """GB/s against message size, one line per method; None (and why) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    coll = "gloo" if _host(data) else "NCCL"
    p2p, pairs = data.get("point_to_point") or [], data.get("all_pairs") or []
    panels = [("point to point, rank 0 -> rank 1", p2p, "bytes",
               [("put_GBps", "iris put"), ("get_GBps", "iris get"), ("copy_engine_GBps", "copy engine (copy_)"),
                ("copy_peer_map_GBps", "copy_ into the peer's heap"), ("nccl_sendrecv_GBps", f"{coll} send/recv")])]
    if pairs:
        panels.append((f"all pairs, {data.get('ranks', '?')} ranks", pairs, "bytes_per_pair",
                       [("iris_GBps", "iris put"), ("nccl_all_to_all_GBps", f"{coll} all_to_all")]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, rows, xkey, series) in zip(axes[0], panels):
        for key, label in series:
            pts = [(r[xkey], r[key]) for r in rows if r.get(key)]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)" if xkey == "bytes" else "bytes per pair")
        ax.set_ylabel("GB/s (1e9 bytes/s)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"iris bandwidth on {data.get('device', '?')}" + (" (dry run)" if data.get("dry_run") else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


# -- putting it together -------------------------------------------------------------------------------
def report(records: List[dict], out: Path, run: dict) -> dict:
    """The summary written to summary.json: what ran, the table, and the plot."""
    table, notes, plot = [], [], None
    for rec in records:
        if rec.get("note"):
            notes.append(f"{rec['name']}: {rec['status']}: {rec['note']}")
        if rec["status"] != "ok":
            if not rec.get("note"):
                notes.append(f"{rec['name']}: {rec['status']}")
            continue
        data = json.loads(Path(rec["json"]).read_text())
        rows = table_rows(rec["name"], data)
        if not rows:
            notes.append(f"{rec['name']}: no reader for its JSON; see {rec['json']}")
        table += rows
        if rec["name"] == "rma_bandwidth":
            plot = plot_bandwidth(data, out / "bandwidth.png")
            if plot is None:
                notes.append(f"no bandwidth plot: matplotlib is not installed ({pip_install('trace')})")
        for key in ("checked", "put_checked", "get_checked", "iris_checked", "checked_vs_nccl"):
            wrong = [r for r in _all_rows(data) if r.get(key) is False]
            if wrong:
                notes.append(f"{rec['name']}: {len(wrong)} row(s) with {key}=false: iris moved WRONG data there")
    return {**run, "benchmarks": records, "table": table, "notes": notes, "plot": plot}


def _all_rows(data: dict):
    for v in data.values():
        if isinstance(v, list):
            for r in v:
                if isinstance(r, dict):
                    yield r
                elif isinstance(r, list):
                    yield from (x for x in r if isinstance(x, dict))


def _num(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def _times(r: dict) -> str:
    """The ratio, or "-" where there is none to give: a reference missing, figures that cannot be
    compared, or iris at zero (zero copy: no extra bytes at all, shown as 0 beside the reference)."""
    return f"{r['speedup']:.2f}" if r["speedup"] else "-"


def render(summary: dict) -> str:
    """The table as text: iris, its reference, and how many times better iris does (>1: iris wins)."""
    head = ("benchmark", "measure", "unit", "iris", "reference", "ref", "iris x")
    body = [(r["benchmark"], r["measure"], r["unit"], _num(r["iris"]), r["reference"], _num(r["reference_value"]),
             _times(r)) for r in summary["table"]]
    lines = []
    if body:
        widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
        fmt = "  ".join(f"{{:<{w}}}" if i < 3 or i == 4 else f"{{:>{w}}}" for i, w in enumerate(widths))
        lines += [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*b) for b in body]
        lines.append("iris x: how many times better iris does than the reference (>1: iris is faster or leaner); "
                     "-: no ratio (no reference here, iris at zero, or a kernel in Triton's interpreter)")
    else:
        lines.append("no results to compare")
    for n in summary["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)
