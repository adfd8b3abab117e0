"""What a fix buys (analyzer/views/whatif.py) on real traces: every committed fixture and external trace gets a
saving per top-level finding that never makes a step slower and never goes below the GPU's own work, or says why it
has none; the H200 pairs' predictions fall within their measured noise band or 25% (benchmarks/what_if.py); the
reports rank by saving and show it next to the GPU idle."""
import importlib.util
from pathlib import Path

import pytest

from analyzer import api
from analyzer.report.markdown import render_markdown
from conftest import report_of

HERE = Path(__file__).resolve().parents[1]
REPO = HERE.parent
FIXTURES = sorted(p.parent for p in (HERE / "fixtures").glob("*/*/rank0.trace.json.gz"))
PAIRS = sorted(p for p in (HERE / "fixtures" / "h200_whatif").iterdir() if p.is_dir())
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
    # numpy's top-p sort takes 7.4 ms per step in the profiled trace, but removing it saves 5.4 ms unprofiled
    # (band 3.9-6.2): the profiled window runs the sampler's C code ~35% slower than the unprofiled rounds, which a
    # per-event profiler cost cannot model (the sampler records a dozen events). Captured on an H100 whose host
    # speed drifted between phases (timing-phase p50 15.7 ms, comparison rounds 13.5 ms).
    "numpy_sampler": "over",
    # transformers' fix (one StaticCache reused; generate() compiles the decode forward with reduce-overhead) graphs
    # 3 of the 4 forwards of a generate() call: the prefill forward and generate()'s own ops stay eager (2700 eager
    # launches per 2 calls in h100_compile/hf_generate_static). The replay prices the whole call as graphs, the
    # bound: 102 -> 14 ms predicted, 63 -> 27 ms measured. The timing phase the calibration uses ran at 102 ms, the
    # interleaved comparison rounds at 63 ms (the H100 host's speed drifted between the phases).
    "hf_generate": "over",
}


@pytest.mark.parametrize("path", PAIRS, ids=[p.name for p in PAIRS])
def test_prediction_is_within_the_measured_noise_band_or_25_percent(path):
    bench = what_if_bench()
    row = bench.row_for(path)
    assert row["predicted_ms"] is not None, row
    assert row["sign_right"], row
    if path.name in KNOWN_MISSES:
        assert not row["within"] and row["predicted_ms"] > row["band_ms"][1], row
    else:
        assert row["within"], row


def test_serving_pair_predicts_the_session_the_fixed_engine_serves():
    """serve (the loop parks 1 ms in asyncio.sleep between steps) against serve_no_sleep, two captures of the same
    traffic on the H200: the event-loop finding's saving per engine step times the steps of a session, against the
    measured session times (tests/fixtures/h200_serve, meta.json serving.unprofiled.sessions)."""
    bench = what_if_bench()
    (name,) = bench.SESSION_PAIRS
    row = bench.session_row(name)
    assert row["within"] and row["sign_right"], row
    assert row["measured_ms"] == pytest.approx(16.38, abs=0.01) and row["predicted_ms"] > 0


def test_a_fix_that_buys_nothing_is_predicted_to_buy_nothing():
    # item_sync's .item() in a launch-bound eager decode: measured -0.15 ms per step (band -1.13 … 0.77)
    report = report_of(HERE / "fixtures" / "h200_whatif" / "item_sync")
    sync = next(f for f in report["findings"] if f["kind"] == "sync" and f["detail"]["kind"] == "item")
    assert sync["what_if"]["saving_ms"] < 0.1
    assert sync["what_if"]["saving_share"] < 0.02


def test_graph_fix_is_the_steps_gpu_work_back_to_back():
    report = report_of(HERE / "fixtures" / "h200_whatif" / "decode_vs_graph")
    launch = next(f for f in report["findings"] if f["id"] == "launch_overhead")
    measured_graph_ms = 1.864  # meta.json fix_comparison.fixed_step_ms: the same decode as a CUDA graph
    assert launch["what_if"]["fixed_step_ms"] == pytest.approx(measured_graph_ms, rel=0.10)
    assert "CUDA graph" in launch["what_if"]["fix"]


@pytest.mark.parametrize("path", PAIRS, ids=[p.name for p in PAIRS])
def test_unprofiled_world_is_calibrated_to_the_measured_step(path):
    report = report_of(path)
    section = report["what_if"]
    assert section["basis"] == "unprofiled"
    measured = report["summary"]["step_time_us"]["unprofiled_p50"] / 1e3
    assert section["step_ms"] == pytest.approx(measured, rel=0.02)
    assert section["profiled_step_ms"] > section["step_ms"]  # the profiler dilates these CPU-bound steps
    assert section["profiler"]["predicted_over_measured"] is not None
    assert section["profiler"]["calibrated_op_event_us"] > 0  # a cost per recorded event explains the dilation


@pytest.mark.skipif(not EXTERNAL_TRACES, reason="no ../shared/traces/external")
def test_a_trace_without_a_measured_step_is_priced_in_its_own_time():
    report = report_of(EXTERNAL / "b200-vllm-eager.json.gz")
    section = report["what_if"]
    assert section["basis"] == "profiled" and section["profiler"]["predicted_over_measured"] is None
    assert "profiled" in render_markdown(report)


def test_reports_rank_by_saving_and_show_it_beside_the_gpu_idle(tmp_path):
    report = report_of(HERE / "fixtures" / "h200_whatif" / "print_tensor")
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
    bound = report_of(HERE / "fixtures" / "h200_whatif" / "hf_generate")["what_if"]["all_fixed"]["fixed_step_ms"]
    measured_fix = api.read_meta(HERE / "fixtures" / "h200_whatif" / "hf_generate" / "meta.json") \
        .data["fix_comparison"]["fixed_step_ms"]
    assert twin["what_if"]["gpu_busy_per_step_ms"] < bound < measured_fix
