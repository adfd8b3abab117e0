"""A helper process that reads the second part of a large trace's event array while the main process reads the
first: decoding is CPU-bound Python work that threads cannot share. The helper sends back numpy columns (pickled
through a pipe), not events.

Where it is safe, the helper is a fork of this process: it starts at once, with the modules already imported and
the file already mapped. Where other threads run (a Dask worker, the dashboard), a fork could inherit a lock some
thread holds, so a fresh interpreter runs analyzer.trace.helper_process instead.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Callable

from analyzer.progress import TICKER_THREAD_NAME

from .parse import NotChunkable

NOT_CHUNKABLE = "not chunkable"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    if not hasattr(os, "fork") or sys.platform != "linux":
        return False
    return all(thread is threading.main_thread() or thread.name == TICKER_THREAD_NAME
               for thread in threading.enumerate())


class Helper:
    """The helper process reading array (a part of the trace at path, mapped as text here) into columns."""

    def __init__(self, path: Path, text, array, *, fork: bool, read_part: Callable) -> None:
        """fork: a fork of this process (when can_fork() says it is safe) that sends back read_part(text, array),
        else a fresh interpreter running analyzer.trace.helper_process."""
        self.array = array
        self.process: subprocess.Popen | None = None
        self.pid: int | None = None
        if fork:
            self._fork(read_part, text, array)
            return
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_PACKAGE_ROOT),
                                                                       os.environ.get("PYTHONPATH")])))
        args = [str(path), str(len(text)), str(array.start), str(array.end), str(int(array.bare))]
        self.process = subprocess.Popen([sys.executable, "-m", "analyzer.trace.helper_process", *args], env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.output = self.process.stdout

    def _fork(self, read_part: Callable, text, array) -> None:
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():  # Python 3.12 warns of any other thread; can_fork allowed only ours
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the helper: never returns into the caller's code
            status = 1
            try:
                os.close(read_fd)
                with open(write_fd, "wb") as out:
                    pickle.dump(read_part(text, array), out, protocol=pickle.HIGHEST_PROTOCOL)
                status = 0
            finally:
                os._exit(status)
        os.close(write_fd)
        self.pid = pid
        self.output = open(read_fd, "rb")

    def join_into(self, columns) -> tuple[list, int] | None:
        """Append the helper's columns to columns and return (its chunks' spans, legacy events adopted); None when
        the helper failed, so that the caller reads the part itself. Raises NotChunkable as reading would."""
        try:
            result = pickle.load(self.output)
        except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
            return None
        if self._wait() != 0:
            return None
        if result == NOT_CHUNKABLE:
            raise NotChunkable
        columns.extend(result["columns"])
        return result["spans"], result["legacy"]

    def _wait(self) -> int:
        if self.process is not None:
            return self.process.wait()
        if self.pid is None:
            return 0
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        return os.waitstatus_to_exitcode(status)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._wait()
        self.output.close()
