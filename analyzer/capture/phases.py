"""The phases of a capture, in order: time -> compare modes -> memory-history overhead -> profiler cost -> profile ->
stackless pass -> graph replays timed -> sample -> script facts.

Each phase takes the `CaptureSession` and the workload kind and returns its part of meta.json; the runner merges the
parts in order, so a phase that fails leaves the parts of the phases before it in meta.json. What a phase measures is
written once, here: the profiler's options and window, the allocator counters read at the window's edges only, the
trace export, the sampling pass and its sync-site recorder. How the script is driven inside a phase is the kind's
(`WorkloadKind`): steps of a sequence (steps.py) or sessions of requests (serve.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import pickle
import statistics
import time
from typing import Callable, Protocol

import torch
from torch.profiler import ProfilerActivity

from analyzer.capture.config import REPO_ROOT
from analyzer.capture.session import CaptureSession
from analyzer.capture.syncdebug import SyncSiteRecorder

TRACE_FILE = "rank0.trace.json.gz"  # rank N of a tensor-parallel run writes rank<N>.trace.json.gz (rank_file)
SNAPSHOT_FILE = "memory_snapshot.pickle"
STACKLESS_FILE = "rank0.stackless.trace.json.gz"  # analyzer.trace.inputs.stackless_beside finds it


@dataclasses.dataclass(frozen=True)
class Plan:
    """A phase's progress line: its label and how many of the kind's units (steps, requests) it runs."""
    label: str
    total: int


@dataclasses.dataclass(frozen=True)
class Schedule:
    """torch.profiler.schedule(wait, warmup, active, repeat=1): steps skipped, traced but discarded, recorded."""
    wait: int
    warmup: int
    active: int


@dataclasses.dataclass(frozen=True)
class ProfilePlan(Plan):
    #: None: everything the kind runs inside the profiler is recorded, from the profiler's start
    schedule: Schedule | None = None
    #: whether meta.json's `profiled` also keeps the allocator's counters after the window (step workloads do)
    counters_after: bool = True


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What the kind ran in the profiled window: its annotations, in order, and more of meta.json of its own."""
    annotations: list[str]
    extra: dict = dataclasses.field(default_factory=dict)


class Sampler:
    """Handed to the kind in the sample phase: `sample(step)` after each step records the allocator's memory,
    `phase(name)` names what the sync-debug recorder attributes its sync sites to."""

    def __init__(self, session: CaptureSession, recorder: SyncSiteRecorder | None):
        self.session, self.recorder = session, recorder
        self.samples: list[dict] = []

    def phase(self, name: str) -> None:
        if self.recorder is not None:
            self.recorder.phase = name

    def sample(self, step: str) -> None:
        self.samples.append({"step": step, **self.session.memory_sample()})


class WorkloadKind(Protocol):
    """How a kind of workload script is driven in each phase (steps.StepsKind, serve.ServeKind)."""
    #: what the progress line counts: "steps" or "requests"
    unit: str
    #: whether run_profiled runs the same window again when called twice (the stackless pass needs it)
    repeats_window: bool

    def time(self, session: CaptureSession) -> dict:
        """Warm up, then time without the profiler: meta.json's `unprofiled` (and the kind's own figures)."""

    def compare_modes(self, session: CaptureSession) -> dict:
        """timing.compare_modes is set: the other decode mode's timing and the eager/graph ratio (or a note)."""

    def compare_fix(self, session: CaptureSession, twin: type) -> dict:
        """timing.compare_fix names a script: this workload and that one (`twin`, its Workload class) timed in
        interleaved sessions: meta.json's `fix_comparison` (or a note)."""

    def profile_plan(self) -> ProfilePlan: ...

    def run_profiled(self, session: CaptureSession, prof, window_opens: Callable[[], None]) -> None:
        """Run the workload inside the profiler, nothing else: `prof.step()` after each step and, when the plan's
        schedule skips steps first, `window_opens()` just before the step() that starts the recorded window."""

    def recorded(self) -> Recorded:
        """What the profiled window held, read once the profiler is done (never inside the window)."""

    def sample_plan(self, sync_debug: bool) -> Plan: ...

    def retime(self, session: CaptureSession) -> dict | None:
        """The unprofiled timing once more (its `step_ms`), for a comparison made under other conditions; None
        where the kind has no cheap way to repeat it."""

    def run_sampled(self, session: CaptureSession, sampler: Sampler) -> int:
        """Run the sampling pass, calling `sampler.sample()` after each step; returns the steps it ran."""

    def facts(self) -> dict:
        """What only the script knows, for meta.json (last tokens, `describe()`)."""


