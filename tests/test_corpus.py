"""The committed corpus of bad and odd traces (tests/corpus/, made by tests/make_corpus.py): `python -m analyzer
analyze` gives exactly the outcome manifest.json records for each entry. A report: exit 0, report.* written, the
expected counts, and one `warning:` line on stderr (or none), plus one for a run folder's meta.json when part of it
was ignored. An error: exit 2, one stderr line naming the file and the problem, and no report.* file anywhere."""
import gzip
import json
import shutil
from pathlib import Path

import pytest

from make_corpus import CORPUS, MANIFEST, generate, source_digests

ENTRIES = json.loads(MANIFEST.read_text())["entries"]
REPAIR_WARNING = "event names with unescaped double quotes, repaired (pytorch#146900)"


def stage(tmp_path: Path, name: str) -> Path:
    """A copy of the entry in a fresh folder: the CLI writes reports (and its cache) beside its input."""
    source, target = CORPUS / name, tmp_path / "in" / name
    target.parent.mkdir(parents=True)
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy(source, target)
    return target


def report_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.startswith("report.") or ".report." in p.name)


def check_counts(report: dict, expected: dict) -> None:
    assert report["trace"]["events"]["kernels"] == expected["kernels"]
    assert report["gaps"]["launch_stats"]["launches"] == expected["launches"]
    assert report["sync_totals"]["total_blocking_calls"] == expected["blocking_syncs"]
    if "repaired_names" in expected:
        assert report["trace"]["warnings"][REPAIR_WARNING] == expected["repaired_names"]


def check_warning(stderr_lines: list[str], trace: Path, expected: str | None, report: dict) -> None:
    lines = [line for line in stderr_lines if str(trace) in line]
    if expected is None:
        assert lines == [] and report["trace"]["warnings"] == {}, lines
        return
    assert len(lines) == 1 and lines[0].startswith(f"warning: {trace}: "), stderr_lines
    assert expected in lines[0]
    assert report["trace"]["warnings"]  # kept in report.json too


def test_manifest_lists_every_corpus_entry():
    on_disk = {p.name for p in CORPUS.iterdir() if p.name != "manifest.json" and not p.name.startswith(".")}
    assert on_disk == set(ENTRIES)
    outcomes = [e["outcome"] for e in ENTRIES.values()]
    assert outcomes.count("report") >= 10 and outcomes.count("error") >= 8
    assert sum(name.startswith("meta_") for name in ENTRIES) >= 5


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_cli_outcome_matches_manifest(cli, tmp_path, name):
    expected = ENTRIES[name]
    path = stage(tmp_path, name)
    result = cli("analyze", str(path))
    assert "Traceback" not in result.stderr, result.stderr
    stderr = result.stderr.strip().splitlines()
    if expected["outcome"] == "error":
        assert result.returncode == 2, result.stdout + result.stderr
        assert len(stderr) == 1 and stderr[0].startswith("error: "), result.stderr
        assert expected["message_contains"] in stderr[0]
        assert str(path) in stderr[0]
        assert result.stdout == ""
        assert report_files(tmp_path) == []
        return
    assert result.returncode == 0, result.stderr
    if path.is_dir() and "ranks" in expected:
        assert all(line.startswith("warning: ") for line in stderr), stderr
        for trace_name, counts in expected["ranks"].items():
            trace = path / trace_name
            out = path / (trace_name.removesuffix(".json.gz").removesuffix(".json") + ".report")
            assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
            report = json.loads((out / "report.json").read_text())
            check_counts(report, counts)
            check_warning(stderr, trace, counts["warning_contains"], report)
        return
    if path.is_dir():  # a run folder: one trace, its reports beside it
        trace, out = path / "rank0.trace.json.gz", path
    else:
        trace, out = path, path.parent / (path.name.removesuffix(".gz").removesuffix(".json") + ".report")
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("report.")) == [
        "report.html", "report.json", "report.md"]
    report = json.loads((out / "report.json").read_text())
    meta_warning = expected.get("meta_warning_contains")
    assert len(stderr) == (expected["warning_contains"] is not None) + (meta_warning is not None), stderr
    check_warning(stderr, trace, expected["warning_contains"], report)
    check_counts(report, expected)
    assert f"trace:   {trace}" in result.stdout
    if "run" in expected:
        check_meta(stderr, path / "meta.json", meta_warning, report, expected)


def check_meta(stderr_lines: list[str], meta: Path, expected_warning: str | None, report: dict, expected: dict):
    """What a run folder's meta.json gave: one warning line naming what was ignored, the run facts kept."""
    lines = [line for line in stderr_lines if str(meta) in line]
    if expected_warning is None:
        assert lines == [] and report["source"]["meta_warnings"] == []
    else:
        assert len(lines) == 1 and lines[0].startswith(f"warning: {meta}: ") and expected_warning in lines[0]
        assert report["source"]["meta_warnings"]
    if expected["run"] is None:
        assert report["run"] is None
    else:
        assert {k: report["run"][k] for k in expected["run"]} == expected["run"]
    assert ("step_time_us" in report["summary"]) == expected["step_time"]


def test_corpus_is_what_make_corpus_writes(tmp_path):
    """The committed files are the generator's output (compared after gunzip: zlib builds may differ)."""
    if json.loads(MANIFEST.read_text())["sources"] != source_digests():
        pytest.skip("the fixtures the corpus is cut from were recaptured: run python tests/make_corpus.py")
    manifest = generate(tmp_path / "corpus")
    assert manifest["sources"] == source_digests()
    assert manifest["entries"] == ENTRIES
    for fresh in sorted(p for p in (tmp_path / "corpus").rglob("*") if p.is_file()):
        committed = CORPUS / fresh.relative_to(tmp_path / "corpus")
        a, b = fresh.read_bytes(), committed.read_bytes()
        if fresh.name.endswith(".gz") and a[:2] == b[:2] == b"\x1f\x8b":
            try:
                a, b = gzip.decompress(a), gzip.decompress(b)
            except (EOFError, OSError):  # the deliberately truncated ones
                pass
        assert a == b, fresh.name


def test_corpus_stays_small():
    assert sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file()) < 400_000
