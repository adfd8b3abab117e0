"""meta.json written by `capture`, read back by the analyzer (optional: any Kineto trace works without it).

A meta.json that is not a JSON object, or a value of the wrong type under a key the analyzer reads, never stops
the analysis of the trace beside it: what cannot be used is dropped and named in `RunMeta.warnings`. Keys the
analyzer does not read are kept and ignored without a word (a newer capture may write more).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

NUMBER = "a number"
INTEGER = "an integer"
TEXT = "a string"
FLAG = "true or false"
OBJECT = "an object"
LIST = "a list"

# The keys the analyzer reads and the type each must have (nested dicts: an object with these keys).
SCHEMA = {
    "created_utc": TEXT, "workload_file": TEXT, "complete": FLAG, "error": TEXT,
    "workload": {"script": TEXT, "name": TEXT, "batch_size": INTEGER, "mode": TEXT},
    "model": {"preset": TEXT, "checkpoint": TEXT, "dtype": TEXT, "config": {"num_hidden_layers": INTEGER}},
    "environment": {"gpu_name": TEXT, "device": TEXT, "torch": TEXT, "cuda_runtime": TEXT},
    "unprofiled": {"steps": INTEGER, "step_label": TEXT, "step_ms": {"p50": NUMBER}},
    "mode_comparison": {"eager_step_ms": NUMBER, "cuda_graph_step_ms": NUMBER, "eager_over_graph": NUMBER},
    "fix_comparison": {"step_ms": NUMBER, "statistic": TEXT},
    "profiled": {"memory_stats_delta": OBJECT},
    "sync_sites": LIST,
}
REQUIRED = {"mode_comparison": ("eager_step_ms", "cuda_graph_step_ms", "eager_over_graph")}  # read together


@dataclasses.dataclass(frozen=True)
class RunMeta:
    path: Path
    data: dict
    warnings: tuple[str, ...] = ()  # what was ignored, e.g. "ignored unprofiled.steps (a string, not an integer)"

    def get(self, *keys, default=None):
        node = self.data
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return node

    @property
    def sync_sites(self) -> list[dict]:
        sites = self.data.get("sync_sites")
        return sites if isinstance(sites, list) else []


def read_meta(path: Path) -> RunMeta | None:
    """The run's meta.json, None when there is none. Never raises for its content: see the module doc."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return RunMeta(path, {}, (f"ignored: not readable JSON ({exc})",))
    if not isinstance(data, dict):
        return RunMeta(path, {}, (f"ignored: {_kind(data)}, not a JSON object",))
    warnings: list[str] = []
    return RunMeta(path, _checked(data, SCHEMA, "", warnings), tuple(warnings))


def _checked(data: dict, schema: dict, prefix: str, warnings: list[str]) -> dict:
    """A copy of data without the values of the wrong type (null counts as absent)."""
    out = dict(data)
    for key, expected in schema.items():
        value, name = data.get(key), prefix + key
        if value is None:
            continue
        if isinstance(expected, dict):
            if not isinstance(value, dict):
                warnings.append(f"ignored {name} ({_kind(value)}, not {OBJECT})")
                del out[key]
                continue
            out[key] = _checked(value, expected, name + ".", warnings)
            missing = [k for k in REQUIRED.get(name, ()) if out[key].get(k) is None]
            if missing:
                warnings.append(f"ignored {name} (no valid {', '.join(missing)})")
                del out[key]
        elif not _is(value, expected):
            warnings.append(f"ignored {name} ({_kind(value)}, not {expected})")
            del out[key]
    if prefix == "" and "sync_sites" in out:
        out["sync_sites"] = _sites(out["sync_sites"], warnings)
    return out


def _sites(sites: list, warnings: list[str]) -> list[dict]:
    kept = [s for s in sites if isinstance(s, dict)]
    if len(kept) < len(sites):
        warnings.append(f"ignored {len(sites) - len(kept)} of {len(sites)} sync_sites entries (not objects)")
    return kept


def _is(value, expected: str) -> bool:
    if expected == NUMBER:
        return type(value) in (int, float) and math.isfinite(value)
    if expected == INTEGER:
        return type(value) is int
    return isinstance(value, {TEXT: str, FLAG: bool, OBJECT: dict, LIST: list}[expected])


def _kind(value) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)
