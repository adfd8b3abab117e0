"""What the capture asks of the workloads package besides a script's `Workload` class: the model a script runs
(unless its Workload has its own `build_model`), the sampling settings, the tensor-parallel plan, and serving's
metrics. analyzer/capture imports this module and the scripts it loads by path, nothing else of workloads/.

Each function takes the validated workload (`analyzer.capture.config.CaptureConfig`) and raises
`analyzer.errors.UsageError` naming the workload file and its key for what it cannot do.
"""
from __future__ import annotations

from pathlib import Path

from analyzer.errors import UsageError


def preset_names() -> tuple[str, ...]:
    from workloads.qwen2.config import PRESETS  # here, not at the top: workloads.qwen2 imports torch
    return tuple(PRESETS)


def build_model(workload, device, dtype, tp=None):
    """Qwen2 from `model.checkpoint`, else `model.preset` with random weights (seeded); with `tp` (a
    TensorParallel of size > 1) this rank's slices of it."""
    from workloads.qwen2 import PRESETS, CheckpointError, load_checkpoint, random_model
    m = workload.model
    try:
        if m.checkpoint:
            return load_checkpoint(m.checkpoint, device, dtype, m.layers, tp=tp)
        return random_model(PRESETS[m.preset].with_layers(m.layers), device, dtype, workload.seed, tp=tp)
    except CheckpointError as exc:
        raise UsageError(f"{workload.path}: key 'model.checkpoint': {exc}") from None
    except ValueError as exc:  # a shape tensor parallelism cannot cut (parallel.plan_shard)
        raise UsageError(f"{workload.path}: key 'tp': {exc}") from None


def sampling(workload):
    from workloads.qwen2 import Sampling
    return Sampling(workload.sampling.temperature, workload.sampling.top_k)


def check_shard(workload) -> None:
    """The model's shape splits `tp` ways (checked before any rank starts)."""
    from workloads.qwen2 import PRESETS, config_from_hf
    from workloads.qwen2.parallel import plan_shard
    m = workload.model
    try:
        plan_shard(config_from_hf(Path(m.checkpoint) / "config.json") if m.checkpoint else PRESETS[m.preset], 0,
                   workload.tp)
    except ValueError as exc:
        raise UsageError(f"{workload.path}: key 'tp': {exc}") from None


def tensor_parallel():
    """This rank's TensorParallel over the initialised default process group."""
    from workloads.qwen2 import TensorParallel
    return TensorParallel.from_process_group()


def serving_summary(session) -> dict:
    from workloads.serving.metrics import summarize
    return summarize(session)


def serving_lifetimes(session) -> dict:
    from workloads.serving.metrics import lifetimes_unix_ns
    return lifetimes_unix_ns(session)
