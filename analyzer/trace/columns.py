"""Turn one field of many decoded events into a numpy column.

Strictly decoded events hold only ints, floats and strings (missing keys decode
to sentinel numbers), so np.fromiter converts a whole column in one C pass. Events
from the lenient decoder may hold anything ("inf", "N/A", null, lists); they go
through a per-value cleanup that turns odd values into the missing marker.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any, Callable, Sequence

import numpy as np

from .parse import MISSING

Getter = Callable[[Any], Any]
_MAX_ABS_US = 9.2e15  # beyond this, µs * 1000 no longer fits in int64 ns
SYNTHETIC_ID_BASE = -1_000_000_000  # string pids/tids map below this; -1 is a real pid (overhead)


def _as_int(value: Any, missing: int | None) -> int | None:
    if type(value) is int:
        return value if -(2**63) <= value < 2**63 else missing
    if type(value) is float and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if type(value) is str:  # a decimal string ("128", as ROCm writes bytes): what np.fromiter accepts too
        try:
            return _as_int(int(value), missing)
        except ValueError:
            return missing
    return missing


def _as_float(value: Any) -> float:
    if type(value) is int or type(value) is float:
        return float(value)
    return math.nan


def ints(rows: Sequence, get: Getter, *, lenient: bool, missing: int = MISSING,
         bad: list | None = None) -> np.ndarray:
    """int64 column; anything but an integral number (or a decimal string) becomes `missing`.

    With `bad` given, a bool mask of the values that were present (not null) but not integers is appended to it
    whenever there were any (only possible when the one-pass conversion failed).
    """
    if not lenient:
        try:
            return np.fromiter(map(get, rows), dtype=np.int64, count=len(rows))
        except (TypeError, ValueError, OverflowError):
            pass
        try:  # nulls (the root frame's Python parent id) read as NaN in a float column
            values = np.fromiter(map(get, rows), dtype=np.float64, count=len(rows))
        except (TypeError, ValueError):
            values = None
        if values is not None and not (np.abs(values) >= 2**53).any() and not (values % 1 > 0).any():
            return np.where(np.isnan(values), missing, values).astype(np.int64)
    raw = list(map(get, rows))
    column = np.array([_as_int(v, missing) for v in raw], dtype=np.int64)
    if bad is not None:
        odd = np.array([v is not None and _as_int(v, None) is None for v in raw], dtype=bool)
        if odd.any():
            bad.append(odd)
    return column


def microseconds(rows: Sequence, get: Getter, *, lenient: bool) -> np.ndarray:
    """float64 µs; NaN where missing or not a number."""
    if lenient:
        return np.array([_as_float(v) for v in map(get, rows)], dtype=np.float64)
    return np.fromiter(map(get, rows), dtype=np.float64, count=len(rows))


_EXACT_BELOW_US = 2.0**43


def to_ns(us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ns int64, valid bool) from µs with up to 3 decimals.

    Splitting into whole and fractional µs before scaling keeps the result exact
    below 2**43 µs (ts relative to kineto's trimonth base stay there), where a
    double's rounding error is under 0.5 ns; ts * 1000 in one step could be off
    by one ns. Integer µs stay exact up to 2**53.
    """
    valid = np.isfinite(us) & (np.abs(us) < _MAX_ABS_US)
    us = np.where(valid, us, 0.0)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64), valid


def lost_precision(us: np.ndarray) -> bool:
    """Whether some values had sub-µs digits a double cannot hold: fractional values at or
    beyond 2**43 µs, as in traces with absolute epoch timestamps at ns resolution."""
    big = us[np.abs(us) >= _EXACT_BELOW_US]
    return bool(len(big)) and bool((big[np.isfinite(big)] % 1 != 0).any())


