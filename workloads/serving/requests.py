"""Requests of a serving session: when each arrives and how long its prompt and output are (seeded, host only)."""
from __future__ import annotations

import dataclasses
import random

ARRIVALS = ("poisson", "uniform", "burst")


@dataclasses.dataclass
class Request:
    id: int
    arrival_s: float  # offset from the session's start
    prompt_len: int
    output_len: int
    # filled in by the engine (perf_counter seconds, and the KV cache row it decodes in)
    slot: int | None = None
    arrived_at: float | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.output_len


def make_requests(count: int, arrival: str, rate: float, prompt_len: tuple[int, int], output_len: tuple[int, int],
                  seed: int) -> list[Request]:
    """`count` requests: Poisson arrivals at `rate` per second, evenly spaced ones (`uniform`), or all at once
    (`burst`); prompt and output lengths uniform over the inclusive ranges."""
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival {arrival!r}: expected one of {', '.join(ARRIVALS)}")
    rng = random.Random(seed)
    requests, t = [], 0.0
    for i in range(count):
        if i and arrival == "poisson":
            t += rng.expovariate(rate)
        elif i and arrival == "uniform":
            t += 1.0 / rate
        requests.append(Request(i, t, rng.randint(*prompt_len), rng.randint(*output_len)))
    return requests
