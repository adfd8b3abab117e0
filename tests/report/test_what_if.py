"""What a fix buys (analyzer/views/whatif.py) on real traces: every committed fixture and external trace gets a
saving per top-level finding that never makes a step slower and never goes below the GPU's own work, or says why it
has none; the H200 pairs' predictions fall within their measured noise band or 25% (benchmarks/what_if.py); the
reports rank by saving and show it next to the GPU idle."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from analyzer import api
from analyzer.report.markdown import render_markdown
from conftest import report_of
from rawtrace import raw_events

HERE = Path(__file__).resolve().parents[1]
REPO = HERE.parent
FIXTURES = sorted(p.parent for p in (HERE / "fixtures").glob("*/*/rank0.trace.json.gz"))
EXTERNAL = REPO.parent / "shared" / "traces" / "external"
EXTERNAL_TRACES = sorted(EXTERNAL.glob("*.json.gz")) if EXTERNAL.is_dir() else []
TRACES = FIXTURES + EXTERNAL_TRACES
IDS = [f"{p.parent.name}/{p.name}" for p in TRACES]
TOLERANCE = 0.25  # the target: within the noise band or 25% of the measured saving


def what_if_bench():
    spec = importlib.util.spec_from_file_location("what_if_bench", REPO / "benchmarks" / "what_if.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PAIRS = sorted(p for d in what_if_bench().PAIR_DIRS if (HERE / "fixtures" / d).is_dir()
               for p in (HERE / "fixtures" / d).iterdir() if p.is_dir()) + \
    [HERE / "fixtures" / d / name for d in what_if_bench().HOST_REASON_DIRS for name in what_if_bench().HOST_REASON_PAIRS]
PAIR_IDS = [f"{p.parent.name}/{p.name}" for p in PAIRS]


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_every_top_level_finding_has_a_saving_or_says_why(path):
    report = report_of(path)
    section = report["what_if"]
    tops = [f for f in report["findings"] if not f.get("parent")]
    if not section["available"]:
        assert section["limits"]
        assert all(f["what_if"]["saving_ms"] is None and "cannot model" in f["what_if"]["why"] for f in tops)
        return
    step, busy = section["step_ms"], section["gpu_busy_per_step_ms"]
    assert busy <= step + 1e-3
    fixed_all = section["all_fixed"]["fixed_step_ms"]
    assert busy - 1e-3 <= fixed_all <= step + 1e-3  # the bound: never below the GPU's own work
    for f in tops:
        w = f["what_if"]
        if w["saving_ms"] is None:
            assert w["why"]
            continue
        assert w["saving_ms"] >= 0 and w["fixed_step_ms"] <= w["step_ms"] + 1e-3  # a fix never slows a step
        assert w["step_ms"] == pytest.approx(step, abs=1e-3)
        assert w["fixed_step_ms"] >= fixed_all - 1e-3 or f["kind"] == "launch_gap"
        assert w["fix"]
    assert set(section["ranking"]) == {f["id"] for f in tops}


# Pairs whose prediction misses the target, with what is known of why; each must still get the sign right and keep
# missing the way it is written down here (if it starts passing, move it out of this list).
KNOWN_MISSES = {
    # The window (decode steps 0-3 of a sequence) holds 2 cudaMalloc and 1 cudaFree in 5 steps, the calls the fix
    # prices, and the window's median step does not move without them: 0.00. The pathology's cost grows with the
    # position in a sequence (its buffer grows by 32 MiB a step to 1 GiB at step 32: each step's torch.cat copies it
    # whole and empty_cache hands the old one back), and the twin is timed over whole sequences: 1.49 ms (band
    # 0.73-2.00) in 12 rounds, 1.61 in the earlier H200 capture's 6 (band -3.20-1.76: too noisy to check then). A
    # window at the start of a sequence cannot show what its middle costs; the finding's advice says so, naming the
    # growing buffer (analyzer/views/growing.py: aten::cat's allocation 32 → 128 MiB over the window's 4 steps).
    "h100_rounds12/alloc_churn": "under",
    # position_checksum() (3,000 iterations of Python a step): 0.50 predicted against 0.39 measured (band 0.10-0.54),
    # inside the band but 28% over. Its captures in h100_stackless, h100_recapture and h100_calibration land within;
    # one of this pair's 12 rounds measured +4.2 ms (the host's step time switched regimes mid-round).
    "h100_rounds12/host_work": "over",
    # GPU-bound pairs (the step a CUDA graph at batch 8, 1.76 ms of GPU work in 588 nodes, the unprofiled step
    # 2.0-2.5 ms): the savings are 0.03-0.5 ms, and the criterion (25%, or 1% of the step) asks the replayed world to
    # be right to ~0.05 ms. It is not: the world the probed costs build is 0.1-0.25 ms per step slower than measured
    # (CUPTI lengthens each graph node's gap by ~0.36 µs in these traces where the probe's own graph measured 0.2, and
    # the wake-up after the .item() and the graph launch's head are longer under the profiler), and the scale that
    # meets the measured step (0.8-2.7x here; 5.7-8x on h100_stackless's, which have no graph timing) is
    # ill-conditioned: little of the step is host time it can take out, and it takes the rest off the GPU's gaps.
    # The helper (3,000 iterations of pure Python after the .item()): without the stackless pass its 1.5 ms in the
    # trace (6,000 recorded calls) minus their probed cost is the small difference of two large numbers, 0.11
    # against 0.40 measured. With it (h100_stackless) the helper's run keeps its unprofiled time (0.22 ms a step
    # against 0.21 saved: tests/views/test_stackless.py) and the pair lands within (0.21 against 0.21; the
    # recapture on another host 0.21 against 0.20; graph_sync_big_host, 20,000 iterations, 1.47 against 1.40;
    # h100_graph_timing's, 0.22 against 0.21).
    "h100_whatif/graph_sync_host_vs_no_host_work": "under",
    # The read-back's and the pageable upload's fixes: the host's time after the read-back is ~0.29 ms in the
    # stackless pass against ~0.20 ms unprofiled. The profiler's own code is cut whole (prof.step() between two
    # steps, and what record_function's enter and exit kept without stacks); the rest, the profiler's cost around
    # each recorded call, the probe's per-op cost does not take out. With the GPU side measured (h100_graph_timing:
    # the graph 2.01 ms a replay unprofiled against 2.18 traced, launch latency 19-23 µs against 31-33) a saving of
    # the CPU side is capped at the measured step less the GPU's work (test_a_saving_of_the_cpu_side_stops_at_the_
    # gpus_own_work), and both land within; here the GPU side is the probe's guess and no cap applies.
    "h100_stackless/graph_sync_host_vs_no_item": "over",  # 0.37 against 0.24 (band 0.22-0.35)
    "h100_whatif/graph_pageable_upload": "over",  # 0.10 against 0.03 (band 0.03-0.09)
    # A training step (forward, autograd's backward thread, AdamW) reading loss and grad norm back every step, in
    # plain torch.profiler: the two read-backs priced 0.31 ms (0.31-0.33 across the guessed profiler cost) against
    # 0.42 measured, inside the band (0.29-0.60) but 26% under, the tolerance 25%.
    "h100_plain_pairs/training_readback": "under",
    # The same four pairs captured again on another H100 machine (h100_plain_pairs_again), the other day's question:
    # is the price stable across captures of the same code? The training read-back lands within there (0.44 against
    # 0.40; the price moved 0.31 -> 0.44, the truth 0.42 -> 0.40). The compiled read-back's fix buys nothing in
    # either capture (0.01, then -0.03 against predictions of 0.04 and 0.02, about 1% of a 1.6 ms step).
    # The in-thread DataLoader is priced as if loading were fully hidden (19.48 against 12.18, band 7.25-20.25):
    # the twin's 2 workers cannot keep up (its step 13.72 ms is loader-bound), and the report says it takes at
    # least 5 workers; the first capture's "within" (16.75 against 17.82) was the same overestimate met by a slower
    # host's larger saving.
    "h100_plain_pairs_again/compiled_item_break": "over",
    "h100_plain_pairs_again/dataloader_tokenize": "over",
    # Host work in Python on traces with stacks and no probe (h100_host_reasons): the bytecode itself ran slower under
    # the stack tracer (tokenizer 1.7x, detokenizer 3.1x its unprofiled time), which no event records; the point
    # prices are over (a tokenizer thread holding the GIL 5.80 against 3.02, a per-step detokenizer 1.45 against
    # 0.90) and their spans (1.87-5.80, 0.47-1.45: python_under_stacks) hold the truth
    # (tests/detectors/test_host_reasons_h100.py).
    "h100_host_reasons/tokenizer_threads": "over",
    "h100_host_reasons/detokenize_steps": "over",
}


@pytest.mark.parametrize("path", PAIRS, ids=PAIR_IDS)
def test_prediction_is_within_the_measured_noise_band_or_25_percent(path):
    bench = what_if_bench()
    row = bench.row_for(path)
    assert row["predicted_ms"] is not None, row
    known = KNOWN_MISSES.get(f"{path.parent.name}/{path.name}")
    if known:
        assert row["verdict"] in ("missed", "wrong sign"), row
        assert (row["predicted_ms"] > row["measured_ms"]) == (known == "over"), row
    else:
        assert row["verdict"] in ("within", "too noisy to check"), row


def test_a_replaced_pair_keeps_its_row_beside_its_recapture():
    """--freeze prices the old capture before it is deleted; the table puts that row beside the recapture's, under
    the same name in the new folder (here a fixture stands for both, under a stand-in folder)."""
    bench = what_if_bench()
    run = HERE / "fixtures" / "h100_whatif" / "graph_sync_host_vs_no_item"
    row = bench.row_for(run)
    older = HERE / "fixtures" / "h100_whatif" / "graph_pageable_upload"  # stands for an older capture of the pair
    key = "recaptured/graph_sync_host_vs_no_item"
    frozen = bench.freeze("recaptured", [run], bench.freeze("recaptured", [older], {}))
    frozen[key] = frozen.pop("recaptured/graph_pageable_upload") + frozen[key]
    assert bench.freeze("recaptured", [run], frozen)[key][-1]["from"] == "h100_whatif/graph_sync_host_vs_no_item"
    assert len(bench.freeze("recaptured", [run], frozen)[key]) == 2  # refrozen, not added twice
    first, entry = frozen[key]
    assert entry["from"] == "h100_whatif/graph_sync_host_vs_no_item" and entry["rounds"] == row["rounds"] == 12
    assert entry["predicted_ms"] == pytest.approx(row["predicted_ms"], abs=1e-4)
    assert entry["band_ms"] == pytest.approx(list(row["band_ms"]), abs=1e-4)
    new = dict(row, run=key)
    lines = bench.table([new, row], frozen).splitlines()
    assert lines[0].endswith("| earlier capture: predicted, measured (band), rounds, verdict |")
    assert lines[2].endswith(f"; `h100_whatif/graph_sync_host_vs_no_item`: {entry['predicted_ms']:.2f}, "
                             f"{entry['measured_ms']:.2f} ({entry['band_ms'][0]:.2f} … {entry['band_ms'][1]:.2f}), 12, "
                             f"{entry['verdict']} |")
    assert f"| `{first['from']}`: {first['predicted_ms']:.2f}, " in lines[2]  # the older capture first
    assert lines[3].endswith("| – |")
    assert "earlier capture" not in bench.table([row], {})  # no column where no row has an earlier capture


def test_serving_pair_predicts_the_session_the_fixed_engine_serves():
    """serve (the loop parks 1 ms in asyncio.sleep between steps) against serve_no_sleep, two captures of the same
    traffic on the H200: the event-loop finding's saving per engine step times the steps of a session, against the
    measured session times (tests/fixtures/h200_serve, meta.json serving.unprofiled.sessions)."""
    bench = what_if_bench()
    (name,) = bench.SESSION_PAIRS
    row = bench.session_row(name)
    assert row["verdict"] == "within", row
    assert row["measured_ms"] == pytest.approx(16.38, abs=0.01) and row["predicted_ms"] > 0


def test_a_fix_that_buys_little_is_predicted_to_buy_little():
    # item_sync's .item() in a launch-bound eager decode: measured 0.16 ms of a 13.8 ms step (band -0.02 … 0.18, 12
    # rounds on an H100; -0.15 in the earlier H200 capture's 6 rounds)
    report = report_of(HERE / "fixtures" / "h100_rounds12" / "item_sync")
    sync = next(f for f in report["findings"] if f["kind"] == "sync" and f["detail"]["kind"] == "item")
    assert sync["what_if"]["saving_ms"] < 0.1
    assert sync["what_if"]["saving_share"] < 0.02


def test_graph_fix_is_the_steps_gpu_work_back_to_back():
    run = HERE / "fixtures" / "h100_rounds12" / "decode_vs_graph"
    report = report_of(run)
    launch = next(f for f in report["findings"] if f["id"] == "launch_overhead")
    # the same decode as a CUDA graph, timed in the rounds
    measured_graph_ms = api.read_meta(run / "meta.json").data["fix_comparison"]["fixed_step_ms"]
    assert launch["what_if"]["fixed_step_ms"] == pytest.approx(measured_graph_ms, rel=0.10)
    assert "CUDA graph" in launch["what_if"]["fix"]


@pytest.mark.parametrize("name", ["h200/decode", "h200/item_sync", "h200_extra/host_work"])
def test_unprofiled_world_is_checked_against_the_measured_step(name):
    """These captures predate the probe: the profiler's costs come from the project's table for their torch version
    (2.11), and the world they build is checked against the timing phase's p50 (scaled where it misses it by over
    5%)."""
    path = HERE / "fixtures" / name
    report = report_of(path)
    section = report["what_if"]
    prof = section["profiler"]
    assert section["basis"] == "unprofiled"
    assert prof["estimated"] and "torch 2.11" in prof["costs_from"]
    measured = json.loads((path / "meta.json").read_text())["unprofiled"]["step_ms"]["p50"]
    assert prof["measured_unprofiled_step_ms"] == pytest.approx(measured, abs=1e-3)
    assert section["step_ms"] == pytest.approx(measured, rel=0.05)
    assert section["profiled_step_ms"] > prof["probe_step_ms"] > 0  # the probed costs take time out
    assert prof["probe_over_measured"] == pytest.approx(prof["probe_step_ms"] / prof["measured_unprofiled_step_ms"],
                                                       rel=1e-3)
    assert (prof["scale"] == 1.0) == (abs(prof["probe_over_measured"] - 1) <= 0.05)


def test_a_saving_of_the_cpu_side_stops_at_the_gpus_own_work():
    """A GPU-bound graph loop whose world replays the step 3% slower than measured (the host's time after each
    read-back, which the stackless pass still holds): a fix of the CPU side saves at most the measured step less the
    GPU's own work per step in the replay, whose graphs were timed unprofiled. The read-back's fix is capped there
    (0.28 ms replayed, 0.24 measured), and the report says from what to what."""
    path = HERE / "fixtures" / "h100_graph_timing" / "graph_sync_host_vs_no_item"
    report = report_of(path)
    section = report["what_if"]
    measured = section["profiler"]["measured_unprofiled_step_ms"]
    assert section["step_ms"] > measured
    assert section["headroom_ms"] == pytest.approx(measured - section["gpu_floor_ms"], abs=2e-4)
    assert section["gpu_busy_per_step_ms"] < section["gpu_floor_ms"] < measured
    tops = [f for f in report["findings"] if not f.get("parent") and f["what_if"]["saving_ms"] is not None]
    assert all(f["what_if"]["saving_ms"] <= section["headroom_ms"] + 1e-3 for f in tops)
    assert section["all_fixed"]["saving_ms"] <= section["headroom_ms"] + 1e-3
    item = next(f for f in tops if f["kind"] == "sync" and f["detail"]["kind"] == "item")
    assert item["what_if"]["replayed_saving_ms"] > item["what_if"]["saving_ms"]
    assert item["what_if"]["saving_ms"] == pytest.approx(section["headroom_ms"], abs=1e-3)
    measured_saving = json.loads((path / "meta.json").read_text())["fix_comparison"]["saving_ms"]
    assert abs(item["what_if"]["saving_ms"] - measured_saving) <= 0.25 * measured_saving
    assert "at best, the GPU's own work per step in the replay" in render_markdown(report)
    # the pageable upload's twin saves 0.02 ms of a 2.02 ms step; the replay gave 0.06, over 1% of the step off
    path = HERE / "fixtures" / "h100_graph_timing" / "graph_pageable_upload"
    report = report_of(path)
    comparison = json.loads((path / "meta.json").read_text())["fix_comparison"]
    upload = next(f for f in report["findings"] if not f.get("parent") and f["kind"] == "sync")
    assert abs(upload["what_if"]["replayed_saving_ms"] - comparison["saving_ms"]) > 0.01 * comparison["step_ms"]
    assert abs(upload["what_if"]["saving_ms"] - comparison["saving_ms"]) <= 0.01 * comparison["step_ms"]


@pytest.mark.parametrize("name", ["h100_stackless/graph_sync_host_vs_no_item", "h100_calibration/host_work"])
def test_no_cap_where_the_gpus_work_is_a_guess_or_the_host_bounds_the_step(name):
    """Without the graphs timed, the GPU's side of the world keeps the probe's guess at CUPTI's cost per node, too
    long to bound anything by; in a host-bound eager step the GPU's work is far below the step."""
    report = report_of(HERE / "fixtures" / name)
    assert not any("replayed_saving_ms" in (f.get("what_if") or {}) for f in report["findings"])
    if name.startswith("h100_stackless"):
        assert "headroom_ms" not in report["what_if"]


