"""Detectors: pure functions of the analysis context (trace model + optional run metadata), one module each.

Each one is `detect(ctx: AnalysisContext, **thresholds) -> DetectorResult`, whose `sections` are the report.json keys
it owns, and is listed once in DETECTORS: the report assembles them as they come, without knowing any. Each owns the
idle pieces of its causes (analyzer.views.idle): launch_gaps the cpu_launch pieces under a millisecond and host_work
the longer ones (but those in a graph break's eager section, which graph_breaks owns), queued queued, warmup warmup
(but those inside recompiles, which recompiles owns), shape_setup setup, syncs sync, allocator allocator, serving event_loop_idle and
thread_hop, input_wait input_wait, host_compute host_compute; so its top-level findings' impacts partition the GPU's
idle time with the other detectors'.
"""
from analyzer.detectors import allocator, graph_breaks, host_compute, host_work, input_wait, launch_gaps, queued, \
    recompiles, serving, shape_setup, syncs, warmup
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding

DETECTORS = (launch_gaps.detect, host_work.detect, queued.detect, warmup.detect, recompiles.detect, graph_breaks.detect,
             syncs.detect, allocator.detect, serving.detect, input_wait.detect, host_compute.detect, shape_setup.detect)

__all__ = ["DETECTORS", "AnalysisContext", "DetectorResult", "Finding"]
