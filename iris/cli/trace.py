"""`iris trace trace.json`: draw a trace that ctx.tracing.export() wrote as a PNG timeline, one row
per rank and SM, one colour per event kind, and print what it holds (events, bytes, time span).
Reads per-rank and merged files alike (any Chrome trace JSON with complete "X" events)."""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def _load(path: Path) -> list:
    doc = json.loads(path.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("ph") in ("X", "i", "I")]


def summary(events: list) -> list:
    """(name, count, payload bytes, busy microseconds) per event kind, most frequent first."""
    rows = defaultdict(lambda: [0, 0, 0.0])
    for e in events:
        r = rows[e["name"]]
        r[0] += 1
        r[1] += int(e.get("args", {}).get("payload_bytes", 0))
        r[2] += float(e.get("dur", 0.0))
    return sorted(((n, *v) for n, v in rows.items()), key=lambda r: -r[1])


def draw(events: list, output: Path, title: str) -> None:
    """The timeline PNG: x is microseconds from the trace's origin, y one row per (rank, SM)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = sorted({(e["pid"], e.get("tid", 0)) for e in events})
    row_of = {lane: i for i, lane in enumerate(lanes)}
    names = [n for n, *_ in summary(events)]
    colours = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(names)}
    span = max((e["ts"] + e.get("dur", 0.0) for e in events), default=1.0) - min((e["ts"] for e in events),
                                                                               default=0.0)
    least = max(span, 1e-3) / 2000  # a zero-length event still shows as a sliver
    bars = defaultdict(list)
    instants = defaultdict(list)
    for e in events:
        lane = row_of[(e["pid"], e.get("tid", 0))]
        if e["ph"] == "X":
            bars[(lane, e["name"])].append((e["ts"], max(e.get("dur", 0.0), least)))
        else:
            instants[e["name"]].append((e["ts"], lane))
    fig, ax = plt.subplots(figsize=(12, min(60, 1.5 + 0.28 * len(lanes))))
    for (lane, name), spans in bars.items():
        ax.broken_barh(spans, (lane - 0.4, 0.8), facecolors=colours[name], edgecolor="none")
    for name, points in instants.items():
        ax.scatter([t for t, _ in points], [lane for _, lane in points], marker="|", color=colours[name], s=60)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"rank {p} SM {t}" for p, t in lanes], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (microseconds from the first event)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names]
    ax.legend(handles, [f"{n} ({c})" for n, c, *_ in summary(events)], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="iris trace", description=__doc__)
    parser.add_argument("trace", type=Path, help="a JSON file from ctx.tracing.export()")
    parser.add_argument("-o", "--output", type=Path, help="PNG to write (default: the trace's name with .png)")
    opts = parser.parse_args(argv)
    try:
        events = _load(opts.trace)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"iris trace: cannot read {opts.trace}: {e}. Give a file written by ctx.tracing.export()",
              file=sys.stderr)
        return 2
    if not events:
        print(f"iris trace: {opts.trace} holds no events (was ctx.tracing.enable() called before the kernels, "
              "and their DeviceContext initialized with tracing=True?)", file=sys.stderr)
        return 1
    span = max(e["ts"] + e.get("dur", 0.0) for e in events) - min(e["ts"] for e in events)
    ranks = sorted({e["pid"] for e in events})
    print(f"{opts.trace}: {len(events)} events, ranks {ranks}, {span:.3f} us")
    for name, count, nbytes, busy in summary(events):
        print(f"  {name:<14} {count:>9} events {nbytes:>14} bytes {busy:>12.3f} us")
    output = opts.output or opts.trace.with_suffix(".png")
    try:
        draw(events, output, f"{opts.trace.name}: {len(events)} events on {len(ranks)} rank(s)")
    except ImportError:
        print("iris trace: drawing needs matplotlib (pip install matplotlib); the summary above is all",
              file=sys.stderr)
        return 1
    print(f"timeline: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
