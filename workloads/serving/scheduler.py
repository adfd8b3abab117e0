"""Continuous batching over a static KV cache, without torch: which request decodes in which cache row, when.

Requests queue in arrival order and join the running batch at step boundaries while a row is free (the lowest free
row first, so the live rows stay packed at the front and a step decodes rows [0, live_rows)). A request leaves when
it has all its output tokens; its row is reused by the next admission.
"""
from __future__ import annotations

import heapq
from collections import deque

from .requests import Request


class Scheduler:
    def __init__(self, max_batch: int, capacity: int):
        self.max_batch, self.capacity = max_batch, capacity
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self._free = list(range(max_batch))

    def check(self, request: Request) -> None:
        if request.prompt_len + request.output_len > self.capacity:
            raise ValueError(f"request {request.id}: {request.prompt_len} prompt + {request.output_len} output "
                             f"tokens exceed the KV cache's {self.capacity} positions")

    def submit(self, request: Request, now: float) -> None:
        self.check(request)
        request.arrived_at = now
        self.waiting.append(request)

    def admit(self, now: float) -> list[Request]:
        """Move waiting requests into free rows, first come first served."""
        admitted = []
        while self.waiting and self._free:
            request = self.waiting.popleft()
            request.slot = heapq.heappop(self._free)
            request.admitted_at = now
            self.running[request.slot] = request
            admitted.append(request)
        return admitted

    @property
    def live_rows(self) -> int:
        """Rows a decode step must cover: up to the highest running row."""
        return max(self.running) + 1 if self.running else 0

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def add_token(self, request: Request, token: int, now: float) -> None:
        if request.done:  # a request admitted with output_len 1 also gets the step's decode token: drop it
            return
        if not request.tokens:
            request.first_token_at = now
        request.tokens.append(token)

    def retire(self, now: float) -> list[Request]:
        """Remove the finished requests and free their rows."""
        finished = [r for r in self.running.values() if r.done]
        for request in finished:
            request.finished_at = now
            del self.running[request.slot]
            heapq.heappush(self._free, request.slot)
        return finished
