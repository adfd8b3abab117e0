"""analyze-many on Dask into a Parquet dataset, and query over it with DuckDB, on the real H200 run folders of
tests/fixtures (and the external DDP trace where ../shared/traces/external is present): one traces row per input
with the single-trace report's utilization, an error row for a corrupt file, re-runs that skip by content key, the
README's queries, one-line errors for bad usage."""
import csv
import gzip
import io
import json
import re
import subprocess
import sys
import types

import pytest

from analyzer import api
from conftest import REPO, run_cli

pytest.importorskip("distributed")
pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from analyzer import fleet  # noqa: E402
from analyzer.fleet.dataset import table_files  # noqa: E402
from analyzer.fleet.tables import SCHEMA, describe  # noqa: E402

FIXTURE_SETS = [REPO / "tests" / "fixtures" / name for name in ("h200", "h200_extra", "h200_serve")]
EXTERNAL = REPO.parent / "shared" / "traces" / "external"
DDP = EXTERNAL / "v100-ddp-training-with-memory.json.gz"
needs_external = pytest.mark.skipif(not DDP.is_file(), reason=f"{EXTERNAL} is absent")


def fixture_traces() -> list:
    return sorted(p for s in FIXTURE_SETS for p in s.glob("*/rank0.trace.json.gz"))


