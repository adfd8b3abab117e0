"""The Dask side: a client of the cluster named (`--scheduler ADDRESS` / `--scheduler-file F`), else a
`distributed.LocalCluster` sized to this machine and to the largest trace; the tasks submitted with retries; a live
progress line on stderr."""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from pathlib import Path

from analyzer.errors import UsageError

RETRIES = 2  # a worker that dies (killed, out of memory) has its task run again elsewhere
GIB = 1 << 30
WORKER_BASE = GIB  # headroom for the worker process itself (67 MiB with the analyzer imported) and small traces
RSS_PER_TRACE_BYTE = 3  # peak RSS per uncompressed trace byte, with margin (1 GB: 0.45 GB, its helper 0.24 GB)


@dataclasses.dataclass
class Cluster:
    client: object
    cluster: object | None  # the LocalCluster we started (closed with the client), None for a scheduler's
    description: str

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def machine() -> tuple[int, int]:
    """(cores usable by this process, RAM bytes)."""
    import psutil
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores, psutil.virtual_memory().total


def local_size(n_traces: int, largest_uncompressed: int, workers: int | None = None) -> tuple[int, int]:
    """(worker processes, memory limit per worker in bytes): one worker per core and per trace, each allowed a few
    times the largest trace's uncompressed size; fewer workers when RAM cannot hold that many. `workers` overrides the
    count (the limit is then RAM / workers when that is less)."""
    cores, ram = machine()
    need = WORKER_BASE + RSS_PER_TRACE_BYTE * largest_uncompressed
    n = workers or max(1, min(cores, n_traces, ram // need))
    return n, min(need, ram // n)


def connect(*, scheduler: str | None = None, scheduler_file: str | None = None, workers: int | None = None,
            processes: bool = True, n_traces: int = 1, largest_uncompressed: int = 0,
            dashboard: bool = True) -> Cluster:
    import distributed
    logging.getLogger("distributed").setLevel(logging.CRITICAL)  # failures are reported by us, one line each
    if scheduler or scheduler_file:
        if scheduler_file and not Path(scheduler_file).is_file():
            raise UsageError(f"{scheduler_file}: no such scheduler file")
        try:
            client = distributed.Client(scheduler, scheduler_file=scheduler_file, timeout="10s")
        except (OSError, ValueError, TypeError) as exc:
            from analyzer.fleet.task import one_line
            raise UsageError(f"cannot reach the Dask scheduler {scheduler or scheduler_file}: {one_line(exc)}") from None
        n = len(client.scheduler_info().get("workers", {}))
        return Cluster(client, None, f"scheduler {client.scheduler.address} ({n} workers now)")
    n, limit = local_size(n_traces, largest_uncompressed, workers)
    if processes:
        cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True, memory_limit=limit,
                                           silence_logs=logging.CRITICAL,
                                           dashboard_address=":0" if dashboard else None)
        description = (f"LocalCluster: {n} worker process{'es' if n != 1 else ''} x 1 thread, "
                       f"{limit / GIB:.1f} GiB each")
    else:  # one process, a thread per worker (tests, or a machine where processes cannot be started)
        cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=n, processes=False,
                                           silence_logs=logging.CRITICAL,
                                           dashboard_address=":0" if dashboard else None)
        description = f"LocalCluster in this process: {n} threads"
    return Cluster(distributed.Client(cluster), cluster, description)


def dashboard_line(cluster: Cluster) -> str:
    import importlib.util
    if importlib.util.find_spec("bokeh") is None:
        return "dashboard: none (pip install bokeh for the Dask dashboard)"
    return f"dashboard: {cluster.client.dashboard_link}"


class ProgressLine:
    """`12/64 traces, 1 error rows, 0 failed, 85.0 MB/s, 14 s` on stderr: on a terminal redrawn in place twice a
    second (so it ticks while the workers start), elsewhere a line every `every` seconds and the last one."""

    def __init__(self, total: int, stream=None, every: float = 10.0):
        import threading
        self.total, self.stream, self.every = total, stream or sys.stderr, every
        self.live = self.stream.isatty()
        self.done = self.errors = self.failed = self.bytes = 0
        self.started = self.shown = time.perf_counter()
        self._stop = threading.Event()
        if self.live:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self.stream.write(f"\r  {self.line()}\033[K")
            self.stream.flush()

    def update(self, nbytes: int, error: bool = False, failed: bool = False) -> None:
        self.done += 1
        self.bytes += nbytes
        self.errors += error
        self.failed += failed
        now = time.perf_counter()
        if not self.live and now - self.shown >= self.every:
            self.shown = now
            self.stream.write(f"  {self.line()}\n")
            self.stream.flush()

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return (f"{self.done}/{self.total} traces, {self.errors} error rows, {self.failed} failed, "
                f"{self.bytes / 1e6 / elapsed:,.1f} MB/s, {elapsed:,.0f} s")

    def close(self) -> None:
        self._stop.set()
        if self.live:
            self._thread.join()
        self.stream.write(("\r  " if self.live else "  ") + self.line() + ("\033[K\n" if self.live else "\n"))
        self.stream.flush()


def run_all(cluster: Cluster, items: list, out_dir: Path, progress: ProgressLine) -> tuple[list[dict], list[str]]:
    """Submit one task per trace (keyed by content key and retried) and collect them as they finish: (results,
    failures: one line each for a task that failed after its retries)."""
    from distributed import as_completed
    from analyzer.fleet.task import analyze_one, one_line
    futures = {cluster.client.submit(analyze_one, item, str(out_dir), key=f"analyze-{item.content_key}",
                                     retries=RETRIES, pure=False): item for item in items}
    results, failures = [], []
    for future in as_completed(futures):
        item = futures[future]
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - the worker died more often than retried, or ran out of memory
            failures.append(f"{item.source}: {one_line(exc)}")
            progress.update(item.size, failed=True)
            continue
        results.append(result)
        progress.update(item.size, error=result["error"] is not None)
    return results, failures
