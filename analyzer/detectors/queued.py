"""Queued idle: the GPU idle between work that had already been launched (analyzer.views.idle's `queued`), by what
the next work waited for (analyzer.views.queued): a replayed graph's nodes, another stream, a host callback, a
pageable copy's staging, the device's own latency, work launched before the window. Owns the pieces of cause
queued."""
from __future__ import annotations

import numpy as np

from analyzer.arrays import distinct
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, severity_for, share_text
from analyzer.units import fmt_fine_us, fmt_us, plural, short_kernel_name, us
from analyzer.views.idle import QUEUED
from analyzer.views.queued import DEVICE_LATENCY_NS, REASONS as QUEUED_REASONS

CHILD_SHARE = 0.10  # a reason is shown under the queued finding when it holds this share


def detect(ctx: AnalysisContext) -> DetectorResult:
    return DetectorResult({}, tuple(_queued_finding(ctx, ctx.timeline.window_ns / 1e3)))


WAIT_TEXT = {
    "before_window": "work launched before the profiling window began (the GPU was still behind the CPU when "
                     "recording started)",
    "graph_node": "between a replayed graph's nodes (the graph's own dependencies and node latency)",
    "event_wait": "waits on another stream (cudaStreamWaitEvent after the stream's previous work)",
    "host_callback": "a host function queued on the stream (cudaLaunchHostFunc / cudaStreamAddCallback)",
    "pageable_copy": "host-to-device copies from pageable memory (the driver stages them on the host first)",
    "device_latency": f"gaps under {DEVICE_LATENCY_NS / 1e3:g} µs: the device's latency between queued work",
    "unseen_wait": "waits the trace does not show (another process or device, an event recorded outside the "
                   "window)",
}


WAIT_SHORT = {"before_window": "behind work launched before the window",
              "graph_node": "between a replayed graph's nodes", "event_wait": "waiting on another stream",
              "host_callback": "behind host callbacks on the stream",
              "pageable_copy": "before pageable host-to-device copies",
              "device_latency": f"in gaps under {DEVICE_LATENCY_NS / 1e3:g} µs (device latency)",
              "unseen_wait": "on waits the trace does not show"}


WAIT_ADVICE = {
    "before_window": "Start recording after the CPU and GPU are in step (a schedule with warm-up steps).",
    "graph_node": "Fewer, larger graph nodes (fusion) or fewer memset/copy nodes shorten it.",
    "event_wait": "The work waited for what another stream was running (often a collective or a copy): overlap it "
                  "with independent work, or move the wait later, just before the result is needed.",
    "host_callback": "Host callbacks serialize the stream behind the host: move them off the stream.",
    "pageable_copy": "Pin the source (.pin_memory()) and copy with non_blocking=True.",
    "device_latency": "Fewer, larger kernels ({how}) shrink it.",
    "unseen_wait": "Profile the other ranks or processes (analyze-many) to see what it waited for.",
}


def wait_advice(ctx: AnalysisContext, reason: str) -> str:
    """WAIT_ADVICE for this trace: graphs are no advice to a run that already replays them."""
    how = "fusion" if ctx.traits.graphs.replayed else f"fusion, {ctx.traits.graph_word}s"
    return WAIT_ADVICE[reason].format(how=how)


def _queued_finding(ctx: AnalysisContext, window_us: float) -> list[Finding]:
    idle = ctx.idle
    sel = idle.cause == QUEUED
    impact = us(idle.duration_ns[sel].sum())
    if impact <= 0:
        return []
    n = int(len(distinct(idle.gap[sel])))
    worst = np.flatnonzero(sel)[np.argsort(-idle.duration_ns[sel], kind="stable")[:8]]
    waits = _queued_breakdown(ctx)
    parts = "; ".join(f"{w['what']}: {fmt_us(w['idle_us'])}" for w in waits)
    parent = Finding(
        kind="queued", severity=severity_for(impact, window_us),
        title=f"GPU idle between work that was already queued ({plural(n, 'gap')}, mean {fmt_fine_us(impact / n)})",
        call_site=None, impact_us=impact, count=n, id="queued",
        advice="Nothing on the CPU delayed these: the next work had been launched before the GPU ran dry. By what "
               f"it waited for: {parts}. " + " ".join(wait_advice(ctx, w["reason"]) for w in waits[:3]),
        detail={"before_window_us": next((w["idle_us"] for w in waits if w["reason"] == "before_window"), 0.0),
                "waits": waits},
        occurrences_us=tuple((us(idle.start_ns[i]), us(idle.end_ns[i])) for i in worst.tolist()))
    children = [Finding(
        kind="queued", severity=severity_for(w["idle_us"], window_us),
        title=f"of which {share_text(w['idle_us'], impact)} {WAIT_SHORT[w['reason']]}"
              + (f", after {w['example']}" if w.get("example") else ""),
        call_site=None, impact_us=w["idle_us"], count=w["count"], id=f"queued.{w['reason']}", parent="queued",
        advice=wait_advice(ctx, w["reason"]), detail={"reason": w["reason"], "example": w.get("example")},
        occurrences_us=tuple(tuple(o) for o in w["occurrences"]))
        for w in waits if len(waits) > 1 and w["idle_us"] >= CHILD_SHARE * impact]
    return [parent, *children]


def _queued_breakdown(ctx: AnalysisContext) -> list[dict]:
    """Queued idle by what the next work waited for (analyzer.views.queued), largest first; an event wait names
    the work on the other stream that ran last before its longest occurrence."""
    q, idle, model = ctx.queued_waits, ctx.idle, ctx.model
    dur = idle.duration_ns[q.pieces]
    out = []
    for code, reason in enumerate(QUEUED_REASONS):
        mine = np.flatnonzero(q.reason == code)
        if not len(mine):
            continue
        longest = mine[np.argsort(-dur[mine], kind="stable")]
        entry = {"reason": reason, "what": WAIT_TEXT[reason], "idle_us": us(dur[mine].sum()),
                 "count": int(len(mine)),
                 "occurrences": [(us(idle.start_ns[q.pieces[i]]), us(idle.end_ns[q.pieces[i]]))
                                 for i in longest[:8].tolist()]}
        other = next((int(q.other_gpu[i]) for i in longest.tolist() if q.other_gpu[i] >= 0), -1)
        if other >= 0:
            entry["example"] = (f"{describe_gpu_work(model.names[model.gpu.name[other]])} on stream "
                                f"{int(model.gpu.stream[other])}")
        out.append(entry)
    return sorted(out, key=lambda w: -w["idle_us"])


def describe_gpu_work(name: str) -> str:
    """A kernel or copy name short enough for a title: a collective, a copy, else the kernel's name cut short."""
    if "nccl" in name.lower() or "rccl" in name.lower():
        return f"a collective ({name.split('(')[0][:48]})"
    if name.startswith(("Memcpy", "Memset")):
        return f"a {name.split(' (')[0]}"
    return short_kernel_name(name, 48)
