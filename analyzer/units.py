"""Units, once: nanoseconds on the trace clock to report µs (`us`), and the human formats every report, the CLI and
the dashboard print (durations from µs, shares, sizes, factors)."""
from __future__ import annotations


def us(ns) -> float:
    """ns -> µs rounded to the nanosecond, as report.json stores every time."""
    return round(float(ns) / 1e3, 3)


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


def fmt_peak_bytes(value: int | None) -> str:
    """A memory peak that a trace without [memory] events cannot know."""
    return "unknown (no [memory] events)" if value is None else fmt_bytes(value)


def fmt_pct(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.1f}%"


def fmt_ms(value_us: float | None) -> str:
    """µs as a bare number of ms (tables whose header says ms)."""
    return "–" if value_us is None else f"{value_us / 1e3:.3f}"


def fmt_ms_value(value_ms: float | None) -> str:
    """A value already in ms, one decimal (serving latencies)."""
    return "–" if value_ms is None else f"{value_ms:.1f} ms"


def fmt_fine_us(value_us: float) -> str:
    """Sub-µs durations in ns (mean GPU-side gaps), else µs with one decimal."""
    return f"{value_us * 1e3:.0f} ns" if value_us < 1 else f"{value_us:.1f} µs"


def fmt_factor(factor) -> str:
    return "–" if factor is None else f"{factor}×"


def plural(count, noun: str, many: str | None = None) -> str:
    """'1 gap', '3 gaps' (`many` for irregular plurals)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def short_kernel_name(name: str, width: int = 60) -> str:
    """A demangled kernel's name without its return type, template arguments and parameters, for a title:
    `void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, ...)` ->
    `at::native::max_pool_forward_nchw`."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    return name.split("(")[0].split("<")[0][:width]