@pytest.mark.parametrize("name", ["h100_stackless/graph_sync_big_host", "h100_whatif/graph_pageable_upload"])
def test_the_checks_scale_is_the_least_the_measured_step_asks_for(name):
    """Where the probed costs miss the measured step, the scale that meets it is the least one: its world replays
    the step, and a scale a tenth smaller does not. (A bisection that stopped at any scale within 5% of the step had
    left these at 150x and 5.7x, a GPU with no gaps between its kernels.)"""
    from analyzer.views import whatif
    from analyzer.views.profiler_cost import ProfilerCost, event_costs

    ctx = api.views(api.load(HERE / "fixtures" / name, cache=False)).context
    prof = report_of(HERE / "fixtures" / name)["what_if"]["profiler"]
    assert prof["scale"] != 1.0 and prof["scale"] < whatif.SCALE_RANGE[1]
    measure = whatif.measure_for(ctx)
    target = prof["measured_unprofiled_step_ms"] * 1e6
    cost = ProfilerCost(ctx, ctx.replay, event_costs(ctx), measure.until_ns, target, measure.label)

    def step(scale: float) -> float:
        world = cost.world(scale)
        return measure.of(world, world.run(overhead=cost.cut(scale), cpu=False, until_ns=measure.until_ns))

    assert step(prof["scale"]) == pytest.approx(target, rel=2 * whatif.SCALE_RESOLUTION)
    assert step(prof["scale"] * 0.9) > target


