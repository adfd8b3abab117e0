"""`python -m analyzer analyze` and `diff` as a user runs them: files written, one-line errors, no partial output."""
import gzip
import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

FIX = REPO / "tests" / "fixtures" / "h200"
EXTERNAL = REPO.parent / "shared" / "traces" / "external"


def copy_run(tmp_path, name):
    dest = tmp_path / name
    shutil.copytree(FIX / name, dest)
    return dest


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_analyze_run_folder(cli, tmp_path):
    run = copy_run(tmp_path, "item_sync")
    result = cli("analyze", str(run))
    assert result.returncode == 0, result.stderr
    assert ".item() blocks the CPU 6x" in result.stdout and "GPU utilization" in result.stdout
    report = json.loads((run / "report.json").read_text())
    assert report["schema"] == "gpu-idle-analyzer/report/1"
    assert report["source"]["meta"] == str(run / "meta.json")
    assert [s["call_site"] for s in report["syncs"] if s["kind"] == "item"] == ["workloads/decode_item_sync.py:11"]
    md = (run / "report.md").read_text()
    assert len(md) < 60_000 and "| # | severity |" in md and "<details>" in md
    page = (run / "report.html").read_text()
    assert page.count("<html") == 1 and 'src="http' not in page
    # analyzing again replaces our own reports
    assert cli("analyze", str(run)).returncode == 0


def test_analyze_bare_trace_writes_sibling_folder(cli, tmp_path):
    trace = copy_run(tmp_path, "decode") / "rank0.trace.json.gz"
    result = cli("analyze", str(trace))
    assert result.returncode == 0, result.stderr
    out = trace.parent / "rank0.trace.report"
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]


def test_folder_of_ranks_gets_a_report_each(cli, tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank, name in enumerate(("decode", "item_sync")):
        shutil.copy(FIX / name / "rank0.trace.json.gz", folder / f"rank{rank}.trace.json.gz")
    result = cli("analyze", str(folder), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rank0.trace.report", "rank1.trace.report"]


def test_foreign_report_is_never_overwritten(cli, tmp_path):
    run = copy_run(tmp_path, "decode")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text('{"mine": true}')
    result = cli("analyze", str(run), "--out", str(out))
    assert_one_line_error(result, str(out / "report.json"), "not overwriting")
    assert (out / "report.json").read_text() == '{"mine": true}'
    assert not (out / "report.md").exists()


@pytest.mark.parametrize("name, content, fragment", [
    ("empty.json", b"", "empty file"),
    ("cut.json.gz", gzip.compress(b'{"traceEvents": [{"ph": "X"}]}', mtime=0)[:20], "gzip"),
    ("cut.json", b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1', "JSON"),
    ("notatrace.json", b'{"hello": 1}', "traceEvents"),
])
def test_bad_trace_is_one_line_and_writes_nothing(cli, tmp_path, name, content, fragment):
    bad = tmp_path / name
    bad.write_bytes(content)
    result = cli("analyze", str(bad))
    assert_one_line_error(result, str(bad))
    assert fragment.lower() in result.stderr.lower()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_missing_path_and_empty_folder(cli, tmp_path):
    assert_one_line_error(cli("analyze", str(tmp_path / "nope")), "no such file")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(cli("analyze", str(tmp_path / "empty")), "no trace files")


@pytest.mark.skipif(not (EXTERNAL / "cpu-only.json.gz").is_file(), reason="external traces absent")
def test_cpu_only_trace_reports_no_gpu_activity(cli, tmp_path):
    trace = tmp_path / "cpu-only.json.gz"
    shutil.copy(EXTERNAL / "cpu-only.json.gz", trace)
    result = cli("analyze", str(trace))
    assert result.returncode == 0, result.stderr
    assert "No GPU activity" in result.stdout and "findings: none" in result.stdout


def test_diff_before_and_after_a_fix(cli, tmp_path):
    before, after = copy_run(tmp_path, "item_sync"), copy_run(tmp_path, "decode")
    result = cli("diff", str(before), str(after), "--out", str(tmp_path / "diff"))
    assert result.returncode == 0, result.stderr
    diff = json.loads((tmp_path / "diff" / "diff.json").read_text())
    fixed = [f for f in diff["findings"] if f["status"] == "fixed"]
    assert [(f["kind"], f["call_site"], f["count_before"]) for f in fixed] == [
        ("sync", "workloads/decode_item_sync.py:11", 6)]
    assert diff["syncs"]["blocking_calls"] == {"before": 7, "after": 1}
    assert "**fixed**" in (tmp_path / "diff" / "diff.md").read_text()


def test_analyze_imports_neither_torch_nor_hta(tmp_path):
    run = copy_run(tmp_path, "decode")
    code = ("import sys; from analyzer.cli import main; main(['analyze', sys.argv[1]]); "
            "bad = [m for m in ('torch', 'hta', 'pandas') if m in sys.modules]; sys.exit(f'imported {bad}' if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code, str(run)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_hta_side_by_side_or_its_error(cli, tmp_path):
    run = copy_run(tmp_path, "item_sync")
    result = cli("analyze", str(run), "--hta")
    assert result.returncode == 0, result.stderr
    report = json.loads((run / "report.json").read_text())
    hta = report["hta"]
    try:
        import hta as _  # noqa: F401
    except Exception:
        assert "install" in hta["error"]
        return
    assert "error" not in hta, hta
    ours, theirs = hta["side_by_side"]["ours"], hta["side_by_side"]["hta"]
    assert ours["launches"] == report["gaps"]["launch_stats"]["launches"]
    # HTA matches cudaLaunchKernel(ExC) and async copies only: the cuLaunchKernelEx (cuBLAS) launches are missing
    assert theirs["launches"] < ours["launches"]
    assert 0 < theirs["gpu_idle_us"] <= ours["gpu_idle_us"]
    assert "HolisticTraceAnalysis" in (run / "report.md").read_text()