def all_files(out) -> list:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def rows(out, sql) -> list[dict]:
    columns, values = fleet.query(out, sql)
    return [dict(zip(columns, v)) for v in values]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The fixtures' run folders and one corrupt trace, analysed through the command line on a LocalCluster of
    2 worker processes."""
    tmp = tmp_path_factory.mktemp("fleet")
    bad = tmp / "broken_run" / "rank0.trace.json.gz"
    bad.parent.mkdir()
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1'))
    out = tmp / "dataset"
    first = run_cli("analyze-many", *map(str, FIXTURE_SETS), str(bad.parent), "--out", str(out), "--workers", "2")
    return types.SimpleNamespace(out=out, bad=bad, first=first, traces=fixture_traces())


def test_analyze_many_cli_writes_one_traces_row_per_input(dataset):
    r = dataset.first
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    n = len(dataset.traces) + 1
    assert f"analyze-many: {n} traces: {n - 1} analysed, 1 with an error, 0 skipped" in r.stdout
    assert "LocalCluster: 2 worker processes x 1 thread" in r.stderr
    assert f"{n}/{n} traces, 1 error rows, 0 failed" in r.stderr
    got = rows(dataset.out, "SELECT source, job, rank, error FROM traces")
    assert len(got) == n
    assert len({g["source"] for g in got}) == n
    assert {g["job"] for g in got} == {p.parent.name for p in dataset.traces} | {"broken_run"}
    assert {g["rank"] for g in got} == {0}
    for p in dataset.traces:  # hive layout: one traces file per trace, named by its content key
        assert len(list((dataset.out / "traces" / f"job={p.parent.name}").glob("rank=0/*.parquet"))) >= 1


def test_utilization_is_the_single_trace_reports(dataset):
    by_source = {r["source"]: r for r in rows(dataset.out, "SELECT * FROM traces WHERE error IS NULL")}
    assert len(by_source) == len(dataset.traces)
    for trace in dataset.traces:
        report = api.analyze(api.load(trace.parent)).report
        row = by_source[str(trace)]
        assert row["utilization"] == report["summary"]["gpu_utilization"], trace
        assert row["idle_us"] == report["summary"]["gpu_idle_us"]
        assert row["idle_cpu_launch_us"] == report["gaps"]["by_cause"]["cpu_launch"]
        assert row["steps"] == report["summary"]["steps"]
        assert row["findings"] == len(report["findings"])
        assert row["torch"] == report["run"]["torch"] and row["gpu"] == "NVIDIA H200"
        key = row["content_key"]
        findings = rows(dataset.out, f"SELECT kind, impact_us FROM findings WHERE content_key = '{key}' "
                                     "ORDER BY position")
        assert [(f["kind"], f["impact_us"]) for f in findings] == [(f["kind"], f["impact_us"])
                                                                    for f in report["findings"]]
        steps = rows(dataset.out, f"SELECT step, busy_us FROM steps WHERE content_key = '{key}' ORDER BY position")
        assert [(s["step"], s["busy_us"]) for s in steps] == [(s["step"], s["busy_us"])
                                                              for s in report["gaps"]["per_step"]]
        syncs = rows(dataset.out, f"SELECT sum(count) AS n FROM syncs WHERE content_key = '{key}'")[0]["n"]
        assert (syncs or 0) == sum(s["count"] for s in report["syncs"])


def test_a_corrupt_trace_is_an_error_row_and_nothing_else(dataset):
    err = rows(dataset.out, "SELECT source, content_key, error, utilization FROM traces WHERE error IS NOT NULL")
    assert len(err) == 1
    assert err[0]["source"] == str(dataset.bad.parent / dataset.bad.name)
    assert "\n" not in err[0]["error"] and dataset.bad.name in err[0]["error"]
    assert err[0]["utilization"] is None
    key = err[0]["content_key"]
    for table in SCHEMA:
        if table != "traces":
            assert not rows(dataset.out, f"SELECT 1 FROM {table} WHERE content_key = '{key}'"), table
    assert f"error: {dataset.bad}" in dataset.first.stdout


def test_rerun_skips_every_trace_already_in_the_dataset(dataset):
    before = all_files(dataset.out)
    counts = {t: rows(dataset.out, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in SCHEMA}
    r = run_cli("analyze-many", *map(str, FIXTURE_SETS), str(dataset.bad), "--out", str(dataset.out))
    n = len(dataset.traces) + 1
    assert r.returncode == 0, r.stderr
    assert f"analyze-many: {n} traces: 0 analysed, 0 with an error, {n} skipped" in r.stdout
    assert all_files(dataset.out) == before
    assert {t: rows(dataset.out, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in SCHEMA} == counts


def test_query_prints_table_csv_and_json(dataset):
    sql = "SELECT job, count(*) AS traces FROM traces GROUP BY job ORDER BY job"
    expected = sorted([(p.parent.name, 1) for p in dataset.traces] + [("broken_run", 1)])
    table = run_cli("query", str(dataset.out), sql)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["job", "traces"] and set(lines[1]) <= {"-", " "}
    assert [tuple(line.split()) for line in lines[2:-1]] == [(j, str(n)) for j, n in expected]
    assert lines[-1] == f"({len(expected)} rows)"
    as_csv = run_cli("query", str(dataset.out), sql, "--format", "csv")
    assert list(csv.reader(io.StringIO(as_csv.stdout))) == [["job", "traces"]] + [[j, str(n)] for j, n in expected]
    as_json = run_cli("query", str(dataset.out), sql, "--format", "json")
    assert json.loads(as_json.stdout) == [{"job": j, "traces": n} for j, n in expected]


def readme_queries() -> list[str]:
    text = (REPO / "docs" / "fleet.md").read_text()
    section = text.split("### `python -m analyzer query DIR")[1].split("\n### ")[0]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


def test_the_readmes_queries_run(dataset):
    queries = readme_queries()
    assert len(queries) >= 5
    results = [rows(dataset.out, q) for q in queries]
    worst, by_date, syncs, failed, population = results[:5]
    assert worst and worst[0]["utilization"] == min(r["utilization"] for r in worst)
    assert by_date and all(r["traces"] >= 1 for r in by_date)
    assert {r["kind"] for r in syncs} >= {"item", "print"}
    assert [r["source"] for r in failed] == [str(dataset.bad)]
    launch = [r for r in population if r["kind"] == "launch_gap"]
    assert launch and launch[0]["traces"] <= len(dataset.traces)
    assert all(rs for rs in results[5:])


def test_readme_documents_the_schema():
    assert describe() in (REPO / "docs" / "fleet.md").read_text()


def test_in_process_cluster_with_the_python_api(tmp_path):
    """LocalCluster(processes=False), a glob and a run folder naming the same trace twice; with the external DDP
    trace its rank and world size come from distributedInfo."""
    paths = [str(REPO / "tests/fixtures/h200/*/rank0.trace.json.gz"), str(REPO / "tests/fixtures/h200/decode")]
    if DDP.is_file():
        paths.append(str(DDP))
    stream = io.StringIO()
    result = fleet.analyze_many(paths, tmp_path / "ds", workers=2, processes=False, dashboard=False, stream=stream)
    n = len(list((REPO / "tests/fixtures/h200").glob("*/rank0.trace.json.gz"))) + DDP.is_file()
    assert result.inputs == n and len(result.results) == n and not result.failures and not result.errors
    assert "LocalCluster in this process: 2 threads" in stream.getvalue()
    got = rows(tmp_path / "ds", "SELECT job, rank, world_size, utilization FROM traces ORDER BY job")
    assert len(got) == n
    if DDP.is_file():
        ddp = next(r for r in got if r["job"] == "v100-ddp-training-with-memory")
        assert (ddp["rank"], ddp["world_size"]) == (1, 2)
        assert ddp["utilization"] == api.analyze(api.load(DDP)).report["summary"]["gpu_utilization"]
    again = fleet.analyze_many(paths, tmp_path / "ds", workers=2, processes=False, dashboard=False, stream=stream)
    assert len(again.skipped) == n and not again.results


@needs_external
def test_collectives_table_of_a_ddp_trace(tmp_path):
    pytest.importorskip("analyzer.views.collectives")
    fleet.analyze_many([str(DDP)], tmp_path, workers=1, processes=False, dashboard=False, stream=io.StringIO())
    trace = rows(tmp_path, "SELECT content_key, comm_us, busy_us FROM traces")[0]
    coll = rows(tmp_path, "SELECT count(*) AS n, sum(dur_us) AS dur FROM collectives")[0]
    assert coll["n"] > 0 and trace["comm_us"] > 0 and trace["comm_us"] <= trace["busy_us"]
    assert table_files(tmp_path, "collectives")


def test_a_scheduler_of_our_own_and_its_scheduler_file(tmp_path):
    """--scheduler and --scheduler-file reach a running cluster (here one in this process) instead of starting one."""
    import distributed
    # the scheduler writes its file as it starts, as `dask scheduler --scheduler-file` does on a cluster
    # (Client.write_scheduler_file fails once a task's metrics, keyed by tuples, are in the scheduler's info)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                  dashboard_address=None,
                                  scheduler_kwargs={"scheduler_file": str(tmp_path / "sched.json")}) as cluster:
        r = run_cli("analyze-many", str(REPO / "tests/fixtures/h200/decode"), "--out", str(tmp_path / "a"),
                    "--scheduler", cluster.scheduler_address)
        assert r.returncode == 0, r.stderr
        assert f"scheduler {cluster.scheduler_address}" in r.stderr
        r = run_cli("analyze-many", str(REPO / "tests/fixtures/h200/item_sync"), "--out", str(tmp_path / "a"),
                    "--scheduler-file", str(tmp_path / "sched.json"))
        assert r.returncode == 0, r.stderr
    assert len(rows(tmp_path / "a", "SELECT * FROM traces WHERE error IS NULL")) == 2


@pytest.mark.parametrize("args, message", [
    (["analyze-many", "no/such/run"], "no/such/run: no such file or folder"),
    (["analyze-many", "no/such/*.json.gz"], "no/such/*.json.gz: matches nothing"),
    (["analyze-many", "tests/fixtures/h200/decode", "--scheduler", "not an address"], "cannot reach the Dask scheduler"),
    (["analyze-many", "tests/fixtures/h200/decode", "--scheduler-file", "no-such.json"], "no such scheduler file"),
    (["analyze-many", "tests/fixtures/h200/decode", "--workers", "0"], "--workers 0"),
    (["query", "no/such/dataset", "SELECT 1"], "no/such/dataset: no such dataset folder"),
    (["query", "tests/fixtures", "SELECT 1"], "not an analyze-many dataset"),
])
def test_bad_usage_is_one_line_and_exit_2(args, message, tmp_path):
    r = run_cli(*args, "--out", str(tmp_path / "x")) if args[0] == "analyze-many" else run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().count("\n") == 0 and message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("command, blocked", [
    (["analyze-many", "tests/fixtures/h200/decode", "--out", "{tmp}/x"], "distributed"),
    (["query", "tests/fixtures", "SELECT 1"], "duckdb"),
])
def test_without_the_fleet_extra_an_install_hint_not_a_traceback(command, blocked, tmp_path):
    """As on a machine with only the base install: the fleet's module is not importable (None in sys.modules is
    what Python's import system reads as "not there")."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    code = (f"import sys; sys.modules[{blocked!r}] = None; from analyzer.cli import main; "
            f"sys.exit(main({args!r}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == (f"error: {command[0]} needs the fleet extra, which is not installed (no module named "
                                f"{blocked}): pip install -e '.[fleet]'")
    assert not (tmp_path / "x").exists()


