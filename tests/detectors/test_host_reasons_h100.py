"""Host time with a reason on H100 captures of user-style scripts (tests/fixtures/h100_host_reasons, made by
scripts/make_host_reason_fixtures.sh on torch 2.11 + CUDA 13): cuDNN attention building a plan per sequence length,
a tokenizer thread holding the GIL, a per-step Python detokenizer, kernels first launched in the window. Each claim
is checked against the raw events and the unprofiled timings of the fixed twin (truth.json, interleaved rounds), and
against what the trace cannot show once the events that support it are stripped."""
import json
from pathlib import Path

import pytest

import tracecuts
from conftest import report_of
from rawtrace import raw_events

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "h100_host_reasons"


def trace(name: str) -> Path:
    return FIX / name / "trace.json.gz"


def truth(name: str) -> dict:
    return json.loads((FIX / name / "truth.json").read_text())


def top(report: dict, kind: str) -> dict | None:
    return next((f for f in report["findings"] if f["kind"] == kind and not f.get("parent")), None)


def test_cudnn_attention_over_a_growing_cache_builds_a_plan_every_step():
    """Each step attends over k_cache[:, :, :pos + 1]: the first layer's aten::_cudnn_attention_forward builds a
    plan for the new length (~40 ms), the other three layers reuse it at the same shape. That a shape's later calls
    are fast does not make the set-up one-time: a new shape arrives every step. The finding leads, recurring, per
    step, within 15% of what the fixed-size cache saved unprofiled; no warm-up finding claims it, the steps are
    not read as cold, and no CUDA graph is priced over it."""
    raw = raw_events(trace("sdpa_growing_cache"))
    calls = sorted((e for e in raw if e.get("name") == "aten::_cudnn_attention_forward"), key=lambda e: e["ts"])
    slow = [c for c in calls if c["dur"] > 10_000]
    assert len(calls) == 24 and len(slow) == 6
    assert len({json.dumps(c["args"]["Input Dims"]) for c in slow}) == 6
    report = report_of(trace("sdpa_growing_cache"))
    f = report["findings"][0]
    assert f["kind"] == "shape_setup" and f["detail"]["recurrence"] == "recurring" and f["count"] == 6
    assert f["title"].startswith("cuDNN set-up for each new input shape in aten::_cudnn_attention_forward")
    assert "sdpa_kernel" in f["advice"] and "fixed-size cache" in f["advice"]
    assert report["what_if"]["measure"] == "step"
    warmup = top(report, "warmup")
    assert warmup is None or warmup["impact_us"] < 1_000
    assert "replays only the shapes it captured" in top(report, "launch_gap")["what_if"]["fix"]
    assert f["what_if"]["saving_ms"] == pytest.approx(truth("sdpa_growing_cache")["saving_fixed_ms"], rel=0.15)


def test_a_fixed_size_cache_has_no_set_up_to_name():
    report = report_of(trace("sdpa_fixed_cache"))
    assert top(report, "shape_setup") is None and report["gaps"]["by_cause"]["setup"] == 0
    assert report["findings"][0]["kind"] == "launch_gap"


def test_a_tokenizer_thread_holding_the_gil_is_named_and_priced_within_its_span():
    """A one-worker ThreadPoolExecutor tokenizes in pure Python while the launching thread runs an eager step: the
    launching thread's torch calls return to Python only when the tokenizer drops the GIL (5 ms slices), so
    `<built-in function linear>` stays open ~5 ms after aten::linear ended. The finding names the worker thread and
    tokenize(), says the launching thread sat in a torch call waiting for the GIL, and prices moving it to a process
    with a span that holds the measured saving (the tokenizer's bytecode ran slower under the stack tracer, by a
    factor no event records)."""
    report = report_of(trace("tokenizer_threads"))
    held = [f for f in report["findings"] if f["kind"] == "host_work" and f["detail"].get("held_by")]
    assert len(held) == 1
    f = held[0]
    by = f["detail"]["held_by"]
    raw = raw_events(trace("tokenizer_threads"))
    worker = {e["tid"] for e in raw if e.get("name", "").endswith(": tokenize")}
    assert {by["tid"]} == worker and by["tid"] not in by["launching_tids"]
    assert by["binding"].startswith("<built-in") and "tokenize()" in f["title"] and "holding the GIL" in f["title"]
    assert "ProcessPoolExecutor" in f["advice"] and "waiting for the GIL" in f["advice"]
    low, high = f["what_if"]["saving_range_ms"]
    measured = truth("tokenizer_threads")["saving_process_ms"]
    assert low <= measured <= high


def test_a_tokenizer_in_a_process_holds_no_gil_of_the_launching_thread():
    report = report_of(trace("tokenizer_processes"))
    assert not any(f["detail"].get("held_by") for f in report["findings"] if f["kind"] == "host_work")


def test_without_python_stacks_no_thread_is_said_to_hold_the_gil(tmp_path):
    """The same trace with its python_function events dropped (as most users' traces are): nothing shows what
    another thread ran, so no holder is named."""
    cut, dropped = tracecuts.drop_category(tracecuts.read(trace("tokenizer_threads")), "python_function")
    assert dropped > 5_000
    report = report_of(tracecuts.write(cut, tmp_path / "nostacks.json.gz"))
    assert not any((f.get("detail") or {}).get("held_by") for f in report["findings"])
    assert not any("GIL" in f["title"] for f in report["findings"])


def test_a_per_step_python_detokenizer_is_named_and_its_price_span_holds_the_fix():
    """16 steps, each followed by a pure-Python detokenize of the text so far while nothing is queued: the finding
    names detokenize(); its price on this guessed trace spans what deferring it to the end saved unprofiled (its
    bytecode ran ~3x slower under the stack tracer); the twin that detokenizes at the end has no such finding."""
    report = report_of(trace("detokenize_steps"))
    f = top(report, "host_work")
    assert "detokenize()" in f["title"] and f["count"] == 16
    low, high = f["what_if"]["saving_range_ms"]
    assert f["what_if"]["depends_on_guess"] and f["what_if"]["python_under_stacks"] == [1.0, 3.1]
    assert low <= truth("detokenize_steps")["saving_end_ms"] <= high
    fixed = report_of(trace("detokenize_at_end"))
    assert not any("detokenize()" in f["title"] for f in fixed["findings"])


def test_kernels_first_launched_in_the_window_are_one_time_and_the_steps_priced_warm():
    """A warmed-up model whose sampler first runs in the window: the first multinomial / topk / div calls load
    their modules (lazy loading), ~0.3 s before the steady steps. The window's head is one-time cost, priced over
    the window, and the steps are priced on the warm ones: the estimate's span holds the warm step measured
    unprofiled."""
    report = report_of(trace("first_launch_window"))
    warmup = report["findings"][0]
    assert warmup["kind"] == "warmup" and warmup["impact_us"] >= 0.9 * report["summary"]["gpu_idle_us"]
    assert "aten::multinomial" in warmup["title"] and "CUDA_MODULE_LOADING" in warmup["advice"]
    assert warmup["what_if"]["once_ms"] > 200
    low, high = report["what_if"]["profiler"]["guess"]["step_ms"]
    assert low <= truth("first_launch_window")["warm_unprofiled_ms_per_step"] <= high
