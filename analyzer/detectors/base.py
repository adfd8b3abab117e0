"""What every detector shares: its input context and its output record types."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from analyzer.frames import FrameIndex
from analyzer.gapcauses import classify_gaps
from analyzer.runmeta import RunMeta
from analyzer.timeline import GpuTimeline, build_timeline
from analyzer.trace import TraceModel

SEVERITIES = ("high", "medium", "low", "info")


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str  # launch_gap | sync | allocator_churn
    severity: str  # high | medium | low | info
    title: str
    call_site: str | None
    impact_us: float  # GPU idle time this finding explains
    advice: str
    count: int = 0
    detail: dict = dataclasses.field(default_factory=dict)
    occurrences_us: tuple[tuple[float, float], ...] = ()  # (start, end) on the trace clock, µs; the worst few

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["occurrences_us"] = [list(o) for o in self.occurrences_us]
        return d


@dataclasses.dataclass(frozen=True)
class DetectorResult:
    section: str  # key in report.json
    data: dict[str, Any]
    findings: tuple[Finding, ...] = ()


class AnalysisContext:
    """The trace model plus what is derived from it once and read by several detectors."""

    def __init__(self, model: TraceModel, meta: RunMeta | None = None):
        self.model = model
        self.meta = meta

    @functools.cached_property
    def timeline(self) -> GpuTimeline:
        return build_timeline(self.model)

    @functools.cached_property
    def frames(self) -> FrameIndex:
        return FrameIndex(self.model)

    @functools.cached_property
    def gap_causes(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per device timeline: (cause code, responsible runtime row) of every idle interval."""
        return [classify_gaps(self.model, dev) for dev in self.timeline.devices]

    @functools.cached_property
    def outermost_ops(self) -> np.ndarray:
        """For every op row: the outermost enclosing cpu_op (annotations skipped), by pointer jumping."""
        ops = self.model.ops
        is_ann = ops.is_annotation.astype(bool)
        best = np.where(is_ann, -1, np.arange(len(ops)))
        cur = ops.parent.copy()
        while True:
            live = np.flatnonzero(cur >= 0)
            if not len(live):
                return best
            up = cur[live]
            take = ~is_ann[up]
            best[live[take]] = up[take]
            cur[live] = ops.parent[up]

    def name(self, code: int) -> str:
        return self.model.names[code]


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


def us(ns) -> float:
    return round(float(ns) / 1e3, 3)
