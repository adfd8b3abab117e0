"""The dashboard's lanes kept beside the trace's columnar cache (`.gpu-idle-cache/<trace>/lanes/`, one .npy per
array, memory-mapped on reopen), so that a fresh dashboard process paints a large run without recomputing the idle
pieces and merging every lane again (1.8 s of a fresh server's first paint for 1.1M GPU events): the first view
reads only the pages its binary searches touch.

The file is keyed by the trace's cache fingerprint (size, mtime, head and tail hash), a digest of the report the
lanes were built with (a re-analysis, another analyzer version or a new snapshot changes it) and FORMAT. Anything
else (missing, stale, damaged, unwritable) is a miss: the lanes are built as before.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from analyzer.report.files import report_digest
from analyzer.timeline.lanes import Lane, MemoryCurve
from analyzer.trace.cache import cache_folder, fingerprint, write_array_folder

FORMAT = 1  # bump when TimelineData.built() changes what it holds
FOLDER = "lanes"
LANE_FIELDS = ("key", "label", "kind", "states")


def _key(trace: Path, report: dict) -> dict:
    return {"format": FORMAT, "trace": fingerprint(trace), "report_sha1": report_digest(report)}


def save_lanes(trace: Path, report: dict, built: dict) -> bool:
    """Write TimelineData.built() for this trace and report (into a temporary folder, then renamed); False when the
    cache folder cannot be written."""
    folder = cache_folder(trace)
    arrays: dict[str, np.ndarray] = {"sync_rows": built["sync_rows"], "alloc_rows": built["alloc_rows"]}
    lanes = []
    for group in ("gpu_lanes", "cpu_lanes"):
        for lane in built[group]:
            n = len(lanes)
            lanes.append({"group": group, **{f: getattr(lane, f) for f in LANE_FIELDS}})
            arrays.update({f"lane{n}.{name}": a for name, a in lane.arrays().items()})
    for n, m in enumerate(built["memory"]):
        arrays.update({f"memory{n}.ts": m.ts, f"memory{n}.allocated": m.allocated, f"memory{n}.reserved": m.reserved})
    manifest = {"key": _key(trace, report), "lanes": lanes, "memory_devices": [m.device for m in built["memory"]],
                "memory_source": built["memory_source"], "sites": {str(r): v for r, v in built["sites"].items()}}
    return write_array_folder(folder / FOLDER, arrays, {"manifest.json": json.dumps(manifest)})


def load_lanes(trace: Path, report: dict) -> dict | None:
    """What save_lanes wrote for this trace and report, as TimelineData's `saved`; None on any miss."""
    folder = cache_folder(trace) / FOLDER
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        if manifest.get("key") != _key(trace, report):
            return None
        arrays = {p.name[:-len(".npy")]: np.load(p, mmap_mode="r", allow_pickle=False) for p in folder.glob("*.npy")}
    except (OSError, ValueError, json.JSONDecodeError):
        return None
    try:
        built = {"gpu_lanes": [], "cpu_lanes": [], "sync_rows": arrays["sync_rows"],
                 "alloc_rows": arrays["alloc_rows"], "memory_source": manifest["memory_source"],
                 "sites": {int(r): v for r, v in manifest["sites"].items()}}
        for n, lane in enumerate(manifest["lanes"]):
            prefix = f"lane{n}."
            own = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
            built[lane["group"]].append(Lane.restore(*(lane[f] for f in LANE_FIELDS), own))
        built["memory"] = [MemoryCurve(device, *(arrays[f"memory{n}.{f}"] for f in ("ts", "allocated", "reserved")))
                           for n, device in enumerate(manifest["memory_devices"])]
    except (KeyError, TypeError):
        return None
    return built
