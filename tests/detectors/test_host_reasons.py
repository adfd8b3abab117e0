"""Host time with a reason, on real H200 captures of user-style scripts (tests/fixtures/h200_host_reasons, made by
scripts/make_host_reason_fixtures.sh): every claim is checked against the raw events, the unprofiled timings of the
fixed twins (truth.json) and what the trace cannot show."""
import json
from collections import Counter
from pathlib import Path

import pytest

import tracecuts
from conftest import report_of
from rawtrace import raw_events

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "h200_host_reasons"


def trace(name: str) -> Path:
    return FIX / name / "trace.json.gz"


def truth(name: str) -> dict:
    return json.loads((FIX / name / "truth.json").read_text())


def top(report: dict, kind: str) -> dict | None:
    return next((f for f in report["findings"] if f["kind"] == kind and not f.get("parent")), None)


def conv_calls(events):
    return sorted((e for e in events if e.get("name") == "aten::cudnn_convolution"), key=lambda e: e["ts"])


def syncs_inside(events, call):
    return sum(1 for e in events if e.get("name") in ("cudaDeviceSynchronize", "cudaEventSynchronize")
               and call["ts"] <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"])


def test_cudnn_benchmark_at_a_new_shape_every_step_is_recurring_set_up():
    """cudnn.benchmark=True with images of a new size every step: each of the 24 convolutions in the window runs at a
    shape never seen before and times candidate algorithms (dozens of kernels and syncs inside one call). The finding
    names cuDNN's search as a per-step cost, its advice turns benchmark off or buckets shapes, the search's syncs
    and trial allocations are not sync or churn findings, and no CUDA-graph fix is priced over it. Its saving is
    within 15% of what padding every image to one size saved unprofiled (truth.json, 8 interleaved rounds)."""
    raw = raw_events(trace("cudnn_benchmark_new_shapes"))
    calls = conv_calls(raw)
    assert len(calls) == 24 and len({json.dumps(c["args"]["Input Dims"]) for c in calls}) == 24
    assert all(syncs_inside(raw, c) >= 4 for c in calls)
    report = report_of(trace("cudnn_benchmark_new_shapes"))
    f = report["findings"][0]
    assert f["kind"] == "shape_setup" and f["count"] == 24 and f["detail"]["recurrence"] == "recurring"
    assert f["title"].startswith("cuDNN set-up for each new input shape in aten::cudnn_convolution")
    assert "in 6 of 6 steps" in f["title"] and "cudnn.benchmark=True" in f["advice"]
    assert f["impact_us"] >= 0.9 * report["summary"]["gpu_idle_us"]
    assert not any(g["kind"] == "sync" and g["count"] > 6 for g in report["findings"])
    assert report["allocator"]["setup_calls"] >= 70
    launch = top(report, "launch_gap")
    assert "replays only the shapes it captured" in launch["what_if"]["fix"]  # priced without graphs
    measured = truth("cudnn_benchmark_new_shapes")["saving_fixed_ms"]
    assert f["what_if"]["saving_ms"] == pytest.approx(measured, rel=0.15)


def test_a_few_recurring_shapes_pay_their_set_up_once():
    """The same net fed from three size buckets: the window's first step at the third bucket searches (the profiler's
    warm-up steps saw the other two), its later calls at the same shapes take a fraction of a millisecond. That is
    one-time set-up, the warm-up finding's, and no set-up finding says it recurs."""
    raw = raw_events(trace("cudnn_benchmark_few_shapes"))
    by_shape = {}
    for c in conv_calls(raw):
        by_shape.setdefault(json.dumps(c["args"]["Input Dims"]), []).append(c)
    slow = [calls[0] for calls in by_shape.values() if calls[0]["dur"] > 10_000]
    assert slow and all(all(c["dur"] < 1_000 for c in by_shape[json.dumps(s["args"]["Input Dims"])][1:])
                        for s in slow)
    report = report_of(trace("cudnn_benchmark_few_shapes"))
    assert top(report, "shape_setup") is None
    warmup = report["findings"][0]
    assert warmup["kind"] == "warmup"
    (conv,) = [p for p in warmup["detail"]["breakdown"] if p["api"] == "aten::cudnn_convolution"]
    assert conv["kind"] == "shape set-up" and conv["idle_us"] >= 0.9 * sum(s["dur"] for s in slow)


def test_one_padded_shape_has_no_set_up_in_the_window():
    """The fixed twin: every image padded to one size, searched before the window. Nothing is set-up, and the step
    reads as what it is: launch-bound."""
    report = report_of(trace("cudnn_benchmark_fixed_shape"))
    assert top(report, "shape_setup") is None
    assert not any("set-up" in p.get("text", "") for f in report["findings"] if f["kind"] == "warmup"
                   for p in f["detail"]["breakdown"])
    assert report["findings"][0]["kind"] == "launch_gap"


def test_without_shapes_the_search_is_not_named_set_up(tmp_path):
    """record_shapes off: the per-step search cannot be told from slow calls of another cause, so no set-up is
    claimed; the input_shapes check says why and the host-work finding that names the op is not of high
    confidence."""
    cut, stripped = tracecuts.strip_arg(tracecuts.read(trace("cudnn_benchmark_new_shapes")), "Input Dims")
    assert stripped >= 300
    report = report_of(tracecuts.write(cut, tmp_path / "noshapes.json.gz"))
    assert top(report, "shape_setup") is None and report["gaps"]["by_cause"]["setup"] == 0
    shapes = next(c for c in report["validity"]["checks"] if c["name"] == "input_shapes")
    assert shapes["status"] == "warn"
    work = top(report, "host_work")
    assert work["confidence"] != "high" and "input_shapes" in work["confidence_checks"]


def test_a_cold_process_recorded_on_the_gpu_side_only():
    """The process's first CUDA calls, cuDNN's first convolutions and autotuning, recorded with
    activities=[ProfilerActivity.CUDA] alone (no CPU op, no Python frame). The context's creation (the first runtime
    call, far longer than the API's later calls) and module loading at a kernel's first launch are one-time; the
    host_side_recorded check warns that no site can be named; no finding built on the host side is of high
    confidence. (The context is created by the first call that needs one: here cudaDeviceGetStreamPriorityRange,
    146 ms, after device queries of microseconds.)"""
    raw = raw_events(trace("cold_first_forward_cuda_only"))
    cats = Counter(e.get("cat") for e in raw if e.get("ph") == "X")
    assert cats["cpu_op"] == 0 and cats["python_function"] == 0 and cats["kernel"] > 200
    calls = sorted((e for e in raw if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    first = next(e for e in calls if e["dur"] > 1000)
    assert first["dur"] > 100_000 and all(e["dur"] < 100 for e in calls[:calls.index(first)])
    report = report_of(trace("cold_first_forward_cuda_only"))
    assert "host_side_recorded" in report["validity"]["warned"]
    warmup = top(report, "warmup")
    assert f"{first['name']} (first call)" in warmup["title"]
    assert any(p["kind"] == "first call" and p["api"].startswith("cudaLaunchKernel") for p in
               warmup["detail"]["breakdown"])
    assert warmup["impact_us"] >= first["dur"]
    cpu_side = [f for f in report["findings"] if f["kind"] in ("host_work", "launch_gap", "warmup")]
    assert cpu_side and all(f["confidence"] != "high" for f in cpu_side)
