"""Weights: seeded random initialisation on the target device, or a local Hugging Face checkpoint folder.

Checkpoints are read with a small safetensors reader of our own (memory-mapped, standard library + torch) because
the capture path may import nothing beyond torch, pyyaml and the standard library.

With a `TensorParallel` of size > 1 each rank cuts its slices from the full weights as it loads them: from the
checkpoint's memory-mapped tensors, or from the same seeded full model every world size draws (so tp=2 runs the
weights tp=1 runs).
"""
from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

from .config import Qwen2Config, config_from_hf
from .model import Qwen2ForCausalLM
from .parallel import TensorParallel, shard_tensor


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the file and tensor."""


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _empty_model(config: Qwen2Config, device, dtype, tp: TensorParallel | None) -> Qwen2ForCausalLM:
    model = Qwen2ForCausalLM(config, device="meta", dtype=dtype, tp=tp).to_empty(device=device)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def random_model(config: Qwen2Config, device, dtype, seed: int, tp: TensorParallel | None = None) -> Qwen2ForCausalLM:
    """A model whose weights are drawn from a seeded generator directly on `device` (nothing is downloaded). With
    `tp` of size > 1: this rank's slices of that same full model."""
    full = _empty_model(config, device, dtype, None)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in full.named_parameters():  # tied weights are listed once
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=gen)
    if tp is None or tp.size == 1:
        return full
    full_params = dict(full.named_parameters())
    model = _empty_model(config, device, dtype, tp)
    _fill(model, lambda name: full_params[name])
    return model


def _fill(model: Qwen2ForCausalLM, full_tensor) -> None:
    """Copy into each parameter its slice of `full_tensor(name)`, the full model's tensor of that name."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(shard_tensor(name, full_tensor(name), model.shard, model.config.head_dim))


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of one .safetensors file, as CPU views of a memory map (no copy until used)."""
    try:
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        start, end = info["data_offsets"]
        numel = end - start
        if numel == 0:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(buf, dtype=torch.uint8, count=numel, offset=base + start)
        tensors[name] = flat.view(dtype).reshape(info["shape"])
    return tensors


def _checkpoint_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
        files = sorted({folder / shard for shard in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{index}: names shard {f.name!r}, which is missing")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors files (and no model.safetensors.index.json)")
    return files


def load_checkpoint(folder: str | Path, device, dtype, layers: int | None = None,
                    tp: TensorParallel | None = None) -> Qwen2ForCausalLM:
    """A model built from `config.json` + `*.safetensors` in `folder` (sharded with an index or not); with `tp` of
    size > 1, this rank's slices of it."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no config.json")
    try:
        config = config_from_hf(config_path)
    except (ValueError, json.JSONDecodeError) as exc:
        raise CheckpointError(str(exc) if str(config_path) in str(exc) else f"{config_path}: {exc}") from None
    if layers is not None and layers > config.num_hidden_layers:
        raise CheckpointError(f"{config_path}: layers={layers} exceeds num_hidden_layers={config.num_hidden_layers}")
    config = config.with_layers(layers)
    stored: dict[str, torch.Tensor] = {}
    for f in _checkpoint_files(folder):
        stored.update(_read_safetensors(f))
    full_shapes = {name: tuple(p.shape) for name, p in Qwen2ForCausalLM(config, device="meta").named_parameters()}
    for name, shape in full_shapes.items():
        tensor = stored.get(name)
        if tensor is None:
            raise CheckpointError(f"{folder}: tensor {name!r} is missing from the checkpoint")
        if tuple(tensor.shape) != shape:
            raise CheckpointError(f"{folder}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}")
    model = _empty_model(config, device, dtype, tp)
    _fill(model, stored.__getitem__)
    return model
