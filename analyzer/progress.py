"""A dependency-free progress line on stderr (the capture path may import only the standard library and torch)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, stream=None, width: int = 28):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.width = width
        self.label, self.total, self.done, self.started = "", 0, 0, 0.0
        self.unit = "steps"

    def phase(self, label: str, total: int, unit: str = "steps") -> None:
        self._end_line()
        self.label, self.total, self.done, self.started = label, max(total, 1), 0, time.perf_counter()
        self.unit = unit
        if not self.live:
            self.stream.write(f"  {label} ({total} {unit})\n")
            self.stream.flush()
        self._draw()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._draw()

    def close(self) -> None:
        self._end_line()

    def _draw(self) -> None:
        if not self.live or not self.label:
            return
        filled = int(self.width * min(self.done, self.total) / self.total)
        elapsed = time.perf_counter() - self.started
        rate = f"{self.done / elapsed:5.1f} {self.unit}/s" if elapsed > 0 and self.done else ""
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r  {self.label:<22} [{bar}] {self.done}/{self.total} {rate}")
        self.stream.flush()

    def _end_line(self) -> None:
        if self.live and self.label:
            self.stream.write("\n")
            self.stream.flush()
        self.label = ""


TICKER_THREAD_NAME = "gpu-idle-ticker"  # analyzer.trace.helper may fork beside it (it holds no lock but stderr's)


class Ticker:
    """`with Ticker("parsing x.json", size_bytes) as ticker:` keeps one line on stderr up to date while a long call
    runs: elapsed time, and once the call reports its progress through `ticker.update(done, total)` (bytes), a bar,
    the share done and the throughput. Silent when stderr is not a terminal or the work is small."""

    def __init__(self, label: str, size_bytes: int = 0, stream=None, min_bytes: int = 32 << 20, width: int = 24):
        self.label, self.size, self.width = label, size_bytes, width
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() and size_bytes >= min_bytes
        self.done = self.total = 0
        self.read_in = 0.0  # seconds until all bytes were read (the rest of the work builds tables)

    def update(self, done: int, total: int) -> None:
        """Called by the work itself (from its own thread): the line is redrawn by the ticker's thread."""
        self.done, self.total = done, total
        if done >= total and not self.read_in:
            self.read_in = time.perf_counter() - self.started

    def __enter__(self):
        import threading
        self.started = time.perf_counter()
        self._stop = threading.Event()
        if self.live:
            self._thread = threading.Thread(target=self._run, daemon=True, name=TICKER_THREAD_NAME)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.stream.write(f"\r  {self._line(time.perf_counter() - self.started)}\033[K")
            self.stream.flush()

    def _line(self, elapsed: float) -> str:
        if not self.total:
            return f"{self.label} ({self.size / 1e6:,.0f} MB) {elapsed:5.1f} s"
        share = min(self.done / self.total, 1.0)
        filled = int(self.width * share)
        bar = "#" * filled + "-" * (self.width - filled)
        rate = self.done / 1e6 / max(self.read_in or elapsed, 1e-9)
        then = ", building tables" if self.read_in else ""
        return (f"{self.label} [{bar}] {100 * share:3.0f}% {self.done / 1e6:,.0f}/{self.total / 1e6:,.0f} MB "
                f"{rate:,.0f} MB/s {elapsed:5.1f} s{then}")

    def __exit__(self, *exc):
        self._stop.set()
        if self.live:
            self._thread.join()
            elapsed = time.perf_counter() - self.started
            self.stream.write(f"\r  {self.label} ({self.size / 1e6:,.0f} MB) {elapsed:5.1f} s, "
                              f"{self.size / 1e6 / max(elapsed, 1e-9):,.0f} MB/s\033[K\n")
            self.stream.flush()
        return False
