"""Many traces at once: `analyze-many` fans the single-trace analysis out over a Dask cluster into a Parquet
dataset, and `query` runs DuckDB over it. Dask, pyarrow and DuckDB are imported only inside these commands (the
`fleet` extra), never by `capture` or `analyze`.

    result = fleet.analyze_many(["traces/"], "fleet-out", workers=2, processes=False)
    columns, rows = fleet.query("fleet-out", "SELECT job, rank, utilization FROM traces")
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from analyzer.errors import UsageError
from analyzer.fleet.query import query

__all__ = ["ManyResult", "analyze_many", "job_tables", "query"]


@dataclasses.dataclass
class ManyResult:
    inputs: int
    skipped: list[str]  # sources whose content key was already in the dataset (or named twice)
    results: list[dict]  # one per trace analysed now: source, bytes, error, job, rank
    failures: list[str]  # tasks that failed after their retries (a worker died), one line each
    seconds: float
    cluster: str
    job_report: list[Path] = dataclasses.field(default_factory=list)
    job_report_error: str | None = None  # the job report failed (the dataset is complete all the same)

    @property
    def errors(self) -> list[dict]:
        return [r for r in self.results if r["error"] is not None]


def analyze_many(paths: list[str], out: str | Path, *, job: str | None = None, scheduler: str | None = None,
                 scheduler_file: str | None = None, workers: int | None = None, processes: bool = True,
                 dashboard: bool = True, stream=None) -> ManyResult:
    """Analyse every trace the paths name on a Dask cluster into the Parquet dataset `out`; traces whose content key
    is already there are skipped. Status lines (cluster, dashboard, progress) go to `stream` (stderr)."""
    from analyzer.fleet import cluster as dask_cluster
    from analyzer.fleet.dataset import existing_keys
    from analyzer.fleet.inputs import expand, uncompressed_size
    stream = stream or sys.stderr
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder")
    items = expand(paths, job)
    have = existing_keys(out)
    todo, skipped = [], []
    for item in items:
        if item.content_key in have:
            skipped.append(item.source)
        else:
            have.add(item.content_key)
            todo.append(item)
    started = time.perf_counter()
    results, failures, description = [], [], "none (nothing to analyse)"
    if todo:
        largest = max(uncompressed_size(i.trace.trace, i.size) for i in todo)
        cluster = dask_cluster.connect(scheduler=scheduler, scheduler_file=scheduler_file, workers=workers,
                                       processes=processes, n_traces=len(todo), largest_uncompressed=largest,
                                       dashboard=dashboard)
        try:
            description = cluster.description
            stream.write(f"analyze-many: {len(todo)} traces to analyse ({len(skipped)} skipped: already in {out}) "
                         f"on {description}\n{dask_cluster.dashboard_line(cluster)}\n")
            out.mkdir(parents=True, exist_ok=True)
            progress = dask_cluster.ProgressLine(len(todo), stream)
            results, failures = dask_cluster.run_all(cluster, todo, out, progress)
            progress.close()
        finally:
            cluster.close()
    result = ManyResult(len(items), skipped, results, failures, time.perf_counter() - started, description)
    if out.is_dir():
        _job_report(out, result)
    return result


def _job_report(out: Path, result: ManyResult) -> None:
    """The job report (analyzer.fleet.job) over the dataset. Its failure is said in one line and leaves the dataset
    (already complete) and the exit status as they are."""
    from analyzer.fleet.task import one_line
    from analyzer.fleet.job import write_job_report
    try:
        result.job_report = list(write_job_report(out))
    except Exception as exc:  # noqa: BLE001 - the dataset is written; the report over it is an extra
        result.job_report_error = one_line(exc)


def job_tables(paths, *, job: str | None = None) -> dict:
    """The job report's four tables (analyzer.fleet.job: traces, steps, collectives, findings, as pandas
    DataFrames) of the trace files the paths name, analysed here one after another: the rows analyze-many writes,
    without Dask or a dataset. For a few traces, and for tests."""
    import pandas as pd
    from analyzer.fleet.inputs import expand
    from analyzer.fleet.task import trace_rows
    from analyzer.fleet.job import TABLES, normalise
    parts: dict[str, list[dict]] = {t: [] for t in TABLES}
    for item in expand([str(p) for p in paths], job):
        rows, rank, _ = trace_rows(item)
        for table in TABLES:
            parts[table] += [{**row, "job": item.job, "rank": rank} for row in rows.get(table, [])]
    return normalise({t: pd.DataFrame(rows) if rows else None for t, rows in parts.items()})
