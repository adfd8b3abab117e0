"""Launch gaps: every idle interval of the GPU, classified by what the CPU was doing, attributed to the op and the
user's Python frame, plus launch statistics, per-step busy/idle and a CUDA-graph estimate."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from analyzer import apis
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, severity_for, us
from analyzer.frames import site_label
from analyzer.gapcauses import CAUSES, CPU_LAUNCH, OTHER
from analyzer.steps import step_ranges
from analyzer.timeline import overlaps_ns

_SITE_FRAME, _SITE_OP, _SITE_API, _SITE_NONE = range(4)


def _take(column: np.ndarray, rows: np.ndarray, missing: int = 0) -> np.ndarray:
    """column[rows] as int64, `missing` where rows < 0 (also when the column is empty)."""
    if not len(column):
        return np.full(len(rows), missing, np.int64)
    return np.where(rows >= 0, column[np.clip(rows, 0, None)], missing).astype(np.int64)


def _site_keys(ctx: AnalysisContext, rows: np.ndarray) -> np.ndarray:
    """One int64 per runtime row naming its call site, as site_label() would: (kind << 32) | name code."""
    model, rt = ctx.model, ctx.model.runtime
    keys = np.full(len(rows), _SITE_NONE << 32, np.int64)
    has = rows >= 0
    r = rows[has]
    frame = rt.frame[r]
    user = _take(ctx.frames.user_frame, frame, -1)
    best_frame = np.where(user >= 0, user, frame)
    op = rt.op[r]
    outer = _take(ctx.outermost_ops, op, -1)
    frame_label = (_SITE_FRAME << 32) | _take(model.frames.name, best_frame)
    op_label = (_SITE_OP << 32) | _take(model.ops.name, outer)
    api_label = (_SITE_API << 32) | rt.name[r].astype(np.int64)
    k = np.where(best_frame >= 0, frame_label, np.where(outer >= 0, op_label, api_label))
    keys[has] = k
    return keys


def _site_text(ctx: AnalysisContext, key: int) -> str:
    kind, code = key >> 32, key & 0xFFFFFFFF
    if kind == _SITE_NONE:
        return "(unknown)"
    name = ctx.model.names[code]
    return f"{name} (outside any op)" if kind == _SITE_API else name


def _group_gaps(ctx: AnalysisContext, gaps, steps, top_n: int, long_gap_us: float):
    """Idle time grouped by (cause, call site), all in numpy; the details only for what is reported."""
    model = ctx.model
    if not gaps:
        return [], [], []
    start = np.concatenate([d.idle_starts for d, _, _ in gaps])
    end = np.concatenate([d.idle_ends for d, _, _ in gaps])
    cause = np.concatenate([c for _, c, _ in gaps]).astype(np.int64)
    row = np.concatenate([r for _, _, r in gaps]).astype(np.int64)
    device = np.concatenate([np.full(len(d.idle_starts), d.device) for d, _, _ in gaps])
    dur_us = (end - start) / 1e3
    site = _site_keys(ctx, row)
    groups, inverse = np.unique((cause << 40) | site, return_inverse=True)
    inverse = inverse.reshape(-1)
    idle = np.bincount(inverse, weights=dur_us, minlength=len(groups))
    count = np.bincount(inverse, minlength=len(groups))
    long = dur_us >= long_gap_us
    long_count = np.bincount(inverse[long], minlength=len(groups))
    long_idle = np.bincount(inverse[long], weights=dur_us[long], minlength=len(groups))
    largest = np.zeros(len(groups))
    np.maximum.at(largest, inverse, dur_us)
    outer = _take(ctx.outermost_ops, _take(model.runtime.op, row, -1), -1)
    op_code = _take(model.ops.name, outer, -1)
    order = np.lexsort((-dur_us, inverse))  # by group, largest gap first
    first = np.searchsorted(inverse[order], np.arange(len(groups)))
    site_list = []
    for g in np.argsort(-idle, kind="stable")[:50].tolist():
        members = order[first[g]: first[g] + count[g]]
        lead = int(members[0])
        op_idle: dict[str, float] = defaultdict(float)
        for code, d in zip(op_code[members].tolist(), dur_us[members].tolist()):
            if code >= 0:
                op_idle[model.names[code]] += d
        lead_frame = int(model.runtime.frame[row[lead]]) if row[lead] >= 0 else -1
        site_list.append({
            "cause": CAUSES[groups[g] >> 40], "call_site": _site_text(ctx, int(groups[g] & ((1 << 40) - 1))),
            "op": model.names[op_code[lead]] if op_code[lead] >= 0 else None,
            "count": int(count[g]), "idle_us": round(float(idle[g]), 3), "max_us": round(float(largest[g]), 3),
            "long_count": int(long_count[g]), "long_idle_us": round(float(long_idle[g]), 3),
            "context": ctx.frames.context(lead_frame),
            "ops": {k: round(v, 3) for k, v in sorted(op_idle.items(), key=lambda kv: -kv[1])[:5]},
            "occurrences": [(us(start[i]), us(end[i])) for i in members[:8].tolist()],
        })
    top = []
    biggest = np.argsort(-dur_us, kind="stable")[:top_n]
    step_of = steps.index_at(start[biggest]) if len(steps) else np.full(len(biggest), -1)
    for i, k in zip(biggest.tolist(), step_of.tolist()):
        r = int(row[i])
        top.append({"ts_us": us(start[i]), "dur_us": us(end[i] - start[i]), "cause": CAUSES[cause[i]],
                    "device": int(device[i]), "op": model.names[op_code[i]] if op_code[i] >= 0 else None,
                    "call_site": _site_text(ctx, int(site[i])),
                    "context": ctx.frames.context(int(model.runtime.frame[r])) if r >= 0 else [],
                    "runtime_call": model.names[model.runtime.name[r]] if r >= 0 else None,
                    "step": steps.names[k] if k >= 0 else None})
    return top, site_list, _long_gaps(ctx, start, end, cause, row, long_gap_us)


def _frames_during(ctx: AnalysisContext, rows: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """The innermost Python frame active at t on the thread of each runtime row (-1 where none)."""
    from analyzer.trace.joins import Intervals, thread_keys
    frames, rt = ctx.model.frames, ctx.model.runtime
    if not len(frames) or not len(rows) or not len(rt):  # no runtime rows: every row is -1
        return np.full(len(rows), -1, np.int64)
    safe = np.clip(rows, 0, None)
    frame_keys, query_keys = thread_keys([frames.pid, rt.pid[safe]], [frames.tid, rt.tid[safe]])
    found = Intervals(frame_keys, frames.start_ns, frames.end_ns, sorted_by_start=True).innermost_enclosing(
        np.where(rows >= 0, query_keys, -1), t_ns, t_ns + 1)
    return np.where(rows >= 0, found, -1)


def _long_gaps(ctx: AnalysisContext, start, end, cause, row, long_gap_us: float) -> list[dict]:
    """Gaps over the threshold, each with what the CPU was running in its middle (not only what it launched
    next): the innermost user frame there, and whether the profiler itself was running."""
    sel = np.flatnonzero(((end - start) / 1e3 >= long_gap_us) & np.isin(cause, (CPU_LAUNCH, OTHER)))
    if not len(sel):
        return []
    middle = start[sel] + (end[sel] - start[sel]) // 2
    during = _frames_during(ctx, row[sel], middle)
    out = []
    for i, frame in zip(sel.tolist(), during.tolist()):
        chain = ctx.model.frame_chain(frame, 12) if frame >= 0 else []
        user = ctx.frames.user_frame_of(frame)
        out.append({"ts_us": us(start[i]), "dur_us": us(end[i] - start[i]), "cause": CAUSES[cause[i]],
                    "launch_site": site_label(ctx.model, ctx.frames, int(row[i])),
                    "during": ctx.frames.name(user) if user >= 0 else (chain[0] if chain else None),
                    "during_chain": chain[:6],
                    "profiler": any("torch/profiler/" in f or "torch/autograd/profiler" in f for f in chain)})
    return out


def launch_stats(ctx: AnalysisContext) -> dict:
    model, rt, gpu = ctx.model, ctx.model.runtime, ctx.model.gpu
    classes = apis.runtime_classes(model)
    rows = np.flatnonzero(classes == apis.IS_LAUNCH)
    by_api = defaultdict(int)
    for code in rt.name[rows].tolist():
        by_api[model.names[code]] += 1
    call_us = (rt.end_ns[rows] - rt.start_ns[rows]) / 1e3
    kernels = np.flatnonzero((gpu.launch >= 0) & np.isin(gpu.launch, rows))
    launch = gpu.launch[kernels]
    delay_us = (gpu.start_ns[kernels] - rt.end_ns[launch]) / 1e3  # HTA's launch delay: call return -> start
    kernel_us = (gpu.end_ns[kernels] - gpu.start_ns[kernels]) / 1e3
    shorter = kernel_us < (rt.end_ns[launch] - rt.start_ns[launch]) / 1e3

    def dist(x):
        if len(x) == 0:
            return None
        return {"mean": round(float(x.mean()), 3), "p50": round(float(np.median(x)), 3),
                "p90": round(float(np.percentile(x, 90)), 3), "max": round(float(x.max()), 3)}

    return {
        "launches": int(len(rows)), "by_api": dict(sorted(by_api.items(), key=lambda kv: -kv[1])),
        "gpu_activities_launched": int(len(kernels)),
        "launch_call_us": dist(call_us), "launch_to_start_us": dist(delay_us), "kernel_us": dist(kernel_us),
        "kernels_shorter_than_launch_share": round(float(shorter.mean()), 4) if len(kernels) else None,
        "definition": "launch_to_start = GPU start - launch call return (HTA's launch delay); "
                      "short = GPU duration < its launch call's duration",
    }


def detect(ctx: AnalysisContext, *, top_n: int = 25, long_gap_us: float = 1000.0) -> DetectorResult:
    model, timeline = ctx.model, ctx.timeline
    window_us = timeline.window_ns / 1e3
    by_cause = {c: 0.0 for c in CAUSES}
    counts = {c: 0 for c in CAUSES}
    gaps = []  # (start, end, cause, responsible row) over all devices
    for dev, (cause, responsible) in zip(timeline.devices, ctx.gap_causes):
        for code, name in enumerate(CAUSES):
            sel = cause == code
            by_cause[name] += float((dev.idle_ends[sel] - dev.idle_starts[sel]).sum()) / 1e3
            counts[name] += int(sel.sum())
        gaps.append((dev, cause, responsible))
    steps = step_ranges(model)

    top, site_list, long_gaps = _group_gaps(ctx, gaps, steps, top_n, long_gap_us)
    per_step = _per_step(ctx, steps, gaps)
    graph = _graph_estimate(ctx, per_step)
    data = {
        "by_cause": {k: round(v, 3) for k, v in by_cause.items()},
        "count_by_cause": counts,
        "top": top[:top_n],
        "sites": site_list[:50],
        "long_gaps": long_gaps[:200],
        "per_step": per_step,
        "step_source": steps.source,
        "launch_stats": launch_stats(ctx),
        "cuda_graph_estimate": graph,
    }
    return DetectorResult("gaps", data, tuple(_findings(site_list, long_gaps, by_cause, counts, window_us, graph,
                                                        long_gap_us)))


def _per_step(ctx: AnalysisContext, steps, gaps) -> list[dict]:
    model, timeline = ctx.model, ctx.timeline
    out = []
    rt = model.runtime
    launches = np.sort(rt.start_ns[rt.gpu >= 0])
    lo_ns, hi_ns = np.asarray(steps.lo_ns, dtype=np.int64), np.asarray(steps.hi_ns, dtype=np.int64)
    busy_ns = sum((overlaps_ns(d.busy_starts, d.busy_ends, lo_ns, hi_ns) for d in timeline.devices),
                  np.zeros(len(lo_ns), dtype=np.int64)).tolist()
    idle_ns = {c: np.zeros(len(lo_ns), dtype=np.int64) for c in CAUSES}
    for dev, cause, _ in gaps:
        for code, c in enumerate(CAUSES):
            idle_ns[c] += overlaps_ns(dev.idle_starts[cause == code], dev.idle_ends[cause == code], lo_ns, hi_ns)
    idle_ns = {c: values.tolist() for c, values in idle_ns.items()}
    launch_counts = (np.searchsorted(launches, steps.cpu_end_ns) - np.searchsorted(launches, steps.cpu_start_ns))
    for k, name in enumerate(steps.names):
        lo, hi = int(steps.lo_ns[k]), int(steps.hi_ns[k])
        busy = busy_ns[k]
        idle = {c: idle_ns[c][k] for c in CAUSES}
        inside = sum(max(0, min(hi, d.window_end_ns) - max(lo, d.window_start_ns)) for d in timeline.devices)
        span = (hi - lo) * max(len(timeline.devices), 1)
        out.append({
            "step": name, "ts_us": us(lo), "wall_us": us(hi - lo),
            "cpu_us": us(steps.cpu_end_ns[k] - steps.cpu_start_ns[k]),
            "busy_us": us(busy), "idle_us": us(sum(idle.values())),
            "outside_gpu_window_us": us(span - inside),
            "idle_by_cause_us": {c: us(v) for c, v in idle.items()},
            "gpu_utilization": round(busy / (hi - lo), 4) if hi > lo else None, "launches": int(launch_counts[k]),
        })
    return out


def _graph_estimate(ctx: AnalysisContext, per_step: list[dict]) -> dict | None:
    """A CUDA graph replays the step's GPU work back to back: its step time is about the GPU busy time."""
    decode = [s for s in per_step if not s["step"].startswith(("prefill", "ProfilerStep#")) or len(per_step) == 1]
    decode = decode or per_step
    if not decode or not ctx.timeline.devices:
        return None
    busy = float(np.median([s["busy_us"] for s in decode]))
    profiled = float(np.median([s["wall_us"] for s in decode]))
    meta = ctx.meta
    unprofiled_ms = meta.get("unprofiled", "step_ms", "p50") if meta else None
    eager_us = unprofiled_ms * 1e3 if unprofiled_ms and meta.get("workload", "mode") == "eager" else profiled
    est = {
        "steps_used": len(decode), "gpu_busy_per_step_us": round(busy, 3),
        "profiled_step_us": round(profiled, 3),
        "eager_step_us": round(eager_us, 3),
        "eager_step_source": "meta.json unprofiled p50" if eager_us != profiled else "profiled trace",
        "estimated_graph_step_us": round(busy, 3),
        "estimated_speedup": round(eager_us / busy, 2) if busy > 0 else None,
        "recoverable_us_per_step": round(max(eager_us - busy, 0.0), 3),
    }
    if meta and meta.get("mode_comparison"):
        mc = meta.data["mode_comparison"]
        est["measured"] = {"eager_step_us": round(mc["eager_step_ms"] * 1e3, 3),
                           "cuda_graph_step_us": round(mc["cuda_graph_step_ms"] * 1e3, 3),
                           "speedup": round(mc["eager_over_graph"], 2)}
    return est


