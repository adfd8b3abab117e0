"""Whose code a Python frame is: the user's, a third-party library's, torch's, the standard library's, generated
(torch.compile / Inductor / FX output), or this tool's own capture code.

Kineto names a Python frame `file(line): func` where `line` is the function's *definition* line, and writes paths
relative to their sys.path entry (`torch/nn/modules/module.py`, `transformers/generation/utils.py`), so libraries
are recognised by their top-level package as well as by site-packages / dist-packages in absolute paths.
"""
from __future__ import annotations

import functools
import re

import numpy as np

from analyzer.codepaths import INDUCTOR_MODULE, FrameKind, path_kind
from analyzer.trace import TraceModel
from analyzer.views.waits import present_codes


_FILE_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.+)$")
# The compiled graph itself: Inductor's output module, or an FX GraphModule's generated forward.
_COMPILED_GRAPH = re.compile(r"torchinductor_[^/\\]*[/\\]|[/\\]inductor_cache[/\\]|^<eval_with_key>|" + INDUCTOR_MODULE)
# Frames that run on behalf of their enclosing function: time in them belongs to it.
_INNER_FUNCTIONS = frozenset({"<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>"})


@functools.lru_cache(maxsize=65536)
def parse_frame(name: str) -> tuple[str, int, str] | None:
    """(file, definition line, function) for `file(line): func` frames, None for modules and built-ins."""
    m = _FILE_FRAME.match(name)
    if not m:
        return None
    return m.group("file"), int(m.group("line")), m.group("func")


@functools.lru_cache(maxsize=65536)
def frame_kind(name: str, user_code: tuple[str, ...] = ()) -> FrameKind:
    parsed = parse_frame(name)
    if parsed is None:
        return FrameKind.OTHER
    return path_kind(parsed[0], user_code)


def is_inner_function(name: str) -> bool:
    parsed = parse_frame(name)
    return parsed is not None and parsed[2] in _INNER_FUNCTIONS


def describe_compiled(name: str | None) -> str | None:
    """`call() in clw7y73aesw….py (Inductor output)`: a compiled graph by its module, without the cache path."""
    parsed = parse_frame(name) if name else None
    if parsed is None:
        return None
    file, _, func = parsed
    base = re.split(r"[/\\]", file)[-1]
    what = "FX graph" if file.startswith("<eval_with_key>") else "Inductor output"
    short = base if len(base) <= 24 or file.startswith("<") else base[:12] + "…" + base[-3:]
    return f"{func}() in {short} ({what})"


def describe_frame(name: str | None) -> str | None:
    """`forward() (defined at workloads/qwen2/model.py:56)`: a frame as what it is, a function, not a culprit line."""
    if not name:
        return None
    parsed = parse_frame(name)
    if parsed is None:
        return name
    file, line, func = parsed
    return f"{func}() (defined at {file}:{line})"


