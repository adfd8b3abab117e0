"""What `query` costs on a dataset of a large job: docs/fleet.md's queries over a synthetic dataset with the row counts
of N ranks x one trace each (default 1,024 ranks; a 1 GB decode trace holds ~1,400 steps).

    python benchmarks/bench_query.py [--ranks 1024] [--steps 1400] [--collectives 2000] [--work DIR]

The rows are a real analysed run's (tests/fixtures/h200/decode, through analyzer.fleet.tables, so every column has
its real type), repeated to the step and collective counts asked and written with analyzer.fleet.dataset (one file
per rank per table, as analyze-many writes them); utilization and step times get a per-rank spread so the queries
sort real values. Each query runs in a fresh process (DuckDB's start and the views over every file included); wall
time and peak RSS are printed, and the table goes to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from analyzer import api  # noqa: E402
from analyzer.fleet import tables  # noqa: E402
from analyzer.fleet.dataset import write_trace_tables  # noqa: E402

RUN_QUERY = ("import sys, time; sys.path.insert(0, sys.argv[3]); from analyzer import fleet; t = time.perf_counter(); "
             "c, r = fleet.query(sys.argv[1], sys.argv[2]); print(len(r), time.perf_counter() - t)")


def synthesize(out: Path, ranks: int, steps: int, collectives: int, source: Path) -> dict:
    report = api.analyze(api.load(source)).report
    rng = random.Random(0)
    counts = dict.fromkeys(tables.SCHEMA, 0)
    for rank in range(ranks):
        key = f"synthetic{rank:06d}"
        base = {"source": f"/shared/job/rank{rank}.trace.json.gz", "content_key": key, "bytes": 10**9,
                "world_size": ranks, "analyzed_at": tables.now(), "analyzer_version": tables.version()}
        rows = tables.report_rows(report, base)
        scale = 1 + 0.05 * rng.random() + (0.3 if rank == ranks // 3 else 0)  # one slow rank
        trace = rows["traces"][0]
        trace["utilization"] = round(trace["utilization"] / scale, 4)
        one = [s for s in rows["steps"] if not s["step"].startswith("prefill")]
        rows["steps"] = [{**one[i % len(one)], "position": i, "step": f"decode_step#{i}", "step_number": i,
                          "wall_us": one[i % len(one)]["wall_us"] * scale} for i in range(steps)]
        rows["collectives"] = [{"content_key": key, "seq": 1000 + i, "name": "allreduce", "pg": "0",
                                "group_size": ranks, "bytes": 1 << 20, "step": i % steps, "ordinal": 0,
                                "stream": 20, "device": 0, "start_us": 1e6 + 100.0 * i,
                                "end_us": 1e6 + 100.0 * i + 40 * scale, "dur_us": 40 * scale}
                               for i in range(collectives)]
        write_trace_tables(out, "synthetic-job", rank, key, rows)
        for table, r in rows.items():
            counts[table] += len(r)
    return counts


def readme_queries() -> list[str]:
    text = (REPO / "docs" / "fleet.md").read_text()
    section = text.split("### `python -m analyzer query DIR")[1].split("\n### ")[0]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


def run_query(out: Path, sql: str) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", RUN_QUERY, str(out), sql, str(REPO)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    started = time.perf_counter()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    if status:
        raise RuntimeError(stderr.strip().splitlines()[-1])
    n, inside = stdout.split()
    return {"rows": int(n), "query_s": round(float(inside), 3), "process_s": round(wall, 3),
            "rss_mib": round(usage.ru_maxrss / 1024)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=1400)
    ap.add_argument("--collectives", type=int, default=2000)
    ap.add_argument("--source", type=Path, default=REPO / "tests" / "fixtures" / "h200" / "decode")
    ap.add_argument("--work", type=Path, help="folder for the dataset (default: a temporary one, removed after)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-query-"))
    try:
        started = time.perf_counter()
        counts = synthesize(work / "dataset", args.ranks, args.steps, args.collectives, args.source)
        written = time.perf_counter() - started
        size = sum(p.stat().st_size for p in (work / "dataset").rglob("*.parquet"))
        files = sum(1 for _ in (work / "dataset").rglob("*.parquet"))
        results = [{"query": q.split("\n")[0][:70], **run_query(work / "dataset", q)} for q in readme_queries()]
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    stamp = datetime.date.today().isoformat()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    lines = [f"query benchmark, {stamp}, {machine}: {args.ranks} ranks, {files} Parquet files, {size / 1e6:,.0f} MB "
             f"(written in {written:.1f} s); rows: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()), "",
             "| query (first line) | rows out | query (s) | process with start (s) | peak RSS (MiB) |",
             "|---|---|---|---|---|"]
    lines += [f"| `{r['query']}` | {r['rows']} | {r['query_s']:.2f} | {r['process_s']:.2f} | {r['rss_mib']} |"
              for r in results]
    text = "\n".join(lines) + "\n"
    print(text)
    out = REPO / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    name = f"query-{stamp}-{args.ranks}ranks"
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps({"machine": machine, "counts": counts, "files": files,
                                                  "bytes": size, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
