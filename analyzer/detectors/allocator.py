"""Caching-allocator behaviour from CUDA [memory] events and cudaMalloc/cudaFree (cuMem*) calls: the allocated and
reserved timelines, their peaks, the cached (reserved - allocated) share, reserved growth and drops (empty_cache),
churn per step and per call site, and memory_stats counters from the capture."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from analyzer.arrays import distinct
from analyzer.views import apis
from analyzer.detectors.allocator_records import snapshot_findings, snapshot_section
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, SiteTable, severity_for
from analyzer.units import fmt_bytes, plural, us
from analyzer.views.frames import outermost_op
from analyzer.views.frames import describe_frame
from analyzer.views.growing import growing_allocations
from analyzer.views.idle import ALLOCATOR
from analyzer.views.onetime import NONE
from analyzer.views.sites import describe_site, site_keys
from analyzer.views.whatif import intervals_fix

MAX_TIMELINE_POINTS = 2000
STATS_KEYS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams",
              "num_tensor_frees")
ADVICE_CHURN = ("The caching allocator returns memory to the driver and asks for it again inside the loop "
                "({malloc}/{free} are slow and {free} synchronizes the device). Preallocate buffers of their "
                "final size and reuse them (out= / in-place ops / a static KV cache), do not call "
                "torch.cuda.empty_cache() in the loop, and for buffers that must grow set "
                "{conf}=expandable_segments:True.")
ADVICE_GROWTH = ("Reserved memory keeps growing after the first step: the allocator's cache cannot serve requests "
                 "whose sizes change from step to step (a cache or buffer grown by torch.cat, shapes that vary per "
                 "step), so it reserves new segments with {malloc}. Preallocate at the final size (a static KV "
                 "cache), pad or bucket shapes to a few sizes, or set {conf}=expandable_segments:True.")


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
    rows = distinct(np.asarray(keep))
    return (ts[rows], *(s[rows] for s in series))


def detect(ctx: AnalysisContext) -> DetectorResult:
    model, mem, rt = ctx.model, ctx.model.memory, ctx.model.runtime
    cuda = (mem.device_type == 1) & ~mem.is_oom
    timelines, peaks = {}, {}
    allocations = int(((mem.bytes > 0) & cuda).sum())
    drops, growth = {"count": 0, "bytes": 0}, {"count": 0, "bytes": 0}
    for series in ctx.memory_series:
        dev, ts, alloc, reserved = series.device, series.ts_ns, series.allocated, series.reserved
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

    classes = ctx.runtime_classes
    calls = np.flatnonzero(classes == apis.IS_ALLOC)
    by_api = defaultdict(lambda: {"count": 0, "total_us": 0.0})
    steps = ctx.steps
    per_step = {name: {"reserve_calls": 0, "release_calls": 0, "allocations": 0} for name in steps.names}
    sites = SiteTable(sums=("total_us", "gpu_idle_us"), count=None)
    keys = site_keys(ctx, rt.frame[calls], rt.op[calls], rt.name[calls]) if len(calls) else []
    drained = defaultdict(float)
    idle = ctx.idle
    for i in np.flatnonzero(idle.cause == ALLOCATOR).tolist():
        drained[int(idle.row[i])] += (idle.end_ns[i] - idle.start_ns[i]) / 1e3
    warmup_calls = capture_calls = setup_calls = 0
    mem_cuda_ts = np.sort(mem.ts_ns[cuda])
    mem_cuda_reserved = mem.total_reserved[cuda][np.argsort(mem.ts_ns[cuda], kind="stable")]
    for r, key in zip(calls.tolist(), [int(k) for k in keys]):
        api = model.names[rt.name[r]]
        reserve = api in apis.ALLOC_RESERVE
        by_api[api]["count"] += 1
        by_api[api]["total_us"] += (rt.end_ns[r] - rt.start_ns[r]) / 1e3
        first = ctx.one_time[r] != NONE
        captured = bool(ctx.graphs.in_capture[r]) and not first  # a graph capture's own calls: one-time too
        in_setup = bool(ctx.in_setup[r]) and not first and not captured  # a set-up's trial workspaces
        warmup = first or captured or in_setup
        warmup_calls += first
        capture_calls += captured
        setup_calls += in_setup
        step = int(steps.index_at(int(rt.start_ns[r]))) if len(steps) else -1
        if step >= 0:
            per_step[steps.names[step]]["reserve_calls" if reserve else "release_calls"] += 1
        frame = int(rt.frame[r])
        op = int(rt.op[r])
        def new_site(key=key, frame=frame, op=op) -> dict:
            site = describe_site(ctx, key, frame)
            return {"call_site": site["label"], "library_site": site["library_below"], "site": site,
                    "cuda_malloc": 0, "cuda_free": 0, "warmup_calls": 0, "bytes_reserved": 0, "bytes_released": 0,
                    "steps": set(), "op": model.names[model.ops.name[outermost_op(model, op)]] if op >= 0 else None,
                    "context": ctx.frames.context(frame)}

        entry = sites.add(key, new_site, (us(rt.start_ns[r]), us(rt.end_ns[r]), api),
                          **{"cuda_malloc" if reserve else "cuda_free": 1}, warmup_calls=int(warmup),
                          total_us=(rt.end_ns[r] - rt.start_ns[r]) / 1e3, gpu_idle_us=drained.get(r, 0.0))
        if step >= 0:
            entry["steps"].add(step)
        delta = _reserved_change(mem_cuda_ts, mem_cuda_reserved, int(rt.start_ns[r]), int(rt.end_ns[r]))
        if delta is not None:
            entry["bytes_reserved" if delta > 0 else "bytes_released"] += abs(delta)
    if len(steps):
        alloc_steps = steps.index_at(mem.ts_ns[cuda & (mem.bytes > 0)])
        for k, n in zip(*np.unique(alloc_steps[alloc_steps >= 0], return_counts=True)):
            per_step[steps.names[int(k)]]["allocations"] = int(n)
    site_list = sites.rows(lambda s: -(s["cuda_malloc"] + s["cuda_free"]))
    for s in site_list:
        s["steps_with_calls"] = len(s.pop("steps"))
    reserve_calls = sum(v["count"] for k, v in by_api.items() if k in apis.ALLOC_RESERVE)
    release_calls = sum(v["count"] for k, v in by_api.items() if k not in apis.ALLOC_RESERVE)
    idle_us = idle.total_ns(ALLOCATOR) / 1e3
    stats = ctx.meta.get("profiled", "memory_stats_delta", default={}) if ctx.meta else {}
    process = ctx.meta.get("profiled", "memory_stats_after", default={}) if ctx.meta else {}
    data = {
        "cuda_malloc": reserve_calls, "cuda_free": release_calls, "warmup_calls": int(warmup_calls),
        "capture_calls": int(capture_calls), "setup_calls": int(setup_calls),
        "api_names": {"malloc": ctx.traits.api("cudaMalloc"), "free": ctx.traits.api("cudaFree")},
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
        # the process's counters at the window's end: what the allocator did before the window, too
        "memory_stats_process": {k: process[k] for k in (*STATS_KEYS, "reserved_bytes.all.peak") if k in process}
        if process else None,
        "oom_events": int(mem.is_oom.sum()),
        "growing": growing_allocations(model, steps, ctx.outermost_ops, ctx.frames.user_frame),
    }
    findings = _findings(ctx, data, steps)
    snapshot = snapshot_section(ctx)
    if snapshot is not None:  # the key is absent without a snapshot: such reports stay as they were
        data["snapshot"] = snapshot
        parent = next((f for f in findings if f.id == "allocator"), None)
        extra = snapshot_findings(ctx, snapshot, parent)
        lines = [f for f in extra if f.parent]
        if parent is not None and lines:  # the allocator's records name the exact line
            top = max(lines, key=lambda f: f.impact_us)
            findings[findings.index(parent)] = dataclasses.replace(parent, call_site=top.call_site,
                                                                   library_site=top.library_site)
        findings += extra
    return DetectorResult({"allocator": data}, tuple(findings))


def _flushes_before_the_window(data: dict, names: dict) -> str:
    """A sentence on the cache flushes the process's counters show before the window, or nothing."""
    process, window = data["memory_stats_process"] or {}, data["memory_stats_delta"] or {}
    retries = process.get("num_alloc_retries", 0) - window.get("num_alloc_retries", 0)
    if retries <= 0:
        return ""
    peak = process.get("reserved_bytes.all.peak")
    peak_text = f" (reserved memory peaked at {peak / 2 ** 30:.1f} GiB)" if peak else ""
    return (f" Before the profiled window the process ran out of device memory {retries} time"
            f"{'s' if retries > 1 else ''}{peak_text}: each time the allocator freed its cached segments and "
            f"synchronized the device before retrying ({process.get('num_device_free', 0)} {names['free']} in the "
            "process in all). The window shows none of that, so the saving below prices the window's calls only.")


