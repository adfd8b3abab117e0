"""A single-threaded asyncio serving engine: requests arrive as tasks, join the running batch at step boundaries,
and the loop yields to the event loop between steps (`await asyncio.sleep(yield_s)`).

The options that cost GPU time on purpose, to show it in a trace:
- `yield_s`: how long the loop sleeps between steps (0 = just yield); the GPU idles while it does
- `to_thread`: run each step in `asyncio.to_thread` (a thread hop per step)
- `readback`: "batched" reads every new token with one copy per step; "item" calls `.item()` per request
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Callable

import torch

from .batch import SlotBatch
from .requests import Request
from .scheduler import Scheduler

READBACKS = ("batched", "item")
STEP_LABEL = "engine_step"


@dataclasses.dataclass
class StepRecord:
    index: int
    started_at: float
    ended_at: float
    rows: int  # rows the decode covered
    running: int  # requests in the batch
    admitted: int
    finished: int


@dataclasses.dataclass
class Session:
    requests: list[Request]
    steps: list[StepRecord]
    started_at: float  # perf_counter
    started_unix_ns: int  # the same instant on the wall clock (to place times on a profiler trace)
    ended_at: float


class Engine:
    def __init__(self, batch: SlotBatch, max_batch: int, capacity: int, prompt: Callable[[Request], torch.Tensor], *,
                 yield_s: float = 0.001, to_thread: bool = False, readback: str = "batched",
                 annotate: bool = False, on_step: Callable[[StepRecord], None] | None = None):
        if readback not in READBACKS:
            raise ValueError(f"readback {readback!r}: expected one of {', '.join(READBACKS)}")
        self.batch, self.prompt = batch, prompt
        self.scheduler = Scheduler(max_batch, capacity)
        self.yield_s, self.to_thread, self.readback = yield_s, to_thread, readback
        self.annotate, self.on_step = annotate, on_step
        self.steps: list[StepRecord] = []

    def step(self) -> tuple[int, int, int, int]:
        """One engine step: admit, prefill the newcomers, decode every live row, read the new tokens back.
        Returns (rows decoded, requests running, admitted, finished)."""
        scheduler = self.scheduler
        admitted = scheduler.admit(time.perf_counter())
        firsts = [self.batch.prefill(r.slot, self.prompt(r)) for r in admitted]
        rows = scheduler.live_rows
        running = list(scheduler.running.values())
        decoded = self.batch.decode(rows)
        first_tokens, step_tokens = self._read_tokens(firsts, decoded, running)
        now = time.perf_counter()
        for request, token in zip(admitted, first_tokens):
            scheduler.add_token(request, token, now)
        for request, token in zip(running, step_tokens):
            scheduler.add_token(request, token, now)
        retired = scheduler.retire(now)
        for request in retired:
            self.batch.release(request.slot)
        return rows, len(running), len(admitted), len(retired)

    def _read_tokens(self, firsts: list[torch.Tensor], decoded: torch.Tensor,
                     running: list[Request]) -> tuple[list[int], list[int]]:
        if self.readback == "item":  # one host sync per token read
            return [int(t.item()) for t in firsts], [int(decoded[r.slot].item()) for r in running]
        every = torch.cat([*firsts, decoded]).tolist()  # one copy, one sync
        head = len(firsts)
        return every[:head], [every[head + r.slot] for r in running]

    async def serve(self, requests: list[Request]) -> Session:
        for request in requests:  # before any task starts: a request that cannot fit must not hang the loop
            self.scheduler.check(request)
        loop_started, unix_ns = time.perf_counter(), time.time_ns()
        wake = asyncio.Event()

        async def arrive(request: Request) -> None:
            await asyncio.sleep(max(0.0, loop_started + request.arrival_s - time.perf_counter()))
            self.scheduler.submit(request, time.perf_counter())
            wake.set()

        arrivals = [asyncio.create_task(arrive(r)) for r in requests]
        try:
            finished = 0
            while finished < len(requests):
                if self.scheduler.idle:
                    await wake.wait()
                    wake.clear()
                    continue
                # Annotated on the loop's thread: the profiler records ops only on the thread that started it, so a
                # step run by `to_thread` shows as its kernels and runtime calls, inside this region.
                region = (torch.profiler.record_function(f"{STEP_LABEL}#{len(self.steps)}") if self.annotate
                          else contextlib.nullcontext())
                started = time.perf_counter()
                with region:
                    if self.to_thread:
                        counts = await asyncio.to_thread(self.step)
                    else:
                        counts = self.step()
                record = StepRecord(len(self.steps), started, time.perf_counter(), *counts)
                self.steps.append(record)
                if self.on_step:
                    self.on_step(record)
                finished = sum(r.finished_at is not None for r in requests)
                await asyncio.sleep(self.yield_s)
        finally:  # a step that raised leaves arrivals pending: end them with the session
            for task in arrivals:
                task.cancel()
        await asyncio.gather(*arrivals, return_exceptions=True)
        return Session(requests, self.steps, loop_started, unix_ns, time.perf_counter())


def run_session(engine: Engine, requests: list[Request], loop: asyncio.AbstractEventLoop) -> Session:
    """On a loop that outlives the session, so `to_thread`'s worker exists before a later session is profiled (the
    profiler traces Python only on threads that exist when it starts)."""
    return loop.run_until_complete(engine.serve(requests))
