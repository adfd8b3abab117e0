"""A run folder that appears under its final name only once it is complete (or explicitly marked incomplete).

Files are written into a hidden `.NAME.partial` folder, each through a temporary name and a rename; the folder is
renamed to `NAME` at the end. An existing folder is never overwritten: a clashing name gets a numeric suffix.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
from pathlib import Path


def utc_stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        json.dump(obj, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunFolder:
    def __init__(self, parent: Path, name: str):
        parent.mkdir(parents=True, exist_ok=True)
        self.parent = parent
        self.name = f"{name}-{utc_stamp()}"
        for n in range(1, 1000):
            candidate = self.name if n == 1 else f"{self.name}-{n}"
            staging = parent / f".{candidate}.partial"
            if (parent / candidate).exists():
                continue
            try:
                staging.mkdir()
            except FileExistsError:
                continue
            self.name, self.staging = candidate, staging
            break
        else:
            raise FileExistsError(f"{parent}: no free run folder name for {name}")

    @classmethod
    def attach(cls, staging: Path) -> "RunFolder":
        """The staging folder another process made: a rank of a tensor-parallel capture writes its files into the
        folder the launcher publishes."""
        run = object.__new__(cls)
        run.parent, run.staging = staging.parent, staging
        run.name = staging.name.removeprefix(".").removesuffix(".partial")
        return run

    @property
    def final(self) -> Path:
        return self.parent / self.name

    def path(self, filename: str) -> Path:
        return self.staging / filename

    def publish(self) -> Path:
        """Move the staged folder to its final name; never onto an existing folder."""
        target = self.final
        n = 2
        while target.exists():
            target = self.parent / f"{self.name}-{n}"
            n += 1
        os.rename(self.staging, target)
        return target

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
