"""The rules every report keeps, on our own H200 captures and on every external trace (HTA, kineto and TraceLens
test data; skipped where ../shared/traces/external is absent):

- idle is partitioned: top-level findings + the profiler's own code + unexplained = GPU idle, and a finding that
  refines another never exceeds it;
- queued work is never idle-by-CPU: a gap whose next GPU work had been launched when it began (checked from the raw
  events) is `queued` from end to end;
- a call site names a function honestly: no raw `file(line): func` Kineto frame presented as the culprit, never a
  stdlib, torch or generated file;
- words fit the trace: no "decode" and no serving section on training traces, no CUDA-graph capture advice on a
  graph run, HIP names on ROCm traces.
"""
import re
from pathlib import Path

import numpy as np
import pytest

from analyzer.views.idle import CAUSES, QUEUED
from rawtrace import overhead_spans, raw_events, raw_gaps
from conftest import analysis_of

ROOT = Path(__file__).resolve().parents[1]
EXTERNAL = ROOT.parents[1] / "shared" / "traces" / "external"
FIXTURES = sorted((ROOT / "fixtures").glob("*/*/rank0.trace.json.gz"))
TRACES = FIXTURES + (sorted(EXTERNAL.glob("*.json.gz")) if EXTERNAL.is_dir() else [])
IDS = [p.parent.name if p.name == "rank0.trace.json.gz" else p.name.removesuffix(".json.gz") for p in TRACES]
RAW_FRAME = re.compile(r"\(\d+\): ")
# torch, the standard library's threads and imports, generated code (Inductor's content-addressed modules wherever
# TORCHINDUCTOR_CACHE_DIR puts them: <dir>/xy/cxy<hash>.py)
NOT_USER = re.compile(r"(^|/)(torch|concurrent|threading|asyncio|importlib)/|^<|torchinductor_"
                      r"|/([a-z0-9]{2})/c\3[a-z0-9]{40,}\.py")


def external(name):
    path = EXTERNAL / f"{name}.json.gz"
    if not path.is_file():
        pytest.skip(f"{EXTERNAL} not present")
    return path


def analyzed(path: Path):
    analysis = analysis_of(path)
    return analysis.context.model, analysis.context, analysis.report


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_idle_is_partitioned_by_top_level_findings(path):
    _, ctx, report = analyzed(path)
    summary = report["summary"]
    if summary["gpu_utilization"] is None:
        return
    p = summary["idle_partition"]
    top = [f for f in report["findings"] if not f["parent"]]
    tolerance = 0.002 * (len(top) + 2)
    assert sum(f["impact_us"] for f in top) == pytest.approx(p["findings_us"], abs=tolerance)
    assert p["findings_us"] + p["instrumentation_us"] + p["unexplained_us"] == pytest.approx(summary["gpu_idle_us"],
                                                                                              abs=tolerance)
    # what is unexplained is exactly the idle before work whose launch the trace does not hold
    assert p["unexplained_us"] == pytest.approx(p["unknown_launch_us"], abs=tolerance)
    assert sum(report["gaps"]["by_cause"].values()) == pytest.approx(summary["gpu_idle_us"], abs=0.01)
    for f in report["findings"]:
        if f["parent"]:
            parent = next(g for g in report["findings"] if g["id"] == f["parent"])
            assert f["impact_us"] <= parent["impact_us"] + 0.001
    children = {}
    for f in report["findings"]:
        if f["parent"]:
            children[f["parent"]] = children.get(f["parent"], 0) + f["impact_us"]
    for parent_id, total in children.items():
        assert total <= next(g for g in report["findings"] if g["id"] == parent_id)["impact_us"] + 0.01
    # the pieces cover every idle nanosecond once
    idle = ctx.idle
    assert int(idle.duration_ns.sum()) == ctx.timeline.idle_ns and (idle.duration_ns > 0).all()


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_queued_work_is_never_idle_by_cpu(path):
    model, ctx, _ = analyzed(path)
    raw = raw_events(path, exact=True)
    overhead = overhead_spans(raw)
    gaps = [g for g in raw_gaps(raw) if not any(s < g["end_ns"] and e > g["start_ns"] for s, e in overhead)]
    queued = [g for g in gaps if g["queued"]]
    if not queued:
        return
    idle = ctx.idle
    starts, ends = ctx.gaps.start_ns, ctx.gaps.end_ns  # (in device order: not sorted across devices)
    for g in queued:
        matches = np.flatnonzero((np.abs(starts - g["start_ns"]) <= 1) & (np.abs(ends - g["end_ns"]) <= 1)).tolist()
        assert matches, f"gap at {g['start_ns']} not found"
        causes = {CAUSES[c] for c in idle.cause[idle.gap == matches[0]].tolist()}
        assert causes == {CAUSES[QUEUED]}, (g["start_ns"], causes)


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_call_sites_name_functions_not_def_lines(path):
    _, _, report = analyzed(path)
    for f in report["findings"]:
        for text in (f["title"], f["call_site"] or "", f["library_site"] or ""):
            assert not RAW_FRAME.search(text), text
        for site in (f["call_site"], f["library_site"]):
            if site and "(defined at " in site:
                assert not NOT_USER.search(site.split("(defined at ")[1]), site
    for s in report["syncs"] + report["allocator"]["sites"]:
        assert not RAW_FRAME.search(s["call_site"] or ""), s["call_site"]


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_words_fit_the_trace(path):
    _, ctx, report = analyzed(path)
    text = " ".join(f["title"] + " " + f["advice"] for f in report["findings"])
    if ctx.traits.training:
        assert "decode" not in text.lower()
        assert not report["serving"]["is_serving"]
    if ctx.graphs.replayed or ctx.graphs.captured:
        assert "Capture the" not in text and "estimated graph step" not in text.lower()
        assert report["gaps"]["cuda_graph_estimate"] is None
    if ctx.traits.hip:
        assert not re.search(r"\bcuda(Malloc|Free|StreamSynchronize)\b", text)
    # this tool's own capture code and the profiler are never a finding's culprit
    assert not any("analyzer/capture" in (f["call_site"] or "") for f in report["findings"])
    assert all(s["kind"] == "profiler" for s in report["syncs"] if "analyzer/capture" in (s["frame"] or ""))
