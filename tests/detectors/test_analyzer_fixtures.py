"""The detectors on the committed real H200 captures: exact counts per pathology, checked against independent
counts of the raw events, and no false findings on the clean decode loop."""
from pathlib import Path

import re
import pytest

from analyzer.trace.runmeta import read_meta
from rawtrace import count_named, gpu_utilization, raw_events
from conftest import report_of

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "h200"
NAMES = ("alloc_churn", "batch_decode", "decode", "graph_decode", "item_sync", "prefill", "print_tensor")


@pytest.fixture(scope="module")
def reports():
    return {name: report_of(FIX / name) for name in NAMES}


def events(name):
    return raw_events(FIX / name / "rank0.trace.json.gz")


def kinds(report, kind):
    return [f for f in report["findings"] if f["kind"] == kind]


@pytest.mark.parametrize("name", NAMES)
def test_utilization_matches_an_independent_union(reports, name):
    expected, window_ns = gpu_utilization(events(name))
    summary = reports[name]["summary"]
    assert summary["gpu_utilization"] == pytest.approx(expected, abs=1e-3)
    assert summary["window_us"] == pytest.approx(window_ns / 1e3, abs=0.01)
    assert summary["gpu_busy_us"] + summary["gpu_idle_us"] == pytest.approx(summary["window_us"], abs=0.01)
    by_cause = reports[name]["gaps"]["by_cause"]
    assert sum(by_cause.values()) == pytest.approx(summary["gpu_idle_us"], abs=0.01)
    # the GPU idle of every sync site adds up to the idle time classified as `sync`
    assert sum(s["drain_us"] for s in reports[name]["syncs"]) == pytest.approx(by_cause["sync"], abs=0.01)


@pytest.mark.parametrize("name", NAMES)
def test_per_step_split_adds_up(reports, name):
    report = reports[name]
    steps = report["gaps"]["per_step"]
    assert len(steps) == report["summary"]["steps"] == (6 if name == "prefill" else 7)
    assert sum(s["busy_us"] for s in steps) <= report["summary"]["gpu_busy_us"] + 0.01
    assert sum(s["idle_us"] for s in steps) <= report["summary"]["gpu_idle_us"] + 0.01
    for s in steps:
        assert sum(s["idle_by_cause_us"].values()) == pytest.approx(s["idle_us"], abs=0.01)
        # each step launched its own GPU work: its span starts after the step began on the CPU
        assert s["gpu_ts_us"] >= s["ts_us"] and s["busy_us"] <= s["gpu_span_us"] + 0.001
    # the largest idle pieces name the step the per-step table charges them to (the one that launched the work
    # they waited for), never one that holds less idle of that cause
    by_name = {s["step"]: s for s in steps}
    for g in report["gaps"]["top"]:
        if g["step"] is not None:
            assert by_name[g["step"]]["idle_by_cause_us"][g["cause"]] >= g["dur_us"] - 0.01


