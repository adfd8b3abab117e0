"""The serve workload kind (a script whose `Workload.kind` is "serve", workloads/serving/): whole sessions of
requests, each engine step of a session one step.

time: `serve.warmup_sessions` unrecorded sessions, then `serve.timed_sessions` sessions of the same traffic, the one
of median throughput reported (per-request TTFT / TPOT, throughput). profile: one more session with every engine step
annotated (`engine_step#N`), recorded whole. sample: one more session.
"""
from __future__ import annotations

from analyzer.capture.config import CaptureConfig
from analyzer.capture.phases import Plan, ProfilePlan, Recorded, Sampler, summarize_ms
from analyzer.capture.session import CaptureSession

#: meta.json's serving.options: the serve keys that shape the traffic and the engine
OPTION_KEYS = ("requests", "arrival", "rate", "yield_s", "to_thread", "token_readback")


class ServeKind:
    unit = "requests"
    repeats_window = False  # a session follows its arrival process: run again, it is not the same window

    def __init__(self, script: type, model, sampling, config: CaptureConfig):
        s = config.serve
        self.config, self.requests = config, s.requests
        self._profiled = None  # the profiled session
        self.wl = script(model, max_batch=config.batch_size, sampling=sampling, seed=config.seed,
                         requests=s.requests, arrival=s.arrival, rate=float(s.rate),
                         prompt_len=(s.prompt_min, s.prompt_max), output_len=(s.output_min, s.output_max),
                         yield_s=float(s.yield_s), to_thread=s.to_thread, readback=s.token_readback)

    @staticmethod
    def _advance_per_request(session: CaptureSession):
        return lambda step: session.progress.advance(step.finished)

    # --- time ---------------------------------------------------------------------------------------------------

    def time(self, session: CaptureSession) -> dict:
        for _ in range(self.config.serve.warmup_sessions):
            session.progress.phase("warm-up session", self.requests, self.unit)
            self.wl.session(on_step=self._advance_per_request(session))
            session.sync()
        timed, served = self._timed_sessions(session)
        step_ms = [(s.ended_at - s.started_at) * 1e3 for s in timed.steps]
        unprofiled = {
            "steps": len(step_ms), "step_label": self.wl.step_label, "prefill_ms": None,
            "step_ms": summarize_ms(step_ms), "per_step_ms": step_ms, "wall_s": served["wall_s"],
            "tokens_per_s": served["throughput_tokens_per_s"],
            "clock": "time.perf_counter around each engine step on the event loop (admission, prefills, decode, "
                     "token readback, and the hop to and from a worker thread with serve.to_thread)",
        }
        serving = {"options": {k: getattr(self.config.serve, k) for k in OPTION_KEYS},
                   "max_batch": self.config.batch_size, "unprofiled": served}
        return {"unprofiled": unprofiled, "serving": serving}

    def _timed_sessions(self, session: CaptureSession):
        """The same traffic `serve.timed_sessions` times without the profiler; the session of median throughput is
        reported, with every session's headline figures beside it (a short session's numbers vary with arrival
        timing)."""
        from workloads.runtime import serving_summary
        sessions = self.config.serve.timed_sessions
        session.progress.phase("serving (no profiler)", self.requests * sessions, self.unit)
        runs = []
        for _ in range(sessions):
            runs.append(self.wl.session(on_step=self._advance_per_request(session)))
            session.sync()
        summaries = [serving_summary(s) for s in runs]
        chosen = sorted(range(sessions), key=lambda i: summaries[i]["throughput_tokens_per_s"])[sessions // 2]
        served = summaries[chosen]
        served["sessions"] = [{"ttft_p50_ms": s["ttft_ms"]["p50"], "tpot_p50_ms": (s["tpot_ms"] or {}).get("p50"),
                               "throughput_tokens_per_s": s["throughput_tokens_per_s"]} for s in summaries]
        served["reported_session"] = chosen
        return runs[chosen], served

    def retime(self, session: CaptureSession) -> None:
        return None  # a session of traffic is too long to time again for a comparison

    def compare_modes(self, session: CaptureSession) -> dict:
        return {}  # a serving engine decodes in one mode

    def compare_fix(self, session: CaptureSession, twin: type) -> dict:
        session.note("timing.compare_fix times step workloads; a serve session has no fixed twin to interleave")
        return {}

    # --- profile ------------------------------------------------------------------------------------------------

    def profile_plan(self) -> ProfilePlan:
        # serve runs never recorded the allocator's counters after the window (meta.json stays as it was)
        return ProfilePlan("profiling (whole session)", self.requests, schedule=None, counters_after=False)

    def run_profiled(self, session: CaptureSession, prof, window_opens) -> None:
        self._profiled = self.wl.session(annotate=True, on_step=self._advance_per_request(session))
        session.sync()

    def recorded(self) -> Recorded:
        from workloads.runtime import serving_lifetimes, serving_summary
        summary = {k: v for k, v in serving_summary(self._profiled).items() if k != "per_request"}
        return Recorded([f"{self.wl.step_label}#{s.index}" for s in self._profiled.steps],
                        {"serving": {"profiled": {**summary, "lifetimes_unix_ns": serving_lifetimes(self._profiled)}}})

    # --- sample -------------------------------------------------------------------------------------------------

    def sample_plan(self, sync_debug: bool) -> Plan:
        return Plan("sync-debug session" if sync_debug else "memory sampling session", self.requests)

    def run_sampled(self, session: CaptureSession, sampler: Sampler) -> int:
        steps = 0

        def on_step(step) -> None:
            nonlocal steps
            sampler.sample(f"{self.wl.step_label}#{step.index}")
            session.progress.advance(step.finished)
            steps += 1

        sampler.phase("step")
        self.wl.session(on_step=on_step)
        return steps

    def facts(self) -> dict:
        return {}