@pytest.mark.skipif(not EXTERNAL_TRACES, reason="no ../shared/traces/external")
def test_a_trace_without_a_capture_is_priced_in_estimated_unprofiled_time():
    """No meta.json: the profiler's cost per event comes from the project's table (the newest torch with the
    trace's settings), taken out unchecked, and the report says it is an estimate."""
    report = report_of(EXTERNAL / "b200-vllm-eager.json.gz")
    section = report["what_if"]
    prof = section["profiler"]
    assert section["basis"] == "estimated" and prof["estimated"] and prof["probe_over_measured"] is None
    assert prof["scale"] == 1.0 and prof["events"] > 0
    assert section["step_ms"] < section["profiled_step_ms"]
    assert "estimated unprofiled run" in render_markdown(report)


def test_reports_rank_by_saving_and_show_it_beside_the_gpu_idle(tmp_path):
    report = report_of(HERE / "fixtures" / "h100_rounds12" / "print_tensor")
    md = render_markdown(report)
    lines = md.splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith("| # |"))
    assert "| saving | GPU idle |" in lines[at]
    rows = lines[at + 2:lines.index("", at)]
    tops = [r for r in rows if "↳" not in r]
    assert "launch_gap" in tops[0] and "formatting a tensor" in tops[1]  # 8.5 ms, then 0.39 ms, then queued (none)
    assert tops[-1].split("|")[-3].strip() == "–"
    assert "What fixing it buys: with the tensor formatting removed" in md  # the f-string that formats it
    html = api.render(report)["report.html"]
    assert "<th>saving</th>" in html.replace(" class=num", "") or ">saving<" in html


