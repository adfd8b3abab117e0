"""What a fix buys, in words: findings ranked by their saving, the saving as a table cell and as a sentence."""
from __future__ import annotations

import math

from analyzer.units import fmt_us


def ms(value_ms: float | None) -> str:
    return fmt_us(None if value_ms is None else value_ms * 1e3)


def saving_ms(finding: dict) -> float | None:
    return (finding.get("what_if") or {}).get("saving_ms")


def window_saving_ms(finding: dict) -> float | None:
    """What fixing it saves over the profiled window: a per-step saving in each of the window's steps, a one-time
    cost once."""
    w = finding.get("what_if") or {}
    if w.get("saving_ms") is None:
        return None
    return w["saving_ms"] * (w.get("steps_in_window") or 1) + (w.get("once_ms") or 0.0)


def ranked(findings: list[dict]) -> list[dict]:
    """Top-level findings by what fixing them saves over the profiled window (a per-step saving in every step, a
    one-time cost once; those the replay cannot price after, by GPU idle), each still followed by the findings that
    refine it."""
    groups: list[list[dict]] = []
    for f in findings:
        if f.get("parent") and groups:
            groups[-1].append(f)
        else:
            groups.append([f])
    order = sorted(range(len(groups)), key=lambda k: (window_saving_ms(groups[k][0]) is None,
                                                       -(window_saving_ms(groups[k][0]) or 0.0), k))
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
    if w.get("depends_on_guess"):  # the profiler's cost on the trace's host is a guess: the span it allows
        low, high = w["saving_range_ms"]
        cell += f", {ms(low)}–{ms(high)}"
    return cell + (f"; {ms(w['once_ms'])} once" if w.get("once_ms") else "")


def capped_line(w: dict, section: dict) -> str:
    """A saving the measured step caps: from the measured step down to the GPU's own work, at best."""
    measured = (section.get("profiler") or {}).get("measured_unprofiled_step_ms")
    replay = f"the replay, at {ms(w['step_ms'])} a step, gave {ms(w['replayed_saving_ms'])}"
    if section["headroom_ms"] > 0:
        return (f"What fixing it buys: with {w['fix']}, the unprofiled step goes from {ms(measured)} (measured) to "
                f"{ms(section['gpu_floor_ms'])} at best, the GPU's own work per step in the replay (saves "
                f"{ms(w['saving_ms'])} per step; {replay}, but no fix of the CPU side goes below the GPU's work).")
    return (f"What fixing it buys: with {w['fix']}, the unprofiled step stays at {ms(measured)} (measured): it is no "
            f"longer than the GPU's own work per step in the replay ({ms(section['gpu_floor_ms'])}), so the replay "
            f"finds nothing on the step's critical path for a fix of the CPU side to save ({replay}).")


def headroom_clause(section: dict) -> str:
    """Why no fix of the CPU side saves more than the measured step's headroom over the GPU's work."""
    measured = (section.get("profiler") or {}).get("measured_unprofiled_step_ms")
    step = f"the measured step ({ms(measured)})" if measured else "the measured step"
    if section["headroom_ms"] > 0:
        return (f"{step} is only {ms(section['headroom_ms'])} longer than the GPU's own work per step in the replay "
                f"({ms(section['gpu_floor_ms'])}), and no fix of the CPU side saves more than that")
    return (f"{step} is no longer than the GPU's own work per step in the replay ({ms(section['gpu_floor_ms'])}), "
            "so the replay finds nothing on the step's critical path for a fix of the CPU side to save")


