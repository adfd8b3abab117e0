"""The exact source line of every synchronizing call, from `torch.cuda.set_sync_debug_mode("warn")` (the sample phase's
sync-debug pass).

Kineto names Python frames by function only; this unprofiled pass records file:line. Each warning's stack is walked
to the innermost frame outside torch, the standard library and site-packages (for `print(tensor)` the warning itself
is raised deep inside torch/_tensor_str.py).
"""
from __future__ import annotations

import sysconfig
import traceback
import warnings
from pathlib import Path

import torch

from analyzer.codepaths import FrameKind, path_kind

SYNC_WARNING = "called a synchronizing CUDA operation"
_STDLIB_ROOTS = tuple(str(Path(p).resolve()) for p in {sysconfig.get_paths()["stdlib"],
                                                        sysconfig.get_paths()["platstdlib"]})
_TORCH_ROOT = str(Path(torch.__file__).resolve().parent)
_OWN_ROOT = str(Path(__file__).resolve().parent.parent)  # analyzer/: this tool's own frames are never a call site


def _kind(filename: str) -> FrameKind:
    """analyzer.codepaths' rule, plus what only the running process knows: where torch, the standard library and
    this tool really are (a source checkout of torch is not under site-packages)."""
    path = str(Path(filename).resolve()) if not filename.startswith("<") else filename
    if path.startswith(_TORCH_ROOT):
        return FrameKind.TORCH
    if path.startswith(_OWN_ROOT):
        return FrameKind.TOOL
    if path.startswith(_STDLIB_ROOTS) and "site-packages" not in path and "dist-packages" not in path:
        return FrameKind.STDLIB
    return path_kind(path)


def _is_user_frame(filename: str) -> bool:
    return _kind(filename) == FrameKind.USER


def _is_library_frame(filename: str) -> bool:
    """Third-party code (not torch): where inside a library the sync happened."""
    return _kind(filename) == FrameKind.LIBRARY


def _library_path(filename: str) -> str:
    """transformers/masking_utils.py: the path below site-packages, as Kineto writes it."""
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(marker):])
    return filename


def _display_path(filename: str, root: Path) -> str:
    try:
        return str(Path(filename).resolve().relative_to(root))
    except ValueError:
        return filename


class SyncSiteRecorder:
    """Context manager: counts synchronizing calls per user call site while active."""

    def __init__(self, root: Path):
        self.root = root
        self.sites: dict[tuple[str, int], dict] = {}
        self.phase = ""

    def __enter__(self):
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("always")
        self._previous_show = warnings.showwarning
        warnings.showwarning = self._on_warning
        self._previous_mode = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the one-time "prototype feature" notice
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(self._previous_mode)
        warnings.showwarning = self._previous_show
        self._warnings.__exit__(*exc)
        return False

    def _on_warning(self, message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING not in str(message):
            return self._previous_show(message, category, filename, lineno, file, line)
        stack = traceback.extract_stack()[:-1]
        user_at = [i for i, f in enumerate(stack) if _is_user_frame(f.filename)]
        user = [stack[i] for i in user_at]
        site = user[-1] if user else stack[-1]
        below = stack[user_at[-1] + 1:] if user else []
        library = next((f for f in reversed(below) if _is_library_frame(f.filename)), None)
        lib_file = _library_path(library.filename) if library else None
        key = (_display_path(site.filename, self.root), site.lineno, lib_file, library.lineno if library else None)
        entry = self.sites.get(key)
        if entry is None:
            entry = self.sites[key] = {
                "file": key[0], "line": key[1], "function": site.name, "code": (site.line or "").strip(),
                "call_site": f"{key[0]}:{key[1]}", "count": 0, "phases": {},
                "library_file": lib_file, "library_line": key[3], "library_function": library.name if library else None,
                "library_code": (library.line or "").strip() if library else None,
                "raised_at": f"{_display_path(filename, self.root)}:{lineno}",
                "user_stack": [f"{_display_path(f.filename, self.root)}:{f.lineno} {f.name}" for f in user[-4:]],
            }
        entry["count"] += 1
        entry["phases"][self.phase] = entry["phases"].get(self.phase, 0) + 1

    def results(self) -> list[dict]:
        return sorted(self.sites.values(), key=lambda s: -s["count"])