def test_compiled_decode_priced_against_its_reduce_overhead_capture():
    # h200_extra: the same 4-layer decode compiled with mode="default" and with mode="reduce-overhead", captured 22 s
    # apart (no interleaved noise band): unprofiled p50 1.100 -> 0.324 ms per step, a measured saving of 0.776 ms
    extra = HERE / "fixtures" / "h200_extra"
    launch = next(f for f in report_of(extra / "compile_decode")["findings"] if f["id"] == "launch_overhead")
    measured = report_of(extra / "compile_decode")["summary"]["step_time_us"]["unprofiled_p50"] / 1e3 - \
        report_of(extra / "compile_decode_reduce_overhead")["summary"]["step_time_us"]["unprofiled_p50"] / 1e3
    assert measured == pytest.approx(0.776, abs=0.001)
    assert launch["what_if"]["saving_ms"] == pytest.approx(measured, rel=TOLERANCE)


def test_a_partial_graph_fix_leaves_eager_launches_its_own_trace_prices():
    """h100_compile/hf_generate_static: hf_generate's measured fix (decode forwards replayed as CUDA graphs by
    torch.compile, prefill and generate()'s own ops eager). Its trace is a graph run, so the launch finding prices
    the eager launches left, not graph capture, and names them as the ones outside the graphs; the pathological
    trace's all-graphs bound sits below the fix's measured step (what the fix left undone)."""
    twin = report_of(HERE / "fixtures" / "h100_compile" / "hf_generate_static")
    launch = next(f for f in twin["findings"] if f["id"] == "launch_overhead")
    assert "already replays CUDA graphs" in launch["advice"] and "launches made eagerly outside" in launch["advice"]
    assert launch["what_if"]["fix"] == "the CPU time before each eagerly launched kernel taken out"
    assert 0 < launch["what_if"]["saving_ms"] < launch["what_if"]["step_ms"]
    region = [f for f in twin["findings"] if f["kind"] == "host_work" and "Torch-Compiled Region" in f["title"]]
    assert region and "compiled region" in region[0]["advice"] and "guard" in region[0]["advice"]
    bound = report_of(HERE / "fixtures" / "h100_rounds12" / "hf_generate")["what_if"]["all_fixed"]["fixed_step_ms"]
    measured_fix = api.read_meta(HERE / "fixtures" / "h100_rounds12" / "hf_generate" / "meta.json") \
        .data["fix_comparison"]["fixed_step_ms"]
    assert twin["what_if"]["gpu_busy_per_step_ms"] < bound < measured_fix


