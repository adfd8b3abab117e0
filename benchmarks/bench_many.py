"""analyze-many's scaling: the same 64 traces of ~20 MB on a LocalCluster of 1, then 2, ... worker processes.

    python benchmarks/bench_many.py [--traces 64] [--size-mb 20] [--workers 1 2] [--source tests/fixtures/h200/decode]

One trace is made by replicating a committed H200 run (benchmarks/replicate_trace.py SOURCE --size-mb N --out DIR)
and copied into --traces run folders. Copies are distinct traces to analyze-many: the content key is the columnar
cache's fingerprint, which includes the file's mtime in ns, and each copy gets its own mtime (set explicitly, so two
copies made within one clock tick differ too). Each copy sits in its own run folder, so each has its own columnar
cache: before every measurement the caches and the dataset are deleted, and every trace is parsed and analysed from
scratch. The cluster is started, and the analyzer imported in its workers, before the clock starts (worker start-up
is not throughput); it is given to analyze-many as `--scheduler`; each worker's peak RSS is read from the worker
itself (VmHWM) before and after the run. On a shared machine wall time says little: the workers' own CPU time per
trace, the share of a core each worker got, and the load average are printed beside it. The table goes to stdout and
to benchmarks/results/.
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
sys.path.insert(0, str(REPO))

from analyzer import fleet  # noqa: E402
from analyzer.fleet.cluster import local_size  # noqa: E402
from analyzer.fleet.inputs import uncompressed_size  # noqa: E402


def peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM (reset when a process execs, unlike getrusage's ru_maxrss, which a spawned
    worker inherits from the process that forked it)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def warm() -> float:
    import analyzer.fleet.task  # noqa: F401
    return peak_rss_mib()


def cpu_seconds() -> float:
    """This process's CPU time (user + system)."""
    t = os.times()
    return t.user + t.system


def make_traces(source: Path, n: int, size_mb: float, work: Path) -> list[Path]:
    one = work / "source"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "replicate_trace.py"), str(source), "--size-mb",
                    str(size_mb), "--out", str(one)], check=True, stdout=subprocess.DEVNULL)
    trace = one / "rank0.trace.json"
    now = time.time_ns()
    runs = []
    for i in range(n):
        run = work / "runs" / f"run{i:03d}"
        run.mkdir(parents=True)
        shutil.copyfile(trace, run / trace.name)
        if (one / "meta.json").is_file():
            shutil.copyfile(one / "meta.json", run / "meta.json")
        os.utime(run / trace.name, ns=(now + i * 1000, now + i * 1000))  # a distinct content key per copy
        runs.append(run)
    return runs


def measure(runs: list[Path], workers: int, out: Path) -> dict:
    import distributed
    for run in runs:
        shutil.rmtree(run / ".gpu-idle-cache", ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    largest = max(uncompressed_size(p, p.stat().st_size) for r in runs for p in r.glob("rank0.trace.json*"))
    n, limit = local_size(len(runs), largest, workers)
    nbytes = sum(p.stat().st_size for r in runs for p in r.glob("rank0.trace.json*"))
    with distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True, memory_limit=limit,
                                  dashboard_address=None, silence_logs=50) as cluster, \
            distributed.Client(cluster) as client:
        client.wait_for_workers(n)
        idle_rss = client.run(warm)  # imports are start-up, not throughput
        cpu_before = client.run(cpu_seconds)
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        result = fleet.analyze_many([str(r) for r in runs], out, scheduler=cluster.scheduler_address,
                                    stream=open(os.devnull, "w"))
        seconds = time.perf_counter() - started
        rss = client.run(peak_rss_mib)
        cpu = sum(client.run(cpu_seconds).values()) - sum(cpu_before.values())
    assert len(result.results) == len(runs) and not result.errors and not result.failures, result
    return {"workers": n, "traces": len(runs), "mb": round(nbytes / 1e6, 1), "seconds": round(seconds, 2),
            "mb_per_s": round(nbytes / 1e6 / seconds, 1), "traces_per_s": round(len(runs) / seconds, 2),
            "memory_limit_mib": round(limit / 2**20), "idle_rss_mib": round(max(idle_rss.values())),
            "peak_rss_mib_max": round(max(rss.values())), "peak_rss_mib_median": round(statistics.median(rss.values())),
            "worker_cpu_s_per_trace": round(cpu / len(runs), 3), "cpu_share_per_worker": round(cpu / seconds / n, 2),
            "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)]}


def table(results: list[dict]) -> str:
    base = results[0]["mb_per_s"] / results[0]["workers"]
    lines = ["| workers | traces | MB | wall (s) | MB/s | traces/s | vs 1 worker | of N x 1 worker | worker CPU s per trace | "
             "CPU a worker got | load average (1 min, before / after) | worker RSS before (MiB) | "
             "peak RSS per worker, max / median (MiB) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = r["mb_per_s"] / base
        lines.append(f"| {r['workers']} | {r['traces']} | {r['mb']:,.0f} | {r['seconds']:.2f} | {r['mb_per_s']:.1f} | "
                     f"{r['traces_per_s']:.2f} | {ratio:.2f}x | {ratio / r['workers']:.2f} | "
                     f"{r['worker_cpu_s_per_trace']:.3f} | {100 * r['cpu_share_per_worker']:.0f}% | "
                     f"{r['load_average'][0]} / {r['load_average'][1]} | {r['idle_rss_mib']} | "
                     f"{r['peak_rss_mib_max']} / {r['peak_rss_mib_median']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=REPO / "tests" / "fixtures" / "h200" / "decode")
    ap.add_argument("--traces", type=int, default=64)
    ap.add_argument("--size-mb", type=float, default=20)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--work", type=Path, help="folder for the traces (default: a temporary one, removed after)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-many-"))
    try:
        runs = make_traces(args.source, args.traces, args.size_mb, work)
        results = [measure(runs, w, work / "dataset") for w in args.workers]
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    stamp = datetime.date.today().isoformat()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    text = (f"analyze-many benchmark, {stamp}, {machine}: {args.traces} traces of {args.size_mb:g} MB "
            f"(replicated {args.source.name})\n\n{table(results)}\n")
    print(text)
    out = REPO / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    name = f"many-{stamp}-{args.traces}x{args.size_mb:g}mb"
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps({"machine": machine, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
