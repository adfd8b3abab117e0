import copy
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

from analyzer import api

REPO = Path(__file__).resolve().parent.parent
ANALYSES_KEPT = 128  # analyses (model + views) kept for the session (every fixture and external trace: 1.9 GB peak)
_analyses: OrderedDict = OrderedDict()
_reports: dict = {}


def _key(path: str | Path) -> tuple:
    """The path, and its modification time: a trace written again at the same path is analyzed again."""
    path = Path(path).resolve()
    st = path.stat()
    return path, st.st_mtime_ns, st.st_size


def analysis_of(path: str | Path) -> api.Analysis:
    """The analysis of a fixture or external trace (a run folder or a trace file, with the meta.json beside it),
    made once per test session whichever module asks: analyzing is the suite's main cost. Read-only."""
    key = _key(path)
    if key in _analyses:
        _analyses.move_to_end(key)
    else:
        _analyses[key] = api.analyze(api.load(key[0], cache=False))
        _reports.setdefault(key, _analyses[key].report)
        while len(_analyses) > ANALYSES_KEPT:
            _analyses.popitem(last=False)
    return _analyses[key]


def report_of(path: str | Path) -> dict:
    """report.json's dictionary of a fixture or external trace (a copy: change it freely)."""
    key = _key(path)
    if key not in _reports:
        analysis_of(path)
    return copy.deepcopy(_reports[key])


def analyze_loaded(model, path: str | Path, meta=None) -> dict:
    """The report of a model already loaded (or cut) from the trace at `path`, as `analyze` makes it."""
    path = Path(path)
    return api.analyze(api.Trace(api.TraceInput(path, None, path.parent), model, meta)).report


def run_cli(*args: str, cwd: Path = REPO, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m analyzer ARGS` as a user runs it, from the repo root unless told otherwise."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "analyzer", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


# Markers (registered in pyproject.toml) so that the core loop can leave out what is slow or needs more than the
# base install: pytest -m "not torch and not browser and not fleet and not external and not slow".
TORCH_MODULES = {"test_capture_cpu.py", "test_tensorboard_layout.py", "test_capture_phases.py", "test_recompiles.py", "test_serving.py",
                 "test_third_party_workloads.py", "test_tp_cpu.py", "test_workload_validation.py"}
FLEET_MODULES = {"test_fleet.py", "test_job_report.py", "test_dashboard_job.py"}
EXTERNAL_MODULES = {"test_external_traces.py"}
SLOW_MODULES = {"test_dashboard_load.py", "test_fuzz_traces.py"}  # many clients; many mutated traces


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        if any(m.name == "skipif" and "playwright" in str(m.kwargs.get("reason", "")) for m in item.iter_markers()):
            item.add_marker("browser")
        if name in TORCH_MODULES:
            item.add_marker("torch")
        if name in FLEET_MODULES:
            item.add_marker("fleet")
        if name in SLOW_MODULES:
            item.add_marker("slow")
        params = getattr(getattr(item, "callspec", None), "params", {})
        if name in EXTERNAL_MODULES or any("traces/external" in str(v) for v in params.values()):
            item.add_marker("external")