def test_the_launch_fix_graphs_the_loop_inside_generate_and_leaves_the_prefill_eager():
    """transformers' generate() (24 layers, 4 new tokens per call): the prefill forward, then a decode forward per
    token, each ended by the host's stopping check. The decode forwards (1047 kernels each, two kernels flipping
    between elementwise variants from one token to the next) recur inside the call and are priced as graph replays;
    the prefill (1071 kernels) runs once per call and stays eager. Measured: 62.84 -> 26.98 ms per call."""
    from analyzer.views.graphable import inner_loop
    from analyzer.views.whatif import loop_of, measure_for
    ctx = api.views(api.load(HERE / "fixtures" / "h100_rounds12" / "hf_generate", cache=False)).context
    model = ctx.replay
    loop = loop_of(ctx, model, measure_for(ctx))
    assert loop is not None and 0.5 < loop.share < 0.9
    # the 3 decode forwards, the 3 stopping checks' 8 kernels and 3 one-kernel segments before the prefill
    assert loop.graphed.sum() == 3 * 1047 + 3 * 8 + 3 and loop.first.sum() == loop.segments == 9
    eager = (model.step == 0) & ~loop.graphed
    assert eager.sum() >= 1071  # the prefill forward's kernels, and the rest that runs once per call
    report = report_of(HERE / "fixtures" / "h100_rounds12" / "hf_generate")
    launch = next(f for f in report["findings"] if f["id"] == "launch_overhead")
    assert "recurs inside each generate" in launch["what_if"]["fix"]
    assert launch["what_if"]["fixed_step_ms"] > report["what_if"]["all_fixed"]["fixed_step_ms"] * 1.5
    # a decode loop whose step is one forward has no loop of its own: the whole step is the graph
    ctx = api.views(api.load(HERE / "fixtures" / "h100_rounds12" / "decode_vs_graph", cache=False)).context
    assert inner_loop(ctx.replay, measure_for(ctx).steps, ctx.model.gpu.name[ctx.replay.rows],
                      ctx.replay.launch_ns) is None


