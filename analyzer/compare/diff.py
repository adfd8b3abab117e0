"""`python -m analyzer diff A B`: what changed between two runs (before / after a fix), per finding and per step."""
from __future__ import annotations

import html
import statistics

from analyzer.report.mdsafe import cell, code, finish, one_line
from analyzer.compare.verdict import verdict
from analyzer.units import fmt_pct, fmt_peak_bytes, fmt_us

DIFF_SCHEMA = "gpu-idle-analyzer/diff/1"


def _finding_key(f: dict) -> tuple:
    return (f["kind"], f.get("call_site"), f.get("library_site"), (f.get("detail") or {}).get("kind"),
            f.get("parent") is not None)


def _median(values):
    return round(statistics.median(values), 3) if values else None


def _step_stats(report: dict) -> dict:
    steps = [s for s in report["gaps"]["per_step"] if not s["step"].startswith("prefill")] or \
        report["gaps"]["per_step"]
    stats = {"steps": len(steps), "wall_us": _median([s["wall_us"] for s in steps]),
             "busy_us": _median([s["busy_us"] for s in steps]),
             "idle_us": _median([s["idle_us"] for s in steps])}
    for cause in sorted({c for s in steps for c in s["idle_by_cause_us"]}):
        stats[f"idle_{cause}_us"] = _median([s["idle_by_cause_us"].get(cause, 0.0) for s in steps])
    return stats


def compare(name_a: str, a: dict, name_b: str, b: dict) -> dict:
    fa = {_finding_key(f): f for f in a["findings"]}
    fb = {_finding_key(f): f for f in b["findings"]}
    findings = []
    for key in list(fa) + [k for k in fb if k not in fa]:
        before, after = fa.get(key), fb.get(key)
        status = "fixed" if after is None else "new" if before is None else "changed"
        if status == "changed" and before["impact_us"] == after["impact_us"] and before["count"] == after["count"]:
            status = "unchanged"
        ref = after or before
        findings.append({"status": status, "kind": ref["kind"], "call_site": ref.get("call_site"),
                         "child": ref.get("parent") is not None,
                         "severity_before": before and before["severity"], "severity_after": after and after["severity"],
                         "title_before": before and before["title"], "title_after": after and after["title"],
                         "impact_before_us": before and before["impact_us"],
                         "impact_after_us": after and after["impact_us"],
                         "count_before": before and before["count"], "count_after": after and after["count"],
                         "saving_before_ms": _saving(before), "saving_after_ms": _saving(after)})
    order = {"fixed": 0, "new": 1, "changed": 2, "unchanged": 3}
    findings.sort(key=lambda f: (order[f["status"]], -max(f["impact_before_us"] or 0, f["impact_after_us"] or 0)))
    sa, sb = a["summary"], b["summary"]
    summary = {k: {"before": sa.get(k), "after": sb.get(k)}
               for k in ("gpu_utilization", "gpu_busy_us", "gpu_idle_us", "window_us", "steps")}
    for k in ("unprofiled_p50", "profiled_p50"):
        summary[f"step_{k}_us"] = {"before": (sa.get("step_time_us") or {}).get(k),
                                   "after": (sb.get("step_time_us") or {}).get(k)}
    steps_a, steps_b = _step_stats(a), _step_stats(b)
    per_step = {k: {"before": steps_a.get(k), "after": steps_b.get(k)} for k in {**steps_a, **steps_b}}
    names_a = {s["step"]: s for s in a["gaps"]["per_step"]}
    aligned = [{"step": s["step"], "before": names_a[s["step"]], "after": s}
               for s in b["gaps"]["per_step"] if s["step"] in names_a]
    allocator = {k: {"before": _allocator_value(a, k), "after": _allocator_value(b, k)}
                 for k in ("cuda_malloc", "cuda_free", "reserved_peak_bytes", "allocated_peak_bytes")}
    syncs = {"blocking_calls": {"before": sum(s["count"] for s in a["syncs"]),
                                "after": sum(s["count"] for s in b["syncs"])},
             "drain_us": {"before": round(sum(s["drain_us"] for s in a["syncs"]), 3),
                          "after": round(sum(s["drain_us"] for s in b["syncs"]), 3)}}
    d = {"schema": DIFF_SCHEMA, "before": {"name": name_a, "trace": a["source"]["trace"], "run": a.get("run")},
            "after": {"name": name_b, "trace": b["source"]["trace"], "run": b.get("run")},
            "summary": summary, "idle_by_cause_us": {c: {"before": a["gaps"]["by_cause"].get(c, 0.0),
                                                         "after": b["gaps"]["by_cause"].get(c, 0.0)}
                                                     for c in {**a["gaps"]["by_cause"], **b["gaps"]["by_cause"]}},
            "per_step_median": per_step, "steps": aligned, "findings": findings, "syncs": syncs,
            "allocator": allocator}
    d["verdict"] = verdict(d, a, b)
    return d


