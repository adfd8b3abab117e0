"""Run every detector over one trace and assemble report.json's dictionary."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from analyzer import __version__
from analyzer.detectors import DETECTORS, AnalysisContext
from analyzer.detectors.base import SEVERITIES, us
from analyzer.runmeta import RunMeta
from analyzer.trace import GpuKind, TraceModel

REPORT_SCHEMA = "gpu-idle-analyzer/report/1"


def analyze_model(model: TraceModel, meta: RunMeta | None, source: Path) -> dict:
    started = time.perf_counter()
    ctx = AnalysisContext(model, meta)
    results = [detect(ctx) for detect in DETECTORS]
    findings = [f for r in results for f in r.findings]
    findings.sort(key=lambda f: (-f.impact_us, SEVERITIES.index(f.severity), f.title))
    tl = ctx.timeline
    gaps = next(r.data for r in results if r.section == "gaps")
    report = {
        "schema": REPORT_SCHEMA,
        "tool": {"name": "gpu-idle-analyzer", "version": __version__},
        "source": {"trace": str(source), "meta": str(meta.path) if meta else None,
                   "meta_warnings": list(meta.warnings) if meta else []},
        "summary": _summary(ctx, gaps),
        "run": _run_info(meta),
        "trace": _trace_info(model),
        **{r.section: r.data for r in results},
        "timeline": _timeline_payload(ctx),
        "findings": [dataclasses.asdict(f) | {"occurrences_us": [list(o) for o in f.occurrences_us]}
                     for f in findings],
        "hta": None,
        "analysis_seconds": round(time.perf_counter() - started, 3),
    }
    syncs = report.pop("syncs")
    report["syncs"] = syncs.pop("sites")  # report.json's `syncs` is the list of call sites
    report["sync_totals"] = syncs
    report["summary"]["top_finding"] = report["findings"][0]["title"] if findings else None
    if not tl.devices:
        report["summary"]["note"] = "no GPU activity in this trace: a CPU-only run, or no CUDA/HIP activity was recorded"
    return report


def _summary(ctx: AnalysisContext, gaps: dict) -> dict:
    tl = ctx.timeline
    window = tl.window_ns
    steps = gaps["per_step"]
    summary = {
        "gpu_utilization": round(tl.busy_ns / window, 4) if window else None,
        "gpu_busy_us": us(tl.busy_ns), "gpu_idle_us": us(tl.idle_ns), "window_us": us(window),
        "profiler_overhead_us": us(sum(d.overhead_ns for d in tl.devices)),
        "steps": len(steps), "devices": [d.device for d in tl.devices],
    }
    meta = ctx.meta
    unprofiled = meta.get("unprofiled", "step_ms", "p50") if meta else None
    label = meta.get("unprofiled", "step_label", default="") if meta else ""
    # the profiled steps of the same kind as the unprofiled timing (decode steps, or prefill-only steps)
    decode = [s["wall_us"] for s in steps if label and s["step"].startswith(label)]
    if unprofiled and decode:
        profiled = sorted(decode)[len(decode) // 2]
        summary["step_time_us"] = {"unprofiled_p50": round(unprofiled * 1e3, 3), "profiled_p50": profiled,
                                   "profiler_dilation": round(profiled / (unprofiled * 1e3), 2)}
    return summary


def _run_info(meta: RunMeta | None) -> dict | None:
    if meta is None or not meta.data:  # no meta.json, or one ignored whole
        return None
    env, model = meta.get("environment", default={}), meta.get("model", default={})
    return {
        "workload": meta.get("workload_file"), "script": meta.get("workload", "script"),
        "complete": meta.get("complete"), "error": meta.get("error"),
        "model": model.get("preset") or model.get("checkpoint"), "dtype": model.get("dtype"),
        "layers": (model.get("config") or {}).get("num_hidden_layers"),
        "batch_size": meta.get("workload", "batch_size"), "mode": meta.get("workload", "mode"),
        "device": env.get("gpu_name") or env.get("device"), "torch": env.get("torch"),
        "cuda_runtime": env.get("cuda_runtime"), "created_utc": meta.get("created_utc"),
        "unprofiled": meta.get("unprofiled"), "mode_comparison": meta.get("mode_comparison"),
    }


def _trace_info(model: TraceModel) -> dict:
    gpu = model.gpu
    props = model.metadata.get("deviceProperties")
    props = props if isinstance(props, list) else []  # odd top-level values read as absent
    return {
        "events": {"ops": len(model.ops), "python_frames": len(model.frames), "runtime_calls": len(model.runtime),
                   "kernels": int((gpu.kind == GpuKind.KERNEL).sum()), "memcpy": int((gpu.kind == GpuKind.MEMCPY).sum()),
                   "memset": int((gpu.kind == GpuKind.MEMSET).sum()), "cuda_sync": int((gpu.kind == GpuKind.SYNC).sum()),
                   "memory": len(model.memory)},
        "gpus": [p.get("name") for p in props if isinstance(p, dict)],
        "has_python_stacks": len(model.frames) > 0,
        "has_memory_events": len(model.memory) > 0,
        "warnings": dict(model.warnings),
    }


MAX_INTERVALS = 5000


def _timeline_payload(ctx: AnalysisContext) -> dict:
    """Busy and idle intervals per device for the report's timeline, bounded in size: busy intervals closer than
    the cut-off merge, and only the longest idle intervals are kept when there are too many. Each idle interval
    names its call site by index into `sites`."""
    from analyzer.frames import site_label
    from analyzer.gapcauses import CAUSES
    devices, sites, site_index = {}, [], {}

    def site_of(row: int) -> int:
        label = site_label(ctx.model, ctx.frames, row) if row >= 0 else None
        if label is None:
            return -1
        if label not in site_index:
            site_index[label] = len(sites)
            sites.append(label)
        return site_index[label]

    for dev, (cause, responsible) in zip(ctx.timeline.devices, ctx.gap_causes):
        bs, be = dev.busy_starts, dev.busy_ends
        if len(bs) > MAX_INTERVALS:  # keep the widest gaps between busy intervals; merge across the rest
            keep = np.sort(np.argsort(bs[1:] - be[:-1], kind="stable")[-(MAX_INTERVALS - 1):])
            bs, be = bs[np.append(0, keep + 1)], be[np.append(keep, len(be) - 1)]
        dur = dev.idle_ends - dev.idle_starts
        rows = np.arange(len(dur)) if len(dur) <= MAX_INTERVALS else np.sort(np.argsort(-dur)[:MAX_INTERVALS])
        row_site: dict[int, int] = {}
        idle = []
        for i in rows.tolist():
            r = int(responsible[i])
            if r not in row_site:
                row_site[r] = site_of(r)
            idle.append([us(dev.idle_starts[i]), us(dev.idle_ends[i]), CAUSES[cause[i]], row_site[r]])
        devices[str(dev.device)] = {
            "busy_us": [[us(s), us(e)] for s, e in zip(bs.tolist(), be.tolist())], "idle_us": idle,
            "idle_total": int(len(dur)), "busy_total": int(len(dev.busy_starts)),
        }
    return {"devices": devices, "causes": list(CAUSES), "sites": sites,
            "idle_format": ["start_us", "end_us", "cause", "site index (-1: unknown)"]}
