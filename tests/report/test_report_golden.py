"""Reports stay the same through refactors: for every committed fixture and every external trace, report.json
(timing fields zeroed, paths as the test names them) and report.md against a golden copy in
tests/golden/reports/<fixtures/...|external/...>.json.gz, compared by meaning (tests/golden_compare.py): keys,
strings and ints exactly, floats within 1e-6 relative or one unit of their last rounded decimal (sums whose last
bits depend on the CPU), report.md line by line with the same rule for its numbers. A failure names the paths that
changed and both values. The external traces are skipped where ../shared/traces/external is absent.

A change that means to alter reports regenerates the goldens, and says why in its commit:

    UPDATE_GOLDEN=1 python -m pytest -q tests/report/test_report_golden.py

which rewrites the goldens that no longer match (and those missing), leaves the others byte for byte, and removes
the goldens of traces that are gone; UPDATE_GOLDEN=all rewrites every one.
"""
import dataclasses
import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from analyzer import api
from analyzer.report.assemble import MAX_INTERVALS, _timeline_payload, longest
from analyzer.report.files import _jsonable
from conftest import analysis_of, report_of
from golden_compare import compare_json, compare_markdown

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT.parent
GOLDEN = ROOT / "golden" / "reports"
EXTERNAL = REPO.parent / "shared" / "traces" / "external"
RUNS = sorted(p.parent for p in (ROOT / "fixtures").glob("*/*/rank0.trace.json.gz"))
EXTERNALS = sorted(EXTERNAL.glob("*.json.gz")) if EXTERNAL.is_dir() else []
TIMING = ("analysis_seconds",)
UPDATE = os.environ.get("UPDATE_GOLDEN", "")
SHOWN = 12  # differences a failure lists


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else f"external/{path.name}"


def golden_path(name: str) -> Path:
    """tests/fixtures/h200/x -> golden/reports/fixtures/h200/x.json.gz; external/y.json.gz -> external/y.json.gz"""
    if name.startswith("external/"):
        return GOLDEN / f"{name.removesuffix('.json.gz')}.json.gz"
    return GOLDEN / f"{name.removeprefix('tests/')}.json.gz"


def normalised(path: Path) -> dict:
    """report.json's tree (as JSON reads it back: lists, str keys) with timing zeroed and paths normalised, and
    report.md's text."""
    (item,) = api.find(path, "/nonexistent-out")
    report = report_of(item.trace)
    for key in TIMING:
        report[key] = 0.0
    report["source"]["trace"] = _name(item.trace)  # paths as the test names them, wherever the checkout is
    report["source"]["meta"] = _name(item.meta) if item.meta else None
    if snapshot := report["allocator"].get("snapshot"):
        snapshot["source"] = _name(Path(snapshot["source"]))
    markdown = api.render(report)["report.md"]
    return {"report.json": json.loads(json.dumps(report, default=_jsonable)), "report.md": markdown}


def read_golden(path: Path) -> dict | None:
    return json.loads(gzip.decompress(path.read_bytes())) if path.is_file() else None


def write_golden(path: Path, name: str, got: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"name": name, **got}, indent=1, ensure_ascii=False) + "\n"
    path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))  # mtime 0: same input, same bytes


def differences(expected: dict, got: dict) -> list[str]:
    return compare_json(expected["report.json"], got["report.json"], limit=SHOWN) + \
        compare_markdown(expected["report.md"], got["report.md"], limit=SHOWN)


def _external_golden_names() -> list[str]:
    return sorted(f"external/{p.name}" for p in (GOLDEN / "external").glob("*.json.gz"))


# Without ../shared/traces/external, its traces are listed from their goldens and skipped.
CASES = [pytest.param(p, id=_name(p)) for p in RUNS + EXTERNALS] + \
    ([pytest.param(None, id=n, marks=pytest.mark.skip(reason=f"{EXTERNAL} is absent"))
      for n in _external_golden_names()] if not EXTERNAL.is_dir() else [])


