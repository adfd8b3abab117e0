"""Predicted against measured: what each fix buys, as the analyzer predicts it from the pathological run's trace alone,
next to the saving measured on the GPU (meta.json fix_comparison: the run and its fixed twin timed in one process, in
interleaved rounds). The measured saving is the median of the rounds' paired savings, its noise band the median's
95% confidence interval from order statistics (distribution-free: with 12 rounds, the 3rd smallest to the 3rd largest;
with 6 or fewer, the whole range).

    python benchmarks/what_if.py [RUN_DIR ...]    (default: every pair in PAIR_DIRS under tests/fixtures, and the
                                                   serving pair)
    python benchmarks/what_if.py --freeze NEW_FOLDER RUN_DIR ...

A pair made in plain torch.profiler (scripts/make_fix_pairs.sh: trace.json.gz and truth.json, no meta.json, no
probe, no stackless pass, as a user's trace) is read the same way: truth.json's per-round paired savings are the
measured saving, its `pair.finding` the finding kind the fix removes.

A recapture replaces a fixture pair (the repository has room for one capture of each): before the old pair is deleted,
--freeze predicts it with the analyzer of that day and keeps its row in benchmarks/what_if_earlier.json under
NEW_FOLDER/its name. The table shows it beside the new capture's row.

A prediction holds when it is within 25% of the measured saving or within 1% of the step. Where the band holds both
zero and the prediction and is wider than that tolerance, the pair cannot tell a right prediction from a wrong one:
"too noisy to check" (it needs more rounds). Prints a Markdown table (docs/cli.md's) and exits 1 if a prediction
misses (outside the tolerance, or of the wrong sign).
"""
from __future__ import annotations

import datetime
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from analyzer import api  # noqa: E402
from analyzer.capture.runfolder import write_json_atomic  # noqa: E402

EARLIER = REPO / "benchmarks" / "what_if_earlier.json"
PAIR_DIRS = ("h100_rounds12", "h100_whatif", "h100_stackless", "h100_recapture",
             "h100_graph_timing", "h100_calibration", "h100_plain_pairs", "h100_plain_pairs_again")  # tests/fixtures
HOST_REASON_DIRS = ("h100_host_reasons",)  # tests/fixtures: only the folders HOST_REASON_PAIRS names
TOLERANCE = 0.25
STEP_TOLERANCE = 0.01  # of the step: a prediction this close holds whatever the saving
CONFIDENCE = 0.95
# the finding each pathology script's fix removes: (kind, sync kind or None)
FIXED = {"decode_item_sync": ("sync", "item"), "decode_print": ("sync", "print"),
         "decode_alloc_churn": ("allocator_churn", None), "decode_alloc_steady": ("allocator_churn", None),
         "decode_fragmentation": ("allocator_churn", None),
         "decode_host_work": ("host_work", None), "decode_numpy_sampler": ("host_work", None),
         "hf_generate": ("launch_gap", None)}  # its twin: static cache + forward compiled with CUDA graphs
# pairs whose pathology script has several fixes, one per twin: by the run's name (make_what_if_pairs.sh)
FIXED_BY_NAME = {"graph_sync_host_vs_no_host_work": ("host_work", None),
                 "graph_sync_big_host": ("host_work", None), "graph_hidden_host_work": ("host_work", None),
                 "graph_sync_host_vs_no_item": ("sync", "item"),
                 "graph_pageable_upload": ("sync", "pageable_h2d")}


def fixed_finding(report: dict, meta: dict) -> dict | None:
    """The top-level finding the twin fixes: launch overhead where the twin is the same script as a CUDA graph."""
    comparison = meta["fix_comparison"]
    graphs_fix = (comparison.get("fixed_mode") == "cuda_graph" and meta["workload"].get("mode") != "cuda_graph") or \
        comparison.get("fixed_compile_mode") in ("reduce-overhead", "max-autotune")
    if graphs_fix:
        kind, sub = "launch_gap", None
    else:
        kind, sub = FIXED_BY_NAME.get(meta["workload"].get("name"), FIXED.get(meta["workload"]["script"], (None, None)))
    mine = [f for f in report["findings"] if not f.get("parent") and f["kind"] == kind
            and (sub is None or f["detail"].get("kind") == sub)]
    return max(mine, key=lambda f: f["what_if"].get("saving_ms") or 0.0) if mine else None


