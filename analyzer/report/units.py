"""Human units for reports: durations from µs, sizes from bytes."""
from __future__ import annotations


def fmt_us(value_us: float | None) -> str:
    if value_us is None:
        return "–"
    v = float(value_us)
    if v == 0:
        return "0"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.2f} s"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.1f} µs"


def fmt_bytes(value: int | None) -> str:
    if value is None:
        return "–"
    v = float(value)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(v) >= size:
            return f"{v / size:.2f} {unit}"
    return f"{int(v)} B"


def fmt_pct(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.1f}%"
