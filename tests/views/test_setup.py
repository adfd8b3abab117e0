"""Set-up for a new input shape inside a library op (analyzer.views.setup), on real traces: what is claimed, checked
against the raw events' Input Dims and durations, and what is not claimed once the shapes are gone."""
import json
from pathlib import Path

import pytest

import tracecuts
from conftest import report_of
from rawtrace import raw_events

REPO = Path(__file__).resolve().parents[2]
COLD = REPO / "tests/fixtures/h200_foreign/cold_first_forward/trace.json.gz"
EXTERNAL = REPO.parent / "shared/traces/external"


def finding(report, kind):
    return next((f for f in report["findings"] if f["kind"] == kind and not f.get("parent")), None)


def first_calls_by_shape(events, name):
    by_shape = {}
    for e in sorted((e for e in events if e.get("cat") == "cpu_op" and e["name"] == name), key=lambda e: e["ts"]):
        by_shape.setdefault(json.dumps(e["args"].get("Input Dims")), []).append(e)
    return by_shape


def test_a_cold_forwards_first_calls_at_each_shape_are_one_time_set_up():
    """cudnn.benchmark on, the process's first forward in the window: each convolution's first call at its shape runs
    cuDNN's algorithm search (63 device and event synchronizes in all), and its later calls at the same shapes (the next two
    forwards) take ~50 us. So that time is one-time set-up: the warm-up finding leads with it, owns at least 80% of
    the window's idle, and the search's synchronizes are not a sync finding."""
    raw = raw_events(COLD)
    report = report_of(COLD)
    by_shape = first_calls_by_shape(raw, "aten::cudnn_convolution")
    assert len(by_shape) == 3 and all(len(calls) == 3 for calls in by_shape.values())
    slow = [calls[0] for calls in by_shape.values()]
    assert all(c["dur"] > 50_000 for c in slow[:2]) and all(c["dur"] < 1_000 for calls in by_shape.values()
                                                           for c in calls[1:])
    top = report["findings"][0]
    assert top["kind"] == "warmup"
    assert top["impact_us"] >= 0.8 * report["summary"]["gpu_idle_us"]
    (conv,) = [p for p in top["detail"]["breakdown"] if p["api"] == "aten::cudnn_convolution"]
    assert conv["kind"] == "shape set-up" and conv["text"].startswith("cuDNN set-up for a new input shape")
    assert conv["idle_us"] >= 0.9 * sum(c["dur"] for c in slow) - 10_000
    assert "keep the shapes few" in top["advice"]
    syncs = [e for e in raw if e.get("name") in ("cudaDeviceSynchronize", "cudaEventSynchronize")
             and any(c["ts"] <= e["ts"] <= c["ts"] + c["dur"] for c in slow)]
    assert len(syncs) >= 60
    assert not any(f["kind"] == "sync" and "forward()" in (f["call_site"] or "") for f in report["findings"])
    assert not any(f["kind"] in ("shape_setup", "host_work") for f in report["findings"])


def test_without_shapes_no_set_up_is_claimed(tmp_path):
    """The same trace without Input Dims (record_shapes off): nothing tells a first call at a shape from a thread that
    lost its core, so no call is named set-up; the first calls of each op stay one-time (first call of its name),
    and the second convolution's long call is host work whose advice says record_shapes would tell."""
    cut, stripped = tracecuts.strip_arg(tracecuts.read(COLD), "Input Dims")
    assert stripped > 700
    report = report_of(tracecuts.write(cut, tmp_path / "noshapes.json.gz"))
    assert report["shape_setup"]["shapes_recorded"] is False
    for f in report["findings"]:
        assert "new input shape" not in f["title"] and f["kind"] != "shape_setup"
    work = finding(report, "host_work")
    assert work and work["detail"]["tail_op"]["op"] == "aten::cudnn_convolution"
    assert "record_shapes=True shows whether" in work["advice"]


def test_set_up_at_shapes_that_never_come_back_is_not_called_one_time():
    """The Particle Transformer's first forward (no steps): two convolutions' first calls at shapes no later call
    repeats are far slower than the calls at a repeated shape. Nothing shows whether new shapes stop coming, so the
    finding says it cannot tell instead of 'paid once'."""
    path = EXTERNAL / "a100-particle-transformer-first-forward.json.gz"
    if not path.is_file():
        pytest.skip(f"{EXTERNAL} not present")
    report = report_of(path)
    setup = finding(report, "shape_setup")
    assert setup["detail"]["recurrence"] == "unknown" and setup["count"] == 2
    assert "cannot tell whether new shapes stop arriving" in setup["advice"]
    assert "a window without steps" in setup["title"]
    by_shape = first_calls_by_shape(raw_events(path), "aten::cudnn_convolution")
    lone = [calls[0] for calls in by_shape.values() if len(calls) == 1]
    assert len(lone) == 2 and setup["impact_us"] <= sum(c["dur"] for c in lone)
