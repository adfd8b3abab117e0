"""Whose code a source path is: the user's, a third-party library's, torch's, the standard library's, generated
(torch.compile / Inductor / FX output, exec'd strings), or this tool's own capture code. One rule, standard library
only, shared by the capture's sync-debug pass (absolute paths at run time) and the analyzer's frame index (Kineto's
paths, written relative to their sys.path entry, so libraries are recognised by their top-level package too).
"""
from __future__ import annotations

import enum
import re
import sys


class FrameKind(enum.IntEnum):
    USER = 0
    LIBRARY = 1  # third-party packages: transformers, vllm, ...
    TORCH = 2
    STDLIB = 3
    GENERATED = 4  # torch.compile output (Inductor cache files), FX graph modules, exec'd strings
    TOOL = 5  # this tool's own capture code
    OTHER = 6  # built-in calls and nn.Module markers: not a source location


_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"_pytest"}
_TORCH = frozenset({"torch", "torchvision", "torchaudio", "functorch", "torchao", "torchgen"})
# Top-level packages of well-known libraries, for paths written relative to site-packages.
_LIBRARIES = frozenset({
    "accelerate", "aiter", "apex", "bitsandbytes", "deepspeed", "diffusers", "einops", "fairscale", "fastapi",
    "fbgemm_gpu", "flash_attn", "flashinfer", "huggingface_hub", "hydra", "jax", "lightning", "liger_kernel",
    "lmdeploy", "megatron", "mmcv", "mmengine", "msgspec", "numpy", "omegaconf", "packaging", "pandas", "peft",
    "pluggy", "pydantic", "pytorch_lightning", "ray", "safetensors", "scipy", "sgl_kernel", "sglang",
    "starlette", "tensorrt_llm", "timm", "tokenizers", "tqdm", "transformers", "triton", "triton_kernels",
    "typing_extensions", "uvicorn", "uvloop", "vllm", "xformers", "zmq",
})
_INSTALLED = re.compile(r"[/\\](site|dist)-packages[/\\]")
_STDLIB_PATH = re.compile(r"[/\\]lib[/\\]python3(\.\d+)?[/\\]")
# Inductor's output modules are content-addressed wherever TORCHINDUCTOR_CACHE_DIR puts them: <dir>/xy/cxy<hash>.py
INDUCTOR_MODULE = r"[/\\]([a-z0-9]{2})[/\\]c\1[a-z0-9]{40,}\.py"
_GENERATED_PATH = re.compile(r"torchinductor_[^/\\]*[/\\]|[/\\]inductor_cache[/\\]|[/\\]\.triton[/\\]cache[/\\]|"
                             + INDUCTOR_MODULE)
_TOOL_PATH = re.compile(r"(^|[/\\])analyzer[/\\]capture")


def path_kind(path: str, user_code: tuple[str, ...] = ()) -> FrameKind:
    if path.startswith("<frozen"):
        return FrameKind.STDLIB
    if path.startswith("<") or _GENERATED_PATH.search(path):
        return FrameKind.GENERATED
    if _TOOL_PATH.search(path):
        return FrameKind.TOOL
    clean = path.replace("\\", "/")
    if any(clean.startswith(prefix) or clean.lstrip("./").startswith(prefix.lstrip("./")) for prefix in user_code):
        return FrameKind.USER
    parts = [p for p in clean.split("/") if p and p != "."]
    top = parts[0][:-3] if parts and parts[0].endswith(".py") else (parts[0] if parts else "")
    installed = bool(_INSTALLED.search(path))
    if top in _TORCH or (installed and any(p in _TORCH for p in parts)):
        return FrameKind.TORCH
    if not clean.startswith("/") and top in _STDLIB:
        return FrameKind.STDLIB
    if _STDLIB_PATH.search(path) and not installed:
        return FrameKind.STDLIB
    if installed or top in _LIBRARIES or (clean.startswith("/") and any(p in _LIBRARIES for p in parts[:-1])):
        return FrameKind.LIBRARY
    return FrameKind.USER
