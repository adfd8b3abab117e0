"""Steps of a run: which annotations mark them, and the CPU time each one owns (its launches)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from analyzer.trace import TraceModel

_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")


@dataclasses.dataclass(frozen=True)
class StepRanges:
    names: list[str]
    cpu_start_ns: np.ndarray
    cpu_end_ns: np.ndarray
    lo_ns: np.ndarray  # the CPU time the step owns: [lo, hi)
    hi_ns: np.ndarray
    source: str  # which annotations were used

    def __len__(self) -> int:
        return len(self.names)

    def index_at(self, t_ns) -> np.ndarray:
        """Step index owning each time, -1 outside every step."""
        t = np.asarray(t_ns)
        i = np.searchsorted(self.lo_ns, t, side="right") - 1
        ok = (i >= 0) & (t < self.hi_ns[np.clip(i, 0, None)])
        return np.where(ok, i, -1)


def step_ranges(model: TraceModel) -> StepRanges:
    """Steps from the capture's own annotations (prefill, decode_step#N, ...) when present, else ProfilerStep#N.

    Step k owns the CPU time from its start to the next step's start (the last one: to its end): runtime calls made
    then are its launches, and the GPU work they launched is its GPU work, wherever on the GPU timeline it ran.
    """
    steps, names = model.steps, model.names
    labels = [names[c] for c in steps.name.tolist()]
    profiler = np.array([bool(_PROFILER_STEP.match(n)) for n in labels], dtype=bool)
    own = ~profiler
    use = own if own.any() else profiler
    source = "annotations" if own.any() else "ProfilerStep"
    rows = np.flatnonzero(use)
    rows = rows[np.argsort(steps.start_ns[rows], kind="stable")]
    # drop steps nested in an earlier one (e.g. a word#N annotation inside another)
    keep, last_end = [], -1
    for r in rows.tolist():
        if steps.start_ns[r] >= last_end:
            keep.append(r)
            last_end = int(steps.end_ns[r])
    rows = np.asarray(keep, np.int64)
    cpu_s, cpu_e = steps.start_ns[rows], steps.end_ns[rows]
    lo = cpu_s.copy()
    hi = np.append(cpu_s[1:], cpu_e[-1:]).astype(np.int64)
    return StepRanges([labels[r] for r in rows.tolist()], cpu_s, cpu_e, lo, hi, source)
