"""What `python -m analyzer capture` drives for a serving workload: whole sessions of requests, not single steps
(the capture's serve kind, analyzer/capture/serve.py)."""
from __future__ import annotations

import asyncio

import torch

from workloads.qwen2 import Qwen2ForCausalLM, Sampling

from .batch import SlotBatch
from .engine import Engine, Session, run_session
from .requests import Request, make_requests


class ServingWorkload:
    kind = "serve"
    step_label = "engine_step"

    def __init__(self, model: Qwen2ForCausalLM, *, max_batch: int, sampling: Sampling, seed: int, requests: int,
                 arrival: str, rate: float, prompt_len: tuple[int, int], output_len: tuple[int, int],
                 yield_s: float, to_thread: bool, readback: str):
        self.model, self.max_batch, self.seed = model, max_batch, seed
        self.count, self.arrival, self.rate = requests, arrival, rate
        self.prompt_len, self.output_len = prompt_len, output_len
        self.options = dict(yield_s=yield_s, to_thread=to_thread, readback=readback)
        self.capacity = prompt_len[1] + output_len[1]
        if model.device.type == "cuda":
            # The cuDNN attention backend builds an execution plan per new shape and misses its cache as the batch's
            # row count changes from step to step: ~80 ms on an H200 (torch 2.11) every few steps, which would
            # drown the effects this workload exists to show. The flash / memory-efficient kernels have no such cost.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.batch = SlotBatch(model, max_batch, self.capacity + 1, sampling)
        self.prompt_gen = torch.Generator(device=model.device)
        self.loop = asyncio.new_event_loop()

    def requests(self) -> list[Request]:
        """The session's traffic: the same requests every time (seeded)."""
        return make_requests(self.count, self.arrival, self.rate, self.prompt_len, self.output_len, self.seed)

    def prompt(self, request: Request) -> torch.Tensor:
        """The request's prompt ids, drawn on the device (no host-to-device copy), the same in every session."""
        self.prompt_gen.manual_seed(self.seed * 1_000_003 + request.id)
        return torch.randint(0, self.model.config.vocab_size, (1, request.prompt_len), device=self.model.device,
                             generator=self.prompt_gen)

    def session(self, requests: list[Request] | None = None, *, annotate: bool = False, on_step=None) -> Session:
        self.batch.live.zero_()
        engine = Engine(self.batch, self.max_batch, self.capacity, self.prompt, annotate=annotate,
                        on_step=on_step, **self.options)
        return run_session(engine, self.requests() if requests is None else requests, self.loop)
