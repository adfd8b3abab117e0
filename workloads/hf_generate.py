"""Third-party code: Hugging Face transformers' `Qwen2ForCausalLM.generate()`, called as user code calls it.

Each step is one whole `model.generate(input_ids, attention_mask=..., max_new_tokens=N, min_new_tokens=N,
do_sample=False)` call (annotated `generate#K`): its prefill and N - 1 decode iterations, each with generate's own
input preparation, DynamicCache update, mask helpers, logits processors and stopping criteria (max length and
end-of-sequence, with the check that every sequence is finished: a host read per token). `new_sequence()` draws the
next random prompt (no GPU work of its own, so no `prefill` annotation).

The model is transformers' own, built from a transformers `Qwen2Config` of the workload's shape (preset or checkpoint,
cut to `model.layers`), holding the very weights our runtime drew for `seed` (the parameter names are the same; the
tensors are shared, not copied), so its greedy tokens equal our runtime's. transformers is imported here only: the
capture path itself stays torch + pyyaml + the standard library.
"""
from __future__ import annotations

import contextlib

import torch

from analyzer.errors import UsageError
from workloads.base import BaseWorkload

try:  # the model classes too: transformers imports them lazily, and a broken install should fail here, not mid-run
    import transformers
    from transformers import Qwen2Config as HFQwen2Config
    from transformers import Qwen2ForCausalLM as HFQwen2ForCausalLM
except ImportError as exc:  # missing, or installed against other versions of its dependencies
    first_line = (str(exc).strip().splitlines() or [""])[0]
    problem = ("is not installed" if isinstance(exc, ModuleNotFoundError) and exc.name == "transformers" else
               f"failed to import ({exc.__class__.__name__}: {first_line})")
    raise UsageError(f"hf_generate needs Hugging Face transformers (4.45 or newer), which {problem}; "
                     "fix: pip install -e '.[hf]'") from None

QWEN2_EOS_TOKEN_ID = 151643  # <|endoftext|>: bos, eos (and pad) of the published Qwen2 configs


def eos_token_id(vocab_size: int) -> int:
    """Qwen2's end-of-sequence id, or the last id of a smaller vocabulary (the tiny preset)."""
    return QWEN2_EOS_TOKEN_ID if vocab_size > QWEN2_EOS_TOKEN_ID else vocab_size - 1


def hf_config(config) -> HFQwen2Config:
    """A transformers `Qwen2Config` of our runtime's shape (`workloads.qwen2.Qwen2Config`), for transformers 4.x
    (rope_theta) and 5.x (rope_parameters) alike."""
    eos = eos_token_id(config.vocab_size)
    return HFQwen2Config(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings, max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta, rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, use_cache=True)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def hf_model(model) -> HFQwen2ForCausalLM:
    """transformers' Qwen2ForCausalLM on `model`'s device and dtype, holding `model`'s weights (shared tensors)."""
    with torch.device(model.device), _default_dtype(model.dtype):
        hf = HFQwen2ForCausalLM(hf_config(model.config))
    # Same parameter names; assign=True shares our tensors instead of copying them (tied lm_head included).
    hf.load_state_dict(model.state_dict(), strict=True, assign=True)
    return hf.eval()


class Workload(BaseWorkload):
    step_label = "generate"
    has_prefill = False
    option_sections = ("hf",)

    @classmethod
    def check_workload(cls, workload, device) -> None:
        if workload.mode != "eager":
            raise UsageError(f"{workload.path}: key 'mode': hf_generate runs transformers' own generate(), which has "
                             f"no {workload.mode!r} mode; allowed: eager")

    def __init__(self, model, *, batch_size, prompt_length, capacity, sampling, mode, seed, options):
        super().__init__(model, batch_size=batch_size, prompt_length=prompt_length, capacity=capacity,
                         sampling=sampling, mode=mode, seed=seed)
        self.max_new_tokens = self.tokens_per_step = options["hf.max_new_tokens"]
        self.hf = hf_model(model)
        self.generate_kwargs = {"max_new_tokens": self.max_new_tokens, "min_new_tokens": self.max_new_tokens}
        if sampling.temperature > 0:
            self.generate_kwargs.update(do_sample=True, temperature=float(sampling.temperature), top_k=sampling.top_k)
        else:
            self.generate_kwargs.update(do_sample=False)
        self.input_ids = self.attention_mask = self.output = None

    def new_sequence(self) -> None:
        self.input_ids = self.new_prompt()
        self.attention_mask = torch.ones_like(self.input_ids)

    def step(self) -> None:
        self.output = self.hf.generate(self.input_ids, attention_mask=self.attention_mask, **self.generate_kwargs)

    def tokens(self) -> torch.Tensor | None:
        return self.output

    def describe(self) -> dict:
        return {"library": "transformers", "transformers": transformers.__version__,
                "model_class": type(self.hf).__name__,
                "attn_implementation": getattr(self.hf.config, "_attn_implementation", None),
                "generate_kwargs": self.generate_kwargs, "eos_token_id": self.hf.generation_config.eos_token_id,
                "tokens_per_generate": self.batch_size * self.max_new_tokens,
                "output_tokens_last_call": None if self.output is None else
                self.output.shape[1] - self.input_ids.shape[1]}
