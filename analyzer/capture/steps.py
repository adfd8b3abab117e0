"""The steps workload kind: a script of `new_sequence()` and `step()` calls (decode, prefill, hf_generate,
compile_decode, ...; see workloads/base.py).

time: warm-up steps, then a fresh sequence (its prefill timed) and `decode_steps` steps, on CUDA timed by events
between step starts. profile: `profiler.wait + profiler.warmup` steps skipped or discarded by the schedule, then a
fresh sequence's prefill (`prefill`) and `profiler.active` steps (`decode_step#N`), one `ProfilerStep#N` each. sample:
a fresh sequence and up to 8 steps.
"""
from __future__ import annotations

import statistics
import time

import torch
from torch.profiler import record_function

from analyzer.capture.config import CaptureConfig
from analyzer.capture.phases import Plan, ProfilePlan, Recorded, Sampler, Schedule, summarize_ms
from analyzer.capture.session import CaptureSession

SAMPLED_STEPS = 8  # at most, in the sample phase


def tokens_per_step(wl) -> int | None:
    """Tokens one step() adds per sequence: the script's `tokens_per_step`, else 1 for a decode step."""
    tokens = getattr(wl, "tokens_per_step", None)
    return tokens if tokens is not None else (1 if wl.step_label == "decode_step" else None)


