"""report.json -> the dataset's rows: one list of plain dicts per table, every value taken from the report that
`api.analyze` returned (nothing re-derived), typed by `SCHEMA`. docs/fleet.md's schema section is `describe()`.

Every table's rows carry `content_key` (the join key to `traces`); `job` and `rank` are the hive partition
columns of the folder each file sits in, not columns of the files."""
from __future__ import annotations

import datetime as dt
import math
import re

import numpy as np

from analyzer import __version__
from analyzer.api import CAUSES

_IDLE = [(f"idle_{c}_us", "float64", f"GPU idle owned by cause `{c}` (report.json gaps.by_cause)") for c in CAUSES]
_STEP = re.compile(r"^(.*?)#(\d+)$")

# table -> [(column, type, meaning)]; types: string, int64, float64, timestamp (UTC, µs)
SCHEMA: dict[str, list[tuple[str, str, str]]] = {
    "traces": [
        ("source", "string", "the trace's path as given to analyze-many (a folder given: the trace under it)"),
        ("content_key", "string", "the trace's key: its columnar cache's fingerprint (size, mtime, head/tail SHA-1) hashed"),
        ("world_size", "int64", "distributedInfo.world_size, else the rank files in the trace's folder"),
        ("bytes", "int64", "the trace file's size on disk"),
        ("trace_mtime", "timestamp", "the trace file's modification time"),
        ("captured_at", "timestamp", "the capture's start (meta.json created_utc); NULL for a bare trace"),
        ("workload", "string", "meta.json's workload YAML"),
        ("gpu", "string", "the GPUs the trace names (deviceProperties), else meta.json's device"),
        ("torch", "string", "torch version (meta.json)"),
        ("runtime", "string", "CUDA or HIP (summary.traits.runtime)"),
        ("training", "int64", "1 for a training trace (summary.traits.training)"),
        ("utilization", "float64", "GPU utilization 0..1, exactly summary.gpu_utilization; NULL without GPU work"),
        ("window_us", "float64", "first to last GPU activity (summary.window_us)"),
        ("busy_us", "float64", "GPU busy (union over streams)"),
        ("idle_us", "float64", "GPU idle in the window"),
        *_IDLE,
        ("findings_us", "float64", "idle explained by the top-level findings (summary.idle_partition)"),
        ("instrumentation_us", "float64", "idle in the profiler's and the capture's own code"),
        ("unexplained_us", "float64", "idle whose next launch is not in the trace"),
        ("steps", "int64", "steps in the trace (summary.steps)"),
        ("step_word", "string", "what a step is called: decode step, step, engine step"),
        ("step_n", "int64", "traced steps with a wall time, prefill left out (the stats below)"),
        ("step_min_us", "float64", "shortest traced step (wall time, gaps.per_step)"),
        ("step_median_us", "float64", "median traced step"),
        ("step_p90_us", "float64", "90th percentile traced step (linear interpolation)"),
        ("step_max_us", "float64", "longest traced step"),
        ("step_unprofiled_p50_us", "float64", "the capture's unprofiled step p50 (summary.step_time_us)"),
        ("profiler_dilation", "float64", "profiled / unprofiled step (summary.step_time_us)"),
        ("top_finding", "string", "the report's headline finding"),
        ("findings", "int64", "findings in the report (children included)"),
        ("sync_calls", "int64", "blocking host syncs (sync_totals.total_blocking_calls)"),
        ("cuda_malloc", "int64", "cudaMalloc/hipMalloc calls (allocator.cuda_malloc)"),
        ("reserved_peak_bytes", "int64", "allocator reserved peak; NULL when unknown"),
        ("comm_us", "float64", "GPU time in NCCL/RCCL kernels, overlap included (views.collectives comm_totals)"),
        ("compute_us", "float64", "GPU time when only other work ran (comm_us + compute_us = busy_us)"),
        ("comm_overlap_us", "float64", "collectives overlapping compute (a part of comm_us)"),
        ("analysis_seconds", "float64", "the worker's load + analysis time"),
        ("analyzer_version", "string", "gpu-idle-analyzer version that wrote the row"),
        ("analyzed_at", "timestamp", "when the row was written"),
        ("error", "string", "one line when the trace could not be analysed (then no other table has its rows); NULL when analysed"),
    ],
    "steps": [
        ("content_key", "string", "the trace (join to traces)"),
        ("position", "int64", "the step's place in the trace, from 0"),
        ("step", "string", "its label: prefill, decode_step#3, ProfilerStep#2, engine_step#0"),
        ("step_name", "string", "the label before #"),
        ("step_number", "int64", "the number after #; NULL for prefill"),
        ("ts_us", "float64", "start on the trace's clock"),
        ("wall_us", "float64", "CPU span of the step annotation"),
        ("gpu_span_us", "float64", "first to last GPU work the step launched"),
        ("gpu_period_us", "float64", "start of its GPU work to the next step's"),
        ("busy_us", "float64", "GPU busy"),
        ("idle_us", "float64", "GPU idle inside the step's GPU span"),
        ("utilization", "float64", "busy / span"),
        ("launches", "int64", "kernel launches"),
        *[(n, t, m.replace("gaps.by_cause", "gaps.per_step")) for n, t, m in _IDLE],
        ("syncs", "int64", "blocking host syncs in the step (syncs[].per_step)"),
        ("reserve_calls", "int64", "cudaMalloc calls in the step (allocator.per_step)"),
        ("release_calls", "int64", "cudaFree calls in the step"),
    ],
    "gaps_by_site": [
        ("content_key", "string", "the trace"),
        ("cause", "string", "idle cause of the gaps (cpu_launch = launch gaps)"),
        ("call_site", "string", "innermost frame of your code before the gap (gaps.sites)"),
        ("library_site", "string", "innermost third-party frame inside it"),
        ("count", "int64", "gaps"),
        ("idle_us", "float64", "GPU idle they cost"),
        ("max_us", "float64", "the longest"),
    ],
    "syncs": [
        ("content_key", "string", "the trace"),
        ("kind", "string", "branch, item, print, copy_to_host, nonzero, pageable_h2d, explicit_sync, profiler"),
        ("call_site", "string", "where your code synchronized (file:line when the capture recorded it)"),
        ("library_site", "string", "third-party frame inside it"),
        ("api", "string", "the call the CPU waited in"),
        ("op", "string", "the aten op"),
        ("count", "int64", "times the CPU blocked"),
        ("steps", "int64", "steps with at least one"),
        ("wait_us", "float64", "CPU time blocked"),
        ("drain_us", "float64", "GPU idle while blocked (the finding's cost)"),
    ],
    "allocator_sites": [
        ("content_key", "string", "the trace"),
        ("call_site", "string", "where cudaMalloc/cudaFree were called from (allocator.sites)"),
        ("library_site", "string", "third-party frame inside it"),
        ("op", "string", "the aten op"),
        ("cuda_malloc", "int64", "reserves"),
        ("cuda_free", "int64", "releases"),
        ("warmup_calls", "int64", "first allocations (one-time)"),
        ("bytes_reserved", "int64", "bytes reserved"),
        ("bytes_released", "int64", "bytes released"),
        ("total_us", "float64", "CPU time in the calls"),
        ("gpu_idle_us", "float64", "GPU idle they cost"),
        ("steps_with_calls", "int64", "steps with a call"),
    ],
    "findings": [
        ("content_key", "string", "the trace"),
        ("position", "int64", "rank in the report (children after their parent)"),
        ("id", "string", "the finding's id in report.json"),
        ("parent", "string", "the finding it refines; NULL for a top-level one"),
        ("kind", "string", "launch_gap, host_work, warmup, queued, sync, allocator_churn, ..."),
        ("severity", "string", "high, medium, low, info"),
        ("title", "string", "one sentence"),
        ("call_site", "string", "your code's frame"),
        ("library_site", "string", "third-party frame inside it"),
        ("impact_us", "float64", "GPU idle it costs (µs)"),
        ("count", "int64", "occurrences"),
        ("advice", "string", "what to do"),
    ],
    "collectives": [
        ("content_key", "string", "the trace"),
        ("seq", "int64", "the collective's sequence number in its process group (record_param_comms); -1 unknown"),
        ("name", "string", "collective: allreduce, allgather, reduce_scatter, broadcast, ..."),
        ("pg", "string", "process group name, else `stream N` (NCCL runs one stream per communicator)"),
        ("group_size", "int64", "ranks in the group; -1 unknown"),
        ("bytes", "int64", "message size; -1 unknown"),
        ("step", "int64", "the step it was launched in (steps.position); -1 outside steps"),
        ("ordinal", "int64", "its place among its group's collectives in that step: the same on every rank"),
        ("stream", "int64", "GPU stream"),
        ("device", "int64", "GPU"),
        ("start_us", "float64", "kernel start on the trace's clock"),
        ("end_us", "float64", "kernel end"),
        ("dur_us", "float64", "kernel duration, waiting for late ranks included"),
    ],
}
PARTITIONS = [("job", "string", "partition: --job, or the run folder's name (folders of loose traces: the trace's name)"),
              ("rank", "int64", "partition: distributedInfo.rank, else rank<N> in the file name, else 0")]


