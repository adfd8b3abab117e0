"""Device allocations that grow step over step at one op: a buffer rebuilt larger every step (torch.cat onto a tensor
that the step keeps, a cache grown by concatenation). Each step then copies the whole buffer and asks the allocator
for a block it has not held before, so the step's cost grows with its position: a window of a few steps prices only
the sizes it saw. Read from the [memory] events (profile_memory=True): per step, the largest device allocation made at
each call site (the allocating op, the outermost op around it and the Python function it ran in, where the trace has
stacks: two tensors from `torch.empty` in two places are two buffers); a site whose allocation grew by at least
GROWTH_BYTES in every one of at least MIN_STEPS consecutive steps."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from analyzer.trace import TraceModel
from analyzer.views.steps import StepRanges

MIN_STEPS = 3
GROWTH_BYTES = 1 << 20  # a step's growth this large is a block the caching allocator may not hold yet


def growing_allocations(model: TraceModel, steps: StepRanges, outermost_ops: np.ndarray,
                        user_frame: np.ndarray) -> list[dict]:
    """The growing buffers, largest last size first: the op, where it was called (the outermost op around it, the
    user's Python function: user_frame, analyzer.views.frames.FrameIndex's), the consecutive steps it grew in, its first and last sizes there and the mean growth per step."""
    mem, ops, names = model.memory, model.ops, model.names
    if len(steps) < MIN_STEPS or not len(mem):
        return []
    rows = np.flatnonzero((mem.device_type == 1) & (mem.bytes >= GROWTH_BYTES) & ~mem.is_oom & (mem.op >= 0))
    step = steps.index_at(mem.ts_ns[rows]) if len(rows) else np.zeros(0, np.int64)
    rows, step = rows[step >= 0], step[step >= 0]
    largest: dict[tuple, dict[int, int]] = defaultdict(dict)  # call site -> step -> its largest allocation there
    frames = model.frames
    for r, k in zip(rows.tolist(), step.tolist()):
        op = int(mem.op[r])
        outer, frame = int(outermost_ops[op]), int(ops.frame[op])
        frame = int(user_frame[frame]) if frame >= 0 else -1  # the user's function that called it
        site = (int(ops.name[op]), int(ops.name[outer]) if outer >= 0 else -1,
                int(frames.name[frame]) if frame >= 0 else -1)
        largest[site][k] = max(largest[site].get(k, 0), int(mem.bytes[r]))
    out = []
    for (code, outer, frame), sizes in largest.items():
        run = _longest_growing_run(sizes)
        if len(run) >= MIN_STEPS:
            first, last = sizes[run[0]], sizes[run[-1]]
            out.append({"op": names[code], "in_op": names[outer] if outer >= 0 and outer != code else None,
                        "function": names[frame] if frame >= 0 else None,
                        "steps": len(run), "first_step": steps.names[run[0]],
                        "first_bytes": first, "last_bytes": last,
                        "growth_per_step_bytes": (last - first) // (len(run) - 1)})
    return sorted(out, key=lambda g: -g["last_bytes"])


def _longest_growing_run(sizes: dict[int, int]) -> list[int]:
    """The longest run of consecutive steps in which the size grew by at least GROWTH_BYTES from the step before."""
    best, run = [], []
    for k in sorted(sizes):
        if run and k == run[-1] + 1 and sizes[k] - sizes[run[-1]] >= GROWTH_BYTES:
            run.append(k)
        else:
            run = [k]
        if len(run) > len(best):
            best = list(run)
    return best
