"""Trace records to Chrome trace-event JSON (what ui.perfetto.dev and chrome://tracing open), and the
merge of several ranks' traces onto one clock. Pure: tables in, dicts out.

A record is one row of FIELDS (iris/tracing/device.py). In the JSON a rank is a process (pid) and an
SM a thread (tid); "ts" and "dur" are microseconds as the format defines them, with nanosecond
digits, counted from the trace's time origin (metadata.time_origin_ns, in the clock named by
metadata.clock).
"""
from __future__ import annotations

from .device import FIELDS
from .events import EVENT_NAMES

SCHEMA = "iris-trace/1"


def events_of(records, rank: int) -> list:
    """Chrome events of one rank's records (a sequence of FIELDS-long rows), on the device's clock
    (ts_ns). An event without an end (end_ns 0) is an instant event."""
    out = []
    for op_index, row in enumerate(records):
        r = dict(zip(FIELDS, (int(v) for v in row)))
        event = {"name": EVENT_NAMES.get(r["event"], f"event_{r['event']}"), "cat": "iris", "pid": rank,
                 "tid": r["sm_id"], "ts_ns": r["start_ns"],
                 "args": {"program_id": r["program_id"], "pid_m": r["pid_m"], "pid_n": r["pid_n"],
                          "cur_rank": r["cur_rank"], "target_rank": r["target_rank"], "sm_id": r["sm_id"],
                          "address": hex(r["address"] & (2 ** 64 - 1)), "payload_bytes": r["payload_bytes"],
                          "op_index": op_index, "start_ns": r["start_ns"], "end_ns": r["end_ns"]}}
        if r["end_ns"] >= r["start_ns"] and r["end_ns"] > 0:
            event.update(ph="X", dur_ns=r["end_ns"] - r["start_ns"])
        else:
            event.update(ph="i", s="t")
        out.append(event)
    return out


def _names(events) -> list:
    """Metadata events naming each rank ("rank 0") and each SM row ("SM 12")."""
    ranks = sorted({e["pid"] for e in events})
    rows = sorted({(e["pid"], e["tid"]) for e in events})
    return ([{"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}} for r in ranks]
            + [{"name": "thread_name", "ph": "M", "pid": p, "tid": t, "args": {"name": f"SM {t}"}} for p, t in rows]
            + [{"name": "process_sort_index", "ph": "M", "pid": r, "args": {"sort_index": r}} for r in ranks])


def document(events: list, metadata: dict) -> dict:
    """The JSON document: times counted from the earliest event, in microseconds."""
    origin = min((e["ts_ns"] for e in events), default=0)
    trace = []
    for e in events:
        e = dict(e)
        e["ts"] = (e.pop("ts_ns") - origin) / 1000
        if "dur_ns" in e:
            e["dur"] = e.pop("dur_ns") / 1000
        trace.append(e)
    meta = dict(metadata, schema=SCHEMA, time_origin_ns=origin, num_events=len(events),
                time_unit="ts and dur in microseconds (Chrome trace format); args.start_ns/end_ns raw device ns")
    return {"traceEvents": trace + _names(events), "displayTimeUnit": "ns", "metadata": meta}


def merge(per_rank: list) -> list:
    """One event list from every rank's (events, clock_offset_ns) pair: each rank's device times plus
    its offset, so all ranks share the host clock."""
    return [dict(e, ts_ns=e["ts_ns"] + offset) for events, offset in per_rank for e in events]