def report_rows(report: dict, base: dict) -> dict[str, list[dict]]:
    """The rows of every table for one analysed trace; `base`: the traces row's fields known before analysis."""
    key = {"content_key": base["content_key"]}
    summary, run, traits = report["summary"], report.get("run") or {}, report["summary"].get("traits") or {}
    partition = summary.get("idle_partition") or {}
    step_time = summary.get("step_time_us") or {}
    steps = step_rows(report, key)
    walls = sorted(s["wall_us"] for s in steps if s["wall_us"] and not s["step"].startswith("prefill"))
    gpus = sorted(set(report["trace"].get("gpus") or [])) or ([run["device"]] if run.get("device") else [])
    trace = {
        **base, "captured_at": _utc(run.get("created_utc")), "workload": run.get("workload"),
        "gpu": ", ".join(gpus) or None, "torch": run.get("torch"), "runtime": traits.get("runtime"),
        "training": int(bool(traits.get("training"))), "utilization": summary.get("gpu_utilization"),
        "window_us": summary.get("window_us"), "busy_us": summary.get("gpu_busy_us"),
        "idle_us": summary.get("gpu_idle_us"),
        **{f"idle_{c}_us": report["gaps"]["by_cause"].get(c) for c in CAUSES},
        "findings_us": partition.get("findings_us"), "instrumentation_us": partition.get("instrumentation_us"),
        "unexplained_us": partition.get("unexplained_us"), "steps": summary.get("steps"),
        "step_word": summary.get("step_word"), "step_n": len(walls),
        "step_min_us": walls[0] if walls else None, "step_median_us": _quantile(walls, 0.5),
        "step_p90_us": _quantile(walls, 0.9), "step_max_us": walls[-1] if walls else None,
        "step_unprofiled_p50_us": step_time.get("unprofiled_p50"),
        "profiler_dilation": step_time.get("profiler_dilation"), "top_finding": summary.get("top_finding"),
        "findings": len(report["findings"]), "sync_calls": (report.get("sync_totals") or {}).get("total_blocking_calls"),
        "cuda_malloc": report["allocator"].get("cuda_malloc"),
        "reserved_peak_bytes": report["allocator"].get("reserved_peak_bytes"),
        "analysis_seconds": report.get("analysis_seconds"),
    }
    return {
        "traces": [trace], "steps": steps,
        "gaps_by_site": [{**key, **_pick(s, SCHEMA["gaps_by_site"])} for s in report["gaps"].get("sites") or []],
        "syncs": [{**key, **_pick(s, SCHEMA["syncs"]), "steps": len(s.get("per_step") or {})}
                  for s in report.get("syncs") or []],
        "allocator_sites": [{**key, **_pick(s, SCHEMA["allocator_sites"])}
                            for s in report["allocator"].get("sites") or []],
        "findings": [{**key, **_pick(f, SCHEMA["findings"]), "position": n}
                     for n, f in enumerate(report["findings"])],
    }