CONCATENATING_OPS = frozenset({"aten::cat", "aten::_cat", "aten::concat", "aten::concatenate", "aten::stack",
                               "aten::hstack", "aten::vstack"})


def _growing_buffers(growing: list[dict], step_word: str) -> str:
    """What the window's price leaves out where a buffer grows every step (analyzer.views.growing)."""
    if not growing:
        return ""
    g = growing[0]
    copies = "copies the whole buffer and " if g["op"] in CONCATENATING_OPS else ""
    where = (f" in {describe_frame(g['function'])}" if g.get("function") else
             f" (inside {g['in_op']}; no Python stack recorded)" if g.get("in_op") else " (no Python stack recorded)")
    return (f" A buffer grows every {step_word} here: {g['op']}'s allocation{where} went from "
            f"{fmt_bytes(g['first_bytes'])} "
            f"to {fmt_bytes(g['last_bytes'])} over {g['steps']} {step_word}s ({fmt_bytes(g['growth_per_step_bytes'])} "
            f"more each). Every {step_word} {copies}needs a block the cache has not held, so later {step_word}s cost "
            f"more than these: the saving priced here covers the window's sizes only. Allocate the buffer once at its "
            f"final size and write each {step_word}'s part into a slice of it.")


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
    names = data["api_names"]
    rt = ctx.model.runtime
    steady = np.flatnonzero((ctx.runtime_classes == apis.IS_ALLOC) & (ctx.one_time == NONE) & ~ctx.graphs.in_capture
                            & ~ctx.in_setup)
    reserve_codes = [c for c, n in enumerate(ctx.model.names) if n in apis.ALLOC_RESERVE]
    reserves = int(np.isin(rt.name[steady], reserve_codes).sum())
    releases = len(steady) - reserves
    if len(steady) or data["gpu_idle_us"] > 0:
        top = next((s for s in data["sites"] if s["cuda_malloc"] + s["cuda_free"] > s["warmup_calls"]),
                   data["sites"][0] if data["sites"] else None)
        in_steps = len({int(k) for k in steps.index_at(rt.start_ns[steady]).tolist() if k >= 0}) if len(steps) else 0
        where = f" in {in_steps} of {len(steps)} steps" if len(steps) > 1 else ""
        warm = " and ".join(part for part in (
            plural(data["warmup_calls"], "first allocation") if data["warmup_calls"] else "",
            plural(data["capture_calls"], "call") + " inside graph captures" if data["capture_calls"] else "",
            plural(data["setup_calls"], "call") + " inside set-up for new shapes" if data["setup_calls"] else "")
            if part)
        warm = f", after {warm}" if warm else ""
        conf = ctx.traits.alloc_conf
        if releases:
            dropped = f" (reserved dropped {data['reserved_drops']['count']}x)" if data["timeline"] else ""
            title = f"Allocator churn: {releases} {names['free']} and {reserves} {names['malloc']}{where}{warm}{dropped}"
            advice = ADVICE_CHURN.format(malloc=names["malloc"], free=names["free"], conf=conf)
        else:
            title = f"Reserved memory grows inside the loop: {reserves} {names['malloc']}{where}{warm}"
            advice = ADVICE_GROWTH.format(malloc=names["malloc"], conf=conf)
        advice += _flushes_before_the_window(data, names) + _growing_buffers(data["growing"], ctx.traits.step_word)
        findings.append(Finding(
            kind="allocator_churn", severity=severity_for(data["gpu_idle_us"], window_us), title=title,
            call_site=top["call_site"] if top else None,
            library_site=top["library_site"] if top else None, impact_us=data["gpu_idle_us"],
            count=len(steady), advice=advice, id="allocator",
            detail={"sites": [{k: s[k] for k in ("call_site", "library_site", "cuda_malloc", "cuda_free",
                                                 "warmup_calls", "total_us", "gpu_idle_us")}
                              for s in data["sites"][:5]],
                    "call_time_us": round(sum(v["total_us"] for v in data["by_api"].values()), 3),
                    "memory_stats_delta": stats, "growing": data["growing"]},
            occurrences_us=tuple((o[0], o[1]) for o in (top["occurrences"] if top else [])),
            fix=intervals_fix(f"the steady-state {names['malloc']}/{names['free']} calls served from the cache",
                              rt.tid[steady], rt.start_ns[steady], rt.end_ns[steady])))
    if stats.get("num_alloc_retries", 0) > 0 or stats.get("num_ooms", 0) > 0:
        findings.append(Finding(
            kind="allocator_churn", severity="high",
            title=f"Allocator ran out of cached memory: {stats.get('num_alloc_retries', 0)} alloc retries "
                  f"(cache flush + {names['malloc']} retry), {stats.get('num_ooms', 0)} OOMs in the window",
            call_site=None, impact_us=0.0, count=int(stats.get("num_alloc_retries", 0)), id="allocator_retries",
            advice="Each retry frees every cached block and synchronizes; its GPU idle is part of the allocator "
                   "churn above. Lower peak memory (smaller batch or KV cache), or set "
                   f"{ctx.traits.alloc_conf}=expandable_segments:True to reduce fragmentation.",
            detail={"memory_stats_delta": stats}))
    return findings
