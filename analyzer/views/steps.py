"""Steps of a run: which annotations mark them, and the CPU time each one owns (its launches)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from analyzer.trace import TraceModel

_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
# Serving engines' step annotations, with the batch they ran (analyzer.trace.build.STEP_NAME reads them as steps):
# vLLM V1 `execute_context_<n>(<tokens>...)_generation_<n>(<tokens>...)` (context: requests still in prefill, their
# scheduled tokens; generation: decoding requests), optionally `execute_<tokens>_context_...` with `sq<n>sk<n>...`
# inside the brackets; SGLang `step[EXTEND bs=<n> toks=<n>]`, `step[DECODE bs=<n>]`, `step[MIXED ...]`; ATOM
# `prefill[bs=<n> tok=<n> ...]`, `decode[bs=<n> tok=<n> ...]`.
_VLLM_STEP = re.compile(r"^execute_(?:\d+_)?context_(\d+)\((?:sq)?(\d+)[^)]*\)_generation_(\d+)\((?:sq)?(\d+)[^)]*\)$")
_VLLM_OLD_STEP = re.compile(r"^execute_new_(\d+)_cached_(\d+)$")
_BRACKET_STEP = re.compile(r"^(?:step\[([A-Z_]+)|(prefill|decode)\[)([^\]]*)\]$")
_FIELD = re.compile(r"(\w+)=(\d+)")
# SGLang names its steps in vLLM's format too (sglang_profiler): its package in the trace's frames or ops says whose
# steps they are (vLLM never runs SGLang's code; SGLang has run vLLM's kernels)
_SGLANG_CODE = re.compile(r"(?:^|/)sglang(?:/|_profiler::)", re.M)


def engine_batch(name: str, code_engine: str | None = None) -> dict | None:
    """The batch a serving engine's step annotation names: engine, phase (prefill / decode / mixed) and the
    prefill and decode requests and tokens it states (None where it does not say). code_engine: the engine whose
    code the trace shows ran (engine_in_code), which names a step in vLLM's format that another engine wrote."""
    m = _VLLM_STEP.match(name)
    if m:
        ctx_n, ctx_tok, gen_n, gen_tok = (int(x) for x in m.groups())
        return _batch(code_engine or "vllm", ctx_n, ctx_tok, gen_n, gen_tok)
    m = _VLLM_OLD_STEP.match(name)
    if m:
        return {"engine": code_engine or "vllm", "phase": None, "new_requests": int(m.group(1)),
                "cached_requests": int(m.group(2))}
    m = _BRACKET_STEP.match(name)
    if not m:
        return None
    mode = (m.group(1) or m.group(2)).lower()
    fields = {k: int(v) for k, v in _FIELD.findall(m.group(3))}
    bs, toks = fields.get("bs"), fields.get("toks", fields.get("tok"))
    engine = "sglang" if m.group(1) else "atom"
    if mode in ("extend", "prefill"):
        return _batch(engine, bs, fields.get("c_sq", toks), 0, 0)
    if mode == "decode":
        return _batch(engine, 0, 0, bs, fields.get("g_sq", toks if toks is not None else bs))
    if mode == "mixed":
        return _batch(engine, fields.get("c"), fields.get("c_sq"), fields.get("g"), fields.get("g_sq"))
    return {"engine": engine, "phase": mode, "requests": bs}


def engine_in_code(model: TraceModel) -> str | None:
    """"sglang" where the trace's names (Python frames, ops) come from SGLang's package, else None."""
    return "sglang" if _SGLANG_CODE.search("\n".join(model.names)) else None


def _batch(engine: str, prefill_requests, prefill_tokens, decode_requests, decode_tokens) -> dict:
    phases = [p for p, n in (("prefill", prefill_requests), ("decode", decode_requests)) if n]
    return {"engine": engine, "phase": "mixed" if len(phases) == 2 else phases[0] if phases else None,
            "prefill_requests": prefill_requests, "prefill_tokens": prefill_tokens,
            "decode_requests": decode_requests, "decode_tokens": decode_tokens}


@dataclasses.dataclass(frozen=True)
class StepRanges:
    names: list[str]
    cpu_start_ns: np.ndarray
    cpu_end_ns: np.ndarray
    lo_ns: np.ndarray  # the CPU time the step owns: [lo, hi)
    hi_ns: np.ndarray
    source: str  # which annotations were used
    code_engine: str | None = None  # engine_in_code where the steps are an engine's annotations

    def __len__(self) -> int:
        return len(self.names)

    def index_at(self, t_ns) -> np.ndarray:
        """Step index owning each time, -1 outside every step."""
        t = np.asarray(t_ns)
        i = np.searchsorted(self.lo_ns, t, side="right") - 1
        ok = (i >= 0) & (t < self.hi_ns[np.clip(i, 0, None)])
        return np.where(ok, i, -1)


def step_ranges(model: TraceModel) -> StepRanges:
    """Steps from the capture's own annotations (prefill, decode_step#N, ...) when present, else ProfilerStep#N.

    Step k owns the CPU time from its start to the next step's start (the last one: to its end): runtime calls made
    then are its launches, and the GPU work they launched is its GPU work, wherever on the GPU timeline it ran.
    """
    steps, names = model.steps, model.names
    labels = [names[c] for c in steps.name.tolist()]
    profiler = np.array([bool(_PROFILER_STEP.match(n)) for n in labels], dtype=bool)
    own = ~profiler
    use = own if own.any() else profiler
    rows = np.flatnonzero(use)
    rows = rows[np.argsort(steps.start_ns[rows], kind="stable")]
    # drop steps nested in an earlier one (e.g. a word#N annotation inside another)
    keep, last_end = [], -1
    for r in rows.tolist():
        if steps.start_ns[r] >= last_end:
            keep.append(r)
            last_end = int(steps.end_ns[r])
    rows = np.asarray(keep, np.int64)
    code_engine = engine_in_code(model) if any(engine_batch(labels[r]) for r in keep) else None
    engines = {b["engine"] for b in (engine_batch(labels[r], code_engine) for r in keep) if b}
    source = (f"{'/'.join(sorted(engines))} engine step annotations" if engines else "annotations") if own.any() \
        else "ProfilerStep"
    cpu_s, cpu_e = steps.start_ns[rows], steps.end_ns[rows]
    lo = cpu_s.copy()
    hi = np.append(cpu_s[1:], cpu_e[-1:]).astype(np.int64)
    return StepRanges([labels[r] for r in rows.tolist()], cpu_s, cpu_e, lo, hi, source, code_engine)
