"""What a fix buys, in words: findings ranked by their saving, the saving as a table cell and as a sentence."""
from __future__ import annotations

from analyzer.units import fmt_us


def ms(value_ms: float | None) -> str:
    return fmt_us(None if value_ms is None else value_ms * 1e3)


def saving_ms(finding: dict) -> float | None:
    return (finding.get("what_if") or {}).get("saving_ms")


def ranked(findings: list[dict]) -> list[dict]:
    """Top-level findings by what fixing them saves (those the replay cannot price after, by GPU idle), each still
    followed by the findings that refine it."""
    groups: list[list[dict]] = []
    for f in findings:
        if f.get("parent") and groups:
            groups[-1].append(f)
        else:
            groups.append([f])
    order = sorted(range(len(groups)), key=lambda k: (saving_ms(groups[k][0]) is None,
                                                       -(saving_ms(groups[k][0]) or 0.0), k))
    return [f for k in order for f in groups[k]]


def saving_cell(finding: dict) -> str:
    """`0.43 ms (4%)` per step (or per window), `–` where the replay gives no number, empty for a child."""
    w = finding.get("what_if")
    if finding.get("parent") or not w:
        return ""
    if w.get("saving_ms") is None:
        return "–"
    share = w.get("saving_share")
    cell = ms(w["saving_ms"]) + (f" ({share:.0%})" if share is not None else "")
    return cell + (f"; {ms(w['once_ms'])} once" if w.get("once_ms") else "")


def what_if_line(finding: dict, section: dict | None) -> str:
    """One sentence: the fix, and the step time before and after it; or why there is no number."""
    w = finding.get("what_if")
    if not w:
        return ""
    if w.get("saving_ms") is None:
        return f"What fixing it buys: no estimate ({w.get('why')})."
    unit = "per step" if w.get("measure") == "step" else "over the window"
    world = " unprofiled" if (section or {}).get("basis") == "unprofiled" else ""
    line = (f"What fixing it buys: with {w['fix']}, the{world} {'step' if w.get('measure') == 'step' else 'window'} "
            f"goes from {ms(w['step_ms'])} to {ms(w['fixed_step_ms'])} "
            f"(saves {ms(w['saving_ms'])} {unit}).")
    if w.get("once_ms"):
        line += (f" Paid once: over the whole window ({ms(w['window_ms'])}) a warmed-up run saves "
                 f"{ms(w['once_ms'])}.")
    if (w.get("kept_cost_ms") or 0) > (w.get("saving_ms") or 0):
        line += (f" The blocking calls spent {ms(w['kept_cost_ms'])} after the GPU work they waited for was done "
                 f"(their own cost, or a wait on something the trace does not show): that time stays.")
    return line


def summary_line(report: dict) -> str | None:
    """The what-if section in one paragraph: the basis, all fixes together, and the profiler's trust ratio."""
    w = report.get("what_if")
    if not w:
        return None
    if not w.get("available"):
        return "What a fix buys: no estimates for this trace (" + "; ".join(w.get("limits") or []) + ")."
    unit = f"per {w['step_label']}" if w["measure"] == "step" else "over the window (no repeated steps)"
    source = (w.get("profiler") or {}).get("measured_by") or "meta.json's unprofiled step"
    basis = (f"in the unprofiled run (profiler cost calibrated to {source.split(' (')[0]})"
             if w["basis"] == "unprofiled" else "in the trace's own, profiled time")
    line = (f"What a fix buys, {basis}: {ms(w['step_ms'])} {unit} now; all findings fixed, "
            f"{ms(w['all_fixed']['fixed_step_ms'])} (the GPU's own work is "
            f"{ms(w['gpu_busy_per_step_ms'])}).")
    prof = w.get("profiler") or {}
    timed = ((report.get("summary") or {}).get("step_time_us") or {}).get("unprofiled_p50")
    measured = prof.get("measured_unprofiled_step_ms")
    if timed and measured and abs(timed / 1e3 - measured) > 0.05 * measured:  # calibrated to the rounds
        line += (f" The comparison rounds, the timing nearest the profiled window, measured "
                 f"{ms(measured)} per {w['step_label']}; the timing phase {ms(timed / 1e3)} (the host's speed "
                 f"drifted between them).")
    if prof.get("predicted_over_measured"):
        line += (f" Profiler overhead: the trace predicts an unprofiled step of "
                 f"{ms(prof['predicted_unprofiled_step_ms'])} at a default cost per recorded event; "
                 f"measured {ms(prof['measured_unprofiled_step_ms'])} "
                 f"({prof['predicted_over_measured']:.2f}x).")
    return line
