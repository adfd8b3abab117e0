"""A diff's verdict: one sentence saying what got better or worse and by how much, and whether the step-time change
is beyond the run-to-run noise.

Two noises bound a step-time change. Step to step: each run's per-step times resampled with replacement, the ratio of
their medians taken 2000 times (a fixed seed: the same runs give the same verdict), its 95% interval. Session to
session: the capture times `timing.sessions` fresh sequences, and their medians differ more than the steps of one
session suggest (on the H200, sessions of one process 20% apart). A change is beyond the noise when the steps' interval
excludes no change and the change is larger than the sessions' spread. A run with one timed session (older captures, bare traces) gives no session band: its step
change is reported but not judged, and the verdict rests on the findings."""
from __future__ import annotations

import numpy as np

from analyzer.units import fmt_pct, fmt_us

RESAMPLES = 2000
EXPLAINED_SHARE = 0.25  # predicted and measured savings this close (or within the noise): the fix explains the change
MIN_STEPS = 4  # fewer step samples per run give no band
# which way is better for each compared metric (True: higher is better)
HIGHER_IS_BETTER = {"gpu_utilization": True, "gpu_busy_us": None, "gpu_idle_us": False, "window_us": None,
                    "steps": None, "step_unprofiled_p50_us": False, "step_profiled_p50_us": False, "wall_us": False,
                    "busy_us": None, "idle_us": False, "blocking_calls": False, "drain_us": False,
                    "cuda_malloc": False, "cuda_free": False, "reserved_peak_bytes": False,
                    "allocated_peak_bytes": False}


def step_samples(report: dict) -> tuple[list[float], str]:
    """Step times in µs and what they are: the capture's unprofiled steps, else the profiled steps' wall times."""
    timing = ((report.get("run") or {}).get("unprofiled") or {})
    per_step = [v * 1e3 for v in timing.get("per_step_ms") or [] if isinstance(v, (int, float))]
    if len(per_step) >= MIN_STEPS:
        return per_step, "unprofiled step"
    return _profiled_steps(report), "profiled step"


def _profiled_steps(report: dict) -> list[float]:
    """The traced steps' wall times (µs), prefill left out."""
    return [s["wall_us"] for s in report["gaps"]["per_step"]
            if not s["step"].startswith("prefill") and s.get("wall_us")]


def step_change(a: dict, b: dict) -> dict | None:
    """The median step before and after, the ratio, and its 95% bootstrap interval (None where too few steps)."""
    (xa, what_a), (xb, what_b) = step_samples(a), step_samples(b)
    if what_a != what_b:  # compare like with like: both profiled when one run lacks unprofiled timing
        xa, xb, what_a = _profiled_steps(a), _profiled_steps(b), "profiled step"
    if not xa or not xb:
        return None
    ma, mb = float(np.median(xa)), float(np.median(xb))
    out = {"measure": what_a, "before_us": round(ma, 3), "after_us": round(mb, 3), "ratio": round(mb / ma, 4),
           "steps_before": len(xa), "steps_after": len(xb), "interval": None}
    if len(xa) >= MIN_STEPS and len(xb) >= MIN_STEPS:
        rng = np.random.default_rng(0)
        ra = np.median(rng.choice(np.asarray(xa), (RESAMPLES, len(xa))), axis=1)
        rb = np.median(rng.choice(np.asarray(xb), (RESAMPLES, len(xb))), axis=1)
        lo, hi = np.percentile(rb / ra, [2.5, 97.5])
        out["interval"] = [round(float(lo), 4), round(float(hi), 4)]
    spreads = [session_spread(r) for r in (a, b)] if what_a == "unprofiled step" else [None, None]
    out["session_spread"] = None if None in spreads else round(max(spreads), 4)
    return out


def session_spread(report: dict) -> float | None:
    """(max - min) / median of a run's timed sessions' medians; None with fewer than two sessions."""
    medians = ((report.get("run") or {}).get("unprofiled") or {}).get("session_p50_ms") or []
    if len(medians) < 2:
        return None
    return (max(medians) - min(medians)) / float(np.median(medians))


