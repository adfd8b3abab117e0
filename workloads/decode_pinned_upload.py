"""decode_pageable_upload with its fix: the host buffer pinned, the copy issued with non_blocking=True, so the CPU
goes on while the copy runs in stream order."""
import torch

from workloads.base import DecodeWorkload


class Workload(DecodeWorkload):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        vocab = self.model.config.vocab_size
        pin = self.device.type == "cuda"
        self.bias_host = torch.zeros(vocab, pin_memory=pin)
        self.bias = torch.zeros(vocab, device=self.device)

    def step(self) -> None:
        super().step()
        self.bias.copy_(self.bias_host, non_blocking=True)