class StepsKind:
    unit = "steps"
    repeats_window = True

    def __init__(self, script: type, model, sampling, config: CaptureConfig):
        self.script, self.model, self.sampling, self.config = script, model, sampling, config
        self.wl = self.make(config.mode)
        self.timing: dict | None = None

    def make(self, mode: str, script: type | None = None, option_overrides: dict | None = None):
        """An instance of the script (or of `script`) in `mode`, its KV cache sized for the longest sequence any
        phase runs; `option_overrides`: dotted keys of its option sections set otherwise than the workload's."""
        c = self.config
        capacity = c.prompt_length + 1 + max(c.decode_steps, c.timing.warmup_steps,
                                             c.profiler.wait + c.profiler.warmup, c.profiler.active)
        script = script or self.script
        sections = getattr(script, "option_sections", ())
        options = {"options": {**c.options(sections), **(option_overrides or {})}} if sections else {}
        return script(self.model, batch_size=c.batch_size, prompt_length=c.prompt_length, capacity=capacity,
                           sampling=self.sampling, mode=mode, seed=c.seed, **options)

    # --- time ---------------------------------------------------------------------------------------------------

    def time(self, session: CaptureSession) -> dict:
        self.timing = time_steps(session, self.wl)
        return {"unprofiled": self.timing}

    def compare_modes(self, session: CaptureSession) -> dict:
        c = self.config
        if not (session.cuda and self.wl.step_label == "decode_step"):
            session.note("timing.compare_modes needs CUDA and a decode workload; skipped")
            return {}
        other_mode = "eager" if c.mode == "cuda_graph" else "cuda_graph"
        other = time_steps(session, self.make(other_mode))
        by_mode = {c.mode: self.timing["step_ms"]["p50"], other_mode: other["step_ms"]["p50"]}
        return {"mode_comparison": {"eager_step_ms": by_mode["eager"], "cuda_graph_step_ms": by_mode["cuda_graph"],
                                    "eager_over_graph": by_mode["eager"] / by_mode["cuda_graph"],
                                    "statistic": "p50 of unprofiled steps", "other_mode_timing": other}}

    def compare_fix(self, session: CaptureSession, twin: type) -> dict:
        """This script and its fixed twin on the same model, warmed up, then `timing.sessions` rounds of one session
        each, in alternating order (ABBA...), so that drift of the machine's speed falls on both alike."""
        c = self.config
        compile_mode = c.timing.compare_fix_compile_mode
        fixed = self.make(c.timing.compare_fix_mode or c.mode, twin,
                          {"compile.mode": compile_mode} if compile_mode else None)
        if fixed.step_label != self.wl.step_label:
            session.note(f"timing.compare_fix: {c.timing.compare_fix} steps {fixed.step_label!r}, this script "
                         f"{self.wl.step_label!r}: not the same unit of work; skipped")
            return {}
        for wl in (self.wl, fixed):
            _warm_up(session, wl)
        ms = {True: [], False: []}  # as captured (True) or fixed, per session
        for k in range(c.timing.sessions):
            for as_is in ((True, False) if k % 2 == 0 else (False, True)):
                session.progress.phase(f"fix comparison, round {k + 1} of {c.timing.sessions}: "
                                       f"{'as captured' if as_is else c.timing.compare_fix}", c.decode_steps + 1)
                ms[as_is].append(_timed_session(session, self.wl if as_is else fixed, c.decode_steps)[0])
        p50 = {key: [statistics.median(one) for one in sessions] for key, sessions in ms.items()}
        paired = [a - b for a, b in zip(p50[True], p50[False])]
        with_ms = summarize_ms([x for one in ms[True] for x in one])["p50"]
        fixed_ms = summarize_ms([x for one in ms[False] for x in one])["p50"]
        return {"fix_comparison": {
            "fixed_script": c.timing.compare_fix, "fixed_mode": c.timing.compare_fix_mode or c.mode,
            **({"fixed_compile_mode": compile_mode} if compile_mode else {}),
            "statistic": "p50 of unprofiled steps",
            "order": "rounds of one session each, alternating which goes first",
            "step_ms": with_ms, "fixed_step_ms": fixed_ms, "saving_ms": with_ms - fixed_ms,
            "saving_share": (with_ms - fixed_ms) / with_ms if with_ms else None,
            "session_p50_ms": p50[True], "fixed_session_p50_ms": p50[False],
            "paired_saving_ms": paired, "paired_saving_range_ms": [min(paired), max(paired)],
        }}

    def retime(self, session: CaptureSession) -> dict:
        return time_steps(session, self.wl, sessions=1)

    # --- profile ------------------------------------------------------------------------------------------------

    def profile_plan(self) -> ProfilePlan:
        p = self.config.profiler
        recorded = p.active + (1 if self.wl.has_prefill else 0)
        return ProfilePlan("profiling", p.wait + p.warmup + recorded, Schedule(p.wait, p.warmup, recorded))

    def run_profiled(self, session: CaptureSession, prof, window_opens) -> None:
        wl, p, progress = self.wl, self.config.profiler, session.progress
        skipped = p.wait + p.warmup
        if skipped:
            wl.new_sequence()
        for i in range(skipped):
            wl.step()
            if i == skipped - 1:
                window_opens()  # before the step() that starts the recorded window
            prof.step()
            progress.advance()
        if wl.has_prefill:
            with record_function("prefill"):
                wl.new_sequence()
            prof.step()
            progress.advance()
        for k in range(p.active):
            with record_function(f"{wl.step_label}#{k}"):
                wl.step()
            prof.step()
            progress.advance()

    def recorded(self) -> Recorded:
        steps = [f"{self.wl.step_label}#{k}" for k in range(self.config.profiler.active)]
        return Recorded((["prefill"] if self.wl.has_prefill else []) + steps)

    # --- sample -------------------------------------------------------------------------------------------------

    def _sampled_steps(self) -> int:
        return min(self.config.profiler.active, SAMPLED_STEPS)

    def sample_plan(self, sync_debug: bool) -> Plan:
        return Plan("sync-debug pass" if sync_debug else "memory sampling pass", self._sampled_steps() + 1)

    def run_sampled(self, session: CaptureSession, sampler: Sampler) -> int:
        wl, steps = self.wl, self._sampled_steps()
        sampler.phase("new_sequence")
        wl.new_sequence()
        sampler.sample("prefill" if wl.has_prefill else "start")
        session.progress.advance()
        sampler.phase("step")
        for k in range(steps):
            wl.step()
            sampler.sample(f"{wl.step_label}#{k}")
            session.progress.advance()
        return steps

    # --- the script's facts -------------------------------------------------------------------------------------

    def facts(self) -> dict:
        part = {}
        tokens = self.wl.tokens()
        if tokens is not None:
            part["sample_tokens"] = tokens[0, -8:].tolist()
        info = self.wl.describe() if hasattr(self.wl, "describe") else None
        if info:
            part["script_info"] = info
        return part