# host-reason fixtures (scripts/make_host_reason_fixtures.sh) whose truth.json times the pathology against its fix in
# interleaved rounds: folder name -> (pathology variant, fix variant, the finding the fix removes)
HOST_REASON_PAIRS = {"sdpa_growing_cache": ("growing", "fixed", ("shape_setup", None)),
                     "tokenizer_threads": ("thread", "process", ("host_work", None)),
                     "detokenize_steps": ("step", "end", ("host_work", None))}


def truth_pair(run: Path) -> dict | None:
    """truth.json of a pair made in plain torch.profiler (scripts/foreign/pairkit.py, or a host-reason fixture named
    in HOST_REASON_PAIRS), None for a capture's run."""
    path = run / "truth.json"
    truth = json.loads(path.read_text()) if path.is_file() else None
    if truth and "pair" not in truth and run.name in HOST_REASON_PAIRS:
        bad, fix, finding = HOST_REASON_PAIRS[run.name]
        steps = truth["ms_per_step"]
        truth = {**truth, "pair": {"pathology": bad, "fix": fix, "finding": list(finding)},
                 "paired_saving_ms": [a - b for a, b in zip(steps[bad], steps[fix])]}
    return truth if truth and "pair" in truth else None


def truth_row(run: Path, truth: dict) -> dict:
    """A plain-profiler pair: no meta.json, no probe, no stackless pass (a user's trace). Its fix may remove several
    findings of the kind (two read-backs on two lines): their savings, each priced alone, are summed."""
    report = api.analyze(api.load(run / "trace.json.gz", cache=False)).report
    kind, sub = truth["pair"]["finding"]
    mine = [f for f in report["findings"] if not f.get("parent") and f["kind"] == kind
            and (sub is None or f["detail"].get("kind") == sub)]
    priced = [f["what_if"]["saving_ms"] for f in mine if f["what_if"].get("saving_ms") is not None]
    predicted = sum(priced) if priced else (None if mine else 0.0)
    measured, (lo, hi) = median_band(truth["paired_saving_ms"])
    steps = truth["ms_per_step"]
    step, fixed = (statistics.median(steps[truth["pair"][k]]) for k in ("pathology", "fix"))
    top = max(mine, key=lambda f: f["what_if"].get("saving_ms") or 0.0) if mine else None
    ranges = [f["what_if"]["saving_range_ms"] for f in mine if f["what_if"].get("saving_range_ms")]
    row = {"run": f"{run.parent.name}/{run.name}",
           "fix": (top["what_if"].get("fix") if top else "none (no such finding: nothing to fix)")
           + (f" (+{len(mine) - 1} more)" if len(mine) > 1 else "")
           + (f"; guessed profiler cost: {sum(r[0] for r in ranges):.2f} … {sum(r[1] for r in ranges):.2f}"
              if ranges else ""),
           "finding": top["title"] if top else None, "predicted_ms": predicted, "measured_ms": measured,
           "band_ms": (lo, hi), "step_ms": step, "fixed_step_ms": fixed, "basis": report["what_if"].get("basis"),
           "rounds": len(truth["paired_saving_ms"])}
    row["verdict"] = verdict(predicted, measured, lo, hi, step)
    return row


