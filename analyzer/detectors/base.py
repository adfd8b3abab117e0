"""What every detector shares: its output record types (its input is analyzer.views.context.AnalysisContext)."""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

from analyzer.views.context import AnalysisContext
from analyzer.views.whatif import Fix

__all__ = ["AnalysisContext", "DetectorResult", "Finding", "SEVERITIES", "SiteTable", "severity_for", "share_text"]

SEVERITIES = ("high", "medium", "low", "info")


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str  # launch_gap | host_work | queued | warmup | recompile | graph_break | sync | allocator_churn
    # | event_loop_idle | thread_hop | input_wait | host_compute | shape_setup
    severity: str  # high | medium | low | info
    title: str
    call_site: str | None  # the user's code (a function, or an exact line when known), else the library's / op
    impact_us: float  # GPU idle time this finding explains (a top-level finding owns it alone)
    advice: str
    count: int = 0
    detail: dict = dataclasses.field(default_factory=dict)
    occurrences_us: tuple[tuple[float, float], ...] = ()  # (start, end) on the trace clock, µs; the worst few
    id: str = ""  # unique in the report
    parent: str | None = None  # the finding this one refines ("of which ..."); its idle is part of the parent's
    library_site: str | None = None  # the third-party library code inside call_site where it happened
    fix: Fix | None = dataclasses.field(default=None, compare=False, repr=False)  # what taking the cause away
    # changes in the replay (analyzer.views.whatif); not part of report.json

    def as_dict(self) -> dict:
        d = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "fix"}
        d["occurrences_us"] = [list(o) for o in self.occurrences_us]
        return d


@dataclasses.dataclass(frozen=True)
class DetectorResult:
    sections: dict[str, Any]  # report.json keys this detector owns, with their content
    findings: tuple[Finding, ...] = ()


def severity_for(impact_us: float, window_us: float) -> str:
    """Severity from the share of the GPU window a finding leaves idle."""
    share = impact_us / window_us if window_us > 0 else 0.0
    if share >= 0.10:
        return "high"
    if share >= 0.02:
        return "medium"
    if share >= 0.002:
        return "low"
    return "info"


def share_text(part: float, whole: float) -> str:
    share = 100 * part / whole if whole else 0.0
    return "<1%" if 0 < share < 1 else f"{share:.0f}%"


class SiteTable:
    """Rows keyed by call site (or any key), each made once by `new()` on the key's first event: `add` counts one
    event, adds its values to the row's sums and keeps its first occurrences (`kept` says whether this one was);
    `rows` returns them ranked, sums rounded."""

    def __init__(self, *, sums: tuple[str, ...] = (), count: str | None = "count", max_occurrences: int = 16):
        self._sums, self._count, self._max = sums, count, max_occurrences
        self._rows: dict[Any, dict] = {}
        self.kept = False

    def add(self, key, new: Callable[[], dict], occurrence: tuple | None = None, **values) -> dict:
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = new()
            if self._count:
                row[self._count] = 0
            row.update({name: 0.0 for name in self._sums if name not in row})
            row.setdefault("occurrences", [])
        if self._count:
            row[self._count] += 1
        for name, value in values.items():
            row[name] += value
        self.kept = occurrence is not None and len(row["occurrences"]) < self._max
        if self.kept:
            row["occurrences"].append(occurrence)
        return row

    def rows(self, rank: Callable[[dict], Any]) -> list[dict]:
        out = sorted(self._rows.values(), key=rank)
        for row in out:
            for name in self._sums:
                row[name] = round(row[name], 3)
        return out