def time_phase(session: CaptureSession, kind: WorkloadKind) -> dict:
    """Unprofiled timing: the per-step latency distribution and throughput the profiled run is compared with."""
    return kind.time(session)


def compare_phase(session: CaptureSession, kind: WorkloadKind) -> dict:
    """`timing.compare_modes`: the other decode mode, timed the same way (meta.json's `mode_comparison`);
    `timing.compare_fix`: the fixed twin script, timed in sessions interleaved with this one (`fix_comparison`)."""
    timing = session.config.timing
    out = kind.compare_modes(session) if timing.compare_modes else {}
    if timing.compare_fix:
        from analyzer.capture.prepare import load_script_named
        out.update(kind.compare_fix(session, load_script_named(session.config, timing.compare_fix,
                                                               "timing.compare_fix")))
    return out


@contextlib.contextmanager
def memory_history(session: CaptureSession):
    """Records the caching allocator's own history (every alloc / free / segment map with its Python stack) while
    open, where the workload asks for it and CUDA runs it; yields whether it is recording."""
    history = session.config.memory_history
    if not (session.cuda and history.enabled):
        yield False
        return
    try:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                 max_entries=history.max_entries)
    except (AttributeError, TypeError, RuntimeError) as exc:
        session.note(f"memory_history: not recorded on torch {torch.__version__} ({exc.__class__.__name__}: {exc})")
        yield False
        return
    try:
        yield True
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def history_phase(session: CaptureSession, kind: WorkloadKind) -> dict:
    """What recording the allocator's history costs: the unprofiled step time without and then with it, back to
    back (meta.json's `memory_history`)."""
    history = session.config.memory_history
    if not (session.cuda and history.enabled):
        return {}
    part = {"enabled": True, "max_entries": history.max_entries, "stacks": "python", "context": "all"}
    without = kind.retime(session)
    if without is None:
        return {"memory_history": part | {"overhead": None,
                                          "note": f"not measured for {kind.unit}: no cheap way to repeat the timing"}}
    with memory_history(session) as recording:
        with_history = kind.retime(session) if recording else None
    if with_history is None:
        return {"memory_history": part | {"enabled": False}}
    before, after = without["step_ms"]["p50"], with_history["step_ms"]["p50"]
    return {"memory_history": part | {"step_ms_p50_without": before, "step_ms_p50_with": after,
                                      "overhead": after / before - 1 if before else None,
                                      "statistic": "p50 of unprofiled steps, timed back to back"}}


def cost_phase(session: CaptureSession, kind: WorkloadKind) -> dict:
    """What the profiler costs per recorded event on this host with this run's settings (analyzer.capture.probe),
    measured just before the profiled window (meta.json's `profiler_cost`)."""
    if not session.config.profiler.cost_probe:
        return {}
    from analyzer.capture.probe import probe_profiler_cost
    session.progress.phase("probing the profiler's cost", 1, "probes")
    part = probe_profiler_cost(profiler_options(session), session.device)
    session.progress.advance()
    return {"profiler_cost": part}


