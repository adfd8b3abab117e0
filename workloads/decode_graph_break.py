"""Pathology: a graph break inside a `torch.compile`d sampler. The compiled function branches on a GPU value
(`if probs.max().item() > threshold:`), which Dynamo cannot trace: it splits the function into two compiled graphs
with the `.item()` run eagerly between them, so every call waits for the GPU and launches twice. The fix: keep the
branch on the device (`torch.where`), so the function is one graph with no host sync."""
from __future__ import annotations

import torch

from analyzer.errors import UsageError
from workloads.base import DecodeWorkload
from workloads.compile_decode import toolchain_problem


def confident_sample(logits: torch.Tensor, temperature: float = 0.7, threshold: float = 0.5) -> torch.Tensor:
    """Greedy where the model is confident, sampled (exponential race) where it is not."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if probs.max().item() > threshold:  # PATHOLOGY: a data-dependent branch: a graph break and a host sync
        return probs.argmax(dim=-1)
    return torch.argmax(probs / torch.empty_like(probs).exponential_(1.0), dim=-1)


class Workload(DecodeWorkload):
    option_sections = ("compile",)

    @classmethod
    def check_workload(cls, workload, device) -> None:
        problem = toolchain_problem(device) if workload.compile.backend == "inductor" else None
        if problem:
            raise UsageError(f"{workload.path}: key 'script': decode_graph_break: {problem}")

    def __init__(self, model, *, batch_size, prompt_length, capacity, sampling, mode, seed, options):
        super().__init__(model, batch_size=batch_size, prompt_length=prompt_length, capacity=capacity,
                         sampling=sampling, mode=mode, seed=seed)
        self.sample = torch.compile(confident_sample, backend=options["compile.backend"])

    @torch.inference_mode()
    def step(self) -> None:
        super().step()
        gen = self.generator
        gen.ids.copy_(self.sample(gen.last_logits.reshape(self.batch_size, -1))[:, None])
        gen.history.index_copy_(1, gen.pos, gen.ids)
