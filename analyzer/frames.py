"""Which Python frames are the user's: the innermost frame outside torch, the standard library and installed
packages is where a finding is attributed; library frames stay as context."""
from __future__ import annotations

import functools
import re
import sys

import numpy as np

from analyzer.trace import TraceModel

_FILE_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.+)$")
_INSTALLED = re.compile(r"(site-packages|dist-packages)[/\\]|[/\\]lib[/\\]python3(\.\d+)?[/\\]|^<")
# The profiler writes paths relative to their sys.path entry (`torch/nn/modules/module.py`, `contextlib.py`), so
# libraries are also recognised by their top-level package.
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
_KNOWN_LIBRARIES = frozenset({
    "torch", "torchvision", "torchaudio", "torchao", "functorch", "triton", "numpy", "transformers", "accelerate",
    "safetensors", "tokenizers", "huggingface_hub", "einops", "peft", "diffusers", "typing_extensions", "tqdm",
    "packaging", "xformers", "flash_attn", "apex", "deepspeed", "pytorch_lightning", "lightning", "_pytest",
    "pluggy", "runpy", "importlib",
})


def _is_library_path(path: str) -> bool:
    if _INSTALLED.search(path):
        return True
    top = re.split(r"[/\\]", path.lstrip("./"), maxsplit=1)[0]
    top = top[:-3] if top.endswith(".py") else top
    return top in _STDLIB or top in _KNOWN_LIBRARIES


@functools.lru_cache(maxsize=65536)
def parse_frame(name: str) -> tuple[str, int, str] | None:
    """(file, definition line, function) for `file(line): func` frames, None for modules and built-ins."""
    m = _FILE_FRAME.match(name)
    if not m:
        return None
    return m.group("file"), int(m.group("line")), m.group("func")


@functools.lru_cache(maxsize=65536)
def is_user_frame(name: str) -> bool:
    parsed = parse_frame(name)
    return parsed is not None and not _is_library_path(parsed[0])


class FrameIndex:
    """Per-frame-row answers computed once per trace: the innermost user frame at or above each frame."""

    def __init__(self, model: TraceModel):
        self.model = model
        frames = model.frames
        codes = np.unique(frames.name)
        user_code = np.zeros(len(model.names), dtype=bool)
        user_code[codes] = [is_user_frame(model.names[c]) for c in codes.tolist()]
        self.user_frame = _nearest_marked(user_code[frames.name], frames.parent, frames.start_ns)

    def user_frame_of(self, frame_row: int) -> int:
        return int(self.user_frame[frame_row]) if frame_row >= 0 else -1

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
    rank = np.empty(len(marked), dtype=np.int64)
    rank[np.argsort(start, kind="stable")] = rows
    linked = (parent >= 0) & (rank[np.maximum(parent, 0)] < rank)
    pointer = np.where(marked, rows, np.where(linked, parent, -1))
    while len(pending := np.flatnonzero((pointer >= 0) & ~marked[np.maximum(pointer, 0)])):
        pointer[pending] = pointer[pointer[pending]]
    return pointer


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


def site_label(model: TraceModel, frames: FrameIndex, runtime_row: int) -> str:
    """Where a runtime call came from: the innermost user frame, else the innermost Python frame, else (in
    traces without Python stacks) the outermost op, else the call itself."""
    if runtime_row < 0:
        return "(unknown)"
    frame = int(model.runtime.frame[runtime_row])
    user = frames.user_frame_of(frame)
    if user >= 0:
        return frames.name(user)
    if frame >= 0:
        return frames.name(frame)
    op = int(model.runtime.op[runtime_row])
    if op >= 0:
        return model.names[model.ops.name[outermost_op(model, op)]]
    return f"{model.names[model.runtime.name[runtime_row]]} (outside any op)"