def test_calibration_uses_the_unprofiled_timing_nearest_the_profiled_window():
    """A capture with timing.compare_fix times this workload again in the comparison's rounds, right before the
    profiled window: that p50 is the one the profiler's cost is calibrated to (the host drifted from 11.68 ms in
    the timing phase to 9.37 ms in the rounds); without a comparison, the timing phase's p50."""
    run = HERE / "fixtures" / "h100_rounds12" / "decode_vs_graph"
    meta = api.read_meta(run / "meta.json").data
    rounds, timing = meta["fix_comparison"]["step_ms"], meta["unprofiled"]["step_ms"]["p50"]
    assert abs(rounds - timing) > 0.1 * rounds  # the two differ: which one is used shows
    report = report_of(run)
    prof = report["what_if"]["profiler"]
    assert prof["measured_unprofiled_step_ms"] == pytest.approx(rounds, abs=1e-3)
    assert "fix_comparison" in prof["measured_by"]
    assert report["what_if"]["step_ms"] == pytest.approx(rounds, rel=0.05)
    report = report_of(HERE / "fixtures" / "h200" / "decode")
    prof = report["what_if"]["profiler"]
    assert prof["measured_by"] == "meta.json unprofiled.step_ms.p50"


@pytest.mark.parametrize("name,loop", [("h200_extra/hf_generate", True), ("h200/decode", False)])
def test_launch_advice_follows_the_fix_that_was_priced(name, loop):
    """Where the launch fix is priced as the loop inside each step replayed as graphs (generate(): one forward per
    new token between host syncs), the advice says to capture one iteration, not the whole step; where the whole step
    is the graph (a decode loop), it says to capture the step."""
    launch = next(f for f in report_of(HERE / "fixtures" / name)["findings"] if f["id"] == "launch_overhead")
    priced_as_loop = "recurs inside each" in launch["what_if"]["fix"]
    assert priced_as_loop == loop
    assert ("capture one iteration" in launch["advice"]) == loop
    assert ("Capture the" in launch["advice"] and "step in a CUDA graph" in launch["advice"]) == (not loop)


