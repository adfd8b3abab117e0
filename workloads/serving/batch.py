"""The device side of continuous batching: one static KV cache whose rows are sequences of different lengths."""
from __future__ import annotations

import torch

from workloads.qwen2 import KVCache, Qwen2ForCausalLM, Sampling, select_tokens


class SlotBatch:
    """`max_batch` rows of `capacity` positions. Each row keeps its last token and its position on the device, so a
    decode step needs nothing from the host but how many rows to cover."""

    def __init__(self, model: Qwen2ForCausalLM, max_batch: int, capacity: int, sampling: Sampling):
        self.model, self.sampling = model, sampling
        dev = model.device
        slots = -(-capacity // 16) * 16  # aligned rows keep SDPA from padding the mask each call
        model.prepare(slots)
        self.cache = KVCache(model.config, max_batch, slots, dev, model.dtype)
        self.ids = torch.zeros(max_batch, 1, dtype=torch.long, device=dev)  # each row's last token
        self.pos = torch.zeros(max_batch, 1, dtype=torch.long, device=dev)  # where that token goes in the cache
        self.live = torch.zeros(max_batch, 1, dtype=torch.long, device=dev)  # 1 for rows that hold a request

    @torch.inference_mode()
    def prefill(self, row: int, prompt: torch.Tensor) -> torch.Tensor:
        """Start a sequence in `row` from `prompt` [1, T] (on the device); its first new token, [1] on the device."""
        t = prompt.shape[1]
        logits = self.model(prompt, torch.arange(t, device=prompt.device), self.cache.rows(row, row + 1))
        first = select_tokens(logits, self.sampling)
        self.ids[row].copy_(first)
        self.pos[row].fill_(t)
        self.live[row].fill_(1)
        return first

    @torch.inference_mode()
    def decode(self, rows: int) -> torch.Tensor:
        """One token for each of rows [0, rows) ([rows] on the device); free rows among them compute and are
        ignored (their position stays put)."""
        logits = self.model(self.ids[:rows], self.pos[:rows], self.cache.rows(0, rows))
        nxt = select_tokens(logits, self.sampling)
        self.ids[:rows, 0].copy_(nxt)
        self.pos[:rows].add_(self.live[:rows])
        return nxt

    def release(self, row: int) -> None:
        self.live[row].fill_(0)
