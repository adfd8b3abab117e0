"""meta.json written by `capture`, read back by the analyzer (optional: any Kineto trace works without it)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from analyzer.errors import UsageError


@dataclasses.dataclass(frozen=True)
class RunMeta:
    path: Path
    data: dict

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
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object")
    return RunMeta(path, data)