@pytest.mark.parametrize("path", [p for p in PAIRS if p.parent.name.startswith("h100_")
                                  and (p / "meta.json").is_file()])  # captures of this project's, with a probe
def test_a_capture_with_a_probe_is_priced_with_its_own_costs(path):
    """Captures made with the probe (meta.json profiler_cost): its costs, not the table's, build the unprofiled
    world, and a CUDA graph launch call costs its graph's nodes on top (CUPTI traces each one)."""
    report = report_of(path)
    prof = report["what_if"]["profiler"]
    probed = json.loads((path / "meta.json").read_text())["profiler_cost"]["per_event_us"]
    assert prof["costs_from"] == "this capture's probe" and not prof["estimated"]
    assert {k: prof["per_event_us"][k] for k in probed} == pytest.approx(probed)
    assert all(prof["per_event_us"][k] == 0 for k in set(prof["per_event_us"]) - set(probed))  # an older probe
    assert probed["graph_node"] > 0 and probed["launch"] > 0
    if path.name.startswith("graph_"):  # captured with the probe's GPU side: CUPTI's time between graph nodes
        assert probed["gpu_graph_node"] > 0 and probed["gpu_queued_kernel"] > 0
        assert "less CUPTI's time per node" in report["what_if"]["graph_node_gap_source"]
    assert report["what_if"]["basis"] == "unprofiled"
    assert prof["probe_step_ms"] < report["what_if"]["profiled_step_ms"]


def test_a_fix_that_changes_only_some_steps_says_what_it_saves_on_average():
    """alloc_churn's window (H100, 12 rounds): the steady-state cudaMalloc/cudaFree calls fall in a minority of the
    measured steps, so the median step does not move without them (saving 0), while the steps that hold them do:
    the finding gives the mean saving per step, and the report says why the median one is 0."""
    run = HERE / "fixtures" / "h100_rounds12" / "alloc_churn"
    raw = raw_events(run / "rank0.trace.json.gz")
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("cat") == "user_annotation"
             and e["name"].startswith("decode_step#")]
    calls = [e for e in raw if e.get("name") in ("cudaMalloc", "cudaFree")]
    measured = steps[:-1]  # the what-if's steps: all but the last, whose period is only its own span
    holding = {k for k, (a, b) in enumerate(measured) for e in calls if a <= e["ts"] < b}
    assert 0 < len(holding) < len(measured) / 2
    report = report_of(run)
    assert report["what_if"]["steps_used"] == len(measured)
    churn = next(f for f in report["findings"] if f["id"] == "allocator")
    w = churn["what_if"]
    assert w["saving_ms"] < 0.01 < w["mean_saving_ms"] < sum(e["dur"] for e in calls) / 1e3
    assert (f"The fix changes only some of the {report['what_if']['steps_used']} steps, and the median step is one "
            f"it leaves alone: on average it saves") in render_markdown(report)
    steady = next(f for f in report["findings"] if f["kind"] == "launch_gap" and not f.get("parent"))
    assert "mean_saving_ms" not in steady["what_if"]  # a fix that moves the median step needs no average


def test_a_price_on_a_guessed_profiler_cost_says_its_span():
    """A vLLM trace from elsewhere (no probe, no unprofiled step): the profiler's cost on its host is a guess, so the
    window and each saving are also priced at the ends of the span the project's captures measured. The launch fix
    of a launch-bound window moves by far more than a fifth across it and says so, with its range in the table, and
    so does a host-work fix of Python code (its slowdown under the stack tracer is a guess too); a
    one-time cost that the profiler barely touches does not. A capture with its own probe gives no span."""
    path = EXTERNAL / "b200-vllm-eager.json.gz"
    if not path.exists():
        pytest.skip(f"{path} not present")
    report = report_of(path)
    guess = report["what_if"]["profiler"]["guess"]
    assert guess["scales"] == [0.9, 2.7] and guess["step_ms"][0] < report["what_if"]["step_ms"] <= guess["step_ms"][1]
    by_kind = {f["kind"]: f["what_if"] for f in report["findings"] if not f.get("parent")}
    launch, warmup = by_kind["launch_gap"], by_kind["warmup"]
    assert launch["depends_on_guess"] and launch["saving_range_ms"][0] < launch["saving_ms"] <= \
        launch["saving_range_ms"][1]
    assert not warmup["depends_on_guess"]
    text = render_markdown(report)
    low, high = launch["saving_range_ms"]
    # and a host-work fix that removes Python code, whose slowdown under the stack tracer is also a guess
    work = next(f["what_if"] for f in report["findings"] if f["kind"] == "host_work" and not f.get("parent"))
    assert work["depends_on_guess"] and work["python_under_stacks"] == [1.0, 3.1]
    assert f"{low:.2f} ms–{high:.2f} ms" in text and "2 findings' savings depend on that guess" in text
    own = report_of(HERE / "fixtures" / "h200" / "decode")
    assert "guess" not in own["what_if"]["profiler"]
    assert not any("saving_range_ms" in (f.get("what_if") or {}) for f in own["findings"])


