"""`analyze --annotate` on real H200 runs: the original events kept byte for byte in order, one added event per idle
piece and per finding occurrence on tracks of their own, and the annotated trace analysing exactly as the
original does in our own loader."""
import gzip
import json
from pathlib import Path

import pytest

from analyzer import api
from analyzer.cli import main
from rawtrace import raw_events

FIX = Path(__file__).resolve().parents[1] / "fixtures"
RUNS = ("h200/item_sync", "h200/alloc_churn", "h200_extra/graph_decode_24")
OURS = "gpu_idle_analyzer"


@pytest.mark.parametrize("run", RUNS)
def test_annotated_trace_adds_one_event_per_piece_and_occurrence(tmp_path, capsys, run):
    assert main(["analyze", str(FIX / run), "--out", str(tmp_path), "--annotate", "--no-cache"]) == 0
    annotated = tmp_path / "rank0.annotated.trace.json.gz"
    assert f"annotated: {annotated}" in capsys.readouterr().out
    original, events = raw_events(FIX / run / "rank0.trace.json.gz"), raw_events(annotated)
    added = [e for e in events if e.get("cat") == OURS]
    assert [e for e in events if e.get("cat") != OURS] == original  # nothing lost, nothing reordered
    report = json.loads((tmp_path / "report.json").read_text())
    analysis = api.analyze(api.load(FIX / run, cache=False))
    pieces = [e for e in added if e["ph"] == "X" and e["name"].startswith("idle: ")]
    assert len(pieces) == len(analysis.context.idle)
    assert sum(e["dur"] for e in pieces) == pytest.approx(report["summary"]["gpu_idle_us"], abs=0.01 * len(pieces))
    by_cause = {}
    for e in pieces:
        by_cause[e["args"]["cause"]] = by_cause.get(e["args"]["cause"], 0.0) + e["dur"]
    for cause, us in report["gaps"]["by_cause"].items():
        assert by_cause.get(cause, 0.0) == pytest.approx(us, abs=0.01 * len(pieces) + 0.01)
    occurrences = [e for e in added if e["ph"] in ("X", "i") and "occurrence" in e.get("args", {})]
    assert len(occurrences) == sum(len(f.get("occurrences_us") or ()) for f in report["findings"])
    for f in report["findings"]:
        mine = [e for e in occurrences if e["args"]["id"] == f["id"]]
        assert [e["ts"] for e in mine] == [o[0] for o in f["occurrences_us"]]
        assert [e["ts"] + e.get("dur", 0) for e in mine] == pytest.approx([o[1] for o in f["occurrences_us"]],
                                                                           abs=2e-3)
        assert len({e["tid"] for e in mine}) <= 1 and all(e["args"]["title"] == f["title"] for e in mine)
    names = {e["args"]["name"] for e in added if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {f"finding {f['id']}: {f['kind']}" for f in report["findings"]} <= names

    # our loader skips the added events: the annotated trace analyses as the original
    again = api.analyze(api.load(annotated, cache=False)).report
    assert again["summary"]["idle_partition"] == analysis.report["summary"]["idle_partition"]
    assert again["trace"] == analysis.report["trace"]
    assert [(f["id"], f["impact_us"]) for f in again["findings"]] == [
        (f["id"], f["impact_us"]) for f in analysis.report["findings"]]


def test_annotate_never_overwrites_a_file_it_did_not_write(tmp_path, capsys):
    target = tmp_path / "rank0.annotated.trace.json.gz"
    target.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    capsys.readouterr()
    assert main(["analyze", str(FIX / "h200/decode"), "--out", str(tmp_path), "--annotate", "--no-cache"]) == 2
    assert "not an annotated trace written by gpu-idle-analyzer" in capsys.readouterr().err
    assert gzip.decompress(target.read_bytes()) == b'{"traceEvents": []}'
    target.unlink()  # and its own file it replaces
    for _ in range(2):
        assert main(["analyze", str(FIX / "h200/decode"), "--out", str(tmp_path), "--annotate", "--no-cache"]) == 0
    assert sum(e.get("cat") == OURS for e in raw_events(target)) > 0


def test_a_run_folder_analyzed_again_after_annotate_is_still_one_run(tmp_path, capsys):
    """The annotated copy beside the original is not a second rank: a second `analyze RUN` rewrites the one
    report.json, and the dashboard's and analyze-many's walks see one trace."""
    run = tmp_path / "decode"
    run.mkdir()
    for name in ("meta.json", "rank0.trace.json.gz"):
        (run / name).write_bytes((FIX / "h200/decode" / name).read_bytes())
    assert main(["analyze", str(run), "--annotate", "--no-cache"]) == 0
    assert (run / "rank0.annotated.trace.json.gz").is_file()
    first = (run / "report.json").stat().st_mtime_ns
    assert main(["analyze", str(run), "--no-cache"]) == 0
    assert not list(run.glob("*.report")) and (run / "report.json").stat().st_mtime_ns >= first
    assert [item.trace.name for item in api.find(run)] == ["rank0.trace.json.gz"]
    # named explicitly, the annotated trace is still read
    assert [item.trace.name for item in api.find(run / "rank0.annotated.trace.json.gz")] == [
        "rank0.annotated.trace.json.gz"]
