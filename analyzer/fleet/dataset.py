"""The Parquet dataset under DIR: `DIR/<table>/job=<job>/rank=<rank>/<content_key>.parquet`, one file per trace per
table (none for a table where the trace has no rows). Each file is written under a temporary name and renamed
(os.replace), the `traces` file last: a trace is in the dataset once its `traces` file exists, and a retried task
rewrites the same names, so nothing is duplicated (and removes the temporary files a killed attempt left)."""
from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

from analyzer.fleet.tables import SCHEMA, typed

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
def partition_value(job: str) -> str:
    """A job name safe as a folder name on every filesystem (other characters become _)."""
    safe = _UNSAFE.sub("_", job).lstrip(".")
    return safe or "_"


def arrow_schema(table: str):
    import pyarrow as pa
    types = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "timestamp": pa.timestamp("us", "UTC")}
    return pa.schema([(name, types[kind]) for name, kind, _ in SCHEMA[table]])


def write_trace_tables(out_dir: Path, job: str, rank: int, key: str, rows: dict[str, list[dict]]) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    written = []
    for table in sorted(rows, key=lambda t: t == "traces"):  # traces last: it marks the trace as done
        if not rows[table]:
            continue
        folder = Path(out_dir) / table / f"job={partition_value(job)}" / f"rank={rank}"
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{key}.parquet"
        for left in folder.glob(f".{key}.*.tmp"):  # a killed attempt's file (its retry is this call)
            left.unlink(missing_ok=True)
        staging = folder / f".{key}.{uuid.uuid4().hex}.tmp"
        try:
            pq.write_table(pa.Table.from_pylist(typed(table, rows[table]), schema=arrow_schema(table)), staging)
            os.replace(staging, target)
        finally:
            staging.unlink(missing_ok=True)
        written.append(target)
    return written


def existing_keys(out_dir: Path) -> set[str]:
    """Content keys already in the dataset: the names of the `traces` files (no file is read)."""
    return {p.stem for p in table_files(out_dir, "traces")}


def table_files(out_dir: Path, table: str) -> list[Path]:
    return sorted((Path(out_dir) / table).glob("job=*/rank=*/*.parquet"))
