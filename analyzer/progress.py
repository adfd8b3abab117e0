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


class Ticker:
    """`with Ticker("parsing x.json", size_bytes):` shows elapsed time (and, at the end, MB/s) on a terminal while
    one long call runs; silent when stderr is not a terminal or the work is small."""

    def __init__(self, label: str, size_bytes: int = 0, stream=None, min_bytes: int = 32 << 20):
        self.label, self.size = label, size_bytes
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() and size_bytes >= min_bytes

    def __enter__(self):
        import threading
        self.started = time.perf_counter()
        self._stop = threading.Event()
        if self.live:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.stream.write(f"\r  {self.label} ({self.size / 1e6:,.0f} MB) {time.perf_counter() - self.started:5.1f} s")
            self.stream.flush()

    def __exit__(self, *exc):
        self._stop.set()
        if self.live:
            self._thread.join()
            elapsed = time.perf_counter() - self.started
            self.stream.write(f"\r  {self.label} ({self.size / 1e6:,.0f} MB) {elapsed:5.1f} s, "
                              f"{self.size / 1e6 / max(elapsed, 1e-9):,.0f} MB/s\n")
            self.stream.flush()
        return False