ADVICE_LAUNCH = ("The GPU finishes each kernel before Python has launched the next: the step is bound by eager "
                 "launch overhead (Python, dispatcher, cudaLaunchKernel). Capture the decode step in a CUDA graph "
                 "(torch.cuda.CUDAGraph / torch.compile(mode=\"reduce-overhead\")), batch more sequences per step, "
                 "or fuse small ops.")


def _findings(site_list, long_gaps, by_cause, counts, window_us, graph, long_gap_us):
    findings = []
    launch_us = by_cause["cpu_launch"]
    if window_us > 0 and launch_us / window_us >= 0.05:
        top_sites = [s for s in site_list if s["cause"] == "cpu_launch"][:5]
        detail = {"share_of_window": round(launch_us / window_us, 4),
                  "top_sites": [{"call_site": s["call_site"], "idle_us": s["idle_us"], "count": s["count"]}
                                for s in top_sites]}
        advice = ADVICE_LAUNCH
        if graph and graph.get("estimated_speedup"):
            advice += (f" Estimated graph step {graph['estimated_graph_step_us'] / 1e3:.2f} ms vs eager "
                       f"{graph['eager_step_us'] / 1e3:.2f} ms ({graph['estimated_speedup']:.1f}x)")
            if graph.get("measured"):
                advice += f"; measured {graph['measured']['speedup']:.1f}x"
            advice += "."
        findings.append(Finding(
            kind="launch_gap", severity=severity_for(launch_us, window_us),
            title=f"GPU idle {100 * launch_us / window_us:.0f}% of the window waiting for kernel launches "
                  f"({counts['cpu_launch']} gaps)",
            call_site=top_sites[0]["call_site"] if top_sites else None, impact_us=round(launch_us, 3),
            advice=advice, count=counts["cpu_launch"], detail=detail,
            occurrences_us=tuple(tuple(o) for o in (top_sites[0]["occurrences"] if top_sites else []))))
    groups: dict[tuple[str, bool], list[dict]] = defaultdict(list)
    for g in long_gaps:
        groups[(g["during"] or g["launch_site"], g["profiler"])].append(g)
    for (site, profiler), members in groups.items():
        idle = round(sum(g["dur_us"] for g in members), 3)
        worst = max(g["dur_us"] for g in members)
        head = f"{len(members)} GPU idle gaps over {long_gap_us / 1e3:g} ms (max {worst / 1e3:.1f} ms)"
        if profiler:
            title = f"{head} while the profiler itself ran ({site}): instrumentation, absent from unprofiled runs"
            advice = ("These gaps are the profiler's own step bookkeeping between steps. Compare with the "
                      "unprofiled step time in meta.json; profile fewer steps or without with_stack to shrink it.")
        else:
            title = f"{head} while the CPU ran {site}"
            advice = ("The CPU ran for over a millisecond between GPU launches here: move host work (data "
                      "preparation, Python bookkeeping, logging) off the step or overlap it with GPU work.")
        findings.append(Finding(
            kind="launch_gap", severity="info" if profiler else severity_for(idle, window_us), title=title,
            call_site=site, impact_us=idle, count=len(members), advice=advice,
            detail={"context": members[0]["during_chain"], "launch_site": members[0]["launch_site"],
                    "profiler_overhead": profiler},
            occurrences_us=tuple((g["ts_us"], g["ts_us"] + g["dur_us"]) for g in members[:16])))
    return findings