def profile_phase(session: CaptureSession, kind: WorkloadKind) -> dict:
    """torch.profiler around the kind's annotated steps; the trace is written to the run folder.

    Nothing but the workload runs inside the recorded window: memory_stats() alone costs ~1 ms of Python per call,
    which would show up as a GPU gap in every step, so the allocator's counters are read at the window's edges only.
    """
    plan = kind.profile_plan()
    session.progress.phase(plan.label, plan.total, kind.unit)
    session.sync()
    edges: dict[str, dict] = {}

    def window_opens() -> None:
        edges["before"] = session.memory_stats()

    schedule = plan.schedule
    if schedule is None or schedule.wait + schedule.warmup == 0:
        window_opens()  # the recorded window opens with the profiler
    t0 = time.perf_counter()
    options = scheduled(profiler_options(session), schedule)
    with memory_history(session) as recording:
        with torch.profiler.profile(**options) as prof:
            kind.run_profiled(session, prof, window_opens)
        session.sync()
        window_s = time.perf_counter() - t0
        snapshot = torch.cuda.memory._snapshot() if recording else None
    stats_after = session.memory_stats()
    session.progress.phase("writing trace", 1)
    trace_file, snapshot_file = session.rank_file(TRACE_FILE), session.rank_file(SNAPSHOT_FILE)
    prof.export_chrome_trace(str(session.file(trace_file)))
    session.progress.advance()
    recorded = kind.recorded()
    profiled = {"trace": trace_file, "recorded_steps": len(recorded.annotations),
                "schedule": dataclasses.asdict(schedule) if schedule is not None else None,
                "annotations": recorded.annotations, "window_wall_s": window_s,
                "memory_stats_delta": memory_stats_delta(edges["before"], stats_after)}
    if snapshot is not None:
        with open(session.file(snapshot_file), "wb") as f:
            pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
        traces = snapshot.get("device_traces") or []
        profiled["memory_snapshot"] = {"file": snapshot_file, "segments": len(snapshot.get("segments") or []),
                                       "trace_entries": sum(len(t) for t in traces),
                                       "max_entries": session.config.memory_history.max_entries,
                                       "clock": "time_us: Unix epoch µs (trace ts + baseTimeNanoseconds / 1000)"}
    if plan.counters_after:
        profiled["memory_stats_after"] = {k: v for k, v in stats_after.items()
                                          if k.startswith(("num_", "allocated_bytes.all", "reserved_bytes.all",
                                                           "inactive_split_bytes.all", "requested_bytes.all"))}
    return {"profiled": profiled, **recorded.extra}


def stackless_phase(session: CaptureSession, kind: WorkloadKind) -> dict:
    """The recorded window once more, under the same profiler settings but without Python stacks: no Python event
    is recorded, so the host's time between two recorded calls is what its code took (analyzer.views.stackless
    lines its steps up with the trace's). Step workloads whose trace records Python stacks only."""
    p = session.config.profiler
    if not (p.with_stack and p.stackless_pass and kind.repeats_window):
        return {}
    plan = kind.profile_plan()
    session.progress.phase("stackless pass (no Python stacks)", plan.total, kind.unit)
    session.sync()
    options = scheduled(profiler_options(session) | {"with_stack": False}, plan.schedule)
    t0 = time.perf_counter()
    with torch.profiler.profile(**options) as prof:
        kind.run_profiled(session, prof, lambda: None)
    session.sync()
    window_s = time.perf_counter() - t0
    session.progress.phase("writing the stackless trace", 1)
    trace_file = session.rank_file(STACKLESS_FILE)
    prof.export_chrome_trace(str(session.file(trace_file)))
    session.progress.advance()
    return {"stackless_pass": {"trace": trace_file, "recorded_steps": len(kind.recorded().annotations),
                               "with_stack": False, "window_wall_s": window_s,
                               "purpose": "times the host's code between recorded calls without the cost of "
                                          "Python events (the what-if's profiler cost)"}}