def step_rows(report: dict, key: dict) -> list[dict]:
    syncs: dict[str, int] = {}
    for s in report.get("syncs") or []:
        for label, n in (s.get("per_step") or {}).items():
            syncs[label] = syncs.get(label, 0) + n
    alloc = {s["step"]: s for s in report["allocator"].get("per_step") or [] if isinstance(s, dict) and "step" in s}
    rows = []
    for n, s in enumerate(report["gaps"].get("per_step") or []):
        label = str(s["step"])
        m = _STEP.match(label)
        by_cause = s.get("idle_by_cause_us") or {}
        rows.append({**key, **_pick(s, SCHEMA["steps"]), "position": n, "step": label,
                     "step_name": m.group(1) if m else label, "step_number": int(m.group(2)) if m else None,
                     "utilization": s.get("gpu_utilization"), **{f"idle_{c}_us": by_cause.get(c) for c in CAUSES},
                     "syncs": syncs.get(label, 0), "reserve_calls": alloc.get(label, {}).get("reserve_calls"),
                     "release_calls": alloc.get(label, {}).get("release_calls")})
    return rows


def error_row(base: dict, error: str) -> dict[str, list[dict]]:
    return {"traces": [{**base, "error": error}]}


def frame_rows(frame, key: dict, table: str) -> list[dict]:
    """A pandas DataFrame's rows (views.collectives) for `table`, with the trace's key."""
    return [{**key, **_pick(r, SCHEMA[table])} for r in frame.to_dict("records")]


def coerce(value, kind: str):
    """A report value as the column's type: NaN and odd values become NULL, never a failed write."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        if kind == "int64":
            return int(value)
        if kind == "float64":
            return float(value)
        if kind == "timestamp":
            return value if isinstance(value, dt.datetime) else None
        return str(value)
    except (TypeError, ValueError, OverflowError):
        return None


def typed(table: str, rows: list[dict]) -> list[dict]:
    columns = SCHEMA[table]
    return [{name: coerce(row.get(name), kind) for name, kind, _ in columns} for row in rows]


def describe() -> str:
    """The dataset's schema as Markdown: one table per dataset table (docs/fleet.md's copy is tested against it)."""
    parts = []
    for table, columns in SCHEMA.items():
        lines = [f"`{table}`", "", "| column | type | meaning |", "|---|---|---|"]
        lines += [f"| `{n}` | {t} | {m} |" for n, t, m in [*columns, *PARTITIONS]]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _pick(d: dict, columns) -> dict:
    return {name: d.get(name) for name, _, _ in columns if name in d}


def _quantile(xs: list[float], q: float) -> float | None:
    return float(np.quantile(xs, q)) if xs else None


def _utc(stamp) -> dt.datetime | None:
    """meta.json's created_utc (20261202T160424Z)."""
    try:
        return dt.datetime.strptime(str(stamp), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return None


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def version() -> str:
    return __version__
