"""The shape of each tool's structured content (analyzer.mcp.answers builds it), as dataclasses the SDK publishes as
the tool's output schema and checks each answer against. Report sections a detector owns stay open dicts, as in
report.json's own schema (analyzer.report.schema)."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Paged:
    total: int
    offset: int
    next_offset: int | None  # where the next page starts; None: nothing left
    note: str | None  # how to get the rest, where some is left


@dataclasses.dataclass
class BiggestSaving:
    finding: str | None
    title: str | None
    saving_ms: float | None
    saving_share: float | None


@dataclasses.dataclass
class RunEntry:
    run: str  # the id the other tools take
    workload: str
    model: str | None
    device: str | None
    created: str | None
    status: str  # analyzed | not analyzed | queued | analyzing | error
    error: str | None
    gpu_utilization: float | None
    top_finding: str | None
    biggest_saving: BiggestSaving | None


@dataclasses.dataclass
class RunList(Paged):
    text: str
    runs: list[RunEntry]


@dataclasses.dataclass
class FindingBrief:
    id: str
    row: str | None  # its row in report.md's findings table ('2', '1.1'); `finding` takes either
    kind: str
    severity: str
    title: str
    call_site: str | None
    parent: str | None
    gpu_idle_us: float  # GPU idle this finding explains (a top-level finding owns it alone)
    count: int
    confidence: str
    saving_ms: float | None  # what fixing it buys per step (or over the window), in the unprofiled run
    saving_share: float | None
    fix: str | None  # the change the replay priced
    why_no_saving: str | None


@dataclasses.dataclass
class Analysis(Paged):
    text: str
    run: str
    trace: str
    summary: dict[str, Any]
    idle_partition: dict[str, Any]
    what_if: dict[str, Any]
    what_if_text: str | None
    checks: list[dict[str, Any]]  # the trace checks that warn or fail: name, status, meaning
    checks_failed: list[str]
    checks_warned: list[str]
    findings: list[FindingBrief]  # top-level, ranked by saving


@dataclasses.dataclass
class FindingFull(FindingBrief):
    text: str
    run: str
    library_site: str | None
    advice: str
    confidence_checks: list[str]
    python_frames: list[str]
    source_lines: list[dict[str, Any]]  # file, line, code
    what_if: dict[str, Any] | None
    what_if_text: str | None
    refined_by: list[FindingBrief]
    occurrences_us: list[list[float]]  # [start, duration] of the first occurrences
    occurrences_total: int
    occurrences_note: str | None
    detail: dict[str, Any]


@dataclasses.dataclass
class FixedFinding:
    kind: str
    title: str
    call_site: str | None
    predicted_saving_ms: float | None
    gpu_idle_before_us: float | None


@dataclasses.dataclass
class NewFinding:
    kind: str
    title: str
    gpu_idle_us: float | None


@dataclasses.dataclass
class Difference:
    what: str  # GPU, model, workload, batch size, torch (analyzer.compare.verdict.DIFFERENCES)
    before: Any
    after: Any


@dataclasses.dataclass
class Comparison(Paged):  # paged over diff.md's lines (total: its lines)
    text: str
    before: str
    after: str
    differences: list[Difference]  # what differs between the runs besides the change (the headline leads with it)
    warnings: list[str]  # the comparison's own warnings, in full
    verdict: dict[str, Any]  # outcome, headline, the step change and its noise, attribution
    summary: dict[str, Any]
    fixed: list[FixedFinding]
    new: list[NewFinding]
    markdown: str  # diff.md, whole


@dataclasses.dataclass
class QueryResult:
    text: str
    columns: list[str]
    rows: list[list[Any]]  # text values cut to analyzer.mcp.texts.CELL characters
    offset: int
    next_offset: int | None  # where the next page starts; None: no rows left
    truncated: bool
    note: str | None
    cells_cut: int  # values cut to CELL characters


@dataclasses.dataclass
class Column:
    name: str
    type: str  # string, int64, float64, timestamp (UTC, µs)
    meaning: str


@dataclasses.dataclass
class Table:
    table: str
    rows: int
    columns: list[Column]


@dataclasses.dataclass
class Tables:
    text: str
    tables: list[Table]


@dataclasses.dataclass
class Captured:
    text: str
    runs: list[str]
    stdout: str
