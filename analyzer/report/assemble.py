"""Run every detector over one trace and assemble report.json's dictionary."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from analyzer.arrays import distinct
from analyzer import __version__
from analyzer.detectors import DETECTORS, AnalysisContext
from analyzer.detectors.base import SEVERITIES, severity_for
from analyzer.units import plural, us
from analyzer.views.collectives import comm_totals
from analyzer.trace.runmeta import RunMeta
from analyzer.views.idle import CAUSES, PROFILER, UNKNOWN
from analyzer.views.sites import describe_site, site_keys
from analyzer.report.stored import trace_key
from analyzer.views.validity import confidence, title_prefix, validity_checks
from analyzer.views.whatif import evaluate
from analyzer.trace import GpuKind, TraceModel

REPORT_SCHEMA = "gpu-idle-analyzer/report/1"
DEVICE_FREE_KINDS = frozenset({"recompile", "graph_break"})


def assemble_report(ctx: AnalysisContext, source: Path, started: float | None = None) -> dict:
    """Run every registered detector over the context and assemble report.json's dictionary."""
    started = time.perf_counter() if started is None else started
    model, meta = ctx.model, ctx.meta
    results = [detect(ctx) for detect in DETECTORS]
    # with no GPU timeline there is no idle to explain: only findings about the code itself (torch.compile's
    # recompiles and graph breaks, which a CPU run makes too) are stated
    findings = _ranked([f for r in results for f in r.findings
                        if ctx.timeline.devices or f.kind in DEVICE_FREE_KINDS])
    what_if, savings = evaluate(ctx, findings)
    findings = _severity_on_unprofiled_step(findings, what_if, savings)
    checks = validity_checks(ctx, _dilation(ctx, ctx.step_table))
    tl = ctx.timeline
    report = {
        "schema": REPORT_SCHEMA,
        "tool": {"name": "gpu-idle-analyzer", "version": __version__},
        "source": {"trace": str(source), "meta": str(meta.path) if meta else None,
                   "meta_warnings": list(meta.warnings) if meta else [], "trace_key": trace_key(Path(source))},
        "summary": _summary(ctx, findings),
        "run": _run_info(meta),
        "trace": _trace_info(model),
        **{key: value for r in results for key, value in r.sections.items()},
        "timeline": _timeline_payload(ctx),
        "validity": _validity(checks),
        "findings": _with_confidence([f.as_dict() | ({"what_if": savings[f.id]} if f.id in savings else {})
                                      for f in findings], checks),
        "what_if": what_if,
        "hta": None,
        "analysis_seconds": round(time.perf_counter() - started, 3),
    }
    report["summary"]["top_finding"] = report["findings"][0]["title"] if findings else None
    if not tl.devices:
        report["summary"]["note"] = _no_gpu_note(model, checks)
    return report


def _validity(checks: list) -> dict:
    failed = [c.name for c in checks if c.status == "fail"]
    warned = [c.name for c in checks if c.status == "warn"]
    return {"checks": [c.as_dict() for c in checks], "failed": failed, "warned": warned,
            "definition": "named checks of what the trace can show; a finding a failed check touches has confidence "
                          "low (its title says why), one a warning touches medium"}


def _with_confidence(findings: list[dict], checks: list) -> list[dict]:
    """Each finding's confidence after the validity checks (a child keeps its parent's); a low one's title says
    which missing data it rests on."""
    by_id = {}
    for f in findings:
        parent = by_id.get(f["parent"]) if f["parent"] else None
        level, why = (parent["confidence"], parent["confidence_checks"]) if parent else confidence(f["kind"], checks)
        f["confidence"], f["confidence_checks"] = level, why
        if level == "low" and not parent:
            f["title"] = title_prefix(checks, why) + f["title"]
            if f.get("what_if"):  # a saving computed from a timeline with holes is not a number to act on
                f["what_if"] = {"measure": f["what_if"].get("measure"), "saving_ms": None,
                                "why": "withheld: it rests on data the trace does not hold (" + ", ".join(why) + ")"}
        by_id[f["id"]] = f
    return findings


KNOWN_DILATION = 1.2  # the profiled step this much over the measured unprofiled one: window shares mislead