def test_a_read_back_inside_a_compiled_region_is_priced_without_the_region():
    """A graph break's `.item()` runs eagerly inside the `Torch-Compiled Region` op that wraps the compiled sampler
    (1.1 ms, with both graphs' kernels). The fix removes the read-back (aten::item and its wait), not the region: the
    region's kernels and the second graph's launch stay. Before, it took the whole region out (0.57 ms a step, 23%)."""
    from analyzer.detectors import syncs
    from analyzer.views.context import AnalysisContext
    trace = api.load(HERE / "fixtures" / "h100_compile" / "compile_graph_break", cache=False)
    ctx = AnalysisContext(trace.model, trace.meta)
    fix = next(f for f in syncs.detect(ctx).findings if f.kind == "sync" and "item" in f.title).fix
    ops, names = ctx.model.ops, ctx.model.names
    item = np.flatnonzero([names[c] == "aten::item" for c in ops.name])
    assert len(fix.removed) == 6
    for _tid, start, end in fix.removed.tolist():
        assert ((ops.start_ns[item] == start) & (ops.end_ns[item] == end)).any()
    report = report_of(HERE / "fixtures" / "h100_compile" / "compile_graph_break")
    sync = next(f for f in report["findings"] if f["kind"] == "sync")
    assert 0 < sync["what_if"]["saving_ms"] < 0.1


def test_severity_on_a_dilated_trace_is_the_fixs_share_of_the_unprofiled_step(tmp_path):
    """h100_stackless/graph_sync_host_vs_no_item: a CUDA-graph decode at batch 8, 2.24 ms a step unprofiled, 5.65 ms
    profiled. In the profiled window launch gaps are 63% of the idle (high); replayed as graphs the unprofiled step
    saves ~1% (low). The .item() read-back leaves 38 µs idle in the window (info) and its fix measured 0.24 ms of
    2.24 ms (11%): high. Without the capture's meta.json the dilation is a guess, and the window's severities stay."""
    run = HERE / "fixtures" / "h100_stackless" / "graph_sync_host_vs_no_item"
    report = report_of(run)
    by_kind = {f["kind"]: f for f in report["findings"] if not f.get("parent")}
    launch, sync = by_kind["launch_gap"], by_kind["sync"]
    assert launch["severity"] == "low" and launch["what_if"]["severity_from"]["window_severity"] == "high"
    assert all(f["severity"] == "low" for f in report["findings"] if f.get("parent") == launch["id"])
    assert sync["severity"] == "high" and sync["what_if"]["severity_from"]["window_severity"] == "info"
    assert "judged on the unprofiled step, which the profiler dilated 2.5x" in render_markdown(report)

    bare = tmp_path / "bare.json.gz"
    bare.write_bytes((run / "rank0.trace.json.gz").read_bytes())
    guessed = report_of(bare)
    assert guessed["what_if"]["basis"] == "estimated"
    by_kind = {f["kind"]: f for f in guessed["findings"] if not f.get("parent")}
    assert by_kind["launch_gap"]["severity"] == "high" and by_kind["sync"]["severity"] == "info"
    assert not any("severity_from" in (f.get("what_if") or {}) for f in guessed["findings"])


def test_an_in_thread_loader_price_says_how_many_workers_keep_up():
    """The DataLoader pair (num_workers=0, tokenizing in __getitem__) is priced with the loading fully hidden; the
    sentence says how many workers that takes, from the loading's time and the rest of the step, since the twin's 2
    workers leave its step loader-bound (13.72 ms against the 4.61 ms the price assumes)."""
    report = report_of(HERE / "fixtures" / "h100_plain_pairs_again" / "dataloader_tokenize" / "trace.json.gz")
    (f,) = [f for f in report["findings"] if f["kind"] == "input_wait"]
    w = f["what_if"]
    workers = -(-w["saving_ms"] // w["fixed_step_ms"])
    assert workers == 5
    assert f"so it takes at least {workers:.0f} workers" in render_markdown(report)
