"""One Dask task: analyse one trace with the single-trace path (`api.load`, its columnar cache reused, then
`api.analyze`) and write its rows into the dataset. A trace that cannot be analysed becomes a `traces` row with its
error; only a dying worker (or memory running out) fails the task, and Dask retries it."""
from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from analyzer import api
from analyzer.errors import UsageError
from analyzer.fleet import tables
from analyzer.fleet.dataset import write_trace_tables
from analyzer.fleet.inputs import FleetInput, rank_of


def analyze_one(item: FleetInput, out_dir: str) -> dict:
    started = time.perf_counter()
    rows, rank, error = trace_rows(item)
    for row in rows["traces"]:
        row["analysis_seconds"] = round(time.perf_counter() - started, 3)
        row["analyzed_at"] = tables.now()
    write_trace_tables(Path(out_dir), item.job, rank, item.content_key, rows)
    return {"source": item.source, "bytes": item.size, "error": error, "rank": rank, "job": item.job}


def trace_rows(item: FleetInput) -> tuple[dict[str, list[dict]], int, str | None]:
    """One trace's rows of every table (only a traces row with its error when it cannot be analysed), its rank, and
    the error."""
    base = {"source": item.source, "content_key": item.content_key, "bytes": item.size,
            "trace_mtime": _mtime(item.trace.trace), "analyzer_version": tables.version()}
    rank, world = rank_of(item, None)
    try:
        trace = api.load(item.trace)
        rank, world = rank_of(item, trace.model.metadata)
        analysis = api.analyze(trace)
        rows = tables.report_rows(analysis.report, {**base, "world_size": world})
        rows.update(collective_rows(analysis, rows["traces"][0]))
        return rows, rank, None
    except MemoryError:
        raise  # the worker's limit, not the trace's fault: Dask retries it
    except Exception as exc:  # noqa: BLE001 - a corrupt, foreign or unexpected trace is a row, never a failed run
        error = one_line(exc)
        return tables.error_row({**base, "world_size": world}, error), rank, error


def collective_rows(analysis, trace_row: dict) -> dict[str, list[dict]]:
    """The table of this trace's collective kernels, and their totals as columns of the traces row."""
    from analyzer.fleet.collectives import collective_table
    from analyzer.views.collectives import comm_totals
    totals = comm_totals(analysis.context)
    trace_row.update(comm_us=totals.get("comm_us"), compute_us=totals.get("compute_us"),
                     comm_overlap_us=totals.get("overlap_us"))
    frame = collective_table(analysis.context)
    return {"collectives": tables.frame_rows(frame, {"content_key": trace_row["content_key"]}, "collectives")}


def _mtime(path: Path) -> dt.datetime | None:
    try:
        return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)
    except OSError:  # gone since it was listed: its load says so in the error row
        return None


def one_line(exc: BaseException) -> str:
    """An exception as one line: its message's first line, after its type's name unless it is a UsageError (whose
    line already names the file and what is wrong)."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    if not isinstance(exc, UsageError):
        line = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return line[:500]
