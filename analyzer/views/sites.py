"""Call sites on two levels: the user's code (innermost user frame) and the third-party library code inside it
where the thing happened. Traces without Python stacks fall back to the op the user called, then to the API.

Kineto records a function's definition line, not the line that made the call; a site therefore names a function
("step() (defined at workloads/decode_item_sync.py:9)"), unless the capture's sync-debug pass knew the exact line.
"""
from __future__ import annotations

import numpy as np

from analyzer.views.frames import FrameKind, describe_compiled, describe_frame

KIND_FRAMES, KIND_OTHER_FRAME, KIND_OP, KIND_API, KIND_NONE = range(5)
_SHIFT = 30
_MASK = (1 << _SHIFT) - 1


def _take(column: np.ndarray, rows: np.ndarray, missing: int = -1) -> np.ndarray:
    """column[rows] as int64, `missing` where rows < 0 (also when the column is empty)."""
    rows = np.asarray(rows, np.int64)
    if not len(column):
        return np.full(len(rows), missing, np.int64)
    return np.where(rows >= 0, column[np.clip(rows, 0, None)], missing).astype(np.int64)


def site_keys(ctx, frame_rows: np.ndarray, op_rows: np.ndarray, api_codes: np.ndarray) -> np.ndarray:
    """One int64 per event naming its site: (user frame, library frame) when either exists, else the outermost op,
    else the innermost (torch / stdlib) frame, else the API name."""
    model, index = ctx.model, ctx.frames
    frame_rows = np.asarray(frame_rows, np.int64)
    user = _take(index.user_frame, frame_rows)
    lib = _take(index.library_frame, frame_rows)
    user_code = _take(model.frames.name, user)
    lib_code = _take(model.frames.name, lib)
    outer = _take(ctx.outermost_ops, np.asarray(op_rows, np.int64))
    op_code = _take(model.ops.name, outer)
    frame_code = _take(model.frames.name, frame_rows)
    api_codes = np.asarray(api_codes, np.int64)
    return np.select(
        [(user >= 0) | (lib >= 0), op_code >= 0, frame_code >= 0, api_codes >= 0],
        [(KIND_FRAMES << 60) | ((user_code + 1) << _SHIFT) | (lib_code + 1), (KIND_OP << 60) | op_code,
         (KIND_OTHER_FRAME << 60) | frame_code, (KIND_API << 60) | api_codes],
        KIND_NONE << 60)


def frames_key(user_name_code: int, library_name_code: int = -1) -> int:
    """The site key of a (user function, library function) pair of frame-name codes (-1: none)."""
    return (KIND_FRAMES << 60) | ((user_name_code + 1) << _SHIFT) | (library_name_code + 1)


def op_key(op_name_code: int) -> int:
    return (KIND_OP << 60) | op_name_code


def describe_site(ctx, key: int, frame_row: int = -1, exact: str | None = None) -> dict:
    """What a site key names, for report.json: the user's code, the library code inside it, the op or API, the
    compiled graph that ran (frame_row: one event of the site, for its context), and a phrase for titles."""
    names = ctx.model.names
    kind = key >> 60
    call = library = op = api = other = None
    if kind == KIND_FRAMES:
        u, lib = ((key >> _SHIFT) & _MASK) - 1, (key & _MASK) - 1
        call = names[u] if u >= 0 else None
        library = names[lib] if lib >= 0 else None
    elif kind == KIND_OP:
        op = names[key & _MASK]
    elif kind == KIND_OTHER_FRAME:
        other = names[key & _MASK]
    elif kind == KIND_API:
        api = names[key & _MASK]
    generated = int(ctx.frames.generated_frame[frame_row]) if frame_row >= 0 else -1
    site = {
        "call_site": exact or describe_frame(call), "call_frame": call, "exact_line": exact is not None,
        "library_site": describe_frame(library), "library_frame": library,
        "op": op, "compiled_graph": describe_compiled(ctx.frames.name(generated)) if generated >= 0 else None,
    }
    site["phrase"] = site_phrase(site, other=other, api=api)
    site["label"] = site_label_text(site, other=other, api=api)
    # for tables: the label names the site; the library beside it only when the label is the user's code
    site["library_below"] = site["library_site"] if site["call_site"] else None
    return site


def site_phrase(site: dict, *, other: str | None = None, api: str | None = None) -> str:
    """`at FILE:LINE`, `in f() (defined at ...)`, `in lib() (defined at ...), called from f() (...)`, `in aten::x`."""
    call, library = site.get("call_site"), site.get("library_site")
    graph = f" (torch.compile graph {site['compiled_graph']})" if site.get("compiled_graph") else ""
    if call and site.get("exact_line"):
        text = f"at {call}"
        return text + (f" (in {library})" if library else "") + graph
    if library and call:
        return f"in {library}, called from {call}{graph}"
    if call or library:
        return f"in {call or library}{graph}"
    if site.get("op"):
        return f"in {site['op']} (no Python stack recorded)"
    if other:
        return f"in {describe_frame(other)} (no user code on the stack)"
    if api:
        return f"at {api} (outside any op)"
    return "at an unknown site"


def site_label_text(site: dict, *, other: str | None = None, api: str | None = None) -> str:
    """A short name for tables: the user's function (or exact line), else the library's, else the op / API."""
    if site.get("call_site"):
        return site["call_site"]
    if site.get("library_site"):
        return site["library_site"]
    if site.get("op"):
        return site["op"]
    if other:
        return describe_frame(other)
    if api:
        return f"{api} (outside any op)"
    return "(unknown)"


def runtime_site(ctx, row: int, exact: str | None = None) -> dict:
    """describe_site for one runtime row."""
    rt = ctx.model.runtime
    if row < 0:
        return describe_site(ctx, KIND_NONE << 60)
    key = int(site_keys(ctx, rt.frame[row:row + 1], rt.op[row:row + 1], rt.name[row:row + 1])[0])
    return describe_site(ctx, key, int(rt.frame[row]), exact)


def frame_site(ctx, frame_row: int) -> dict:
    """describe_site for a Python frame (no op, no API)."""
    key = int(site_keys(ctx, np.array([frame_row]), np.array([-1]), np.array([-1]))[0])
    return describe_site(ctx, key, frame_row)


def is_tool_frame(ctx, frame_row: int) -> bool:
    user = ctx.frames.user_frame_of(frame_row)
    return user >= 0 and ctx.frames.kind[user] == FrameKind.TOOL


def piece_site_keys(ctx, sel: np.ndarray) -> np.ndarray:
    """Site keys of the runtime rows responsible for the selected idle pieces."""
    rt, idle = ctx.model.runtime, ctx.idle
    row = idle.row[sel]
    if not len(rt):
        return site_keys(ctx, idle.frame[sel], idle.op[sel], np.full(len(sel), -1))
    safe = np.maximum(row, 0)
    # a piece cut for a runtime call names the call's site; one cut for a frame or an op (a wait, an import, a
    # first call) names that frame's or op's
    return site_keys(ctx, np.where(row >= 0, rt.frame[safe], idle.frame[sel]),
                     np.where(row >= 0, rt.op[safe], idle.op[sel]), np.where(row >= 0, rt.name[safe], -1))
