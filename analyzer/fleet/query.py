"""`query DIR "SQL"`: DuckDB (embedded, in memory) over the Parquet dataset, each table a view over its files with
the hive partitions `job` and `rank` as columns. A table with no files yet is an empty view of its schema, so every
query of docs/fleet.md runs on any dataset. Only the tables whose names the SQL mentions get a view."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import threading
from pathlib import Path

from analyzer.errors import UsageError
from analyzer.fleet.tables import SCHEMA

MAX_CELL = 80  # characters of a text cell in the aligned table (csv and json carry everything)


def connect(out_dir: str | Path, tables: list[str] | None = None):
    """An in-memory DuckDB connection with a view per table (`tables`: only these; binding a view reads the footer
    of every file of its table, which is most of a query's time on thousands of files)."""
    import duckdb
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise UsageError(f"{out_dir}: no such dataset folder (write one with analyze-many --out {out_dir})")
    if not (out_dir / "traces").is_dir():
        raise UsageError(f"{out_dir}: not an analyze-many dataset (no traces/ folder in it)")
    from analyzer.fleet.dataset import arrow_schema, table_files
    con = duckdb.connect(":memory:")
    for table in SCHEMA if tables is None else tables:
        if table_files(out_dir, table):
            pattern = str(out_dir.resolve() / table / "**" / "*.parquet").replace("'", "''")
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{pattern}', hive_partitioning=true, "
                        f"union_by_name=true, hive_types={{'job': VARCHAR, 'rank': BIGINT}})")
        else:
            import pyarrow as pa
            schema = arrow_schema(table).append(pa.field("job", pa.string())).append(pa.field("rank", pa.int64()))
            con.register(f"_{table}_empty", schema.empty_table())
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM _{table}_empty")
    return con


def query(out_dir: str | Path, sql: str) -> tuple[list[str], list[tuple]]:
    """(column names, rows) of one SQL statement over the dataset; bad SQL is a one-line UsageError."""
    import duckdb
    con = connect(out_dir, [t for t in SCHEMA if re.search(rf"\b{t}\b", sql, re.I)])
    try:
        cursor = con.execute(sql)
        if cursor.description is None:
            return [], []
        return [d[0] for d in cursor.description], cursor.fetchall()
    except duckdb.Error as exc:
        raise UsageError(f"query: {str(exc).strip().splitlines()[0]}") from None
    finally:
        con.close()


def query_sandboxed(out_dir: str | Path, sql: str, limit: int, offset: int = 0,
                    timeout_s: float | None = None) -> tuple[list[str], list[tuple], bool]:
    """One read-only SELECT over the dataset, for callers that pass on SQL they did not write (the MCP server):
    one statement, a SELECT (a query, a WITH, a FROM-first), run with every file outside the dataset's folder out of
    reach (DuckDB's enable_external_access off, allowed_directories the dataset, the setting locked: no ATTACH,
    COPY, INSTALL, LOAD, and no other file read), and stopped after `timeout_s`. Returns (columns, at most `limit`
    rows from row `offset`, whether more were left); anything else is a one-line UsageError."""
    import duckdb
    out_dir = Path(out_dir).resolve()
    con = connect(out_dir, [t for t in SCHEMA if re.search(rf"\b{t}\b", sql, re.I)])
    try:
        try:
            statements = con.extract_statements(sql)
        except duckdb.Error as exc:
            raise UsageError(f"sql: {str(exc).strip().splitlines()[0]}") from None
        if len(statements) != 1:
            raise UsageError(f"sql: one statement, not {len(statements)}")
        if statements[0].type != duckdb.StatementType.SELECT:
            raise UsageError(f"sql: only a SELECT reads the dataset here, not {statements[0].type.name}")
        _sandbox(con, out_dir)
        with time_limit(con, timeout_s) as stopped:
            try:
                cursor = con.execute(sql)
                columns = [d[0] for d in cursor.description or []]
                skip = offset if cursor.description else 0
                while skip > 0:  # the rows before `offset`, read and dropped a block at a time
                    got = len(cursor.fetchmany(min(skip, 10_000)))
                    skip = skip - got if got else 0
                rows = cursor.fetchmany(limit + 1) if cursor.description else []
            except duckdb.Error as exc:
                if stopped:
                    raise UsageError(f"sql: stopped after {timeout_s:g} s, the time limit for a query") from None
                raise UsageError(f"sql: {str(exc).strip().splitlines()[0]}") from None
        return columns, rows[:limit], len(rows) > limit
    finally:
        con.close()


def describe_sandboxed(out_dir: str | Path, timeout_s: float | None = None) -> dict[str, dict]:
    """Each table of the dataset: its rows and its columns (name, type, meaning; the hive partitions `job` and
    `rank` last), for a caller that discovers the tables before writing SQL. Counting reads the Parquet footers
    only, and stops after `timeout_s`."""
    import duckdb
    out_dir = Path(out_dir).resolve()
    con = connect(out_dir)
    partitions = [("job", "string", "the job folder the trace sits in (hive partition)"),
                  ("rank", "int64", "the trace's rank (hive partition)")]
    try:
        _sandbox(con, out_dir)
        with time_limit(con, timeout_s) as stopped:
            try:
                counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in SCHEMA}
            except duckdb.Error as exc:
                why = f"stopped after {timeout_s:g} s, the time limit" if stopped else str(exc).splitlines()[0]
                raise UsageError(f"tables: {why}") from None
    finally:
        con.close()
    return {t: {"rows": counts[t], "columns": [*SCHEMA[t], *partitions]} for t in SCHEMA}


def _sandbox(con, out_dir: Path) -> None:
    con.execute(f"SET allowed_directories = ['{str(out_dir).replace(chr(39), chr(39) * 2)}']")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


@contextlib.contextmanager
def time_limit(con, timeout_s: float | None):
    """Interrupt what runs on `con` once `timeout_s` have passed; yields a list that is non-empty once it did. The
    interrupt is repeated until the block ends: one sent before DuckDB starts the statement would be lost."""
    stopped: list[bool] = []
    if timeout_s is None:
        yield stopped
        return
    done = threading.Event()

    def watch():
        if done.wait(timeout_s):
            return
        stopped.append(True)
        while not done.is_set():
            con.interrupt()
            done.wait(0.05)
    watcher = threading.Thread(target=watch, name="query-time-limit", daemon=True)
    watcher.start()
    try:
        yield stopped
    finally:
        done.set()
        watcher.join()


def render(columns: list[str], rows: list[tuple], fmt: str = "table") -> str:
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows([["" if v is None else str(v) for v in row] for row in rows])
        return buf.getvalue()
    if fmt == "json":
        return json.dumps([dict(zip(columns, row)) for row in rows], default=str, indent=1) + "\n"
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [bool(rows) and all(isinstance(r[i], (int, float)) or r[i] is None for r in rows)
               for i in range(len(columns))]
    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()
    out = [line(columns), "  ".join("-" * w for w in widths)] + [line(r) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out) + "\n"


def _cell(v) -> str:
    if v is None:
        return "NULL"
    text = repr(round(v, 4)) if isinstance(v, float) else " ".join(str(v).split())
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"
