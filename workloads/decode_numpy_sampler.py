"""Pathology: the next token is sampled on the host with numpy. After each decode step the logits are copied to the
CPU, and a top-p (nucleus) sampler written with numpy sorts the whole vocabulary, while nothing is queued on the
GPU; the chosen tokens are then copied back (from pageable memory) as the next step's input. Most of the sampler's
time is inside numpy (argsort, cumsum, take_along_axis), so its host work shows up under numpy's frames as well as
under the user's function: one cause, reported once. The fix: sample on the device (workloads/qwen2/generate.py's
select_tokens with temperature and top_k: no host sync, no copy)."""
from __future__ import annotations

import numpy as np
import torch

from workloads.base import DecodeWorkload


def top_p_sample(logits: np.ndarray, top_p: float, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """One token per row of `logits` [batch, vocab]: softmax, keep the smallest set of tokens whose probability
    reaches `top_p`, draw from it."""
    z = logits / temperature
    z -= z.max(axis=-1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=-1, keepdims=True)
    order = np.argsort(-probs, axis=-1)  # PATHOLOGY: sorting the whole vocabulary on the host, every step
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    cumulative = np.cumsum(sorted_probs, axis=-1)
    tokens = np.empty(len(logits), dtype=np.int64)
    for row in range(len(logits)):
        kept = int(np.searchsorted(cumulative[row], top_p)) + 1
        nucleus = sorted_probs[row, :kept] / cumulative[row, kept - 1]
        tokens[row] = order[row, rng.choice(kept, p=nucleus)]
    return tokens


class Workload(DecodeWorkload):
    top_p, temperature = 0.9, 0.8

    def __init__(self, model, *, batch_size, prompt_length, capacity, sampling, mode, seed):
        super().__init__(model, batch_size=batch_size, prompt_length=prompt_length, capacity=capacity,
                         sampling=sampling, mode=mode, seed=seed)
        self.rng = np.random.default_rng(seed)

    @torch.inference_mode()
    def step(self) -> None:
        super().step()
        gen = self.generator
        logits = gen.last_logits.reshape(self.batch_size, -1).float().cpu().numpy()  # waits for the step
        tokens = top_p_sample(logits, self.top_p, self.temperature, self.rng)
        gen.ids.copy_(torch.from_numpy(tokens)[:, None])  # the host's choice replaces the device's greedy one
        gen.history.index_copy_(1, gen.pos, gen.ids)