def _saving(finding: dict | None) -> float | None:
    """What the report predicted fixing this finding saves (ms per step, or over the window)."""
    return ((finding or {}).get("what_if") or {}).get("saving_ms")


def predicted_text(f: dict) -> str:
    """A fixed finding's predicted saving (from the run before), to read next to the measured change."""
    value = f.get("saving_before_ms") if f["status"] == "fixed" else None
    return "–" if value is None else f"{fmt_us(value * 1e3)}"


def _allocator_value(report: dict, key: str):
    """A peak is unknown (None), not 0, in a trace without [memory] events (captured without profile_memory)."""
    al = report["allocator"]
    return None if key.endswith("_bytes") and not al.get("devices") else al.get(key)


def _change(before, after, fmt) -> str:
    if before is None and after is None:
        return "–"
    shown_before, shown_after = fmt(before), fmt(after)
    text = f"{shown_before} → {shown_after}"
    if shown_before == shown_after:  # no change at the precision shown: no delta that reads as one
        return text
    if fmt is fmt_pct and isinstance(before, (int, float)) and isinstance(after, (int, float)):
        # a share: its change in points, of the values as shown (7.2% → 7.3% is +0.1 pt, whatever the digits after)
        return text + f" ({round(100 * after, 1) - round(100 * before, 1):+.1f} pt)"
    if isinstance(before, (int, float)) and isinstance(after, (int, float)) and before:
        text += f" ({100 * (after - before) / abs(before):+.0f}%)"
    return text


def render_diff_markdown(d: dict) -> str:
    d = one_line(d)
    s = d["summary"]
    lines = [f"### GPU idle diff: {code(d['before']['name'])} → {code(d['after']['name'])}", "",
             f"**{d['verdict']['headline']}**" if d.get("verdict") else "", "",
             f"GPU utilization {_change(s['gpu_utilization']['before'], s['gpu_utilization']['after'], fmt_pct)}; "
             f"median step {_change(d['per_step_median']['wall_us']['before'], d['per_step_median']['wall_us']['after'], fmt_us)}"
             f" (profiled); unprofiled step p50 "
             f"{_change(s['step_unprofiled_p50_us']['before'], s['step_unprofiled_p50_us']['after'], fmt_us)}.", "",
             "| finding | status | call site | GPU idle | count | predicted saving |", "|---|---|---|---|---|---|"]
    for f in d["findings"]:
        title = cell(f["title_after"] or f["title_before"])
        lines.append(f"| {title} | **{f['status']}** | {cell(code(f['call_site']))} | "
                     f"{_change(f['impact_before_us'], f['impact_after_us'], fmt_us)} | "
                     f"{f['count_before'] if f['count_before'] is not None else '–'} → "
                     f"{f['count_after'] if f['count_after'] is not None else '–'} | {predicted_text(f)} |")
    lines += ["", "| per step (median) | before | after |", "|---|---|---|"]
    for k, v in d["per_step_median"].items():
        fmt = str if k == "steps" else fmt_us
        lines.append(f"| {k} | {fmt(v['before']) if v['before'] is not None else '–'} | "
                     f"{fmt(v['after']) if v['after'] is not None else '–'} |")
    sy, al = d["syncs"], d["allocator"]
    lines += ["", f"Host syncs: {_change(sy['blocking_calls']['before'], sy['blocking_calls']['after'], str)} "
              f"blocking calls, GPU drain {_change(sy['drain_us']['before'], sy['drain_us']['after'], fmt_us)}. "
              f"Allocator: cudaMalloc {_change(al['cuda_malloc']['before'], al['cuda_malloc']['after'], str)}, "
              f"cudaFree {_change(al['cuda_free']['before'], al['cuda_free']['after'], str)}, peak reserved "
              f"{_change(al['reserved_peak_bytes']['before'], al['reserved_peak_bytes']['after'], fmt_peak_bytes)}.", ""]
    return finish(["<!-- gpu-idle-analyzer diff -->", *lines])


def render_diff_html(d: dict) -> str:
    import plotly.graph_objects as go
    from plotly.offline import get_plotlyjs
    causes = list(d["idle_by_cause_us"])
    fig = go.Figure([go.Bar(name=label, x=causes, y=[d["idle_by_cause_us"][c][side] / 1e3 for c in causes])
                     for side, label in (("before", d["before"]["name"]), ("after", d["after"]["name"]))])
    fig.update_layout(barmode="group", title="GPU idle by cause", yaxis_title="idle (ms)", height=420,
                      margin=dict(l=60, r=20, t=50, b=40))
    body = html.escape(render_diff_markdown(d))
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><meta name='generator' content='gpu-idle-analyzer'>"
            f"<title>GPU idle diff</title><script>{get_plotlyjs()}</script></head><body style='font-family:"
            "system-ui,sans-serif;max-width:1300px;margin:auto'>"
            f"{fig.to_html(include_plotlyjs=False, full_html=False)}<pre style='white-space:pre-wrap'>{body}</pre>"
            "</body></html>")
