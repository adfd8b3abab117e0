"""What a workload script provides to `python -m analyzer capture`.

A script is a module that defines `Workload`, a subclass of `DecodeWorkload` (or of `BaseWorkload`). The capture
builds it once per mode, then calls `new_sequence()` and `step()`; each call of those is one annotated region of the
trace (`prefill`, `decode_step#N`). Scripts do the work and nothing else: timing, profiling and the sync-debug pass
belong to the capture.

Optional hooks (all have defaults here; the capture also accepts scripts that do not subclass these classes):
`check_workload(workload, device)` rejects a workload this script cannot run before anything is written (raise
`analyzer.errors.UsageError`; `workload` is the validated `analyzer.capture.config.CaptureConfig`: `workload.mode`,
`workload.timing.warmup_steps`, `workload.path`); `option_sections` names schema sections (e.g. `("hf",)`) whose keys
reach `__init__` as `options` (a dict of dotted keys: `options["hf.max_new_tokens"]`); `tokens_per_step` is the
tokens one `step()` adds per sequence (meta.json's tokens/s); `describe()` returns facts about the run for meta.json's
`script_info`; `build_model(workload, device, dtype, tp)` (a classmethod) builds the model the script runs instead of
workloads/runtime.py's Qwen2 from `model.preset` / `model.checkpoint`. The capture's steps kind
(analyzer/capture/steps.py) drives these classes.
"""
from __future__ import annotations

import torch

from workloads.qwen2 import Generator, Qwen2ForCausalLM, Sampling


class BaseWorkload:
    #: annotation name of one `step()` call in the trace
    step_label = "decode_step"
    #: whether `new_sequence()` does GPU work worth its own `prefill` annotation
    has_prefill = True
    #: schema sections whose keys the capture passes to `__init__` as `options={"section.key": value, ...}`
    option_sections: tuple[str, ...] = ()
    #: tokens one `step()` adds to each sequence (None: 1 for `decode_step`, no tokens/s otherwise)
    tokens_per_step: int | None = None

    @classmethod
    def check_workload(cls, workload, device) -> None:
        """Raise `analyzer.errors.UsageError` (naming workload.path and the key) for a workload this script cannot
        run; called before the model is built or anything is written."""

    def describe(self) -> dict:
        """Facts about the run only the script knows (library versions, compile time), for meta.json."""
        return {}

    def __init__(self, model: Qwen2ForCausalLM, *, batch_size: int, prompt_length: int, capacity: int,
                 sampling: Sampling, mode: str, seed: int):
        self.model = model
        self.batch_size, self.prompt_length = batch_size, prompt_length
        self.device = model.device
        self.prompt_gen = torch.Generator(device=self.device).manual_seed(seed)

    def new_prompt(self) -> torch.Tensor:
        """Random token ids drawn on the device (no host-to-device copy)."""
        return torch.randint(0, self.model.config.vocab_size, (self.batch_size, self.prompt_length),
                             device=self.device, generator=self.prompt_gen)

    def new_sequence(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def tokens(self) -> torch.Tensor | None:
        return None


class DecodeWorkload(BaseWorkload):
    """Prefill a random prompt, then decode one token per step for every sequence of the batch."""

    def __init__(self, model, *, batch_size, prompt_length, capacity, sampling, mode, seed):
        super().__init__(model, batch_size=batch_size, prompt_length=prompt_length, capacity=capacity,
                         sampling=sampling, mode=mode, seed=seed)
        self.generator = Generator(model, batch_size, capacity, sampling, mode)
        self.steps_done = 0

    def new_sequence(self) -> None:
        self.generator.prefill(self.new_prompt())
        self.steps_done = 0

    def step(self) -> None:
        self.generator.step()
        self.steps_done += 1

    def tokens(self) -> torch.Tensor:
        return self.generator.tokens()