def test_bad_sql_is_one_line_and_exit_2(dataset):
    for sql in ("SELEC job FROM traces", "SELECT nope FROM traces", "SELECT * FROM no_such_table"):
        r = run_cli("query", str(dataset.out), sql)
        assert r.returncode == 2 and r.stderr.startswith("error: query: ")
        assert r.stderr.strip().count("\n") == 0


def test_capture_and_analyze_import_no_fleet_dependency():
    code = ("import sys; from analyzer import api, cli; import analyzer.capture; "
            "api.analyze(api.load('tests/fixtures/h200/decode')); "
            "print(sorted(m for m in ('dask', 'distributed', 'pyarrow', 'duckdb') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_an_attempt_killed_midway_is_redone_without_duplicates(tmp_path):
    """What a worker killed between two files leaves (some tables written, no traces file, a temporary file) is
    not in the dataset: the next run analyses the trace again, rewrites the same files and removes the leftover."""
    run = str(REPO / "tests/fixtures/h200/item_sync")
    quiet = dict(workers=1, processes=False, dashboard=False, stream=io.StringIO())
    fleet.analyze_many([run], tmp_path, **quiet)
    counts = {t: rows(tmp_path, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in SCHEMA}
    files = all_files(tmp_path)
    (traces_file,) = table_files(tmp_path, "traces")
    traces_file.unlink()
    (steps_file,) = table_files(tmp_path, "steps")
    leftover = steps_file.parent / f".{steps_file.stem}.deadbeef.tmp"
    leftover.write_bytes(b"PAR1 half a file")
    again = fleet.analyze_many([run], tmp_path, **quiet)
    assert len(again.results) == 1 and not again.skipped
    assert all_files(tmp_path) == files and not leftover.exists()
    assert {t: rows(tmp_path, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in SCHEMA} == counts


def test_one_job_of_traces_that_all_claim_rank_0_gets_its_job_report(tmp_path):
    """Seven rank-0 traces put in one job (--job): the job report says rank 0 was claimed more than once and is
    written (a job without collectives once failed on an empty selection)."""
    traces = sorted((REPO / "tests" / "fixtures" / "h200").glob("*/rank0.trace.json.gz"))
    r = run_cli("analyze-many", *map(str, traces), "--job", "X", "--out", str(tmp_path / "d"), "--threads")
    assert r.returncode == 0 and "job report not written" not in r.stderr, r.stderr
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    (job,) = report["jobs"]
    assert job["ranks"] == [0] and job["duplicate_ranks"] == [0] and job["traces"] == len(traces)
    md = (tmp_path / "d" / "report.md").read_text()  # one rank: a table row, not a section of cross-rank "none"s
    assert "## Jobs of one rank (1)" in md and "### Stragglers" not in md
