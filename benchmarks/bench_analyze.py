"""Analyzer speed and memory against the stdlib JSON floor and HolisticTraceAnalysis, on large real-shaped traces.

    python benchmarks/bench_analyze.py [--sizes 200 1000] [--runs 3] [--source tests/fixtures/h200/item_sync]

Builds each trace by replicating a committed H200 run (benchmarks/replicate_trace.py), then measures, in the same
run, each as a whole fresh process: (a) stdlib json.loads of the trace bytes with gc disabled (the floor), (a') our
typed msgspec decode of the event array alone, in one process (the per-core floor of our loader), (b) our
full `analyze --no-cache` (load + all detectors + all three reports), (c) HTA's TraceAnalysis(trace_dir=...)
construction (skipped if HTA is not installed), and (d) reopening the columnar cache. Wall time and peak RSS are
the median of --runs runs; the table goes to stdout and to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from replicate_trace import replicate  # noqa: E402

JSON_FLOOR = ("import gc, json, sys; data = open(sys.argv[1], 'rb').read(); gc.disable(); json.loads(data)")
HTA = ("import logging, sys; logging.disable(logging.WARNING); from hta.trace_analysis import TraceAnalysis; "
       "TraceAnalysis(trace_dir=sys.argv[1])")
# Our typed decode alone (msgspec, the model's fields only, one process, no columns): what the loader cannot beat
# per core, whatever else it does. The full analysis splits it over two processes.
DECODE_FLOOR = """
import gc, mmap, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from analyzer.trace.parse import _as_array, decode_chunk, find_event_array, trace_text
gc.disable()
with trace_text(Path(sys.argv[1])) as text:
    array = find_event_array(text)
    copy = bytearray(0 if isinstance(text, mmap.mmap) else array.end - array.start + 2)  # a mapped file: in place
    with _as_array(text, array.start, array.end, copy) as events:
        decode_chunk(events)
"""
REOPEN = ("import sys; sys.path.insert(0, sys.argv[2]); from analyzer.trace import load_trace; "
          "load_trace(sys.argv[1], cache=True)")


def measure(cmd: list[str], timeout_s: float, cwd: Path = REPO) -> dict:
    """Wall seconds and peak RSS (MiB) of one child process."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
    deadline = started + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            return {"seconds": None, "rss_mib": None, "error": f"timed out after {timeout_s:.0f} s"}
        time.sleep(0.02)
    wall = time.perf_counter() - started
    err = proc.stderr.read().decode(errors="replace").strip().splitlines()
    ok = os.waitstatus_to_exitcode(status) == 0
    return {"seconds": wall if ok else None, "rss_mib": usage.ru_maxrss / 1024,
            "error": None if ok else (err[-1] if err else f"exit {os.waitstatus_to_exitcode(status)}")}


def median_of(runs: list[dict]) -> dict:
    good = [r for r in runs if r["seconds"] is not None]
    if not good:
        return runs[-1]
    return {"seconds": statistics.median(r["seconds"] for r in good),
            "rss_mib": statistics.median(r["rss_mib"] for r in good), "error": None, "runs": len(good)}