@pytest.mark.parametrize("path", CASES)
def test_report_matches_golden(path):
    name = _name(path)
    golden_file = golden_path(name)
    got = normalised(path)
    expected = read_golden(golden_file)
    if UPDATE:
        if expected is None or UPDATE == "all" or differences(expected, got):
            write_golden(golden_file, name, got)
        return
    assert expected is not None, f"no golden for {name} ({golden_file.relative_to(REPO)}): run with UPDATE_GOLDEN=1"
    diffs = differences(expected, got)
    assert not diffs, f"{name}: the report changed (golden {golden_file.relative_to(REPO)}):\n  " + "\n  ".join(diffs)


def test_no_stale_goldens():
    """Every golden belongs to a trace this test runs (the external ones only checked where that folder is)."""
    wanted = {golden_path(_name(p)) for p in RUNS + EXTERNALS}
    present = set((GOLDEN / "fixtures").glob("**/*.json.gz"))
    if EXTERNAL.is_dir():
        present |= set((GOLDEN / "external").glob("*.json.gz"))
    stale = sorted(present - wanted)
    if UPDATE:
        for path in stale:
            path.unlink()
        return
    assert not stale, f"goldens of traces that are gone (UPDATE_GOLDEN=1 removes them): {stale}"
    assert RUNS, "no fixtures found"


@pytest.fixture(scope="module")
def decode_context():
    """graph_decode_24: 5681 idle pieces on one GPU, 994 of them tied at the 5000th longest."""
    (item,) = api.find(ROOT / "fixtures" / "h200_extra" / "graph_decode_24", "/nonexistent-out")
    return analysis_of(item.trace).context


def _pieces(payload: dict) -> dict[str, list]:
    sites = payload["sites"]
    return {dev: sorted((s, e, cause, sites[site] if site >= 0 else None) for s, e, cause, site in d["idle_us"])
            for dev, d in payload["devices"].items()}


def test_timeline_keeps_the_same_pieces_whatever_their_order(decode_context):
    """report.json's timeline keeps the MAX_INTERVALS longest idle pieces; a total order on ties keeps the same ones
    when the pieces come in another order (as numpy's SIMD argsort on another CPU breaks ties otherwise)."""
    ctx = decode_context
    idle = ctx.idle
    dur = np.sort(idle.duration_ns)[::-1]
    assert len(idle) > MAX_INTERVALS and (dur == dur[MAX_INTERVALS - 1]).sum() > 500  # the ties this is about
    before = _timeline_payload(ctx)
    gaps = ctx.gaps
    try:
        for seed in range(3):
            order = np.random.default_rng(seed).permutation(len(idle))
            shuffled = dataclasses.replace(idle, **{f.name: getattr(idle, f.name)[order]
                                                    for f in dataclasses.fields(idle)})
            ctx.__dict__["_idle"] = (gaps, shuffled)  # the cached (gaps, pieces) of AnalysisContext
            after = _timeline_payload(ctx)
            assert _pieces(after) == _pieces(before), f"permutation {seed} kept other idle pieces"
            assert sorted(after["sites"]) == sorted(before["sites"])
    finally:
        ctx.__dict__["_idle"] = (gaps, idle)
    assert _timeline_payload(ctx) == before


def test_longest_is_a_total_order(decode_context):
    """The kept pieces: every one longer than the cut, and of those tied at the cut the earliest."""
    idle = decode_context.idle
    start, end = idle.start_ns, idle.end_ns
    kept = longest(start, end, MAX_INTERVALS)
    dur = end - start
    cut = np.sort(dur)[::-1][MAX_INTERVALS - 1]
    tied = np.flatnonzero(dur == cut)
    expected = np.sort(np.concatenate([np.flatnonzero(dur > cut), tied[np.argsort(start[tied], kind="stable")]
                                       [:MAX_INTERVALS - int((dur > cut).sum())]]))
    assert np.array_equal(kept, expected)
    assert np.array_equal(longest(start[:10], end[:10], MAX_INTERVALS), np.arange(10))
