"""An eager Qwen2 runtime: presets, weights, a static KV cache, prefill/decode and CUDA-graph decode."""
from .config import PRESETS, Qwen2Config, config_from_hf
from .generate import MODES, CapacityError, Generator, Sampling, select_tokens
from .model import KVCache, Qwen2ForCausalLM
from .parallel import TensorParallel
from .weights import CheckpointError, load_checkpoint, random_model

__all__ = [
    "PRESETS", "Qwen2Config", "config_from_hf", "MODES", "CapacityError", "Generator", "Sampling",
    "select_tokens", "KVCache", "Qwen2ForCausalLM", "TensorParallel", "CheckpointError", "load_checkpoint", "random_model",
]
