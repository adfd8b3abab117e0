"""What every detector shares: its input context and its output record types."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from analyzer.views import apis
from analyzer.views.frames import FrameIndex
from analyzer.views.idle import Gaps, IdlePieces, classify_idle
from analyzer.views.graphs import GraphUse, graph_use
from analyzer.views.instrumentation import instrumentation_rows
from analyzer.views.onetime import first_call_ops, one_time_rows
from analyzer.trace.runmeta import RunMeta
from analyzer.views.steps import StepRanges, step_ranges
from analyzer.views.timeline import GpuTimeline, build_timeline
from analyzer.trace import TraceModel
from analyzer.views.traits import TraceTraits, trace_traits

SEVERITIES = ("high", "medium", "low", "info")


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str  # launch_gap | host_work | queued | warmup | sync | allocator_churn | event_loop_idle | thread_hop
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

    def __init__(self, model: TraceModel, meta: RunMeta | None = None, *, user_code: tuple[str, ...] = ()):
        self.model = model
        self.meta = meta
        self.user_code = tuple(user_code)

    @functools.cached_property
    def timeline(self) -> GpuTimeline:
        return build_timeline(self.model)

    @functools.cached_property
    def frames(self) -> FrameIndex:
        return FrameIndex(self.model, self.user_code)

    @functools.cached_property
    def runtime_classes(self) -> np.ndarray:
        return apis.runtime_classes(self.model)

    @functools.cached_property
    def steps(self) -> StepRanges:
        return step_ranges(self.model)

    @functools.cached_property
    def graphs(self) -> GraphUse:
        return graph_use(self.model, self.runtime_classes)

    @functools.cached_property
    def traits(self) -> TraceTraits:
        return trace_traits(self.model, self.graphs, self.steps.names, bool((self.frames.generated_frame >= 0).any()))

    @functools.cached_property
    def one_time(self) -> np.ndarray:
        """Per runtime row: its analyzer.views.onetime label code (0: a steady-state call)."""
        return one_time_rows(self.model, self.runtime_classes, self.outermost_ops, self.steps)

    @functools.cached_property
    def instrumentation(self) -> np.ndarray:
        """Per runtime row: the measurement's own call (analyzer.views.instrumentation), not the workload's."""
        return instrumentation_rows(self.model, self.frames, self.runtime_classes)

    @functools.cached_property
    def _idle(self) -> tuple[Gaps, IdlePieces]:
        return classify_idle(self.model, self.timeline, self.runtime_classes, self.one_time,
                             first_call_ops(self.model, self.outermost_ops), self.instrumentation, self.graphs)

    @property
    def gaps(self) -> Gaps:
        return self._idle[0]

    @property
    def idle(self) -> IdlePieces:
        """Every idle nanosecond of every device, cut into pieces of one cause each."""
        return self._idle[1]

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