def _gpus(report: dict) -> str | None:
    names = [g for g in (report.get("trace") or {}).get("gpus") or [] if isinstance(g, str) and g]
    if names:
        return names[0] if len(set(names)) == 1 else ", ".join(sorted(set(names)))
    return (report.get("run") or {}).get("device")


def _run_key(key: str):
    return lambda report: (report.get("run") or {}).get(key)


DIFFERENCES = (("GPU", _gpus), ("model", _run_key("model")),
               ("workload", lambda r: (r.get("run") or {}).get("workload") or (r.get("run") or {}).get("script")),
               ("batch size", _run_key("batch_size")), ("torch", _run_key("torch")))


def differences(a: dict, b: dict) -> list[dict]:
    """What differs between the two runs besides the change under test (GPU, workload, torch), and what one run
    cannot tell (a bare trace records no workload or torch version): each {"what", "before", "after"}."""
    out = []
    for what, read in DIFFERENCES:
        before, after = read(a), read(b)
        if before != after:
            out.append({"what": what, "before": before, "after": after})
    return out


def differences_text(diffs: list[dict]) -> str:
    """'The runs differ in GPU (NVIDIA H100 → NVIDIA B200); the run after does not say its model, torch (no
    meta.json)'."""
    known = [f"{x['what']} ({x['before']} → {x['after']})" for x in diffs
             if x["before"] is not None and x["after"] is not None]
    parts = ["the runs differ in " + ", ".join(known)] if known else []
    for side in ("before", "after"):
        missing = [x["what"] for x in diffs if x[side] is None]
        if missing:
            listed = ", ".join(missing[:-1]) + " or " + missing[-1] if len(missing) > 1 else missing[0]
            parts.append(f"the run {side} does not say its {listed} (no meta.json)")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:]


def verdict(d: dict, a: dict, b: dict) -> dict:
    """{"outcome": better | worse | mixed | unchanged, "headline": one sentence, led by what differs between the
    runs besides the change (`differences`; `verdict_line` is the sentence without it), "step": step_change}.

    The measured step leads: judged beyond the noise, it decides; judged within it, nothing measurably changed
    whatever the findings say. Unjudged (one timed session per run) but outside the steps' own interval, it is weighed
    with the findings: where the two disagree the outcome is mixed. Only without step times do the findings decide."""
    step = step_change(a, b)
    step_dir, parts, judged = 0, [], False
    if step:
        pct = (step["ratio"] - 1) * 100
        word = step["measure"]
        text = f"the median {word} went {fmt_us(step['before_us'])} → {fmt_us(step['after_us'])} ({pct:+.1f}%"
        spread = step["session_spread"]
        if step["interval"] is None:
            text += ", too few steps to tell noise apart)"
        else:
            lo, hi = step["interval"]
            # beyond noise: the steps' interval excludes no change, and the change exceeds how far sessions differ
            beyond = (lo > 1 or hi < 1) and abs(step["ratio"] - 1) > (spread or 0.0)
            if spread is None:
                step_dir = (1 if step["ratio"] < 1 else -1) if (lo > 1 or hi < 1) else 0
                text += (f"; steps alone put its 95% interval at {(lo - 1) * 100:+.1f}% to {(hi - 1) * 100:+.1f}%, "
                         f"but one timed session per run cannot show the session-to-session noise: not judged)")
            else:
                judged = True
                step_dir = (1 if step["ratio"] < 1 else -1) if beyond else 0
                text += (f", {'beyond' if beyond else 'within'} the noise: the steps' 95% interval "
                         f"{(lo - 1) * 100:+.1f}% to {(hi - 1) * 100:+.1f}%, the sessions' medians up to "
                         f"{spread * 100:.1f}% apart)")
        parts.append(text)
    top = [f for f in d["findings"] if not f.get("child")]
    fixed = sorted((f for f in top if f["status"] == "fixed"), key=lambda f: -(f["impact_before_us"] or 0))
    new = sorted((f for f in top if f["status"] == "new"), key=lambda f: -(f["impact_after_us"] or 0))
    attribution = _attribution(fixed, step)
    if fixed:
        parts.append(f"{len(fixed)} finding{'s' * (len(fixed) > 1)} fixed (largest: {fixed[0]['title_before']}"
                     f"{_predicted(attribution)})")
    if new:
        parts.append(f"{len(new)} new (largest: {new[0]['title_after']})")
    u = d["summary"]["gpu_utilization"]
    if u["before"] is not None and u["after"] is not None:
        parts.append(f"GPU utilization {fmt_pct(u['before'])} → {fmt_pct(u['after'])}")
    finding_dir = (1 if fixed else 0) - (1 if new else 0)
    if judged:
        outcome = {1: "better", -1: "worse", 0: "unchanged"}[step_dir]
    elif step_dir and finding_dir and step_dir != finding_dir:
        outcome = "mixed"
    elif step_dir or finding_dir:
        outcome = "better" if (step_dir or finding_dir) > 0 else "worse"
    elif fixed and new:
        outcome = "mixed"
    else:
        outcome = "unchanged"
    lead = {"better": "Better", "worse": "Worse", "mixed": "Mixed", "unchanged": "No clear change"}[outcome]
    if judged and not step_dir:
        lead = "No measurable change in the step"
    verdict_line = f"{lead}: " + "; ".join(parts) + "." if parts else f"{lead}."
    diffs = differences(a, b)
    headline = f"{differences_text(diffs)}. {verdict_line}" if diffs else verdict_line
    return {"outcome": outcome, "headline": headline, "verdict_line": verdict_line, "step": step,
            "attribution": attribution, "differences": diffs}


