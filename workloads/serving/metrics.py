"""Per-request latency of a serving session: time to first token, time per output token, throughput."""
from __future__ import annotations

import statistics

from .engine import Session


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 4)


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    ordered = sorted(values)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"mean": round(statistics.fmean(values), 4), "p50": round(pct(0.5), 4), "p90": round(pct(0.9), 4),
            "max": round(ordered[-1], 4)}


def request_rows(session: Session) -> list[dict]:
    """One row per request; times in ms from the session's start, latencies in ms."""
    t0 = session.started_at
    rows = []
    for r in session.requests:
        ttft = r.first_token_at - r.arrived_at if r.first_token_at is not None else None
        tpot = ((r.finished_at - r.first_token_at) / (len(r.tokens) - 1)
                if r.finished_at is not None and len(r.tokens) > 1 else None)
        rows.append({
            "id": r.id, "prompt_tokens": r.prompt_len, "output_tokens": len(r.tokens), "row": r.slot,
            "arrived_ms": _ms(r.arrived_at - t0), "admitted_ms": _ms(r.admitted_at - t0),
            "first_token_ms": _ms(r.first_token_at - t0), "finished_ms": _ms(r.finished_at - t0),
            "queue_ms": _ms(r.admitted_at - r.arrived_at), "ttft_ms": _ms(ttft), "tpot_ms": _ms(tpot),
            "latency_ms": _ms(r.finished_at - r.arrived_at),
        })
    return rows


def summarize(session: Session) -> dict:
    rows = request_rows(session)
    tokens = sum(r["output_tokens"] for r in rows)
    first_arrival = min(r.arrived_at for r in session.requests)
    last_finish = max(r.finished_at for r in session.requests)
    steps = session.steps
    return {
        "requests": len(rows), "output_tokens": tokens,
        "ttft_ms": _spread([r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]),
        "tpot_ms": _spread([r["tpot_ms"] for r in rows if r["tpot_ms"] is not None]),
        "latency_ms": _spread([r["latency_ms"] for r in rows]),
        "throughput_tokens_per_s": round(tokens / (last_finish - first_arrival), 2),
        "wall_s": round(session.ended_at - session.started_at, 4),
        "engine_steps": len(steps),
        "mean_batch": round(statistics.fmean(s.running for s in steps), 3) if steps else None,
        "step_ms": _spread([(s.ended_at - s.started_at) * 1e3 for s in steps]),
        "per_request": rows,
    }


def lifetimes_unix_ns(session: Session) -> list[dict]:
    """Each request's arrival, admission, first token and finish on the wall clock (ns since the epoch), so the
    analyzer can place them on the trace's time axis (trace ts + baseTimeNanoseconds is wall-clock time)."""
    def unix(t: float | None) -> int | None:
        return None if t is None else session.started_unix_ns + round((t - session.started_at) * 1e9)

    return [{"id": r.id, "row": r.slot, "prompt_tokens": r.prompt_len, "output_tokens": len(r.tokens),
             "arrived": unix(r.arrived_at), "admitted": unix(r.admitted_at), "first_token": unix(r.first_token_at),
             "finished": unix(r.finished_at)} for r in session.requests]
