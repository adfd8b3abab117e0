"""Prefill only: every step runs the whole prompt through the model (a new batch of random prompts each time)."""
import torch

from workloads.base import BaseWorkload
from workloads.qwen2 import Generator


class Workload(BaseWorkload):
    step_label = "prefill"
    has_prefill = False

    def __init__(self, model, *, batch_size, prompt_length, capacity, sampling, mode, seed):
        super().__init__(model, batch_size=batch_size, prompt_length=prompt_length, capacity=capacity,
                         sampling=sampling, mode="eager", seed=seed)
        self.generator = Generator(model, batch_size, prompt_length + 1, sampling, "eager")

    def new_sequence(self) -> None:
        pass

    def step(self) -> None:
        self.generator.prefill(self.new_prompt())

    def tokens(self) -> torch.Tensor:
        return self.generator.tokens()