def _severity_on_unprofiled_step(findings: list, what_if: dict, savings: dict[str, dict]) -> list:
    """Where the trace is known to be dilated (its step measured without the profiler, and the profiled one at least
    KNOWN_DILATION longer), a priced top-level finding's severity is its fix's share of the unprofiled step (on
    average, where it changes only some steps; a one-time cost keeps its own), not its
    idle share of the profiled window: a step ~83% GPU-busy unprofiled is not launch-bound because the profiler made
    it so. Its what_if says so (`severity_from`, and the window's severity beside it)."""
    step, profiled = what_if.get("step_ms"), what_if.get("profiled_step_ms")
    if what_if.get("basis") != "unprofiled" or not step or not profiled or profiled < KNOWN_DILATION * step:
        return findings
    out, graded = [], {}
    for f in findings:
        w = savings.get(f.id) if not f.parent else None
        saving = max((w or {}).get("saving_ms") or 0.0, (w or {}).get("mean_saving_ms") or 0.0)
        if w and w.get("saving_ms") is not None and w.get("once_ms") is None:  # a one-time cost is not per step
            graded[f.id] = severity_for(saving, step)
            if graded[f.id] != f.severity:
                w["severity_from"] = {"basis": "its saving's share of the unprofiled step",
                                      "dilation": round(profiled / step, 2), "window_severity": f.severity}
                f = dataclasses.replace(f, severity=graded[f.id])
        elif f.parent in graded:  # a refinement is no more severe than what it refines
            f = dataclasses.replace(f, severity=max(f.severity, graded[f.parent], key=SEVERITIES.index))
        out.append(f)
    return out


def _ranked(findings: list) -> list:
    """Top-level findings by GPU idle explained, each followed by the findings that refine it; unique ids."""
    top = sorted((f for f in findings if not f.parent),
                 key=lambda f: (-f.impact_us, SEVERITIES.index(f.severity), f.title))
    children: dict[str, list] = {}
    for f in findings:
        if f.parent:
            children.setdefault(f.parent, []).append(f)
    ordered = []
    for f in top:
        ordered.append(f)
        ordered += sorted(children.pop(f.id, []), key=lambda c: -c.impact_us)
    ids = [f.id for f in ordered]
    if children or len(set(ids)) != len(ids) or not all(ids):
        raise AssertionError(f"finding ids must be set and unique, parents present: {ids}, orphans {list(children)}")
    return ordered


def _no_gpu_note(model: TraceModel, checks: list) -> str:
    missing = next((c for c in checks if c.name == "gpu_activity_recorded"), None)
    if missing is not None:
        return (f"{plural(missing.measured['launches'], 'launch call')} recorded but no GPU activity: the GPU side "
                f"was not recorded (CUDA activity off, or CUPTI unable to record it), so no idle can be explained; "
                f"see the trace checks")
    foreign = model.foreign_activity
    if foreign:
        what = ", ".join(f"{count} {cat}" for cat, count in sorted(foreign.items(), key=lambda kv: -kv[1]))
        return (f"GPU activity of an unsupported device type: {', '.join(model.foreign_device_types)} ({what}); "
                f"this analyzer reads CUDA and HIP activity only, so it cannot say when that device was idle")
    return "no GPU activity in this trace: a CPU-only run, or no CUDA/HIP activity was recorded"


def _partition(ctx: AnalysisContext, findings: list) -> dict:
    """Every idle µs: owned by one top-level finding, the measurement's own, or unexplained."""
    idle_us = ctx.timeline.idle_ns / 1e3
    owned = sum(f.impact_us for f in findings if not f.parent)
    instrumentation = ctx.idle.total_ns(PROFILER) / 1e3
    return {"idle_us": us(ctx.timeline.idle_ns), "findings_us": round(owned, 3),
            "instrumentation_us": round(instrumentation, 3),
            "unexplained_us": round(idle_us - owned - instrumentation, 3),
            "unknown_launch_us": round(ctx.idle.total_ns(UNKNOWN) / 1e3, 3),
            "definition": "findings (top-level impacts) + instrumentation (the profiler's and the capture's own code)"
                          " + unexplained (the next work's launch is not in the trace) = GPU idle"}


def _summary(ctx: AnalysisContext, findings: list) -> dict:
    tl = ctx.timeline
    window = tl.window_ns
    steps = ctx.step_table
    summary = {
        "gpu_utilization": round(tl.busy_ns / window, 4) if window else None,
        "gpu_busy_us": us(tl.busy_ns), "gpu_idle_us": us(tl.idle_ns), "window_us": us(window),
        "profiler_overhead_us": us(sum(d.overhead_ns for d in tl.devices)),
        "steps": len(steps), "step_word": ctx.traits.step_word, "devices": [d.device for d in tl.devices],
        "idle_partition": _partition(ctx, findings), "traits": ctx.traits.as_dict(),
    }
    dilation = _dilation(ctx, steps)
    if dilation:
        summary["step_time_us"] = dilation
    comm = _communication(ctx)
    if comm:
        summary["communication"] = comm
    return summary


def _communication(ctx: AnalysisContext) -> dict | None:
    """How much of the GPU's busy time was collectives (NCCL / RCCL kernels), when there were any: busy is not all
    compute on a distributed run, and a rank that waits inside an all-reduce looks busy."""
    t = comm_totals(ctx)
    if not t["kernels"]:
        return None
    return {"kernels": t["kernels"], "comm_us": round(t["comm_us"], 3), "share_of_busy": t["comm_share"],
            "overlap_us": round(t["overlap_us"], 3), "compute_us": round(t["compute_us"], 3)}


