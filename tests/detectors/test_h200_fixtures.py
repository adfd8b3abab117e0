"""The committed H200 captures hold what the capture promises (read with the standard library, independently of
the analyzer): kernels and their launches, CUDA [memory] events with a nonzero reserved pool, the step annotations,
and meta.json's unprofiled timings and sync sites."""
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "h200"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def load(name):
    with gzip.open(FIXTURES / name / "rank0.trace.json.gz") as f:
        events = json.load(f)["traceEvents"]
    return events, json.loads((FIXTURES / name / "meta.json").read_text())


def test_all_fixtures_present():
    assert NAMES == ["alloc_churn", "batch_decode", "decode", "graph_decode", "item_sync", "prefill", "print_tensor"]
    for name in NAMES:
        assert (FIXTURES / name / "rank0.trace.json.gz").stat().st_size <= 2_000_000


@pytest.mark.parametrize("name", NAMES)
def test_trace_holds_gpu_work_and_memory(name):
    events, meta = load(name)
    assert meta["complete"] is True and meta["environment"]["gpu_name"] == "NVIDIA H200"
    cats = Counter(e.get("cat") for e in events)
    runtime = Counter(e["name"] for e in events if e.get("cat") == "cuda_runtime")
    assert cats["kernel"] > 0 and cats["python_function"] > 0
    launches = runtime["cudaLaunchKernel"] + runtime["cudaGraphLaunch"]
    assert launches > 0
    reserved = [e["args"]["Total Reserved"] for e in events
                if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1]
    assert reserved and max(reserved) > 0
    annotations = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert set(meta["profiled"]["annotations"]) <= set(annotations)
    assert meta["unprofiled"]["step_ms"]["p50"] > 0 and len(meta["unprofiled"]["per_step_ms"]) == 16


def test_graph_fixture_records_the_mode_ratio():
    events, meta = load("graph_decode")
    ratio = meta["mode_comparison"]
    assert ratio["eager_over_graph"] == pytest.approx(ratio["eager_step_ms"] / ratio["cuda_graph_step_ms"])
    assert ratio["eager_over_graph"] > 1
    graph_launches = [e for e in events if e.get("name") == "cudaGraphLaunch"]
    assert len(graph_launches) == 6  # one per recorded decode step


def test_sync_sites_name_the_pathology_lines():
    _, item = load("item_sync")
    assert [(s["call_site"], s["count"]) for s in item["sync_sites"]] == [("workloads/decode_item_sync.py:11", 6)]
    assert "PATHOLOGY" in item["sync_sites"][0]["code"]
    _, printed = load("print_tensor")
    assert printed["sync_sites"][0]["call_site"] == "workloads/decode_print.py:15"
    _, clean = load("decode")
    assert clean["sync_sites"] == []


def test_alloc_churn_fixture_mallocs_in_the_window():
    events, meta = load("alloc_churn")
    mallocs = [e for e in events if e.get("name") == "cudaMalloc"]
    assert mallocs and meta["profiled"]["memory_stats_delta"]["num_device_alloc"] == len(mallocs)
    _, clean = load("decode")
    assert "num_device_alloc" not in clean["profiled"]["memory_stats_delta"]
