"""The serving detectors on the committed H200 sessions: each engine option shows up as the gap cause the book
predicts, checked against independent counts of the raw events."""
from collections import Counter
from pathlib import Path

import pytest

from analyzer.report.markdown import render_markdown
from rawtrace import raw_events
from conftest import report_of

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "h200_serve"
NAMES = ("serve", "serve_item_sync", "serve_no_sleep", "serve_to_thread")
EPOLL = "<built-in method poll of select.epoll object"


@pytest.fixture(scope="module")
def reports():
    return {name: report_of(FIX / name) for name in NAMES}


def steps_of(events):
    return sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("engine_step#")),
                  key=lambda e: e["ts"])


def long_polls(events, tid, min_us=500):
    """The event loop asleep in epoll for at least min_us on the given thread (raw python_function events)."""
    return [e for e in events if e.get("cat") == "python_function" and e["name"].startswith(EPOLL)
            and e["tid"] == tid and e["dur"] >= min_us]


def test_fixtures_present_and_small():
    for name in NAMES:
        assert (FIX / name / "rank0.trace.json.gz").stat().st_size <= 2_000_000


def test_sleeping_loop_shows_event_loop_idle_after_the_awaiting_coroutine(reports):
    events = raw_events(FIX / "serve" / "rank0.trace.json.gz")
    steps = steps_of(events)
    sleeps = long_polls(events, steps[0]["tid"])
    loop = reports["serve"]["serving"]["event_loop_idle"]
    assert len(sleeps) >= len(steps) - 1  # the 1 ms sleep between steps
    # one gap per sleep that found the GPU idle, each at least half asleep
    assert len(steps) // 2 <= loop["count"] <= len(sleeps)
    assert sum(e["dur"] for e in sleeps) / 2 <= loop["idle_us"] <= 2 * sum(e["dur"] for e in sleeps)
    assert loop["sites"][0]["call_site"].startswith("serve() (defined at workloads/serving/engine.py:")
    assert reports["serve"]["gaps"]["by_cause"]["event_loop_idle"] == pytest.approx(loop["idle_us"], abs=0.01)
    kinds = [f["kind"] for f in reports["serve"]["findings"]]
    assert "event_loop_idle" in kinds and "thread_hop" not in kinds


def test_yield_without_sleep_has_no_parked_loop(reports):
    events = raw_events(FIX / "serve_no_sleep" / "rank0.trace.json.gz")
    assert long_polls(events, steps_of(events)[0]["tid"]) == []
    serving = reports["serve_no_sleep"]["serving"]
    assert serving["event_loop_idle"]["count"] == 0 and serving["thread_hops"]["count"] == 0


def test_to_thread_shows_one_hop_per_step_handed_over_by_the_loop(reports):
    events = raw_events(FIX / "serve_to_thread" / "rank0.trace.json.gz")
    steps = steps_of(events)
    loop_tid = steps[0]["tid"]
    launches = Counter(e["tid"] for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaLaunchKernel")
    (worker, from_worker), = [(tid, n) for tid, n in launches.items() if tid != loop_tid]
    assert from_worker > 0.95 * sum(launches.values())  # the steps' kernels, all launched from the worker
    ops_on_worker = [e for e in events if e.get("cat") == "cpu_op" and e["tid"] == worker]
    assert ops_on_worker == []  # the profiler records ops only on the thread that started it
    hops = reports["serve_to_thread"]["serving"]["thread_hops"]
    # one per step, plus up to two before the first step where the session's first work moved to the worker
    assert len(steps) - 2 <= hops["count"] <= len(steps) + 2
    assert hops["sites"][0]["call_site"].startswith("serve() (defined at ")
    assert reports["serve_to_thread"]["serving"]["event_loop_idle"]["count"] == 0


def test_item_readback_blocks_once_per_token_batched_once_per_step(reports):
    events = raw_events(FIX / "serve_item_sync" / "rank0.trace.json.gz")
    scalar_reads = sum(1 for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::_local_scalar_dense")
    item = [s for s in reports["serve_item_sync"]["syncs"] if s["kind"] == "item"]
    assert [s["call_site"] for s in item] == ["workloads/serving/engine.py:82"]
    assert item[0]["count"] == scalar_reads > 3 * len(steps_of(events))
    batched = [s for s in reports["serve"]["syncs"] if s["call_site"] == "workloads/serving/engine.py:83"]
    serve_steps = len(steps_of(raw_events(FIX / "serve" / "rank0.trace.json.gz")))
    assert [(s["kind"], s["count"]) for s in batched] == [("copy_to_host", serve_steps)]


def test_worker_thread_copy_and_its_sync_count_once(reports):
    """On the worker the profiler records no ops: `.tolist()`'s copy and stream sync are paired by their frame."""
    sites = [s for s in reports["serve_to_thread"]["syncs"] if s["call_site"] == "workloads/serving/engine.py:83"]
    assert [s["kind"] for s in sites] == ["copy_to_host"]
    assert sites[0]["count"] == len(steps_of(raw_events(FIX / "serve_to_thread" / "rank0.trace.json.gz")))


@pytest.mark.parametrize("name", NAMES)
def test_requests_lie_on_the_trace_clock_next_to_their_steps(reports, name):
    serving = reports[name]["serving"]
    events = raw_events(FIX / name / "rank0.trace.json.gz")
    steps = steps_of(events)
    first, last = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    assert len(serving["requests"]) == 10
    for r in serving["requests"]:
        assert r["arrived_us"] <= r["admitted_us"] <= r["first_token_us"] <= r["finished_us"]
        assert first - 1000 <= r["admitted_us"] and r["finished_us"] <= last + 1000
    assert [s["step"] for s in serving["steps"]] == [e["name"] for e in steps]
    assert max(s["in_batch"] for s in serving["steps"]) <= 8
    latency = serving["latency"]
    assert latency["requests"] == 10 and len(latency["per_request"]) == 10 and latency["ttft_ms"]["p50"] > 0
    markdown = render_markdown(reports[name])
    assert "#### Serving: per-request latency and per-step GPU utilization" in markdown