def _attribution(fixed: list[dict], step: dict | None) -> dict | None:
    """How much of the measured step change the fixed findings' predicted savings explain (the before-run's what-if,
    summed: each was priced alone, so the sum is an estimate). They explain it when the two differ by no more than
    the change's noise (half the steps' 95% interval, or the sessions' spread, the larger) or 25% of the change."""
    savings = [f["saving_before_ms"] for f in fixed if f.get("saving_before_ms") is not None]
    if not savings:
        return None
    predicted = sum(savings) * 1e3
    out = {"predicted_us": round(predicted, 3), "measured_us": None, "noise_us": None, "unexplained_us": None,
           "explained": None}
    if not step:
        return out
    before, measured = step["before_us"], step["before_us"] - step["after_us"]
    noise = 0.0
    if step.get("interval"):
        lo, hi = step["interval"]
        noise = before * (hi - lo) / 2
    noise = max(noise, before * (step.get("session_spread") or 0.0))
    unexplained = measured - predicted
    out.update({"measured_us": round(measured, 3), "noise_us": round(noise, 3), "unexplained_us": round(unexplained, 3),
                "explained": abs(unexplained) <= max(noise, EXPLAINED_SHARE * abs(measured))})
    return out


def _predicted(attribution: dict | None) -> str:
    """`; predicted to save 0.39 ms per step, measured 0.41 ms`; where the fixed findings do not explain the change,
    how much of it they leave unexplained, without calling the fix its reason."""
    if not attribution:
        return ""
    text = f"; predicted to save {fmt_us(attribution['predicted_us'])} per step"
    measured = attribution["measured_us"]
    if measured is None:
        return text
    if attribution["explained"]:
        return text + f", measured {fmt_us(measured)}"
    why = "other changes between the runs, or the host's speed between captures"
    if measured <= 0:
        return (text + f", but the step grew by {fmt_us(-measured)}: the fixed findings do not explain the change "
                       f"({why})")
    rest = attribution["unexplained_us"]
    if rest > 0:
        return (text + f" of the {fmt_us(measured)} measured: {fmt_us(rest)} ({rest / measured:.0%}) of the change is "
                       f"not explained by the fixed findings ({why})")
    return (text + f", measured only {fmt_us(measured)}: the fix bought less than predicted, or other changes took "
                   f"back part of it ({why})")


def is_improvement(metric: str, before, after) -> bool | None:
    """Whether a metric's change is good (True), bad (False) or neither / unknown (None), for colouring deltas."""
    way = HIGHER_IS_BETTER.get(metric)
    if way is None or not isinstance(before, (int, float)) or not isinstance(after, (int, float)) \
            or before == after:
        return None
    return (after > before) == way