def what_if_line(finding: dict, section: dict | None) -> str:
    """One sentence: the fix, and the step time before and after it; or why there is no number."""
    w = finding.get("what_if")
    if not w:
        return ""
    if w.get("saving_ms") is None:
        return f"What fixing it buys: no estimate ({w.get('why')})."
    unit = "per step" if w.get("measure") == "step" else "over the window"
    world = {"unprofiled": " unprofiled", "estimated": " estimated unprofiled"}.get((section or {}).get("basis"), "")
    if w.get("replayed_saving_ms") is not None and (section or {}).get("headroom_ms") is not None:
        line = capped_line(w, section)
    else:
        line = (f"What fixing it buys: with {w['fix']}, the{world} "
                f"{'step' if w.get('measure') == 'step' else 'window'} goes from {ms(w['step_ms'])} to "
                f"{ms(w['fixed_step_ms'])} (saves {ms(w['saving_ms'])} {unit}).")
    if w.get("mean_saving_ms"):
        line += (f" The fix changes only some of the {section['steps_used']} steps, and the median step is one it "
                 f"leaves alone: on average it saves {ms(w['mean_saving_ms'])} per step.")
    if w.get("once_ms"):
        line += (f" Paid once: over the whole window ({ms(w['window_ms'])}) a warmed-up run saves "
                 f"{ms(w['once_ms'])}.")
    if w.get("depends_on_guess"):
        low, high = w["saving_range_ms"]
        slower = w.get("python_under_stacks")
        line += (f" That price depends on the profiler's cost on this trace's host"
                 + (f" and on how much its stack tracer slowed this Python code ({slower[0]:.1f}x to {slower[1]:.1f}x "
                    f"in the project's own captures)" if slower else "")
                 + f", which the trace cannot tell: {ms(low)} to {ms(high)} across the span the project's own "
                 f"captures measured.")
    if finding.get("kind") == "input_wait" and (finding.get("detail") or {}).get("loader") == "in-thread" \
            and w.get("measure") == "step" and w.get("fixed_step_ms"):
        workers = max(1, math.ceil(w["saving_ms"] / w["fixed_step_ms"]))
        line += (f" That assumes the workers keep up: a batch takes about {ms(w['saving_ms'])} to load on one "
                 f"thread against {ms(w['fixed_step_ms'])} for the rest of the step, so it takes at least {workers} "
                 f"worker{'s' * (workers > 1)} (more where handing each batch over costs them time too); with fewer, "
                 f"the step stays bound by loading.")
    graded = w.get("severity_from")
    if graded:
        line += (f" Severity {finding['severity']}: judged on the unprofiled step, which the profiler dilated "
                 f"{graded['dilation']:.1f}x ({graded['window_severity']} by its share of the profiled window).")
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
    prof = w.get("profiler") or {}
    costs = prof.get("costs_from") or "measured costs"
    basis = {"unprofiled": f"in the unprofiled run (the profiler's cost per event from {costs})",
             "estimated": f"in an estimated unprofiled run (the profiler's cost per event from {costs}; this trace "
                          "has no probe of its own and no unprofiled step time to check it against)"}.get(
        w["basis"], "in the trace's own, profiled time")
    line = (f"What a fix buys, {basis}: {ms(w['step_ms'])} {unit} now; all findings fixed, "
            f"{ms(w['all_fixed']['fixed_step_ms'])} (the GPU's own work is "
            f"{ms(w['gpu_busy_per_step_ms'])}).")
    guess = prof.get("guess")
    if guess:
        dependent = sum(bool((f.get("what_if") or {}).get("depends_on_guess")) for f in report.get("findings") or [])
        low, high = guess["scales"]
        what = "step" if w["measure"] == "step" else "window"
        line += (f" With the profiler's cost per event at {low:g}x to {high:g}x the probe's (the span the project's "
                 f"own captures measured), the {what} now is {ms(guess['step_ms'][0])} to {ms(guess['step_ms'][1])}"
                 + ((f"; {dependent} findings' savings depend on that guess" if dependent > 1 else
                     "; 1 finding's saving depends on that guess") + " (the range beside the saving)."
                    if dependent else ": no finding's saving depends on that guess."))
    stackless = prof.get("stackless") or {}
    if stackless.get("unreadable"):
        line += (f" The capture's pass without stacks could not be read ({stackless['unreadable']}): Python code is "
                 "priced at the probe's cost per event.")
    elif stackless.get("measured_over_probed") is not None:
        line += (f" Python code's cost under the profiler measured against the capture's pass without stacks "
                 f"({stackless['steps_matched']} of {stackless['steps']} steps lined up, {stackless['gaps']:,} host "
                 f"gaps): {stackless['measured_over_probed']:.2f}x the probe's cost per Python event.")
    elif stackless:
        line += (f" The capture's pass without stacks lined up {stackless['steps_matched']} of "
                 f"{stackless['steps']} steps and timed no Python code.")
    calibration = stackless.get("calibration") or {}
    calibrated = bool(calibration.get("calibrated"))
    if calibrated:
        line += (f" The calls both passes record (ops, runtime calls, allocator events) cost "
                 f"{calibration['ratio']:.2f}x the probe's figures in these steps: their host time without stacks "
                 f"against the unprofiled step ({calibration['steps']} steps).")
    elif calibration.get("why"):
        line += f" The recorded calls keep the probe's cost per event ({calibration['why']})."
    graphs = prof.get("graph_replays") or {}
    if graphs:
        line += (f" CUDA graph replays timed without the profiler: {ms(graphs['unprofiled_ms'])} each against "
                 f"{ms(graphs['traced_ms'])} in the trace"
                 + (f", starting {graphs['launch_latency_unprofiled_us']:.0f} µs after the launch call against "
                    f"{graphs['launch_latency_traced_us']:.0f} µs" if "launch_latency_unprofiled_us" in graphs else "")
                 + ".")
    timed = ((report.get("summary") or {}).get("step_time_us") or {}).get("unprofiled_p50")
    measured = prof.get("measured_unprofiled_step_ms")
    if timed and measured and abs(timed / 1e3 - measured) > 0.05 * measured:  # calibrated to the rounds
        line += (f" The comparison rounds, the timing nearest the profiled window, measured "
                 f"{ms(measured)} per {w['step_label']}; the timing phase {ms(timed / 1e3)} (the host's speed "
                 f"drifted between them).")
    ratio = prof.get("probe_over_measured")
    if ratio:
        within = abs(ratio - 1) <= 0.05
        note = ("; the recorded calls' ratio was measured against this step, so this checks that the replay keeps it"
                if calibrated and within else "")
        line += (f" Check: with those costs the trace replays an unprofiled step of {ms(prof['probe_step_ms'])}; "
                 f"measured {ms(prof['measured_unprofiled_step_ms'])} ({ratio:.2f}x{note})")
        line += "." if within else (
            f": the costs were scaled by {prof['scale']:.2f} to meet it (the probe does not explain all of the "
            "profiler's cost here, so the savings lean on the measured step).")
    capped = sum((f.get("what_if") or {}).get("replayed_saving_ms") is not None for f in report.get("findings") or [])
    if capped and w.get("headroom_ms") is not None:
        line += (f" {capped} saving{'s' if capped > 1 else ''} of the replay {'are' if capped > 1 else 'is'} capped at "
                 f"what that step leaves: {headroom_clause(w)}.")
    return line
