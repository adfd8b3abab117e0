"""Qwen2 model shapes: the published presets and Hugging Face `config.json` parsing."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def with_layers(self, layers: int | None) -> "Qwen2Config":
        return self if layers is None else dataclasses.replace(self, num_hidden_layers=layers)

    def parameter_count(self) -> int:
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        attn = h * h + 2 * h * kv + h * h + h + 2 * kv  # q, k, v, o weights + q/k/v biases
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * per_layer + h + head


# Shapes as published in each model's config.json on the Hugging Face hub.
PRESETS: dict[str, Qwen2Config] = {
    "qwen2-0.5b": Qwen2Config(151936, 896, 4864, 24, 14, 2, tie_word_embeddings=True, max_position_embeddings=131072),
    "qwen2-1.5b": Qwen2Config(151936, 1536, 8960, 28, 12, 2, tie_word_embeddings=True, max_position_embeddings=131072),
    "qwen2-7b": Qwen2Config(152064, 3584, 18944, 28, 28, 4, max_position_embeddings=131072),
    "qwen2.5-0.5b": Qwen2Config(151936, 896, 4864, 24, 14, 2, tie_word_embeddings=True),
    "qwen2.5-1.5b": Qwen2Config(151936, 1536, 8960, 28, 12, 2, tie_word_embeddings=True),
    "qwen2.5-3b": Qwen2Config(151936, 2048, 11008, 36, 16, 2, tie_word_embeddings=True),
    "qwen2.5-7b": Qwen2Config(152064, 3584, 18944, 28, 28, 4),
    # A few layers at a small width: CPU tests and quick captures.
    "tiny": Qwen2Config(1024, 64, 176, 2, 4, 2, rope_theta=10000.0, max_position_embeddings=4096),
}

_HF_KEYS = {f.name for f in dataclasses.fields(Qwen2Config)}
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads")


def config_from_hf(config_path: Path) -> Qwen2Config:
    """Read a Hugging Face Qwen2 `config.json` (transformers 4.x or 5.x layout)."""
    raw = json.loads(config_path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{config_path}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("model_type") not in (None, "qwen2"):
        raise ValueError(f"{config_path}: model_type is {raw.get('model_type')!r}, expected 'qwen2'")
    values = {k: raw[k] for k in _HF_KEYS if k in raw}
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if "rope_theta" not in values and "rope_theta" in rope:
        values["rope_theta"] = rope["rope_theta"]
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"{config_path}: rope_type {rope_type!r} is not supported (only 'default')")
    missing = [k for k in _REQUIRED if k not in values]
    if missing:
        raise ValueError(f"{config_path}: missing key {missing[0]!r}")
    for key in _REQUIRED:
        if not isinstance(values[key], int) or isinstance(values[key], bool) or values[key] < 1:
            raise ValueError(f"{config_path}: key {key!r} must be a positive integer, got {values[key]!r}")
    if raw.get("head_dim") not in (None, values["hidden_size"] // values["num_attention_heads"]):
        raise ValueError(f"{config_path}: head_dim {raw['head_dim']} differs from hidden_size/num_attention_heads")
    return Qwen2Config(**values)