def time_steps(session: CaptureSession, wl, sessions: int | None = None) -> dict:
    """Per-step latency of `wl` without the profiler: `timing.warmup_steps` steps, then `timing.sessions` timed
    sessions (each a fresh sequence and `decode_steps` steps; their medians apart show the run-to-run noise that
    one session's steps hide). On CUDA, events between step starts give the per-step times and a synchronize
    brackets each timed region only."""
    c, progress = session.config, session.progress
    steps = c.decode_steps
    sessions = sessions or c.timing.sessions
    _warm_up(session, wl)
    step_ms, cpu_ms, medians, prefill_ms, wall_s = [], [], [], None, 0.0
    for k in range(sessions):
        progress.phase(f"timing (no profiler), session {k + 1} of {sessions}", steps + 1)
        one_steps, one_cpu, prefill, wall = _timed_session(session, wl, steps)
        step_ms += one_steps
        cpu_ms += one_cpu
        medians.append(statistics.median(one_steps))
        prefill_ms = prefill if prefill_ms is None else prefill_ms
        wall_s += wall
    tokens = tokens_per_step(wl)
    return {
        "steps": steps * sessions, "sessions": sessions, "session_p50_ms": medians, "step_label": wl.step_label,
        "prefill_ms": prefill_ms, "step_ms": summarize_ms(step_ms), "per_step_ms": step_ms,
        "cpu_issue_ms": summarize_ms(cpu_ms),
        "wall_s": wall_s,
        "tokens_per_step": tokens,
        "tokens_per_s": c.batch_size * steps * sessions * tokens / wall_s if tokens else None,
        "clock": "cuda events between step starts" if session.cuda else "time.perf_counter",
    }


def _warm_up(session: CaptureSession, wl) -> None:
    """A fresh sequence and `timing.warmup_steps` steps, untimed (first calls, compilation, the allocator's cache)."""
    warmup_steps, progress = session.config.timing.warmup_steps, session.progress
    progress.phase("warm-up", warmup_steps + 1)
    wl.new_sequence()
    progress.advance()
    for _ in range(warmup_steps):
        wl.step()
        progress.advance()
    session.sync()


def _timed_session(session: CaptureSession, wl, steps: int) -> tuple[list[float], list[float], float | None, float]:
    """One fresh sequence and `steps` timed steps: (step ms, CPU issue ms, prefill ms, wall s)."""
    progress = session.progress
    t0 = time.perf_counter()
    wl.new_sequence()
    session.sync()
    prefill_ms = (time.perf_counter() - t0) * 1e3 if wl.has_prefill else None
    progress.advance()
    cuda = session.cuda
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if cuda else []
    cpu_marks = [0.0] * (steps + 1)
    t0 = time.perf_counter()
    for i in range(steps):
        cpu_marks[i] = time.perf_counter()
        if cuda:
            events[i].record()
        wl.step()
        progress.advance()
    cpu_marks[steps] = time.perf_counter()
    if cuda:
        events[steps].record()
    session.sync()
    wall_s = time.perf_counter() - t0
    cpu_ms = [(b - a) * 1e3 for a, b in zip(cpu_marks, cpu_marks[1:])]
    step_ms = [events[i].elapsed_time(events[i + 1]) for i in range(steps)] if cuda else cpu_ms
    return step_ms, cpu_ms, prefill_ms, wall_s
