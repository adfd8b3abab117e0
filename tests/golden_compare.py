"""Compare a report with its golden by what it means, not by its bytes.

Floats in a report are sums whose last bits depend on the CPU's vector units and numpy's summation order, so a
report written on another x86-64 or arm64 machine may differ from the golden in those bits, and where such a sum
sits on a rounding boundary, a rounded value (round(x, 3), "12.35 ms") may read one unit of its last decimal higher
or lower. Everything else must be equal.

report.json (`compare_json`): the two trees must have the same keys, the same list lengths, equal strings, booleans,
None and ints. Two numbers of which one is a float:
- rounded values (at most MAX_ROUNDED decimals, as every number the analyzer computes is) may differ by one unit of
  their last decimal: the finest of the two values' own decimals and of the golden's floats at the same place in
  every list element alike (`timeline.devices.0.idle_us[*][*]`), so 1234.5 beside siblings with three decimals may
  move by 0.001, not by 0.1. No relative tolerance for them: 1e-6 of a timestamp on the trace clock (5e12 µs) would
  be 5 s;
- other floats (17 significant digits: copied from meta.json, or a sum left unrounded) within REL relative or ABS.

report.md (`compare_markdown`): line by line; lines must be equal except for the numbers in them (not those inside
names: `model.py:64`, `step#3`, `H200`), each within one unit of its last printed digit. The exact counts are
report.json's ints, compared exactly.

Each function returns the differences, each one line that names where: `summary.gpu_utilization: 0.5571 != 0.6012`.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal

REL = 1e-9  # for unrounded floats: sums differ by ~1e-15 relative between CPUs, 1e-13 at worst
ABS = 1e-9
MAX_ROUNDED = 6  # values with more decimals than this are not rounded values: REL / ABS only


def decimals(value: float) -> int:
    """Decimals of the shortest text that reads back as this float: 12.35 -> 2, 100.0 -> 0, 1e-05 -> 5."""
    if not math.isfinite(value):
        return 0
    exponent = Decimal(repr(float(value))).normalize().as_tuple().exponent
    return max(0, -int(exponent))


def _within_tolerance(expected: float, got: float) -> bool:
    """Equal, or within REL / ABS."""
    a, b = float(expected), float(got)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= max(ABS, REL * max(abs(a), abs(b)))


def numbers_close(expected: float, got: float, places: int | None = None) -> bool:
    """Rounded values (at most MAX_ROUNDED decimals, or `places`, the finest decimal of the golden's floats at this
    place in the report, when that is at most MAX_ROUNDED) may differ by one unit of their last decimal; others by
    REL / ABS."""
    a, b = float(expected), float(got)
    if a == b or (math.isnan(a) and math.isnan(b)):
        return True
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    finest = places if places is not None and places <= MAX_ROUNDED else 0  # a place of unrounded floats: no hint
    d = max(decimals(a), decimals(b), finest)
    if d <= MAX_ROUNDED:
        return abs(a - b) <= max(ABS, 10.0 ** -d * (1 + 1e-9))
    return _within_tolerance(a, b)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value) -> str:
    return "number" if _is_number(value) else type(value).__name__


def _places(tree) -> dict[str, int]:
    """For every place in the tree (list positions as [*]), the finest decimal of its floats."""
    out: dict[str, int] = {}

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{where}.{key}" if where else str(key))
        elif isinstance(node, list):
            for value in node:
                walk(value, f"{where}[*]")
        elif isinstance(node, float):
            out[where] = max(out.get(where, 0), decimals(node))

    walk(tree, "")
    return out


def compare_json(expected, got, *, limit: int = 20) -> list[str]:
    """The differences between two JSON trees (the first `limit`, then a count of the rest), as 'path: detail'."""
    places: dict[str, int] = {}  # found when first needed: most reports match without it
    diffs: list[str] = []
    more = 0

    def add(text: str) -> None:
        nonlocal more
        if len(diffs) < limit:
            diffs.append(text)
        else:
            more += 1

    def walk(a, b, path: str, shape: str) -> None:
        here = path or "(top)"
        if isinstance(a, dict) and isinstance(b, dict):
            missing, extra = [k for k in a if k not in b], [k for k in b if k not in a]
            if missing:
                add(f"{here}: keys missing {missing}")
            if extra:
                add(f"{here}: keys added {extra}")
            for key in a:
                if key in b:
                    walk(a[key], b[key], f"{path}.{key}" if path else str(key),
                         f"{shape}.{key}" if shape else str(key))
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                add(f"{here}: {len(a)} items != {len(b)}")
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}[{i}]", f"{shape}[*]")
        elif _is_number(a) and _is_number(b):
            if isinstance(a, int) and isinstance(b, int):
                if a != b:
                    add(f"{here}: {a} != {b}")
            elif a != b:
                if not places:
                    places.update(_places(expected))
                if not numbers_close(a, b, places.get(shape)):
                    add(f"{here}: {a!r} != {b!r}")
        elif _kind(a) != _kind(b):
            add(f"{here}: {_short(a)} ({_kind(a)}) != {_short(b)} ({_kind(b)})")
        elif a != b:
            add(f"{here}: {_short(a)} != {_short(b)}")

    walk(expected, got, "", "")
    if more:
        diffs.append(f"... and {more} more")
    return diffs


def _short(value, width: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


# A number in report.md: not part of a name (H200, step#3, model.py:64, 2.11.0+cu130, qwen2-0.5b); a factor's "x"
# may follow it (1.10x).
_NUMBER = re.compile(r"(?<![\w.#:/\-])-?\d+(?:\.\d+)?(?:(?![\w.])|(?=x\b))")


def _printed_close(a: str, b: str) -> bool:
    """Two printed numbers: within one unit of the last printed digit."""
    d = max(len(a.partition(".")[2]), len(b.partition(".")[2]))
    return abs(float(a) - float(b)) <= 10.0 ** -d * (1 + 1e-9)


def line_close(expected: str, got: str) -> bool:
    """One line of report.md: the same text, and the same numbers each within one unit of its last printed digit."""
    if expected == got:
        return True
    a, b = _NUMBER.split(expected), _NUMBER.split(got)
    if a != b:  # the text between the numbers
        return False
    na, nb = _NUMBER.findall(expected), _NUMBER.findall(got)
    return len(na) == len(nb) and all(_printed_close(x, y) for x, y in zip(na, nb))


def compare_markdown(expected: str, got: str, *, limit: int = 10) -> list[str]:
    """The lines of report.md that differ beyond rounding, as 'report.md line N: expected != got'."""
    a, b = expected.splitlines(), got.splitlines()
    diffs = []
    if len(a) != len(b):
        diffs.append(f"report.md: {len(a)} lines != {len(b)}")
    bad = [i for i, (x, y) in enumerate(zip(a, b)) if not line_close(x, y)]
    for i in bad[:limit]:
        diffs.append(f"report.md line {i + 1}: {_short(a[i], 200)} != {_short(b[i], 200)}")
    if len(bad) > limit:
        diffs.append(f"... and {len(bad) - limit} more lines")
    return diffs