def graph_phase(session: CaptureSession, kind: WorkloadKind) -> dict:
    """CUDA only: the recorded window twice more without the profiler, each CUDA graph replay timed on the GPU
    (analyzer.capture.graph_timing): what the user's own graphs take without CUPTI, and how long after the host's
    call they start. Nothing where no graph is replayed."""
    if not (session.cuda and session.config.profiler.graph_timing and kind.repeats_window):
        return {}
    from analyzer.capture.graph_timing import NoProfiler, ReplayTimer, replay_results
    plan = kind.profile_plan()
    session.progress.phase("timing CUDA graph replays (no profiler)", 2 * plan.total, kind.unit)
    timed = []
    try:
        for sleep in (True, False):
            session.sync()
            with ReplayTimer(sleep) as timer:
                kind.run_profiled(session, NoProfiler(), lambda: None)
                session.sync()
            if not timer.pairs:
                return {}
            timed.append(timer.ms())
    except Exception as exc:  # noqa: BLE001 - a measurement for the what-if only: the capture stands without it
        return {"graph_replays": {"error": f"{type(exc).__name__}: {exc}"[:300]}}
    return {"graph_replays": replay_results(*timed)}


def sample_phase(session: CaptureSession, kind: WorkloadKind) -> dict:
    """CUDA only, unprofiled, on a few more steps: memory_allocated / memory_reserved after each step and, with
    `sync_debug_pass`, the file:line of every synchronizing call (torch.cuda.set_sync_debug_mode)."""
    if not session.cuda:
        return {}
    sync_debug = session.config.sync_debug_pass
    plan = kind.sample_plan(sync_debug)
    session.progress.phase(plan.label, plan.total, kind.unit)
    recorder = SyncSiteRecorder(REPO_ROOT) if sync_debug else None
    sampler = Sampler(session, recorder)
    with recorder if recorder is not None else contextlib.nullcontext():
        steps = kind.run_sampled(session, sampler)
        session.sync()
    part = {"memory_per_step": sampler.samples}
    if recorder is not None:
        part.update(sync_sites=recorder.results(), sync_debug_steps=steps)
    return part


def script_phase(session: CaptureSession, kind: WorkloadKind) -> dict:
    """What the script reports about itself once it has run."""
    return kind.facts()


#: the sequence every workload kind runs
PHASES = (time_phase, compare_phase, history_phase, cost_phase, profile_phase, stackless_phase, graph_phase,
          sample_phase, script_phase)


def profiler_options(session: CaptureSession) -> dict:
    """torch.profiler.profile's options from the workload's `profiler` section."""
    p = session.config.profiler
    return {"activities": [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if session.cuda else []),
            "record_shapes": p.record_shapes, "profile_memory": p.profile_memory, "with_stack": p.with_stack,
            "experimental_config": _experimental_config(session, p.cuda_sync_events and session.cuda)}


def scheduled(options: dict, schedule: Schedule | None) -> dict:
    """The profiler's options with the plan's schedule, where it has one."""
    if schedule is None:
        return options
    return options | {"schedule": torch.profiler.schedule(wait=schedule.wait, warmup=schedule.warmup,
                                                          active=schedule.active, repeat=1)}


def _experimental_config(session: CaptureSession, enabled: bool):
    if not enabled:
        return None
    try:
        return torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    except (AttributeError, TypeError):
        session.note(f"profiler.cuda_sync_events: torch {torch.__version__} has no enable_cuda_sync_events; "
                     "the trace has no cuda_sync events")
        return None


def memory_stats_delta(before: dict, after: dict) -> dict:
    """The counters that changed over the profiled window (peaks and current values are not counters)."""
    return {k: after[k] - before.get(k, 0) for k in after
            if after[k] != before.get(k, 0) and not k.endswith((".peak", ".current"))}


def summarize_ms(values: list[float]) -> dict:
    ordered = sorted(values)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"mean": statistics.fmean(values), "p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
            "min": ordered[0], "max": ordered[-1]}