def bench_size(source: Path, size_mb: float, runs: int, work: Path, hta_timeout: float | None,
               baseline: Path | None = None) -> dict:
    run_dir = work / f"run-{int(size_mb)}mb"
    run_dir.mkdir(parents=True, exist_ok=True)
    info = replicate(source, run_dir / "rank0.trace.json", size_mb)
    shutil.copy(source / "meta.json", run_dir / "meta.json")
    trace = run_dir / "rank0.trace.json"
    py = sys.executable
    rows = {}
    rows["json.loads (gc off)"] = median_of([measure([py, "-c", JSON_FLOOR, str(trace)], 600) for _ in range(runs)])
    rows["typed decode only, 1 process"] = median_of([measure([py, "-c", DECODE_FLOOR, str(trace), str(REPO)], 600)
                                                      for _ in range(runs)])
    ours, theirs = [], []
    for _ in range(runs):  # with a baseline, the two alternate: both see the host's load alike
        for checkout, results in ((REPO, ours), *([(baseline, theirs)] if baseline else [])):
            shutil.rmtree(run_dir / ".gpu-idle-cache", ignore_errors=True)
            out = Path(tempfile.mkdtemp(dir=work))
            results.append(measure([py, "-m", "analyzer", "analyze", str(run_dir), "--no-cache", "--out", str(out)],
                                   600, cwd=checkout))
    rows["analyze (full, no cache)"] = median_of(ours)
    if baseline:
        rows[f"analyze (full, no cache), baseline {baseline.name}"] = median_of(theirs)
    subprocess.run([py, "-c", REOPEN, str(trace), str(REPO)], check=True, cwd=REPO)  # build the cache once
    rows["reopen cached model"] = median_of([measure([py, "-c", REOPEN, str(trace), str(REPO)], 600)
                                             for _ in range(runs)])
    if hta_timeout is None:
        return {"size_mb": round(info["bytes"] / 1e6, 1), "events": info["events"], "rows": rows}
    try:
        import hta  # noqa: F401
        hta_dir = work / f"hta-{int(size_mb)}mb"
        hta_dir.mkdir(exist_ok=True)
        (hta_dir / "rank0.trace.json").unlink(missing_ok=True)
        os.link(trace, hta_dir / "rank0.trace.json")
        hta_runs = [measure([py, "-c", HTA, str(hta_dir)], hta_timeout) for _ in range(runs if size_mb <= 300 else 1)]
        rows["HTA TraceAnalysis()"] = median_of(hta_runs)
    except ImportError:
        rows["HTA TraceAnalysis()"] = {"seconds": None, "rss_mib": None, "error": "HTA not installed"}
    return {"size_mb": round(info["bytes"] / 1e6, 1), "events": info["events"], "rows": rows}


def table(results: list[dict]) -> str:
    lines = ["| trace | measurement | wall (s) | peak RSS (MiB) | time vs json.loads | RSS vs HTA |",
             "|---|---|---|---|---|---|"]
    for res in results:
        floor = res["rows"]["json.loads (gc off)"]["seconds"]
        hta_rss = res["rows"].get("HTA TraceAnalysis()", {}).get("rss_mib")
        for name, r in res["rows"].items():
            sec = "–" if r["seconds"] is None else f"{r['seconds']:.2f}"
            rss = "–" if r["rss_mib"] is None else f"{r['rss_mib']:.0f}"
            ratio = f"{r['seconds'] / floor:.2f}x" if r["seconds"] and floor else "–"
            vs_hta = f"{r['rss_mib'] / hta_rss:.2f}x" if r["rss_mib"] and hta_rss and r["seconds"] else "–"
            note = f" ({r['error']})" if r.get("error") else ""
            lines.append(f"| {res['size_mb']} MB, {res['events']:,} events | {name}{note} | {sec} | {rss} | "
                         f"{ratio} | {vs_hta} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[200, 1000], help="trace sizes in MB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--source", type=Path, default=REPO / "tests/fixtures/h200/item_sync")
    ap.add_argument("--hta-timeout", type=float, default=300)
    ap.add_argument("--no-hta", action="store_true", help="skip HTA (minutes per run on these sizes)")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. `git worktree add /tmp/base REV`): its "
                    "`analyze` is measured too, alternating with ours")
    ap.add_argument("--work", type=Path, help="scratch folder (default: a temporary one, removed afterwards)")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-idle-bench-"))
    try:
        results = [bench_size(args.source, size, args.runs, work, None if args.no_hta else args.hta_timeout,
                              args.baseline.resolve() if args.baseline else None) for size in args.sizes]
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    text = f"Analyzer benchmark, {stamp}, {machine}, median of {args.runs} runs\n\n{table(results)}\n"
    print(text)
    out = REPO / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    name = f"analyze-{stamp}-" + "-".join(f"{s:g}" for s in args.sizes) + "mb" + (
        f"-vs-{args.baseline.name}" if args.baseline else "")
    run = 1
    while (out / f"{name}{f'-run{run}' if run > 1 else ''}.md").exists():  # never overwrite an earlier result
        run += 1
    name += f"-run{run}" if run > 1 else ""
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps({"machine": machine, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
