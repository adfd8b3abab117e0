"""The capture's phase sequence on the CPU with a stand-in workload kind: each phase returns its part of meta.json,
the parts merge in order, and a failing phase keeps the parts before it in a published, incomplete run folder."""
import gzip
import io
import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from analyzer.capture.config import load_config  # noqa: E402
from analyzer.capture.phases import STACKLESS_FILE, TRACE_FILE, Plan, ProfilePlan, Recorded, Schedule  # noqa: E402
from analyzer.capture.runfolder import RunFolder  # noqa: E402
from analyzer.capture.runner import Outcome, publish, run_phases  # noqa: E402
from analyzer.capture.session import CaptureSession  # noqa: E402
from analyzer.progress import Progress  # noqa: E402
from conftest import REPO  # noqa: E402


class FakeKind:
    """Two steps of a tiny matmul, recorded after one skipped step; fails in the phase it is told to."""
    unit = "steps"
    repeats_window = True

    def __init__(self, fail_in=None, schedule=Schedule(0, 1, 2)):
        self.fail_in, self.schedule = fail_in, schedule
        self.opened_at = None

    def _maybe_fail(self, phase):
        if self.fail_in == phase:
            raise RuntimeError(f"boom in {phase}")

    def time(self, session):
        self._maybe_fail("time")
        return {"unprofiled": {"steps": 2}, "serving": {"options": {"rate": 1}}}

    def compare_modes(self, session):
        return {}

    def profile_plan(self):
        return ProfilePlan("profiling", 3, self.schedule, counters_after=self.schedule is not None)

    def run_profiled(self, session, prof, window_opens):
        self._maybe_fail("profile")
        x = torch.ones(8, 8)
        for i in range(3):
            if i == 1 and self.schedule is not None:
                window_opens()
            with torch.profiler.record_function(f"fake#{i}"):
                x = x @ x
            prof.step()
            session.progress.advance()

    def recorded(self):
        return Recorded(["fake#1", "fake#2"], {"serving": {"profiled": {"engine_steps": 2}}})

    def sample_plan(self, sync_debug):
        return Plan("sampling", 1)

    def run_sampled(self, session, sampler):
        raise AssertionError("the sample phase runs on CUDA only")

    def facts(self):
        return {"sample_tokens": [1, 2]}


@pytest.fixture
def session(tmp_path):
    config = load_config(REPO / "workloads/tiny.yaml")
    return CaptureSession(config, torch.device("cpu"), RunFolder(tmp_path, "fake"), Progress(io.StringIO()))


def test_parts_merge_in_phase_order(session):
    outcome = Outcome()
    run_phases(session, FakeKind, outcome)
    assert outcome.complete and outcome.error is None and outcome.exit_code == 0
    parts = outcome.parts
    assert list(parts) == ["unprofiled", "serving", "profiler_cost", "profiled", "stackless_pass", "sample_tokens"]
    assert parts["profiler_cost"]["settings"]["with_stack"] is True  # the probe ran with the run's own settings
    assert parts["serving"] == {"options": {"rate": 1}, "profiled": {"engine_steps": 2}}
    profiled = parts["profiled"]
    assert profiled["annotations"] == ["fake#1", "fake#2"] and profiled["recorded_steps"] == 2
    assert profiled["schedule"] == {"wait": 0, "warmup": 1, "active": 2} and profiled["trace"] == TRACE_FILE
    assert profiled["memory_stats_delta"] == {} and profiled["memory_stats_after"] == {}  # CPU: no CUDA counters
    assert session.file(TRACE_FILE).is_file()
    stackless = parts["stackless_pass"]
    assert stackless["trace"] == STACKLESS_FILE and stackless["with_stack"] is False
    assert stackless["recorded_steps"] == 2
    with gzip.open(session.file(STACKLESS_FILE), "rt") as f:
        events = json.load(f)["traceEvents"]
    names = Counter(e.get("name") for e in events)
    assert names["fake#1"] == names["fake#2"] == 1 and names["aten::matmul"] >= 2  # the same window, recorded again
    assert not any(e.get("cat") == "python_function" for e in events)  # without Python stacks


def test_a_kind_that_cannot_repeat_its_window_gets_no_stackless_pass(session):
    class OneShot(FakeKind):
        repeats_window = False  # a serving session follows its own arrivals

    outcome = Outcome()
    run_phases(session, OneShot, outcome)
    assert outcome.complete and "stackless_pass" not in outcome.parts
    assert not session.file(STACKLESS_FILE).exists()


def test_unscheduled_window_records_everything(session):
    outcome = Outcome()
    run_phases(session, lambda: FakeKind(schedule=None), outcome)
    assert outcome.complete
    assert outcome.parts["profiled"]["schedule"] is None and "memory_stats_after" not in outcome.parts["profiled"]


@pytest.mark.parametrize("phase, kept", [("time", []), ("profile", ["unprofiled", "serving", "profiler_cost"])])
def test_failure_keeps_earlier_parts_and_publishes(session, phase, kept):
    outcome = Outcome()
    run_phases(session, lambda: FakeKind(fail_in=phase), outcome)
    assert not outcome.complete and outcome.exit_code == 1
    assert outcome.error == f"RuntimeError: boom in {phase}" and "Traceback" in outcome.traceback
    assert list(outcome.parts) == kept
    final, meta = publish(session, {"created_utc": "now"}, outcome)
    assert not final.name.startswith(".") and final.is_dir()
    written = json.loads((final / "meta.json").read_text())
    assert written == meta and written["complete"] is False and written["error"] == outcome.error
    assert list(written) == ["schema", "complete", "error", "created_utc", "notes", *kept, "traceback", "files"]
