"""A columnar cache of the trace model beside the trace: one .npy file per column, memory-mapped on reopen.

`<trace folder>/.gpu-idle-cache/<trace file name>/` holds the columns, the string table and a manifest keyed by
the trace's size, modification time and a hash of its first and last 64 KiB. A changed trace, another model
format, a damaged cache or a folder we cannot write are all just a cache miss: the trace is parsed again.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .model import Frames, Gpu, GpuAnnotations, Memory, Ops, Overhead, Runtime, Steps, TraceModel

# 3: notes, foreign_activity; old categories read, synthetic ids by name; 4: no warning for a replay launched before
# the window; 5: a step label of any characters but "#"; 6: comm_args; 7: serving engines' step annotations;
# 8: ops' input shapes, the profiler's span
FORMAT = 9
CACHE_DIR = ".gpu-idle-cache"
TABLES = {"ops": Ops, "frames": Frames, "runtime": Runtime, "gpu": Gpu, "gpu_annotations": GpuAnnotations,
          "memory": Memory, "overhead": Overhead, "steps": Steps}
_PROBE = 64 * 1024


def cache_folder(trace: Path) -> Path:
    return trace.parent / CACHE_DIR / trace.name


def fingerprint(trace: Path) -> dict:
    st = trace.stat()
    digest = hashlib.sha1()
    with trace.open("rb") as f:
        digest.update(f.read(_PROBE))
        if st.st_size > _PROBE:
            f.seek(max(st.st_size - _PROBE, _PROBE))
            digest.update(f.read(_PROBE))
    return {"format": FORMAT, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "probe_sha1": digest.hexdigest()}


def load_cached(trace: Path) -> TraceModel | None:
    folder = cache_folder(trace)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        if manifest.get("key") != fingerprint(trace):
            return None
        names = tuple(json.loads((folder / "names.json").read_text()))
        comm_args = {int(k): v for k, v in json.loads((folder / "comm_args.json").read_text()).items()}
        tables = {}
        for table, cls in TABLES.items():
            columns = {f.name: np.load(folder / f"{table}.{f.name}.npy", mmap_mode="r")
                       for f in dataclasses.fields(cls)}
            tables[table] = cls(**columns)
        return TraceModel(path=str(trace), metadata=manifest["metadata"], names=names, **tables,
                          warnings=manifest["warnings"], notes=manifest["notes"],
                          foreign_activity=manifest["foreign_activity"], comm_args=comm_args,
                          synthetic_ids={int(k): v for k, v in manifest["synthetic_ids"].items()},
                          profiler_span_ns=tuple(manifest["profiler_span_ns"]) if manifest["profiler_span_ns"]
                          else None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_cached(trace: Path, model: TraceModel) -> bool:
    """Write the cache (into a temporary folder, then renamed); False when the folder is not writable."""
    arrays = {f"{table}.{f.name}": getattr(getattr(model, table), f.name)
              for table in TABLES for f in dataclasses.fields(getattr(model, table))}
    manifest = {"key": fingerprint(trace), "metadata": model.metadata, "warnings": model.warnings,
                "notes": model.notes, "foreign_activity": model.foreign_activity,
                "synthetic_ids": {str(k): v for k, v in model.synthetic_ids.items()},
                "profiler_span_ns": model.profiler_span_ns}
    return write_array_folder(cache_folder(trace), arrays, {"names.json": json.dumps(list(model.names)),
                                                            "comm_args.json": json.dumps(model.comm_args, default=str),
                                                            "manifest.json": json.dumps(manifest, default=str)})


def write_array_folder(folder: Path, arrays: dict[str, np.ndarray], texts: dict[str, str]) -> bool:
    """`folder` holding NAME.npy per array and the text files, written into a temporary folder beside it and then
    renamed over it; False when it cannot be written."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError:
        return False
    try:
        for name, values in arrays.items():
            np.save(staging / f"{name}.npy", np.ascontiguousarray(values))
        for name, text in texts.items():
            (staging / name).write_text(text)
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        os.rename(staging, folder)
        return True
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return False
