"""report.json's typed core: the parts every reader relies on (source, summary, idle partition, findings, their
savings, the trace checks), as msgspec Structs. A report read from disk is checked against them
(analyzer.report.stored); docs/report-schema.json is generated from them (`python -m analyzer.report.schema`, and a
test keeps the committed file equal to it).

Sections a single detector owns (gaps, syncs, allocator, serving, timeline, ...) stay open dictionaries here: their
keys are documented where they are made, and extra keys anywhere are allowed, so a newer minor version of the report
still reads.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Literal

import msgspec

SCHEMA_PREFIX = "gpu-idle-analyzer/report/"
Severity = Literal["high", "medium", "low", "info"]
Confidence = Literal["high", "medium", "low"]
CheckStatus = Literal["ok", "warn", "fail"]


class Tool(msgspec.Struct):
    name: str
    version: str


class Source(msgspec.Struct):
    trace: str
    meta: str | None
    meta_warnings: list[str]
    trace_key: dict[str, Any] | None = None  # the trace's content key (analyzer.report.stored): is this report fresh


class IdlePartition(msgspec.Struct):
    """Every idle microsecond once: findings (top-level impacts) + instrumentation + unexplained + unknown launch."""
    idle_us: float
    findings_us: float
    instrumentation_us: float
    unexplained_us: float
    unknown_launch_us: float
    definition: str


class Summary(msgspec.Struct):
    gpu_utilization: float | None
    gpu_busy_us: float
    gpu_idle_us: float
    window_us: float
    profiler_overhead_us: float
    steps: int
    step_word: str
    devices: list[int]
    idle_partition: IdlePartition
    traits: dict[str, Any]
    top_finding: str | None
    step_time_us: dict[str, Any] | None = None
    communication: dict[str, Any] | None = None
    note: str | None = None


class Saving(msgspec.Struct):
    """What fixing a top-level finding buys, by replaying the trace without its cause (analyzer.views.whatif); no
    saving (None) where no replay can say, and why."""
    saving_ms: float | None
    why: str | None = None
    measure: str | None = None
    step_ms: float | None = None
    fixed_step_ms: float | None = None
    saving_share: float | None = None
    fix: str | None = None
    kept_cost_ms: float | None = None
    once_ms: float | None = None  # a one-time cost: what a warmed-up run saves over the whole window
    window_ms: float | None = None  # that window's replayed span
    replayed_saving_ms: float | None = None  # the replay's own figure, where it was more than the measured step
    # leaves above the GPU's own work (saving_ms is then that headroom)
    mean_saving_ms: float | None = None  # a fix that changes only some steps and not the median one: per step, mean
    steps_in_window: int | None = None  # measure "step": the steps the window holds (a per-step saving, that often)


class Finding(msgspec.Struct):
    id: str
    kind: str
    severity: Severity
    title: str
    call_site: str | None
    library_site: str | None
    impact_us: float  # GPU idle this finding explains; a top-level finding owns it alone
    advice: str
    count: int
    detail: dict[str, Any]
    occurrences_us: list[list[float]]
    parent: str | None  # the finding this one refines; its idle is part of the parent's
    confidence: Confidence
    confidence_checks: list[str]
    what_if: Saving | None = None


class Check(msgspec.Struct):
    name: str
    status: CheckStatus
    measured: dict[str, Any]
    meaning: str
    affects: list[str]


class Validity(msgspec.Struct):
    checks: list[Check]
    failed: list[str]
    warned: list[str]
    definition: str


class Report(msgspec.Struct):
    schema: str
    tool: Tool
    source: Source
    summary: Summary
    run: dict[str, Any] | None
    trace: dict[str, Any]
    gaps: dict[str, Any]
    validity: Validity
    findings: list[Finding]
    what_if: dict[str, Any]
    hta: dict[str, Any] | None
    analysis_seconds: float


def check(report: dict) -> str | None:
    """None when `report` has report.json's typed core, else the first problem, naming its key."""
    if not isinstance(report, dict) or not str(report.get("schema", "")).startswith(SCHEMA_PREFIX):
        return "not a gpu-idle-analyzer report.json (no 'schema' key)"
    try:
        msgspec.convert(report, Report)
    except msgspec.ValidationError as exc:
        return str(exc)
    return None


def json_schema() -> dict:
    schema = msgspec.json.schema(Report)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gpu-idle-analyzer report.json (typed core; other keys are allowed)"
    return schema


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(json_schema_text())
