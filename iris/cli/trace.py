"""`iris trace trace.json`: draw a trace that ctx.tracing.export() wrote as a PNG timeline, one panel
per rank and one row per SM, one colour per event kind, and print what it holds (events, bytes, time).
Reads per-rank and merged files alike (any Chrome trace JSON with complete "X" events)."""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from ..errors import pip_install


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
    """The timeline PNG: one panel per rank (each on its own time axis, microseconds from that rank's
    first event, so ranks that started apart stay readable), one row per SM, one colour per kind."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = summary(events)
    colours = {name: plt.get_cmap("tab20")(i % 20) for i, (name, *_) in enumerate(kinds)}
    origin = min(e["ts"] for e in events)
    by_rank = defaultdict(list)
    for e in events:
        by_rank[e["pid"]].append(e)
    heights = [min(8.0, max(1.6, 0.9 + 0.07 * len({e.get("tid", 0) for e in evs}))) for evs in by_rank.values()]
    fig, axes = plt.subplots(len(by_rank), 1, figsize=(12, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (rank, evs) in zip(axes[:, 0], sorted(by_rank.items())):
        start = min(e["ts"] for e in evs)
        span = max(e["ts"] + e.get("dur", 0.0) for e in evs) - start
        least = max(span, 1e-3) / 1500  # a zero-length event still shows as a sliver
        sms = sorted({e.get("tid", 0) for e in evs})
        row = {sm: i for i, sm in enumerate(sms)}
        bars, instants = defaultdict(list), defaultdict(list)
        for e in evs:
            y, t = row[e.get("tid", 0)], e["ts"] - start
            if e["ph"] == "X":
                bars[(y, e["name"])].append((t, max(e.get("dur", 0.0), least)))
            else:
                instants[e["name"]].append((t, y))
        for (y, name), spans in bars.items():
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colours[name], edgecolor="none")
        for name, points in instants.items():
            ax.scatter([t for t, _ in points], [y for _, y in points], marker="|", color=colours[name], s=40)
        step = max(1, len(sms) // 16)
        ax.set_yticks(range(0, len(sms), step))
        ax.set_yticklabels([f"SM {sm}" for sm in sms[::step]], fontsize=7)
        ax.set_ylim(len(sms) - 0.5, -0.5)
        ax.set_xlim(-span * 0.01, span * 1.01 + 1e-3)
        ax.set_title(f"rank {rank}: {len(evs)} events on {len(sms)} SM(s), from +{start - origin:.3f} us, "
                     f"over {span:.3f} us", fontsize=8, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("microseconds from the rank's first event")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[name]) for name, *_ in kinds]
    axes[0, 0].legend(handles, [f"{name} ({count})" for name, count, *_ in kinds], fontsize=7, loc="upper left",
                      bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
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
        print(f"iris trace: drawing needs matplotlib ({pip_install('trace')}); the summary above is all",
              file=sys.stderr)
        return 1
    print(f"timeline: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
