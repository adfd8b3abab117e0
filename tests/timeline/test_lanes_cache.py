"""The dashboard's lanes saved beside the columnar cache (analyzer.timeline.cache): a fresh process that reads
them back draws exactly what the process that built them drew, at every zoom, and anything that no longer matches
(another report, a damaged file) is a miss, never a wrong timeline."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from analyzer import api
from analyzer.timeline.cache import FOLDER, load_lanes
from analyzer.trace.cache import cache_folder
from dashboard.figures import timeline_figure

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RUNS = {"serve": FIXTURES / "h200_serve" / "serve", "fragmentation": FIXTURES / "h200_alloc" / "fragmentation",
        "item_sync": FIXTURES / "h200" / "item_sync"}


@pytest.fixture(scope="module", params=sorted(RUNS))
def built(request, tmp_path_factory):
    run = tmp_path_factory.mktemp(request.param) / request.param
    shutil.copytree(RUNS[request.param], run, ignore=shutil.ignore_patterns(".gpu-idle-cache", "report.*"))
    analysis = api.analyze(api.load(run))
    return run, analysis, api.timeline(analysis, cache=True)


def _fresh(run: Path, report: dict):
    return api.timeline(api.views(api.load(run)), report, cache=True)


def _windows(data):
    lo, hi = data.full_range()
    span = hi - lo
    mid = (lo + hi) / 2
    return [(lo, hi), (mid - span / 200, mid + span / 200), (mid - 5e3, mid + 5e3)]


def test_a_fresh_process_draws_what_the_builder_drew(built):
    run, analysis, first = built
    trace = api.find(run)[0].trace
    assert (cache_folder(trace) / FOLDER / "manifest.json").is_file()
    again = _fresh(run, analysis.report)
    assert any(isinstance(lane.starts, np.memmap) for lane in again.lanes)  # read back, not rebuilt
    assert [lane.label for lane in again.lanes] == [lane.label for lane in first.lanes]
    assert again.extent == first.extent and again.memory_source == first.memory_source
    for lo, hi in _windows(first):
        a, b = first.view(lo, hi), again.view(lo, hi)
        for la, lb in zip(a.lanes, b.lanes):
            assert np.array_equal(la.shares, lb.shares) and np.array_equal(la.counts, lb.counts)
            assert (la.rows is None) == (lb.rows is None)
            assert la.rows is None or np.array_equal(la.rows, lb.rows)
        for ma, mb in ((a.syncs, b.syncs), (a.allocs, b.allocs)):
            assert np.array_equal(ma.rows, mb.rows)
        assert len(a.memory) == len(b.memory)
        for ma, mb in zip(a.memory, b.memory):
            assert np.array_equal(ma.ts, mb.ts) and np.array_equal(ma.reserved, mb.reserved)
        fig_a = json.dumps(timeline_figure(first, a), default=str, sort_keys=True)
        fig_b = json.dumps(timeline_figure(again, b), default=str, sort_keys=True)
        assert fig_a == fig_b


def test_another_report_or_a_damaged_cache_is_a_miss(built):
    run, analysis, first = built
    trace = api.find(run)[0].trace
    assert load_lanes(trace, analysis.report) is not None
    changed = dict(analysis.report, findings=analysis.report["findings"][1:])
    assert load_lanes(trace, changed) is None
    manifest = cache_folder(trace) / FOLDER / "manifest.json"
    saved = manifest.read_text()
    try:
        manifest.write_text(saved[: len(saved) // 2])
        assert load_lanes(trace, analysis.report) is None
        rebuilt = _fresh(run, analysis.report)  # rebuilt from the views, and saved again
        assert not any(isinstance(lane.starts, np.memmap) for lane in rebuilt.lanes)
        assert load_lanes(trace, analysis.report) is not None
    finally:
        manifest.write_text(saved)


def test_the_report_read_back_from_disk_finds_the_lanes(built):
    """The dashboard builds the lanes with the report its analysis returned and a fresh server reads report.json."""
    run, analysis, _ = built
    api.write(analysis, run)
    on_disk = json.loads((run / "report.json").read_text())
    assert load_lanes(api.find(run)[0].trace, on_disk) is not None
