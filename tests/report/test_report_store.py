"""Reports on disk, read in one place (analyzer.report.stored): checked against report.json's typed core
(analyzer.report.schema, docs/report-schema.json), and reused only while they are the report of the trace as it is
now (its content key), by the CLI's diff / check and by the dashboard alike."""
import gzip
import json
import shutil
from pathlib import Path

import pytest

from analyzer import api
from analyzer.cli import load_report
from analyzer.errors import UsageError
from analyzer.report.schema import check, json_schema_text
from conftest import REPO
from analyzer.api import RunStore

FIX = REPO / "tests" / "fixtures" / "h200"
GOLDEN = REPO / "tests" / "golden" / "reports"


def analyzed_copy(tmp_path: Path, name: str = "item_sync") -> Path:
    run = tmp_path / "runs" / name
    shutil.copytree(FIX / name, run)
    api.write(api.analyze(api.load(run, cache=False)))
    return run


def rewrite_trace(run: Path) -> None:
    """The same events, other bytes: a trace captured again over the old one."""
    trace = run / "rank0.trace.json.gz"
    events = json.loads(gzip.decompress(trace.read_bytes()))
    events["traceEvents"].append({"ph": "i", "name": "marker", "ts": 0, "pid": 0, "tid": 0, "s": "g"})
    trace.write_bytes(gzip.compress(json.dumps(events).encode(), mtime=0))


def test_docs_schema_is_the_generated_one():
    committed = (REPO / "docs" / "report-schema.json").read_text()
    assert committed == json_schema_text(), "python -m analyzer.report.schema > docs/report-schema.json"


@pytest.mark.parametrize("golden", sorted(GOLDEN.rglob("*.json.gz")), ids=lambda p: p.stem)
def test_every_golden_report_has_the_typed_core(golden):
    report = json.loads(gzip.decompress(golden.read_bytes()))["report.json"]
    assert check(report) is None


def test_a_report_is_fresh_for_its_trace_across_a_copy_and_stale_once_the_trace_changes(tmp_path):
    run = analyzed_copy(tmp_path)
    trace = run / "rank0.trace.json.gz"
    assert api.fresh_report(trace, [run]) == run / "report.json"
    moved = tmp_path / "elsewhere" / "item_sync"
    shutil.copytree(run, moved)  # new modification times: a clone, an scp
    assert api.fresh_report(moved / "rank0.trace.json.gz", [moved]) == moved / "report.json"
    rewrite_trace(moved)
    assert api.fresh_report(moved / "rank0.trace.json.gz", [moved]) is None
    other = analyzed_copy(tmp_path, "decode")
    assert api.fresh_report(trace, [other, run]) == run / "report.json"  # another trace's report is not this one's


def test_diff_reuses_a_fresh_report_and_reanalyzes_a_stale_one(tmp_path):
    run = analyzed_copy(tmp_path)
    stored = json.loads((run / "report.json").read_text())
    stored["analysis_seconds"] = 1234.5  # a mark only the stored report carries
    (run / "report.json").write_text(json.dumps(stored))
    assert load_report(run)[1]["analysis_seconds"] == 1234.5
    rewrite_trace(run)
    assert load_report(run)[1]["analysis_seconds"] != 1234.5


def test_a_report_missing_a_typed_key_is_a_one_line_error_naming_it(cli, tmp_path):
    run = analyzed_copy(tmp_path)
    broken = json.loads((run / "report.json").read_text())
    del broken["summary"]["idle_partition"]["unexplained_us"]
    bad = tmp_path / "bad" / "report.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps(broken))
    result = cli("diff", str(bad), str(run / "report.json"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert str(bad) in line and "unexplained_us" in line and "$.summary.idle_partition" in line
    with pytest.raises(UsageError, match="report.md: not a readable report.json"):
        api.read_report(run / "report.md")


def test_the_dashboard_lists_a_copied_run_as_analyzed_and_a_rewritten_one_as_not(tmp_path):
    analyzed_copy(tmp_path)
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "runs", moved)
    store = RunStore(moved)
    assert store.row(store.find("item_sync")).status == "analyzed"
    rewrite_trace(moved / "item_sync")
    store = RunStore(moved)
    assert store.row(store.find("item_sync")).status == "not analyzed"


def test_the_dashboard_and_analyze_many_find_the_same_traces_in_one_tree(tmp_path):
    """One walker (trace/inputs.walk_traces): hidden folders, the .report folder of a bare trace and the annotated
    copy beside a trace are skipped by the dashboard's run list and by analyze-many alike."""
    from analyzer.fleet.inputs import expand
    from analyzer.api import discover_runs
    root = tmp_path / "runs"
    trace = FIX / "decode" / "rank0.trace.json.gz"
    for rel in ("a/rank0.trace.json.gz", "a/rank0.annotated.trace.json.gz", "b/rank0.trace.json.gz",
                "b/rank1.trace.json.gz", ".hidden/x/rank0.trace.json.gz", "c/bare.json.gz",
                "c/bare.report/deep/rank0.trace.json.gz", "d/e/rank0.trace.json.gz"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(trace, root / rel)
    wanted = {"a/rank0.trace.json.gz", "b/rank0.trace.json.gz", "b/rank1.trace.json.gz", "c/bare.json.gz",
              "d/e/rank0.trace.json.gz"}
    assert {r.trace.relative_to(root.resolve()).as_posix() for r in discover_runs(root)} == wanted
    assert {Path(f.trace.trace).relative_to(root).as_posix() for f in expand([str(root)])} == wanted


MI300 = REPO.parent / "shared" / "traces" / "external" / "mi300-hf-qwen1.5-0.5b.json.gz"


@pytest.mark.parametrize("trace", [MI300])
def test_a_run_without_meta_shows_the_gpu_its_trace_names_past_the_head(tmp_path, trace):
    """This trace's deviceProperties sit 9.7 MB into it, past what the run list reads of a trace's head: once
    analyzed, the row takes the GPU from the report."""
    if not trace.is_file():
        pytest.skip("../shared/traces/external is absent")
    shutil.copy(trace, tmp_path / "mi300.json.gz")
    store = RunStore(tmp_path)
    run = store.find("mi300")
    assert store.row(run).device is None
    store.report(run)
    assert store.row(run).device == "AMD Instinct MI300X VF"
    fresh = RunStore(tmp_path)  # read back from report.json on disk
    assert fresh.row(fresh.find("mi300")).device == "AMD Instinct MI300X VF"
