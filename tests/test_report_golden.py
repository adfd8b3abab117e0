"""Reports stay identical through refactors: for every committed fixture and every external trace, a digest of each
report.json section (timing fields left out), of report.md and of report.html, against tests/golden/reports.json.

A change that means to alter reports regenerates the digests, and says why in its commit:

    UPDATE_GOLDEN=1 python -m pytest -q tests/test_report_golden.py
"""
import hashlib
import json
import os
from pathlib import Path

import pytest

from analyzer import api
from analyzer.report.files import _jsonable

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
GOLDEN = ROOT / "golden" / "reports.json"
EXTERNAL = REPO.parent / "shared" / "traces" / "external"
RUNS = sorted(p.parent for p in (ROOT / "fixtures").glob("h200*/*/rank0.trace.json.gz"))
EXTERNALS = sorted(EXTERNAL.glob("*.json.gz")) if EXTERNAL.is_dir() else []
TIMING = ("analysis_seconds",)


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else f"external/{path.name}"


def digests(path: Path) -> dict[str, str]:
    (item,) = api.find(path, "/nonexistent-out")
    report = api.analyze(api.load(item, cache=False)).report
    for key in TIMING:
        report[key] = 0.0
    report["source"]["trace"] = _name(item.trace)  # paths as the test names them, wherever the checkout is
    report["source"]["meta"] = _name(item.meta) if item.meta else None
    if snapshot := report["allocator"].get("snapshot"):
        snapshot["source"] = _name(Path(snapshot["source"]))
    files = api.render(report)

    def sha(value) -> str:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=_jsonable)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    out = {f"json.{key}": sha(value) for key, value in sorted(report.items())}
    out["report.md"] = sha(files["report.md"])
    return out


def _golden() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}


@pytest.mark.parametrize("path", RUNS + EXTERNALS, ids=[_name(p) for p in RUNS + EXTERNALS])
def test_report_matches_golden(path):
    got = digests(path)
    name = _name(path)
    if os.environ.get("UPDATE_GOLDEN"):
        golden = _golden()
        golden[name] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(dict(sorted(golden.items())), indent=1) + "\n")
        return
    expected = _golden().get(name)
    assert expected is not None, f"no golden digests for {name}: run with UPDATE_GOLDEN=1"
    changed = sorted(k for k in set(expected) | set(got) if expected.get(k) != got.get(k))
    assert not changed, f"{name}: report sections changed: {changed}"
