"""Serving: GPU idle time spent with the event loop parked or work handed between threads, each tied to the user
code that yielded or handed over; and, for runs of the serve workload, each request's lifetime on the trace's
clock next to the engine steps it took part in."""
from __future__ import annotations

import numpy as np

from analyzer.arrays import distinct
from analyzer.views import waits
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, SiteTable, severity_for
from analyzer.units import plural, us
from analyzer.views.frames import describe_frame
from analyzer.views.idle import EVENT_LOOP_IDLE, THREAD_HOP
from analyzer.views.whatif import pieces_fix

_MAX_ATTRIBUTED = 5000  # gaps attributed one by one; the rest only counted
UNKNOWN = "(unknown)"  # no Python wait frame on the launching thread (a trace without with_stack, or none matched)


def detect(ctx: AnalysisContext) -> DetectorResult:
    loop = _parked_sites(ctx, EVENT_LOOP_IDLE, waits.EVENT_LOOP_WAIT, same_thread=True)
    hops = _parked_sites(ctx, THREAD_HOP, waits.HANDOFF_WAIT, same_thread=False)
    requests = _requests(ctx)
    latency = _latency(ctx)
    engine = _engine_steps(ctx)
    data = {"event_loop_idle": loop, "thread_hops": hops, "requests": requests,
            "steps": _steps_with_requests(ctx, requests), "latency": latency, "engine": engine,
            "is_serving": bool(requests or latency or loop["count"] or engine)}
    return DetectorResult({"serving": data}, tuple(_findings(ctx, loop, hops)))


def _engine_steps(ctx: AnalysisContext) -> dict | None:
    """A serving engine's own step annotations (analyzer.views.steps.engine_batch), summed by phase: steps, requests,
    tokens, the steps' GPU busy and idle time (their GPU utilization) and CPU span."""
    steps = [s for s in ctx.step_table if s.get("batch")]
    if not steps:
        return None
    by_phase: dict[str, dict] = {}
    for s in steps:
        b = s["batch"]
        p = by_phase.setdefault(b.get("phase") or "unknown", {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0,
                                                            "busy_us": 0.0, "idle_us": 0.0, "wall_us": 0.0})
        p["steps"] += 1
        p["prefill_tokens"] += b.get("prefill_tokens") or 0
        p["decode_tokens"] += b.get("decode_tokens") or 0
        for k in ("busy_us", "idle_us", "wall_us"):
            p[k] += s[k] or 0.0
    for p in by_phase.values():
        for k in ("busy_us", "idle_us", "wall_us"):
            p[k] = round(p[k], 3)
        p["gpu_utilization"] = round(p["busy_us"] / (p["busy_us"] + p["idle_us"]), 4) \
            if p["busy_us"] + p["idle_us"] else None
    return {"engine": steps[0]["batch"]["engine"], "steps": len(steps), "by_phase": by_phase}


def _parked_sites(ctx: AnalysisContext, code: int, pattern, *, same_thread: bool) -> dict:
    """Total idle of one cause, grouped by the user frame that let the thread park: for an event-loop wait, the
    last user code that ran on the launching thread before it parked (the coroutine that awaited); for a hop, the
    last user code on another thread before the launching thread woke (the code that handed the work over)."""
    model, idle = ctx.model, ctx.idle
    sel = np.flatnonzero(idle.cause == code)
    a, b = idle.start_ns[sel], idle.end_ns[sel]
    launch = ctx.gaps.launch[idle.gap[sel]]  # the thread that launched the work the GPU waited for
    total = float((b - a).sum()) / 1e3
    by_site = SiteTable(sums=("idle_us",), max_occurrences=8)
    if len(a):
        order = np.argsort(a - b, kind="stable")[:_MAX_ATTRIBUTED]  # the longest first
        wait_rows = waits.matching_frames(model, pattern)
        threads: dict[tuple[int, int], _ThreadFrames] = {}
        for i in order.tolist():
            key = (int(model.runtime.pid[launch[i]]), int(model.runtime.tid[launch[i]]))
            if key not in threads:
                threads[key] = _ThreadFrames(ctx, key, wait_rows)
            site = threads[key].site(int(a[i]), int(b[i]), same_thread)
            d = (int(b[i]) - int(a[i])) / 1e3
            entry = by_site.add(site, lambda site=site: {"call_site": site, "max_us": 0.0}, (us(a[i]), us(b[i])),
                                idle_us=d)
            entry["max_us"] = max(entry["max_us"], d)
    sites = by_site.rows(lambda s: -s["idle_us"])
    for s in sites:
        s["max_us"] = round(s["max_us"], 3)
    return {"idle_us": round(total, 3), "count": int(len(distinct(idle.gap[sel]))), "sites": sites[:20]}