def test_graph_replays_stay_in_the_step_that_launched_them(reports):
    """The CPU queues CUDA-graph replays faster than the GPU runs them; each step still owns one replay."""
    raw = events("graph_decode")
    steps = [s for s in reports["graph_decode"]["gaps"]["per_step"] if s["step"].startswith("decode_step")]
    graph_kernels = {e["args"]["correlation"] for e in raw if e.get("name") == "cudaGraphLaunch"}
    per_replay = sum(1 for e in raw if e.get("cat") == "kernel" and e["args"].get("correlation") in graph_kernels)
    assert per_replay % 6 == 0 and all(s["launches"] == 1 for s in steps)
    busy = sorted(s["busy_us"] for s in steps)
    assert busy[-1] < 1.5 * busy[len(busy) // 2]


def test_clean_decode_has_no_sync_or_churn_findings(reports):
    report = reports["decode"]
    assert kinds(report, "sync") == [] and kinds(report, "allocator_churn") == []
    assert report["allocator"]["cuda_malloc"] == count_named(events("decode"), "cudaMalloc") == 0
    # the only blocking call is the profiler's own synchronize when it stops, reported but not a finding
    assert [(s["kind"], s["api"], s["count"]) for s in report["syncs"]] == [("profiler", "cudaDeviceSynchronize", 1)]
    launch = kinds(report, "launch_gap")[0]
    assert launch["severity"] == "high" and report["gaps"]["by_cause"]["cpu_launch"] > 0.9 * report["summary"]["gpu_idle_us"]
    assert re.match(r"GPU idle (8|9)\d% ", launch["title"]) and "decode step" in launch["advice"]


def test_item_sync_site_and_count(reports):
    report = reports["item_sync"]
    raw = events("item_sync")
    site = next(s for s in report["syncs"] if s["kind"] == "item")
    assert site["call_site"] == "workloads/decode_item_sync.py:11"  # the exact line from the sync-debug pass
    assert site["api"] == "cudaStreamSynchronize" and site["op"] == "aten::item"
    assert site["count"] == count_named(raw, "aten::item") == count_named(raw, "cudaStreamSynchronize") == 6
    assert site["per_step"] == {f"decode_step#{k}": 1 for k in range(6)}
    assert site["drain_us"] > 0 and site["wait_us"] > 0
    finding = kinds(report, "sync")[0]
    assert finding["call_site"] == site["call_site"] and finding["impact_us"] == site["drain_us"]
    assert "non_blocking" in finding["advice"]
    assert report["gaps"]["by_cause"]["sync"] == pytest.approx(site["drain_us"], abs=0.01)


def test_print_counts_every_block(reports):
    report = reports["print_tensor"]
    raw = events("print_tensor")
    site = next(s for s in report["syncs"] if s["kind"] == "print")
    assert site["call_site"] == "workloads/decode_print.py:15"
    # each print of the 1-element tensor blocked twice (two host reads), as many as cudaStreamSynchronize calls
    assert site["count"] == count_named(raw, "cudaStreamSynchronize") == 12
    assert [f["call_site"] for f in kinds(report, "sync")] == [site["call_site"]]


def test_alloc_churn_counts(reports):
    report = reports["alloc_churn"]
    raw = events("alloc_churn")
    alloc = report["allocator"]
    assert alloc["cuda_malloc"] == count_named(raw, "cudaMalloc") > 0
    assert alloc["cuda_free"] == count_named(raw, "cudaFree") > 0
    finding = kinds(report, "allocator_churn")[0]
    assert "decode_alloc_churn.py" in finding["call_site"]
    frees = next(s for s in alloc["sites"] if "decode_alloc_churn.py" in s["call_site"])
    assert frees["cuda_free"] == count_named(raw, "cudaFree")
    reserved = [e["args"]["Total Reserved"] for e in raw if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1]
    assert alloc["reserved_peak_bytes"] == max(reserved)
    assert kinds(reports["decode"], "allocator_churn") == []


def test_graph_decode_launch_stats_include_graph_launches(reports):
    report = reports["graph_decode"]
    raw = events("graph_decode")
    stats = report["gaps"]["launch_stats"]
    assert stats["by_api"]["cudaGraphLaunch"] == count_named(raw, "cudaGraphLaunch") == 6
    launch_names = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch"}
    assert stats["launches"] == sum(count_named(raw, n) for n in launch_names)
    assert report["gaps"]["cuda_graph_estimate"] is None  # a graph run: nothing left to estimate
    assert report["run"]["mode_comparison"]["eager_over_graph"] > 1
    launch = next(f for f in kinds(report, "launch_gap") if not f["parent"])
    assert "already replays CUDA graphs" in launch["advice"] and "prefill waits longest" in launch["advice"]
    decode_steps = [s for s in report["gaps"]["per_step"] if s["step"].startswith("decode_step")]
    eager_steps = [s for s in reports["decode"]["gaps"]["per_step"] if s["step"].startswith("decode_step")]
    assert max(s["gpu_utilization"] for s in eager_steps) < min(s["gpu_utilization"] for s in decode_steps)


def test_eager_decode_estimate_sits_beside_unprofiled_time(reports):
    estimate = reports["decode"]["gaps"]["cuda_graph_estimate"]
    meta = read_meta(FIX / "decode" / "meta.json").data
    assert estimate["eager_step_us"] == pytest.approx(meta["unprofiled"]["step_ms"]["p50"] * 1e3, abs=0.01)
    assert estimate["estimated_speedup"] > 1
    dilation = reports["decode"]["summary"]["step_time_us"]
    assert dilation["profiler_dilation"] > 1  # the profiler (with stacks) slows eager steps down


def test_findings_are_ranked_by_impact(reports):
    for report in reports.values():
        impacts = [f["impact_us"] for f in report["findings"] if not f["parent"]]
        assert impacts == sorted(impacts, reverse=True)