def _dilation(ctx: AnalysisContext, steps: list[dict]) -> dict | None:
    """The profiled step against the unprofiled one, measured the same way: CUDA events between step starts are the
    GPU's step period, so they compare with the period between the starts of each step's GPU work; a CPU clock
    compares with the CPU period. Omitted, with the reason, when the two cannot be matched."""
    meta = ctx.meta
    unprofiled = meta.get("unprofiled", "step_ms", "p50") if meta else None
    if not unprofiled:
        return None
    label = meta.get("unprofiled", "step_label", default="") or ""
    clock = str(meta.get("unprofiled", "clock", default="") or "")
    mine = [s for s in steps if label and s["step"].startswith(label)][:-1] or \
        [s for s in steps if label and s["step"].startswith(label)]
    gpu_clock = "cuda" in clock.lower()
    values = [s["gpu_period_us"] for s in mine if s.get("gpu_period_us") is not None] if gpu_clock else \
        [s["wall_us"] for s in mine]
    out = {"unprofiled_p50": round(unprofiled * 1e3, 3), "clock": clock or None}
    if not values:
        out["omitted"] = (f"no profiled {label or 'step'} steps" if not mine else
                          "the profiled steps launched no GPU work to time like the unprofiled CUDA events")
        return out
    profiled = sorted(values)[len(values) // 2]
    out.update({"profiled_p50": profiled, "profiled_measure": "GPU period (start of a step's GPU work to the next's)"
                if gpu_clock else "CPU period (step start to the next step's start)",
                "profiler_dilation": round(profiled / (unprofiled * 1e3), 2)})
    return out


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
        "notes": dict(model.notes),
        "foreign_activity": dict(model.foreign_activity),
    }


MAX_INTERVALS = 5000


def longest(start: np.ndarray, end: np.ndarray, limit: int) -> np.ndarray:
    """Positions of the `limit` longest intervals, ascending (all of them when there are no more). A total order:
    longest first, equal lengths by the earlier start, then the earlier end, then position, so the kept set is the
    same on every machine and for any input order (numpy's default argsort breaks ties differently by CPU)."""
    if len(start) <= limit:
        return np.arange(len(start))
    return np.sort(np.lexsort((end, start, start - end))[:limit])


def _timeline_payload(ctx: AnalysisContext) -> dict:
    """Busy and idle intervals per device for the report's timeline, bounded in size: busy intervals closer than
    the cut-off merge, and only the longest idle pieces are kept when there are too many. Each idle piece names its
    cause and its call site by index into `sites`."""
    devices, sites, site_index = {}, [], {}
    idle, rt = ctx.idle, ctx.model.runtime
    piece_device = ctx.gaps.device[idle.gap] if len(idle) else np.zeros(0, np.int64)
    row = idle.row
    safe = np.maximum(row, 0)
    keys = site_keys(ctx, np.where(row >= 0, rt.frame[safe], idle.frame) if len(rt) else idle.frame,
                     np.where(row >= 0, rt.op[safe], -1) if len(rt) else np.full(len(idle), -1),
                     np.where(row >= 0, rt.name[safe], -1) if len(rt) else np.full(len(idle), -1)) \
        if len(idle) else np.zeros(0, np.int64)
    for dev in ctx.timeline.devices:
        bs, be = dev.busy_starts, dev.busy_ends
        if len(bs) > MAX_INTERVALS:  # keep the widest gaps between busy intervals; merge across the rest
            keep = np.sort(np.argsort(bs[1:] - be[:-1], kind="stable")[-(MAX_INTERVALS - 1):])
            bs, be = bs[np.append(0, keep + 1)], be[np.append(keep, len(be) - 1)]
        mine = np.flatnonzero(piece_device == dev.device)
        chosen = mine[longest(idle.start_ns[mine], idle.end_ns[mine], MAX_INTERVALS)]
        for key in distinct(keys[chosen]).tolist():
            if key not in site_index:
                label = describe_site(ctx, key)["label"]
                site_index[key] = len(sites) if label != "(unknown)" else -1
                if label != "(unknown)":
                    sites.append(label)
        starts = np.round(idle.start_ns[chosen] / 1e3, 3).tolist()
        ends = np.round(idle.end_ns[chosen] / 1e3, 3).tolist()
        out = [[s, e, CAUSES[c], site_index[k]]
               for s, e, c, k in zip(starts, ends, idle.cause[chosen].tolist(), keys[chosen].tolist())]
        devices[str(dev.device)] = {
            "window_us": [round(dev.window_start_ns / 1e3, 3), round(dev.window_end_ns / 1e3, 3)],
            "busy_us": [list(p) for p in zip(np.round(bs / 1e3, 3).tolist(), np.round(be / 1e3, 3).tolist())],
            "idle_us": out,
            "idle_total": int(len(mine)), "busy_total": int(len(dev.busy_starts)),
        }
    return {"devices": devices, "causes": list(CAUSES), "sites": sites,
            "idle_format": ["start_us", "end_us", "cause", "site index (-1: unknown)"]}
