"""hf_generate with transformers' own fix for launch-bound decoding: a static KV cache (fixed shapes), made once and
passed to every generate() call (`past_key_values=`, reset in place between calls). With a static cache on CUDA,
generate() compiles the decode forward itself (`GenerationConfig.compile_config`, default
`torch.compile(mode="reduce-overhead")`: CUDA-graph replays); the prefill stays eager. A new cache per call
(`cache_implementation="static"`) puts its tensors at new addresses every call, and the compiled forward records
its CUDA graphs again each time (115 ms of graph capture in a 2-call profile on an H100). generate()'s own Python
between forwards (input preparation, logits processors, stopping criteria and their host reads) still runs every
token.

It is hf_generate's fixed twin (`--set timing.compare_fix=hf_generate_static`): the measured saving of the fix the
analyzer's launch-overhead finding recommends, for benchmarks/what_if.py. The first calls compile (tens of seconds);
the timed ones replay. Compiling `model.forward` by hand as well (the recipe of older transformers docs) compiles
twice and crashed on transformers 5.17 / torch 2.11.

transformers 5.17 (unlike 5.25) does not mark StaticLayer.cumulative_length, advanced in place every step, as a
static address, and Inductor then skips CUDA graphs ("skipping cudagraphs due to mutated inputs"): the fix would be
a compile without graphs. `_mark_cache_lengths_static` does what 5.25 does, so the twin is the fix as released.
"""
from __future__ import annotations

import torch
from transformers import StaticCache

from workloads.hf_generate import Workload as EagerGenerate


def _mark_cache_lengths_static() -> None:
    from transformers import cache_utils
    layer = getattr(cache_utils, "StaticLayer", None)
    if layer is None or getattr(layer.lazy_initialization, "_marks_length", False):
        return
    initialize = layer.lazy_initialization

    def lazy_initialization(self, *args, **kwargs):
        initialize(self, *args, **kwargs)
        length = getattr(self, "cumulative_length", None)
        if isinstance(length, torch.Tensor) and not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(length)

    lazy_initialization._marks_length = True
    layer.lazy_initialization = lazy_initialization


class Workload(EagerGenerate):
    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        _mark_cache_lengths_static()
        self.cache = StaticCache(config=self.hf.config, max_cache_len=self.prompt_length + self.max_new_tokens)

    def step(self) -> None:
        self.cache.reset()
        self.output = self.hf.generate(self.input_ids, attention_mask=self.attention_mask, past_key_values=self.cache,
                                       **self.generate_kwargs)

    def describe(self) -> dict:
        return {**super().describe(), "cache": "one StaticCache, reset per call (generate() compiles the decode "
                                               "forward, reduce-overhead)"}
