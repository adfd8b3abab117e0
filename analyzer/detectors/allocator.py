"""Caching-allocator behaviour from CUDA [memory] events and cudaMalloc/cudaFree (cuMem*) calls: the allocated and
reserved timelines, their peaks, the cached (reserved - allocated) share, reserved growth and drops (empty_cache),
churn per step and per call site, and memory_stats counters from the capture."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from analyzer import apis
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, severity_for, us
from analyzer.frames import outermost_op, site_label
from analyzer.gapcauses import ALLOCATOR
from analyzer.steps import step_ranges

MAX_TIMELINE_POINTS = 2000
STATS_KEYS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams",
              "num_tensor_frees")
ADVICE_CHURN = ("The caching allocator returns memory to the driver and asks for it again inside the loop "
                "(cudaMalloc/cudaFree are slow and cudaFree synchronizes the device). Preallocate buffers of their "
                "final size and reuse them (out= / in-place ops / a static KV cache), do not call "
                "torch.cuda.empty_cache() in the loop, and for buffers that must grow set "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")


def _downsample(ts: np.ndarray, *series: np.ndarray) -> tuple[np.ndarray, ...]:
    """At most MAX_TIMELINE_POINTS rows: per bucket, the rows holding the min and max of the first series."""
    n = len(ts)
    if n <= MAX_TIMELINE_POINTS:
        return (ts, *series)
    buckets = MAX_TIMELINE_POINTS // 2
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    keep = [0, n - 1]
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist()):
        if hi > lo:
            part = series[0][lo:hi]
            keep += [lo + int(part.argmin()), lo + int(part.argmax())]
    rows = np.unique(np.asarray(keep))
    return (ts[rows], *(s[rows] for s in series))


def detect(ctx: AnalysisContext) -> DetectorResult:
    model, mem, rt = ctx.model, ctx.model.memory, ctx.model.runtime
    cuda = (mem.device_type == 1) & ~mem.is_oom
    devices = sorted(set(mem.device_id[cuda].tolist()))
    timelines, peaks = {}, {}
    allocations = int(((mem.bytes > 0) & cuda).sum())
    drops, growth = {"count": 0, "bytes": 0}, {"count": 0, "bytes": 0}
    for dev in devices:
        rows = np.flatnonzero(cuda & (mem.device_id == dev))
        rows = rows[np.argsort(mem.ts_ns[rows], kind="stable")]
        ts, alloc, reserved = mem.ts_ns[rows], mem.total_allocated[rows], mem.total_reserved[rows]
        cached = reserved - alloc
        step = np.diff(reserved)
        growth["count"] += int((step > 0).sum())
        growth["bytes"] += int(step[step > 0].sum())
        drops["count"] += int((step < 0).sum())
        drops["bytes"] += int(-step[step < 0].sum())
        t, r, a = _downsample(ts, reserved, alloc)
        timelines[str(dev)] = {"ts_us": [us(x) for x in t.tolist()], "allocated_bytes": a.tolist(),
                               "reserved_bytes": r.tolist()}
        peak_r = int(reserved.argmax())
        peaks[str(dev)] = {"allocated_peak_bytes": int(alloc.max()), "reserved_peak_bytes": int(reserved.max()),
                           "cached_peak_bytes": int(cached.max()),
                           "cached_at_reserved_peak_bytes": int(cached[peak_r]),
                           "reserved_end_bytes": int(reserved[-1]), "allocated_end_bytes": int(alloc[-1])}

    classes = apis.runtime_classes(model)
    calls = np.flatnonzero(classes == apis.IS_ALLOC)
    by_api = defaultdict(lambda: {"count": 0, "total_us": 0.0})
    steps = step_ranges(model)
    per_step = {name: {"reserve_calls": 0, "release_calls": 0, "allocations": 0} for name in steps.names}
    sites: dict[str, dict] = {}
    mem_cuda_ts = np.sort(mem.ts_ns[cuda])
    mem_cuda_reserved = mem.total_reserved[cuda][np.argsort(mem.ts_ns[cuda], kind="stable")]
    for r in calls.tolist():
        api = model.names[rt.name[r]]
        reserve = api in apis.ALLOC_RESERVE
        by_api[api]["count"] += 1
        by_api[api]["total_us"] += (rt.end_ns[r] - rt.start_ns[r]) / 1e3
        step = int(steps.index_at(int(rt.start_ns[r]))) if len(steps) else -1
        if step >= 0:
            per_step[steps.names[step]]["reserve_calls" if reserve else "release_calls"] += 1
        frame = int(rt.frame[r])
        site = site_label(model, ctx.frames, r)
        op = int(rt.op[r])
        entry = sites.setdefault(site, {"call_site": site, "cuda_malloc": 0, "cuda_free": 0, "total_us": 0.0,
                                        "bytes_reserved": 0, "bytes_released": 0, "steps": set(),
                                        "op": model.names[model.ops.name[outermost_op(model, op)]] if op >= 0 else None,
                                        "context": ctx.frames.context(frame), "occurrences": []})
        entry["cuda_malloc" if reserve else "cuda_free"] += 1
        entry["total_us"] += (rt.end_ns[r] - rt.start_ns[r]) / 1e3
        if step >= 0:
            entry["steps"].add(step)
        delta = _reserved_change(mem_cuda_ts, mem_cuda_reserved, int(rt.start_ns[r]), int(rt.end_ns[r]))
        if delta is not None:
            entry["bytes_reserved" if delta > 0 else "bytes_released"] += abs(delta)
        if len(entry["occurrences"]) < 16:
            entry["occurrences"].append((us(rt.start_ns[r]), us(rt.end_ns[r]), api))
    if len(steps):
        alloc_steps = steps.index_at(mem.ts_ns[cuda & (mem.bytes > 0)])
        for k, n in zip(*np.unique(alloc_steps[alloc_steps >= 0], return_counts=True)):
            per_step[steps.names[int(k)]]["allocations"] = int(n)
    site_list = sorted(sites.values(), key=lambda s: -(s["cuda_malloc"] + s["cuda_free"]))
    for s in site_list:
        s["steps_with_calls"] = len(s.pop("steps"))
        s["total_us"] = round(s["total_us"], 3)
    reserve_calls = sum(v["count"] for k, v in by_api.items() if k in apis.ALLOC_RESERVE)
    release_calls = sum(v["count"] for k, v in by_api.items() if k not in apis.ALLOC_RESERVE)
    idle_us = sum(float((dev.idle_ends[c == ALLOCATOR] - dev.idle_starts[c == ALLOCATOR]).sum())
                  for dev, (c, _) in zip(ctx.timeline.devices, ctx.gap_causes)) / 1e3
    stats = ctx.meta.get("profiled", "memory_stats_delta", default={}) if ctx.meta else {}
    data = {
        "cuda_malloc": reserve_calls, "cuda_free": release_calls,
        "by_api": {k: {"count": v["count"], "total_us": round(v["total_us"], 3)} for k, v in by_api.items()},
        "reserved_peak_bytes": max((p["reserved_peak_bytes"] for p in peaks.values()), default=0),
        "allocated_peak_bytes": max((p["allocated_peak_bytes"] for p in peaks.values()), default=0),
        "devices": peaks, "timeline": timelines,
        "allocations": allocations,
        "cache_hit_share": round(1 - reserve_calls / allocations, 4) if allocations else None,
        "reserved_growth": growth, "reserved_drops": drops,
        "gpu_idle_us": round(idle_us, 3),
        "per_step": [{"step": k, **v} for k, v in per_step.items()],
        "sites": site_list,
        "memory_stats_delta": {k: stats[k] for k in STATS_KEYS if k in stats} if stats else None,
        "oom_events": int(mem.is_oom.sum()),
    }
    return DetectorResult("allocator", data, tuple(_findings(ctx, data, steps)))


def _reserved_change(ts: np.ndarray, reserved: np.ndarray, start: int, end: int) -> int | None:
    """Total Reserved after a call minus before it, from the nearest [memory] events around it."""
    before = int(np.searchsorted(ts, start, side="right")) - 1
    after = int(np.searchsorted(ts, end, side="left"))
    if after >= len(ts):
        return None
    prior = int(reserved[before]) if before >= 0 else 0
    change = int(reserved[after]) - prior
    return change or None


def _findings(ctx: AnalysisContext, data: dict, steps) -> list[Finding]:
    window_us = ctx.timeline.window_ns / 1e3
    findings = []
    stats = data["memory_stats_delta"] or {}
    steady = [s for s in data["per_step"][1:] if s["reserve_calls"] + s["release_calls"] > 0]
    if steady or (len(steps) <= 1 and data["cuda_malloc"] + data["cuda_free"] > 2):
        top = data["sites"][0] if data["sites"] else None
        steps_with_calls = sum(1 for s in data["per_step"] if s["reserve_calls"] + s["release_calls"])
        n_calls = data["cuda_malloc"] + data["cuda_free"]
        findings.append(Finding(
            kind="allocator_churn", severity=severity_for(data["gpu_idle_us"] + 1, window_us),
            title=f"Allocator churn: {data['cuda_malloc']} cudaMalloc and {data['cuda_free']} cudaFree"
                  + (f" in {steps_with_calls} of {len(steps)} steps" if len(steps) else "")
                  + f" (reserved dropped {data['reserved_drops']['count']}x)",
            call_site=top["call_site"] if top else None, impact_us=data["gpu_idle_us"], count=n_calls,
            advice=ADVICE_CHURN,
            detail={"sites": [{k: s[k] for k in ("call_site", "cuda_malloc", "cuda_free", "total_us")}
                              for s in data["sites"][:5]],
                    "call_time_us": round(sum(v["total_us"] for v in data["by_api"].values()), 3),
                    "memory_stats_delta": stats},
            occurrences_us=tuple((o[0], o[1]) for o in (top["occurrences"] if top else []))))
    if stats.get("num_alloc_retries", 0) > 0 or stats.get("num_ooms", 0) > 0:
        findings.append(Finding(
            kind="allocator_churn", severity="high",
            title=f"Allocator ran out of cached memory: {stats.get('num_alloc_retries', 0)} alloc retries "
                  f"(cache flush + cudaMalloc retry), {stats.get('num_ooms', 0)} OOMs in the window",
            call_site=None, impact_us=data["gpu_idle_us"], count=int(stats.get("num_alloc_retries", 0)),
            advice="Each retry frees every cached block and synchronizes. Lower peak memory (smaller batch or "
                   "KV cache), or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to reduce fragmentation.",
            detail={"memory_stats_delta": stats}))
    return findings
