"""`analyze --annotate`: the original trace plus our diagnosis as events of its own process, so Perfetto UI or
chrome://tracing shows it on their own timeline: per GPU a track of idle intervals named by cause, and per finding a
track with one slice per occurrence (title, call site, advice in its args).

The events are spliced in right after the `[` of the trace's event array; every original byte is kept. Their
category, `gpu_idle_analyzer`, is one our loader skips, so an annotated trace analyses as the original does."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np

from analyzer.errors import UsageError
from analyzer.trace.parse import find_event_array, trace_text
from analyzer.views.idle import CAUSES

CATEGORY = "gpu_idle_analyzer"
PID = 0x7FFFF000  # a process id of its own (above Linux's pid_max), its tracks apart from the CPU and GPU ones
FINDING_TID0 = 1000
_MARKER = b'"cat":"' + CATEGORY.encode() + b'"'


def annotated_name(trace: Path) -> str:
    """rank0.trace.json.gz -> rank0.annotated.trace.json.gz; x.json -> x.annotated.json.gz."""
    name = trace.name
    for suffix in (".trace.json.gz", ".trace.json", ".json.gz", ".json"):
        if name.endswith(suffix):
            return f"{name[: -len(suffix)]}.annotated{suffix.removesuffix('.gz')}.gz"
    return f"{name}.annotated.json.gz"


def annotation_events(context, report: dict) -> list[dict]:
    """Our events: process and track names, idle pieces (every one, by cause, per device), finding occurrences."""
    events = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "cat": CATEGORY,
               "args": {"name": "gpu-idle-analyzer: why the GPU was idle"}},
              {"ph": "M", "name": "process_sort_index", "pid": PID, "tid": 0, "cat": CATEGORY,
               "args": {"sort_index": -1}}]
    idle = context.idle
    devices = context.gaps.device[idle.gap] if len(idle) else np.zeros(0, np.int64)
    for device in sorted(set(devices.tolist())):
        events.append(_thread_name(int(device), f"GPU {device} idle, by cause"))
    starts, ends = np.round(idle.start_ns / 1e3, 3).tolist(), np.round(idle.end_ns / 1e3, 3).tolist()
    for s, e, cause, device in zip(starts, ends, idle.cause.tolist(), devices.tolist()):
        events.append({"ph": "X", "cat": CATEGORY, "name": f"idle: {CAUSES[cause]}", "pid": PID, "tid": int(device),
                       "ts": s, "dur": round(e - s, 3), "args": {"cause": CAUSES[cause], "device": int(device)}})
    for k, f in enumerate(report["findings"]):
        tid = FINDING_TID0 + k
        events.append(_thread_name(tid, f"finding {f['id']}: {f['kind']}"))
        args = {"title": f["title"], "severity": f["severity"], "kind": f["kind"], "id": f["id"],
                "call_site": f.get("call_site"), "library_site": f.get("library_site"),
                "gpu_idle_us": f["impact_us"], "advice": f.get("advice")}
        for n, (s, e) in enumerate(f.get("occurrences_us") or ()):
            event = {"cat": CATEGORY, "name": f"{f['kind']}: {f['title']}"[:200], "pid": PID, "tid": tid, "ts": s,
                     "args": {**args, "occurrence": n + 1}}
            event.update({"ph": "X", "dur": round(e - s, 3)} if e > s else {"ph": "i", "s": "t"})
            events.append(event)
    return events


def _thread_name(tid: int, name: str) -> dict:
    return {"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "cat": CATEGORY, "args": {"name": name}}


def write_annotated(trace: Path, out: Path, events: list[dict]) -> Path:
    """The original trace with `events` spliced into its event array, gzipped, written atomically. An existing file
    is replaced only if it is an annotated trace of ours."""
    if out.exists() and not _is_annotated(out):
        raise UsageError(f"{out}: exists and is not an annotated trace written by gpu-idle-analyzer; not overwriting")
    with trace_text(trace) as text:
        where = find_event_array(text)
        if where is None:
            raise UsageError(f"{trace}: no traceEvents array found to annotate")
        start, end = where.start, where.end
        ours = ",".join(json.dumps(e, separators=(",", ":"), ensure_ascii=False) for e in events).encode()
        has_events = bool(bytes(text[start:end]).strip())
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        try:
            with gzip.open(tmp, "wb", compresslevel=5) as f:
                f.write(text[:start])
                f.write(ours + (b"," if has_events and ours else b""))
                view = memoryview(text)
                for at in range(start, len(text), 16 << 20):
                    f.write(view[at: min(at + (16 << 20), len(text))])
                view.release()
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


def _is_annotated(path: Path) -> bool:
    try:
        with gzip.open(path, "rb") as f:
            return _MARKER in f.read(1 << 16)
    except (OSError, EOFError):
        return False