def row_for(run: Path) -> dict:
    truth = truth_pair(run)
    if truth is not None:
        return truth_row(run, truth)
    analysis = api.analyze(api.load(run, cache=False))
    report, meta = analysis.report, analysis.trace.meta.data
    comparison = meta["fix_comparison"]
    finding = fixed_finding(report, meta)
    # no finding of the kind the twin fixes: the analyzer sees nothing there to fix, a prediction of nothing
    predicted = finding["what_if"].get("saving_ms") if finding else 0.0
    measured, (lo, hi) = median_band(comparison["paired_saving_ms"])
    row = {"run": f"{run.parent.name}/{run.name}",
           "fix": (finding or {}).get("what_if", {}).get("fix", "none (no such finding: nothing to fix)"),
           "finding": finding["title"] if finding else None, "predicted_ms": predicted, "measured_ms": measured,
           "band_ms": (lo, hi), "step_ms": comparison["step_ms"], "fixed_step_ms": comparison["fixed_step_ms"],
           "basis": report["what_if"].get("basis")}
    row["verdict"] = verdict(predicted, measured, lo, hi, comparison["step_ms"])
    row["rounds"] = len(comparison["paired_saving_ms"])
    return row


def median_band(paired: list[float]) -> tuple[float, tuple[float, float]]:
    """The median of the paired savings and its CONFIDENCE interval: the order statistics k and n+1-k, k the largest
    with P(Binomial(n, 1/2) < k) <= (1 - CONFIDENCE) / 2 (at least 1: the range)."""
    x, n = sorted(paired), len(paired)
    k, tail = 1, 0.0
    while k < n // 2:
        tail += math.comb(n, k - 1) / 2 ** n
        if tail + math.comb(n, k) / 2 ** n > (1 - CONFIDENCE) / 2:
            break
        k += 1
    return statistics.median(x), (x[k - 1], x[n - k])


# Serving: two captures of the same traffic in separate processes, the fix a config change that timing.compare_fix
# cannot interleave. The measured saving is per session (the same requests served: output tokens over throughput),
# its band the range across each run's timed sessions; the prediction is the finding's saving per engine step times
# the run's engine steps per session. (pair name: pathological run, fixed run, finding kind)
SESSION_PAIRS = {"serve_vs_no_sleep": ("tests/fixtures/h200_serve/serve", "tests/fixtures/h200_serve/serve_no_sleep",
                                       "event_loop_idle")}


def session_walls_ms(run: Path) -> tuple[list[float], int]:
    serving = api.read_meta(run / "meta.json").data["serving"]["unprofiled"]
    return [serving["output_tokens"] / s["throughput_tokens_per_s"] * 1e3 for s in serving["sessions"]], \
        serving["engine_steps"]


def session_row(name: str) -> dict:
    run, fixed, kind = (REPO / SESSION_PAIRS[name][0], REPO / SESSION_PAIRS[name][1], SESSION_PAIRS[name][2])
    report = api.analyze(api.load(run, cache=False)).report
    mine = [f for f in report["findings"] if not f.get("parent") and f["kind"] == kind]
    finding = max(mine, key=lambda f: f["what_if"].get("saving_ms") or 0.0) if mine else None
    (before, steps), (after, _) = session_walls_ms(run), session_walls_ms(fixed)
    per_step = finding["what_if"].get("saving_ms") if finding else None
    predicted = per_step * steps if per_step is not None else None
    measured = statistics.median(before) - statistics.median(after)
    lo, hi = min(before) - max(after), max(before) - min(after)
    row = {"run": f"{name} (ms per session)", "fix": (finding or {}).get("what_if", {}).get("fix", "–"),
           "finding": finding["title"] if finding else None, "predicted_ms": predicted, "measured_ms": measured,
           "band_ms": (lo, hi), "step_ms": statistics.median(before), "fixed_step_ms": statistics.median(after),
           "basis": report["what_if"].get("basis")}
    row["verdict"] = verdict(predicted, measured, lo, hi, statistics.median(before))
    row["rounds"] = len(before)
    return row


