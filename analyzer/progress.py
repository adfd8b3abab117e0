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

    def phase(self, label: str, total: int) -> None:
        self._end_line()
        self.label, self.total, self.done, self.started = label, max(total, 1), 0, time.perf_counter()
        if not self.live:
            self.stream.write(f"  {label} ({total} steps)\n")
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
        rate = f"{self.done / elapsed:5.1f} steps/s" if elapsed > 0 and self.done else ""
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r  {self.label:<22} [{bar}] {self.done}/{self.total} {rate}")
        self.stream.flush()

    def _end_line(self) -> None:
        if self.live and self.label:
            self.stream.write("\n")
            self.stream.flush()
        self.label = ""
