"""Pathology: a `torch.compile`d helper fed a new shape every step. A repetition penalty over the token history
(which grows by one token per step) is compiled with static shapes, so Dynamo recompiles it for every new length
until its recompile limit (torch._dynamo.config.recompile_limit, 8 by default), then silently runs it eagerly. Each
sequence starts from a cold compile cache (torch._dynamo.reset() in new_sequence), so the profiled window shows
what every new shape costs: in production it recurs whenever a new length arrives. The fix: `dynamic=True` (or
torch._dynamo.mark_dynamic on the length), or padding the history to a few bucket sizes."""
from __future__ import annotations

import torch

from analyzer.errors import UsageError
from workloads.base import DecodeWorkload
from workloads.compile_decode import toolchain_problem


def repetition_penalty(logits: torch.Tensor, tokens: torch.Tensor, penalty: float = 1.1) -> torch.Tensor:
    """CTRL's repetition penalty: the logits of tokens already generated, scaled away from being picked again."""
    scores = logits.gather(1, tokens)
    scores = torch.where(scores < 0, scores * penalty, scores / penalty)
    return logits.scatter(1, tokens, scores)


class Workload(DecodeWorkload):
    option_sections = ("compile",)

    @classmethod
    def check_workload(cls, workload, device) -> None:
        problem = toolchain_problem(device) if workload.compile.backend == "inductor" else None
        if problem:
            raise UsageError(f"{workload.path}: key 'script': decode_recompile: {problem}")

    def __init__(self, model, *, batch_size, prompt_length, capacity, sampling, mode, seed, options):
        super().__init__(model, batch_size=batch_size, prompt_length=prompt_length, capacity=capacity,
                         sampling=sampling, mode=mode, seed=seed)
        # PATHOLOGY: static shapes for a tensor whose length changes every step
        self.penalize = torch.compile(repetition_penalty, backend=options["compile.backend"], dynamic=False)
        self.scores = None

    def new_sequence(self) -> None:
        torch._dynamo.reset()
        super().new_sequence()

    def step(self) -> None:
        super().step()
        gen = self.generator
        logits = gen.last_logits.reshape(gen.tokens().shape[0], -1)
        self.scores = self.penalize(logits, gen.tokens())  # PATHOLOGY: a new shape, a recompile, every step