class FrameIndex:
    """Per-frame-row answers computed once per trace.

    - user_frame: the innermost frame at or above that is the user's (or this tool's) code, skipping generator
      expressions, comprehensions and lambdas, whose time belongs to the function that runs them;
    - library_frame: the innermost third-party library frame at or above, if it lies inside that user frame
      (a library the user called, not a library that called the user's code);
    - generated_frame: the innermost frame of a compiled graph (Inductor's output module, an FX GraphModule) at
      or above: the torch.compile graph that ran.
    """

    def __init__(self, model: TraceModel, user_code: tuple[str, ...] = ()):
        self.model = model
        self.user_code = tuple(user_code)
        frames = model.frames
        codes = present_codes(frames.name, len(model.names))
        kind_by_code = np.full(len(model.names), FrameKind.OTHER, dtype=np.int8)
        inner_by_code = np.zeros(len(model.names), dtype=bool)
        for c in codes.tolist():
            kind_by_code[c] = frame_kind(model.names[c], self.user_code)
            inner_by_code[c] = is_inner_function(model.names[c])
        self.kind_by_code = kind_by_code
        kind = kind_by_code[frames.name] if len(frames) else np.zeros(0, np.int8)
        self.kind = kind
        owner = ((kind == FrameKind.USER) | (kind == FrameKind.TOOL)) & ~inner_by_code[frames.name]
        self.user_frame = _nearest_marked(owner, frames.parent, frames.start_ns)
        library = _nearest_marked(kind == FrameKind.LIBRARY, frames.parent, frames.start_ns)
        # both are on the chain above the row: the library frame is inside the user frame when it began later (or
        # at the same instant but ends earlier)
        u, lib = np.maximum(self.user_frame, 0), np.maximum(library, 0)
        s, e = frames.start_ns, frames.end_ns
        deeper = (s[lib] > s[u]) | ((s[lib] == s[u]) & (e[lib] < e[u])) if len(frames) else np.zeros(0, bool)
        self.library_frame = np.where((library >= 0) & ((self.user_frame < 0) | deeper), library, -1)
        compiled = np.zeros(len(model.names), dtype=bool)
        for c in codes.tolist():
            compiled[c] = bool(_COMPILED_GRAPH.search(model.names[c]))
        self.generated_frame = _nearest_marked(compiled[frames.name] if len(frames) else np.zeros(0, bool),
                                               frames.parent, frames.start_ns)

    def user_frame_of(self, frame_row: int) -> int:
        return int(self.user_frame[frame_row]) if frame_row >= 0 else -1

    def library_frame_of(self, frame_row: int) -> int:
        return int(self.library_frame[frame_row]) if frame_row >= 0 else -1

    def is_tool(self, frame_row: int) -> bool:
        """Whether the code responsible for this frame is this tool's own capture code."""
        user = self.user_frame_of(frame_row)
        return user >= 0 and self.kind[user] == FrameKind.TOOL

    def name(self, frame_row: int) -> str | None:
        return self.model.names[self.model.frames.name[frame_row]] if frame_row >= 0 else None

    def context(self, frame_row: int, limit: int = 6) -> list[str]:
        """The frame chain from `frame_row` outwards (innermost first), at most `limit` names."""
        return self.model.frame_chain(frame_row, limit) if frame_row >= 0 else []


def _nearest_marked(marked: np.ndarray, parent: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Per row: the row itself when marked, else its nearest marked ancestor, -1 if none. Only a parent that starts
    earlier (ties: comes first) counts, as in one forward pass in start order; so chains have no cycles and pointer
    jumping ends after about log2(depth) rounds."""
    rows = np.arange(len(marked))
    if not marked.any():  # (no library frame in a trace of plain scripts, no compiled graph without torch.compile)
        return np.full(len(marked), -1, dtype=np.int64)
    pointer = np.where(marked, rows, np.where(_linked(parent, start), parent, -1))
    pending = np.flatnonzero((pointer >= 0) & ~marked[np.maximum(pointer, 0)])
    while len(pending):  # a row whose pointer reached a marked row or -1 is done for good
        pointer[pending] = pointer[pointer[pending]]
        reached = pointer[pending]
        pending = pending[(reached >= 0) & ~marked[np.maximum(reached, 0)]]
    return pointer


def _linked(parent: np.ndarray, start: np.ndarray) -> np.ndarray:
    rows = np.arange(len(parent))
    if (start[1:] >= start[:-1]).all():  # the model's order: a row's rank in start order is its index
        return (parent >= 0) & (parent < rows)
    rank = np.empty(len(parent), dtype=np.int64)
    rank[np.argsort(start, kind="stable")] = rows
    return (parent >= 0) & (rank[np.maximum(parent, 0)] < rank)


def outermost_op(model: TraceModel, op_row: int) -> int:
    """The outermost cpu_op (not a user annotation) enclosing op_row: the op the user's code called."""
    ops = model.ops
    row, best = int(op_row), -1
    while row >= 0:
        if not ops.is_annotation[row]:
            best = row
        row = int(ops.parent[row])
    return best


def op_chain(model: TraceModel, op_row: int) -> list[str]:
    """Names of op_row and its enclosing ops, innermost first (annotations skipped)."""
    ops, names, chain = model.ops, model.names, []
    row = int(op_row)
    while row >= 0:
        if not ops.is_annotation[row]:
            chain.append(names[ops.name[row]])
        row = int(ops.parent[row])
    return chain
