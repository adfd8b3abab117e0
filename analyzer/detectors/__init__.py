"""Detectors: pure functions of the analysis context (trace model + optional run metadata), one module each.

Each one is `detect(ctx: AnalysisContext, **thresholds) -> DetectorResult` and is listed once in DETECTORS; the
CLI, the renderers and the dashboard iterate over this registry.
"""
from analyzer.detectors import allocator, launch_gaps, serving, syncs
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding

DETECTORS = (launch_gaps.detect, syncs.detect, allocator.detect, serving.detect)

__all__ = ["DETECTORS", "AnalysisContext", "DetectorResult", "Finding"]
