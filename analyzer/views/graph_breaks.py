"""torch.compile graph breaks, from the trace's Python stacks: where Dynamo cannot trace a statement it compiles the
code before it as one graph, runs the statement eagerly, and resumes in a function of its own whose name says where:
`torch_dynamo_resume_in_<function>_at_<line>`. Each call of that resume function is one graph break taken; its
eager section runs from the end of the last compiled graph called before it (in the same call of the compiled
function) to the resume function's start, and holds the eager statement and Dynamo's guard checks for the resumed
graph. Without Python stacks breaks are not named: a second compiled region could as well be another function."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from analyzer.trace import TraceModel
from analyzer.trace.joins import thread_keys
from analyzer.views.frames import parse_frame

RESUME = re.compile(r"\): torch_dynamo_resume_in_(.+)_at_(\d+)$")
# the end of a compiled graph's call: Inductor's annotation, or AOT Autograd's runtime entry (any backend)
GRAPH_CALL_OP = re.compile(r"^## Call CompiledFxGraph ")
GRAPH_CALL_FRAME = re.compile(r"(^|/)torch/_functorch/aot_autograd\.py\(\d+\): forward$")


@dataclasses.dataclass(frozen=True)
class GraphBreaks:
    resume: np.ndarray  # frame row of each resume call, in time order
    site: list[str]  # "file:line" of the statement that broke the graph
    function: list[str]  # the compiled function it broke
    eager_start_ns: np.ndarray  # each break's eager section
    eager_end_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.resume)


def graph_breaks(model: TraceModel) -> GraphBreaks:
    fr, ops, names = model.frames, model.ops, model.names
    resume_codes = {c: m for c, n in enumerate(names) if "torch_dynamo_resume_in_" in n for m in [RESUME.search(n)] if m}
    rows = np.flatnonzero(np.isin(fr.name, list(resume_codes))) if resume_codes and len(fr) else np.zeros(0, np.int64)
    rows = rows[np.argsort(fr.start_ns[rows], kind="stable")]
    sites, functions = [], []
    for r in rows.tolist():
        m = resume_codes[int(fr.name[r])]
        parsed = parse_frame(names[fr.name[r]])
        sites.append(f"{parsed[0]}:{m.group(2)}" if parsed else f"line {m.group(2)}")
        functions.append(m.group(1))
    start = fr.start_ns[rows].copy()
    if len(rows):
        # the end of the last compiled graph call before each resume, on its thread, inside the caller's frame
        call_frames = np.flatnonzero(np.isin(fr.name, [c for c, n in enumerate(names) if GRAPH_CALL_FRAME.search(n)]))
        call_ops = np.flatnonzero(np.isin(ops.name, [c for c, n in enumerate(names) if GRAPH_CALL_OP.search(n)]))
        ends = np.concatenate([fr.end_ns[call_frames], ops.end_ns[call_ops]])
        keys = thread_keys([fr.pid[rows], np.concatenate([fr.pid[call_frames], ops.pid[call_ops]])],
                           [fr.tid[rows], np.concatenate([fr.tid[call_frames], ops.tid[call_ops]])])
        parent = fr.parent[rows]
        floor = np.where(parent >= 0, fr.start_ns[np.maximum(parent, 0)], fr.start_ns[rows])
        for k in range(len(rows)):
            before = ends[(keys[1] == keys[0][k]) & (ends <= fr.start_ns[rows[k]]) & (ends >= floor[k])]
            start[k] = before.max() if len(before) else floor[k]
    return GraphBreaks(rows, sites, functions, start, fr.start_ns[rows].copy())