class _ThreadFrames:
    """One launching thread's waits, and the frames on it and on the other threads ordered by end time."""

    def __init__(self, ctx: AnalysisContext, thread: tuple[int, int], wait_rows: np.ndarray):
        self.ctx = ctx
        frames = ctx.model.frames
        on = (frames.pid == thread[0]) & (frames.tid == thread[1])
        self.waits = wait_rows[on[wait_rows]]
        self.own = _by_end(frames, np.flatnonzero(on))
        self.others = _by_end(frames, np.flatnonzero(~on))

    def site(self, a: int, b: int, same_thread: bool) -> str:
        frames = self.ctx.model.frames
        w = self.waits[(frames.start_ns[self.waits] < b) & (frames.end_ns[self.waits] > a)]
        if not len(w):
            return UNKNOWN
        w = int(w[np.argmax(np.minimum(frames.end_ns[w], b) - np.maximum(frames.start_ns[w], a))])
        if same_thread:  # what ran on this thread just before it parked
            rows, ends = self.own
            last = np.searchsorted(ends, frames.start_ns[w], side="right")
        else:  # what ran on another thread before this one woke
            rows, ends = self.others
            last = np.searchsorted(ends, frames.end_ns[w], side="right")
        recent = rows[max(0, last - 256): last][::-1].tolist()
        index = self.ctx.frames
        # a user frame that itself ended there (the coroutine that awaited, the code that submitted), else the
        # user code around the most recent frame
        for row in recent:
            if index.user_frame_of(row) == row:
                return describe_frame(index.name(row))
        for row in recent:
            if index.user_frame_of(row) >= 0:
                return describe_frame(index.name(index.user_frame_of(row)))
        return describe_frame(index.name(recent[0])) if recent else UNKNOWN


def _by_end(frames, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = rows[np.argsort(frames.end_ns[rows], kind="stable")]
    return order, frames.end_ns[order]


def _base_ns(ctx: AnalysisContext) -> int | None:
    base = ctx.model.metadata.get("baseTimeNanoseconds")
    return int(base) if isinstance(base, (int, float)) and not isinstance(base, bool) else None


def _requests(ctx: AnalysisContext) -> list[dict]:
    """Each request of the profiled session on the trace's clock (µs), from meta.json's wall-clock lifetimes."""
    meta, base = ctx.meta, _base_ns(ctx)
    lifetimes = meta.get("serving", "profiled", "lifetimes_unix_ns", default=[]) if meta else []
    if base is None or not isinstance(lifetimes, list):
        return []
    out = []
    for r in lifetimes:
        if not isinstance(r, dict):
            continue
        times = {k: r.get(k) for k in ("arrived", "admitted", "first_token", "finished")}
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in times.values()):
            continue
        row = {"id": r.get("id"), "row": r.get("row"), "prompt_tokens": r.get("prompt_tokens"),
               "output_tokens": r.get("output_tokens")}
        row.update({f"{k}_us": us(v - base) for k, v in times.items()})
        row["ttft_us"] = us(times["first_token"] - times["arrived"])
        row["latency_us"] = us(times["finished"] - times["arrived"])
        out.append(row)
    return out


def _steps_with_requests(ctx: AnalysisContext, requests: list[dict]) -> list[dict]:
    """Per step: how many requests were in the batch (admitted before it began, not finished before it ended)."""
    if not requests:
        return []
    steps = ctx.steps
    admitted = np.array([r["admitted_us"] for r in requests]) * 1e3
    finished = np.array([r["finished_us"] for r in requests]) * 1e3
    out = []
    for name, lo, hi in zip(steps.names, steps.cpu_start_ns.tolist(), steps.cpu_end_ns.tolist()):
        out.append({"step": name, "in_batch": int(((admitted <= hi) & (finished >= lo)).sum()),
                    "waiting": sum(1 for r in requests if r["arrived_us"] * 1e3 <= lo and r["admitted_us"] * 1e3 > lo)})
    return out