def exact_ns(values: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """(ns int64, valid bool) from µs values decoded exactly (ints and Decimals)."""
    ns = np.zeros(len(values), dtype=np.int64)
    valid = np.zeros(len(values), dtype=bool)
    for i, value in enumerate(values):
        if type(value) is int or (isinstance(value, Decimal) and value.is_finite()):
            scaled = round(value * 1000)
            if abs(scaled) < 2**63:
                ns[i], valid[i] = scaled, True
    return ns, valid


class ThreadIds:
    """Maps the string pids/tids kineto writes ("Spans", "Traces", "", "stream 7") to negative synthetic ints;
    decimal strings ("3004819264", as torch 1.8 wrote tids) read as the integer.

    Ids are handed out in order of first appearance while reading; `canonical()` renumbers them by name, so that
    the final ids do not depend on how the file was split for reading.
    """

    def __init__(self) -> None:
        self.by_name: dict[str, int] = {}

    def column(self, rows: Sequence, get: Getter, *, lenient: bool) -> np.ndarray:
        if not lenient:
            try:
                return np.fromiter(map(get, rows), dtype=np.int64, count=len(rows))
            except (TypeError, ValueError, OverflowError):
                pass
        return np.array([self._id(v) for v in map(get, rows)], dtype=np.int64)

    def _id(self, value: Any) -> int:
        as_int = _as_int(value, None)
        if as_int is not None:
            return as_int
        key = value if isinstance(value, str) else repr(value)
        if key not in self.by_name:
            self.by_name[key] = SYNTHETIC_ID_BASE - len(self.by_name)
        return self.by_name[key]

    def export(self) -> list[str]:
        """The names, in the order of their provisional ids."""
        return list(self.by_name)

    def adopt(self, names: list[str], column: np.ndarray) -> np.ndarray:
        """Another ThreadIds' column (its provisional ids named by its export()) in this one's provisional ids."""
        if not names:
            return column
        ours = np.array([self._id(name) for name in names], dtype=np.int64)
        return _renumber(column, ours)

    def canonical(self, column: np.ndarray) -> np.ndarray:
        """The column with provisional ids replaced by the final ones (ordered by name)."""
        if not self.by_name:
            return column
        rank = {name: i for i, name in enumerate(sorted(self.by_name))}
        return _renumber(column, np.array([SYNTHETIC_ID_BASE - rank[name] for name in self.by_name], dtype=np.int64))

    def names(self) -> dict[int, str]:
        """Final id -> name."""
        return {SYNTHETIC_ID_BASE - i: name for i, name in enumerate(sorted(self.by_name))}


def _renumber(column: np.ndarray, new_ids: np.ndarray) -> np.ndarray:
    """The column with provisional id SYNTHETIC_ID_BASE - k replaced by new_ids[k]."""
    k = SYNTHETIC_ID_BASE - column
    provisional = (k >= 0) & (k < len(new_ids))
    if not provisional.any():
        return column
    return np.where(provisional, new_ids[np.where(provisional, k, 0)], column)


class Codes(dict):
    """Interned keys: each new one gets the next code."""

    def __missing__(self, name: str) -> int:
        code = self[name] = len(self)
        return code


class StringTable:
    """Interns names to int32 codes shared by every table of a model."""

    def __init__(self) -> None:
        self._codes = Codes()

    def codes(self, rows: Sequence, get: Getter, *, lenient: bool, bad: list | None = None) -> np.ndarray:
        """Codes of the names; in lenient rows anything but a string reads as "" (with `bad` given, the number
        of such values that were present, not null, is appended to it)."""
        names = map(get, rows)
        if lenient:
            names = list(names)
            if bad is not None:
                bad.append(sum(1 for name in names if type(name) is not str and name is not None))
            names = (name if type(name) is str else "" for name in names)
        return np.fromiter(map(self._codes.__getitem__, names), dtype=np.int32, count=len(rows))

    def strings(self) -> tuple[str, ...]:
        return tuple(self._codes)

    def code_of(self, name: str) -> int | None:
        """The name's code, None when no row so far has that name."""
        return self._codes.get(name)
