"""Prefill and decode over a static KV cache, with token selection that stays on the device.

`Generator.step()` runs one decode step either eagerly (one kernel per op, launched from Python) or by replaying
a CUDA graph captured once from the very same code. Nothing here reads a value back to the host: no per-step
synchronisation unless a workload adds one.
"""
from __future__ import annotations

import dataclasses

import torch

from .model import Qwen2ForCausalLM

MODES = ("eager", "cuda_graph")
# Slots past the capacity that graph warm-up steps may write into (they are overwritten before being read).
_WARMUP_SLOTS = 3


@dataclasses.dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no top-k filter


def select_tokens(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Next token per row of `logits` [batch, vocab], computed on the device (no host sync)."""
    if sampling.temperature <= 0:
        return torch.argmax(logits, dim=-1)
    logits = logits.float() / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(logits, min(sampling.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    # Exponential-race sampling: argmax(p / E), E ~ Exp(1), draws from p without torch.multinomial's host sync.
    return torch.argmax(probs / torch.empty_like(probs).exponential_(1.0), dim=-1)


class CapacityError(RuntimeError):
    pass


class Generator:
    """One batch of sequences over a static KV cache of `capacity` positions."""

    @torch.inference_mode()
    def __init__(self, model: Qwen2ForCausalLM, batch_size: int, capacity: int,
                 sampling: Sampling = Sampling(), mode: str = "eager"):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
        if mode == "cuda_graph" and model.device.type != "cuda":
            raise ValueError("mode 'cuda_graph' needs a CUDA device")
        self.model, self.sampling, self.mode = model, sampling, mode
        self.batch_size, self.capacity = batch_size, capacity
        dev = model.device
        slots = -(-(capacity + _WARMUP_SLOTS) // 16) * 16  # aligned rows keep SDPA from padding the mask each call
        model.prepare(slots)
        self.cache = model.new_cache(batch_size, slots)
        self.ids = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)  # last token, input of the next step
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)  # its position
        self.history = torch.zeros(batch_size, slots, dtype=torch.long, device=dev)
        self.length = 0  # host-side count of tokens in the sequence, known without reading the device
        self.graph: torch.cuda.CUDAGraph | None = None

    @torch.inference_mode()
    def prefill(self, prompt: torch.Tensor) -> None:
        """Start new sequences from `prompt` [batch, T] (on the device) and select their first new token."""
        t = prompt.shape[1]
        if prompt.shape[0] != self.batch_size or t + 1 > self.capacity:
            raise CapacityError(f"prompt of shape {tuple(prompt.shape)} does not fit batch {self.batch_size} "
                                f"x capacity {self.capacity}")
        logits = self.model(prompt, torch.arange(t, device=prompt.device), self.cache)
        nxt = select_tokens(logits, self.sampling)
        self.history[:, :t].copy_(prompt)
        self.history[:, t].copy_(nxt)
        self.ids.copy_(nxt[:, None])
        self.pos.fill_(t)
        self.length = t + 1

    @torch.inference_mode()
    def step(self) -> None:
        """Append one token to every sequence."""
        if self.length == 0:
            raise CapacityError("step() before prefill()")
        if self.length >= self.capacity:
            raise CapacityError(f"sequence is full ({self.capacity} tokens)")
        if self.mode == "cuda_graph":
            if self.graph is None:
                self._capture_graph()
            self.graph.replay()
        else:
            self._decode()
        self.length += 1

    def tokens(self) -> torch.Tensor:
        """The sequences so far, prompt included: [batch, length] on the device."""
        return self.history[:, : self.length]

    def _decode(self) -> None:
        self.last_logits = logits = self.model(self.ids, self.pos, self.cache)
        nxt = select_tokens(logits, self.sampling)
        self.pos.add_(1)
        self.ids.copy_(nxt[:, None])
        self.history.index_copy_(1, self.pos, self.ids)

    def _capture_graph(self) -> None:
        saved_ids, saved_pos = self.ids.clone(), self.pos.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
            for _ in range(2):
                self._decode()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._decode()
        self.ids.copy_(saved_ids)
        self.pos.copy_(saved_pos)
        self.graph = graph
