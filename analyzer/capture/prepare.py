"""What a capture sets up before its run folder exists: the device, the dtype, the workload script and the model, and
the facts about them meta.json records. A problem found here is the user's input (UsageError, nothing written)."""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import platform
import traceback

import torch

from analyzer.capture.config import REPO_ROOT, CaptureConfig
from analyzer.errors import UsageError


def resolve_device(config: CaptureConfig, notes: list[str]) -> torch.device:
    requested = config.device
    has_cuda = torch.cuda.is_available()
    if requested == "auto":
        if has_cuda:
            requested = "cuda"
        else:
            notes.append("device: auto resolved to CPU because torch sees no CUDA device; "
                         "timings and traces describe the CPU run")
            requested = "cpu"
    if requested.startswith("cuda"):
        if not has_cuda:
            raise UsageError(f"{config.path}: key 'device': {requested!r} needs CUDA, but torch "
                             f"{torch.__version__} sees no CUDA device; allowed here: auto, cpu")
        index = int(requested.split(":")[1]) if ":" in requested else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise UsageError(f"{config.path}: key 'device': {requested!r} does not exist; "
                             f"{torch.cuda.device_count()} CUDA device(s) visible")
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if config.mode == "cuda_graph":
        raise UsageError(f"{config.path}: key 'mode': 'cuda_graph' needs a CUDA device; allowed on CPU: eager")
    return torch.device("cpu")


def resolve_dtype(config: CaptureConfig, device: torch.device) -> torch.dtype:
    name = config.dtype
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" else "float32"
    return getattr(torch, name)


def load_script(config: CaptureConfig) -> type:
    """The script's `Workload` class (workloads/<script>.py, or a .py file next to the YAML)."""
    return _load_workload_class(config, config.script_path(), "script")


def load_script_named(config: CaptureConfig, name: str, key: str) -> type:
    """The `Workload` class of workloads/<name>.py, which the workload's `key` names (errors name that key)."""
    return _load_workload_class(config, REPO_ROOT / "workloads" / f"{name}.py", key)


def _load_workload_class(config: CaptureConfig, path, key: str) -> type:
    module_name = f"workloads.{path.stem}" if path.parent == REPO_ROOT / "workloads" else f"_workload_{path.stem}"
    try:
        if module_name.startswith("workloads."):
            module = importlib.import_module(module_name)
        else:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except UsageError as exc:  # the script's own one-line message, e.g. an optional dependency it lacks
        raise UsageError(f"{config.path}: key '{key}': {exc}") from None
    except Exception as exc:  # a broken script is the user's input: report it on one line
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise UsageError(f"{config.path}: key '{key}': {path} failed to import at "
                         f"{frame.filename}:{frame.lineno}: {exc.__class__.__name__}: {exc}") from None
    if not hasattr(module, "Workload"):
        raise UsageError(f"{config.path}: key '{key}': {path} defines no `Workload` class")
    return module.Workload


def build_model(config: CaptureConfig, script: type, device: torch.device, dtype: torch.dtype, tp=None):
    """The model the script runs: its Workload's own `build_model(workload, device, dtype, tp)` when it has one,
    else workloads.runtime's (Qwen2 from the preset or checkpoint); with `tp` this rank's slices of it."""
    from workloads import runtime
    return getattr(script, "build_model", runtime.build_model)(config, device, dtype, tp)


def check_tensor_parallel(config: CaptureConfig, script: type) -> None:
    """tp > 1 runs scripts that declare `tensor_parallel = True` only, and shapes that split `tp` ways."""
    if config.tp == 1:
        return
    if not getattr(script, "tensor_parallel", False):
        raise UsageError(f"{config.path}: key 'tp': script {config.script!r} does not run tensor parallel (its "
                         "Workload has no `tensor_parallel = True`); allowed with tp > 1: tp_decode")
    from workloads import runtime
    runtime.check_shard(config)


def environment(device: torch.device) -> dict:
    """meta.json's `environment`: versions, the machine and the GPU."""
    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "cuda_runtime": torch.version.cuda, "hip": getattr(torch.version, "hip", None), "device": str(device),
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu_name=props.name, gpu_count=torch.cuda.device_count(),
                   gpu_memory_bytes=props.total_memory, gpu_capability=f"{props.major}.{props.minor}",
                   cuda_driver=_cuda_driver_version())
    return env


def _cuda_driver_version() -> str | None:
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"{version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        pass
    return None


def model_meta(config: CaptureConfig, model) -> dict:
    """meta.json's `model`: preset or checkpoint, dtype, parameter count and the full shape."""
    shape = getattr(model, "config", None)
    if dataclasses.is_dataclass(shape):
        parameters, shape = shape.parameter_count(), dataclasses.asdict(shape)
    else:  # a model of the script's own (build_model hook): a Hugging Face config, or none
        parameters = sum(p.numel() for p in model.parameters())
        shape = shape.to_dict() if hasattr(shape, "to_dict") else None
    meta = {"preset": None if config.model.checkpoint else config.model.preset,
            "checkpoint": config.model.checkpoint, "dtype": str(model.dtype).replace("torch.", ""),
            "parameters": parameters, "config": shape}
    shard = getattr(model, "shard", None)
    if shard is not None and shard.size > 1:
        meta["tensor_parallel"] = shard.as_dict(model.config)
    return meta
