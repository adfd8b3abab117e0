"""Pathology: each step uploads a logit bias built on the host (one float per vocabulary entry) from pageable memory,
so the copy waits for the GPU work queued before it and the CPU waits for the copy."""
import torch

from workloads.base import DecodeWorkload


class Workload(DecodeWorkload):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        vocab = self.model.config.vocab_size
        self.bias_host = torch.zeros(vocab)  # pageable host memory
        self.bias = torch.zeros(vocab, device=self.device)

    def step(self) -> None:
        super().step()
        self.bias.copy_(self.bias_host)  # PATHOLOGY: pageable host-to-device copy, blocking, every step