def _latency(ctx: AnalysisContext) -> dict | None:
    """The capture's unprofiled per-request latency (authoritative: the profiler slows every step)."""
    served = ctx.meta.get("serving", "unprofiled") if ctx.meta else None
    if not isinstance(served, dict):
        return None
    keys = ("requests", "output_tokens", "ttft_ms", "tpot_ms", "latency_ms", "throughput_tokens_per_s",
            "engine_steps", "mean_batch", "per_request")
    return {k: served.get(k) for k in keys} | {"options": ctx.meta.get("serving", "options"),
                                                "max_batch": ctx.meta.get("serving", "max_batch")}


def _findings(ctx: AnalysisContext, loop: dict, hops: dict) -> list[Finding]:
    window_us = ctx.timeline.window_ns / 1e3
    out = []
    if loop["count"]:
        site, occurrences = _top_site(loop)
        out.append(Finding(
            kind="event_loop_idle", severity=severity_for(loop["idle_us"], window_us),
            title=f"GPU idle while the event loop was parked ({plural(loop['count'], 'gap')})"
                  + (f", last code before it: {site}" if site else ""),
            call_site=site, impact_us=loop["idle_us"], count=loop["count"], id="event_loop_idle",
            advice="The thread that launches GPU work sat in the event loop's selector (an `await asyncio.sleep(...)` "
                   "or an await on I/O) with nothing queued on the GPU. Yield with `await asyncio.sleep(0)` between "
                   "steps, or queue the next step before awaiting, so the GPU never waits on the loop's timer.",
            detail={"sites": loop["sites"][:5]}, occurrences_us=occurrences,
            fix=pieces_fix(ctx, np.flatnonzero(ctx.idle.cause == EVENT_LOOP_IDLE),
                           "the launching thread no longer parks in the event loop with the GPU idle")))
    if hops["count"] and ctx.traits.training:
        site, occurrences = _top_site(hops)
        out.append(Finding(
            kind="thread_hop", severity=severity_for(hops["idle_us"], window_us),
            title=f"GPU idle while the next work came from another thread ({hops['count']} hand-offs, e.g. to "
                  f"autograd's backward thread)", call_site=site, impact_us=hops["idle_us"], count=hops["count"],
            id="thread_hop",
            advice="Autograd runs the backward pass on its own thread, so the first backward kernel waits for that "
                   "thread to pick the work up (likewise for data-loader or communication threads handing work "
                   "over). It is normally small; if it is not, look at what the launching thread did first (a "
                   "lock, a Python callback, a hook).",
            detail={"sites": hops["sites"][:5]}, occurrences_us=occurrences,
            fix=_hop_fix(ctx)))
    elif hops["count"]:
        site, occurrences = _top_site(hops)
        out.append(Finding(
            kind="thread_hop", severity=severity_for(hops["idle_us"], window_us),
            title=f"GPU idle while work was handed between threads ({hops['count']} hops)"
                  + (f", handed over at {site}" if site else ": the next work launched from another thread"),
            call_site=site, impact_us=hops["idle_us"], count=hops["count"], id="thread_hop",
            advice="The next GPU work came from a thread that had to be woken (a worker pool's queue, a lock, a "
                   "future) after another thread handed it over. Every "
                   "`asyncio.to_thread` / `run_in_executor` round trip adds such a wake-up to the GPU's idle time: "
                   "launch from one thread, or keep one dedicated thread looping over steps instead of a hand-off "
                   "per step. The profiler records ops only on the thread that started it, so a worker's ops may be "
                   "missing from the trace (its kernels and runtime calls are there).",
            detail={"sites": hops["sites"][:5]}, occurrences_us=occurrences,
            fix=_hop_fix(ctx)))
    return out


def _hop_fix(ctx: AnalysisContext):
    return pieces_fix(ctx, np.flatnonzero(ctx.idle.cause == THREAD_HOP),
                      "the next work launched without the hand-off between threads")


def _top_site(part: dict) -> tuple[str | None, tuple]:
    """The site that explains the most idle time (None when unknown) and the worst occurrences overall."""
    sites = part["sites"]
    named = [s for s in sites if s["call_site"] != UNKNOWN]
    occurrences = tuple(o for s in sites for o in s["occurrences"])
    worst = tuple(sorted(occurrences, key=lambda o: o[0] - o[1])[:8])
    return (named[0]["call_site"] if named else None), worst