def verdict(predicted: float | None, measured: float, lo: float, hi: float, step: float) -> str:
    """"within", "too noisy to check", "wrong sign" or "missed" (see the module's docstring)."""
    if predicted is None:
        return "missed"
    tolerance = max(TOLERANCE * abs(measured), STEP_TOLERANCE * step)
    if lo <= 0 <= hi and lo <= predicted <= hi and hi - lo > 2 * tolerance:
        return "too noisy to check"
    if abs(predicted - measured) <= tolerance:
        return "within"
    wrong = predicted <= 0 if lo > 0 else predicted > hi if lo <= 0 <= hi else predicted > 0
    return "wrong sign" if wrong else "missed"


def table(rows: list[dict], earlier: dict | None = None) -> str:
    """The Markdown table; where earlier (what_if_earlier.json) holds rows of captures the run's capture replaced, a
    last column shows them, oldest first: each one's prediction, measured saving, band, rounds and verdict."""
    earlier = earlier or {}
    shown = any(r["run"] in earlier for r in rows)
    head = ("| pair | fix the replay applies | predicted saving (ms/step) | measured, median (ms/step) | 95% band (ms) "
            "| rounds | measured step → fixed (ms) | verdict |")
    lines = [head + (" earlier capture: predicted, measured (band), rounds, verdict |" if shown else ""),
             "|---" * (9 if shown else 8) + "|"]
    for r in rows:
        line = (f"| `{r['run']}` | {r['fix']} | {_num(r['predicted_ms'])} | {_num(r['measured_ms'])} "
                f"| {_num(r['band_ms'][0])} … {_num(r['band_ms'][1])} | {r['rounds']} "
                f"| {_num(r['step_ms'])} → {_num(r['fixed_step_ms'])} | {r['verdict']} |")
        if shown:
            line += " " + ("; ".join(f"`{e['from']}`: {_num(e['predicted_ms'])}, {_num(e['measured_ms'])} "
                                     f"({_num(e['band_ms'][0])} … {_num(e['band_ms'][1])}), {e['rounds']}, "
                                     f"{e['verdict']}" for e in earlier.get(r["run"], [])) or "–") + " |"
        lines.append(line)
    return "\n".join(lines)


def freeze(new_folder: str, runs: list[Path], frozen: dict) -> dict:
    """frozen (what_if_earlier.json: per recaptured pair, the rows of the captures it replaced) with the rows of runs
    added under new_folder/their name: what the table said of each before its recapture replaced it. A pair frozen
    again from the same capture replaces that capture's row."""
    frozen = {k: list(v) for k, v in frozen.items()}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    for run in runs:
        row = row_for(run)
        key = f"{new_folder}/{run.name}"
        frozen[key] = [e for e in frozen.get(key, []) if e["from"] != row["run"]] + [{
            "from": row["run"], "frozen": f"{datetime.date.today()}, analyzer at {commit or 'unknown'}",
            "rounds": row["rounds"], "verdict": row["verdict"], "band_ms": [round(x, 4) for x in row["band_ms"]],
            **{k: round(row[k], 4) for k in ("predicted_ms", "measured_ms", "step_ms", "fixed_step_ms")}}]
    return frozen


def earlier_rows() -> dict:
    return json.loads(EARLIER.read_text()) if EARLIER.exists() else {}


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--freeze"]:
        if len(argv) < 3:
            print("usage: what_if.py --freeze NEW_FOLDER RUN_DIR ...", file=sys.stderr)
            return 2
        frozen = freeze(argv[1], [Path(a) for a in argv[2:]], earlier_rows())
        write_json_atomic(EARLIER, frozen)
        return 0
    runs = [Path(a) for a in argv] or [p for d in PAIR_DIRS if (REPO / "tests/fixtures" / d).is_dir()
                                       for p in sorted((REPO / "tests/fixtures" / d).iterdir()) if p.is_dir()] + \
        [REPO / "tests/fixtures" / d / name for d in HOST_REASON_DIRS for name in HOST_REASON_PAIRS
         if (REPO / "tests/fixtures" / d / name).is_dir()]
    rows = [row_for(run) for run in runs] + ([] if argv else [session_row(name) for name in SESSION_PAIRS])
    print(table(rows, earlier_rows()))
    return 0 if all(r["verdict"] in ("within", "too noisy to check") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
