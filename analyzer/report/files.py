"""Write report.json, report.md and report.html together: all rendered first, then each moved into place, so a
failure leaves no partial report; files that are not ours are never overwritten."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import msgspec

from analyzer.report.assemble import REPORT_SCHEMA
from analyzer.errors import UsageError

REPORT_FILES = ("report.json", "report.md", "report.html")
MARKER = "gpu-idle-analyzer"


def _is_ours(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(65536).decode("utf-8", "replace")
    except OSError:
        return False
    return MARKER in head


def write_reports(out_dir: Path, contents: dict[str, str]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in contents:
        target = out_dir / name
        if target.exists() and not _is_ours(target):
            raise UsageError(f"{target}: exists and was not written by gpu-idle-analyzer; not overwriting "
                             f"(choose another --out)")
    staged = []
    try:
        for name, text in contents.items():
            tmp = out_dir / f".{name}.tmp-{os.getpid()}"
            tmp.write_text(text, encoding="utf-8")
            staged.append((tmp, out_dir / name))
        for tmp, target in staged:
            os.replace(tmp, target)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    return [target for _, target in staged]


def report_json_text(report: dict) -> str:
    """json.dumps(report, indent=1): compact JSON from the C encoder, indented by msgspec (several times faster
    than the pure-Python encoder that indent selects; the same text, unless NaN, which msgspec rejects, is in it)."""
    assert report["schema"] == REPORT_SCHEMA
    compact = json.dumps(report, default=_jsonable)
    try:
        return msgspec.json.format(compact, indent=1) + "\n"
    except msgspec.DecodeError:
        return json.dumps(report, indent=1, default=_jsonable) + "\n"


def report_digest(report: dict) -> str:
    """sha1 of the report's JSON: the same for the dictionary an analysis returned (numpy scalars in it) and for
    that report read back from report.json."""
    try:
        text = msgspec.json.encode(report, enc_hook=_jsonable)
    except (TypeError, ValueError):  # NaN, or a float subclass msgspec will not take
        text = json.dumps(report, default=_jsonable).encode()
    return hashlib.sha1(text).hexdigest()


def _jsonable(value):
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
