"""hf_generate with transformers' own fix for launch-bound decoding: a static KV cache (`cache_implementation=
"static"`: fixed shapes) and the forward compiled with `torch.compile(mode="reduce-overhead", fullgraph=True)`,
which replays each shape's kernels as a CUDA graph. generate()'s own Python between forwards (input preparation,
logits processors, stopping criteria and their host reads) still runs every token.

It is hf_generate's fixed twin (`--set timing.compare_fix=hf_generate_static`): the measured saving of the fix the
analyzer's launch-overhead finding recommends, for benchmarks/what_if.py. The first calls compile (tens of seconds);
the timed ones replay.
"""
from __future__ import annotations

import torch

from workloads.hf_generate import Workload as EagerGenerate


class Workload(EagerGenerate):
    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        self.generate_kwargs["cache_implementation"] = "static"
        self.hf.forward = torch.compile(self.hf.forward, mode="reduce-overhead", fullgraph=True)

    def describe(self) -> dict:
        return {**super().describe(), "compiled": "forward, mode=reduce-overhead, fullgraph"}
