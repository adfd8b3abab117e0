"""A helper process that reads the second part of a large trace's event array while the main process reads the
first: decoding is CPU-bound Python work that threads cannot share. The helper sends back numpy columns (pickled
through a pipe), not events.

This module is the main process's side; analyzer.trace.helper_process is what runs in the helper.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

from .parse import NotChunkable

NOT_CHUNKABLE = "not chunkable"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Helper:
    """The helper process reading array (a part of the trace at path) into columns."""

    def __init__(self, path: Path, text_length: int, array) -> None:
        self.array = array
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_PACKAGE_ROOT),
                                                                       os.environ.get("PYTHONPATH")])))
        args = [str(path), str(text_length), str(array.start), str(array.end), str(int(array.bare))]
        self.process = subprocess.Popen([sys.executable, "-m", "analyzer.trace.helper_process", *args], env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def join_into(self, columns) -> tuple[list, int] | None:
        """Append the helper's columns to columns and return (its chunks' spans, legacy events adopted); None when
        the helper failed, so that the caller reads the part itself. Raises NotChunkable as reading would."""
        try:
            result = pickle.load(self.process.stdout)
        except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
            return None
        if self.process.wait() != 0:
            return None
        if result == NOT_CHUNKABLE:
            raise NotChunkable
        columns.extend(result["columns"])
        return result["spans"], result["legacy"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdout.close()
