"""GPU idle by cause as the dashboard draws it: report.json's causes, with host work apart.

report.json's `gaps.by_cause` counts host work (the host_work detector's findings: launch gaps of a millisecond and
more, where the CPU ran the user's or a library's code before launching) in `cpu_launch`, the cause of its idle
pieces. Drawn as one colour it read as launch overhead, which CUDA graphs would remove and host work's fix does not:
every chart of causes draws it as `host_work`, carved out of `cpu_launch` by those findings' own numbers (their
impacts for totals, their occurrences for where in time). Nothing is derived from the trace here.

    by_cause = {"cpu_launch": 68425.3, "profiler": 2264.7}      # report.json, µs
    findings: host_work.0 (top level), impact 17787.7 µs, 6 occurrences
    split_by_cause(by_cause, findings) == {"cpu_launch": 50637.6, "host_work": 17787.7, "profiler": 2264.7}
"""
from __future__ import annotations


HOST_WORK = "host_work"
LAUNCH = "cpu_launch"


def host_work_findings(findings: list[dict] | None) -> list[dict]:
    """The top-level host-work findings (their children refine them: their impacts are part of the parent's)."""
    return [f for f in findings or [] if f.get("kind") == HOST_WORK and not f.get("parent")]


def host_work_us(findings: list[dict] | None) -> float:
    return float(sum(f.get("impact_us") or 0.0 for f in host_work_findings(findings)))


def split_by_cause(by_cause: dict[str, float], findings: list[dict] | None) -> dict[str, float]:
    """The causes in the report's order with `host_work` right after `cpu_launch`, which keeps the rest; causes
    with no time are left out."""
    host = min(host_work_us(findings), float(by_cause.get(LAUNCH) or 0.0))
    out: dict[str, float] = {}
    for cause, us in by_cause.items():
        us = float(us or 0.0)
        if cause == LAUNCH:
            us -= host
        if us > 0:
            out[cause] = us
        if cause == LAUNCH and host > 0:
            out[HOST_WORK] = host
    return out


def host_work_spans_us(findings: list[dict] | None) -> list[tuple[float, float]]:
    """The host-work findings' occurrences (trace µs): each one is an idle piece of cause cpu_launch, whole. A
    finding lists its 16 longest: `spans_complete` says whether these are all of them."""
    return sorted((float(s), float(e)) for f in host_work_findings(findings) for s, e in f.get("occurrences_us") or [])


def spans_complete(findings: list[dict] | None) -> bool:
    return all(len(f.get("occurrences_us") or []) >= (f.get("count") or 0) for f in host_work_findings(findings))


def per_step_host_work_us(report: dict) -> list[float] | None:
    """Host work per step of report.json's per-step table, which gives an idle piece to the step of the launch that
    ended it: each occurrence is found among the longest pieces (`gaps.top`, each with that step). None when some
    piece cannot be placed so (a finding lists only its 16 longest occurrences, `gaps.top` the 25 longest pieces):
    the per-step bars then keep host work in cpu_launch rather than guess its step."""
    gaps = report.get("gaps") or {}
    steps = gaps.get("per_step") or []
    findings = report.get("findings")
    index = {s.get("step"): k for k, s in enumerate(steps)}
    step_of = {(round(float(g["ts_us"]), 3), round(float(g["dur_us"]), 3)): g.get("step") for g in gaps.get("top") or []
               if g.get("cause") == LAUNCH and g.get("ts_us") is not None and g.get("dur_us") is not None}
    out = [0.0] * len(steps)
    if not spans_complete(findings):
        return None
    for s, e in host_work_spans_us(findings):
        name = step_of.get((round(s, 3), round(e - s, 3)))
        if name is None:
            name = next((v for (ts, dur), v in step_of.items() if abs(ts - s) <= 0.002 and abs(ts + dur - e) <= 0.002),
                        None)
        if name not in index:
            return None
        out[index[name]] += e - s
    return out
