"""The trace model: a Kineto trace loaded into numpy tables with their joins precomputed."""

from .build import load_trace
from .errors import TraceError
from .model import Frames, Gpu, GpuAnnotations, GpuKind, Memory, Ops, Overhead, Runtime, Steps, TraceModel

__all__ = [
    "Frames", "Gpu", "GpuAnnotations", "GpuKind", "Memory", "Ops", "Overhead", "Runtime", "Steps",
    "TraceError", "TraceModel", "load_trace",
]
