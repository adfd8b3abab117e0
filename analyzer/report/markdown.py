"""report.md: made to be pasted into a GitHub issue (tables, collapsible details, bounded size)."""
from __future__ import annotations

import os

from analyzer.report.mdsafe import cell, code, finish, one_line
from analyzer.report.validity_text import MARK, validity_items, validity_line
from analyzer.report.whatif_text import ranked, saving_cell, summary_line, what_if_line
from analyzer.units import fmt_bytes, fmt_ms_value, fmt_pct, fmt_us, plural

MAX_CHARS = 60_000
MAX_STEP_ROWS = 24
MAX_FINDINGS = 15
MAX_REQUEST_ROWS = 24
BASE_CAUSES = ("cpu_launch", "sync", "allocator", "queued")
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "atom": "ATOM"}
CAUSE_HEADERS = {"cpu_launch": "launch", "event_loop_idle": "event loop", "thread_hop": "thread hop",
                 "warmup": "one-time", "unknown": "unexplained", "input_wait": "input", "host_compute": "host math",
                 "setup": "shape set-up", "host_work": "host work"}




def _table(headers: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def _details(summary: str, body: list[str]) -> list[str]:
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


def headline(report: dict) -> str:
    s = report["summary"]
    if s.get("gpu_utilization") is None:
        note = s.get("note") or "no GPU activity in this trace"
        return f"**{note[0].upper()}{note[1:]}.**"
    steps = s["steps"]
    word = s.get("step_word", "step")
    line = (f"**GPU utilization {fmt_pct(s['gpu_utilization'])}**: busy {fmt_us(s['gpu_busy_us'])}, "
            f"idle {fmt_us(s['gpu_idle_us'])} of a {fmt_us(s['window_us'])} window "
            + (f"over {steps} {word}{'' if steps == 1 else 's'}" if steps else "(no step annotations in the trace)"))
    dil = s.get("step_time_us")
    if dil and dil.get("profiler_dilation") is not None:
        line += (f"; {word} {fmt_us(dil['unprofiled_p50'])} unprofiled vs {fmt_us(dil['profiled_p50'])} profiled "
                 f"(profiler dilation {dil['profiler_dilation']:.2f}x)")
    elif dil and dil.get("omitted"):
        line += f"; unprofiled {word} {fmt_us(dil['unprofiled_p50'])} (no profiled match: {dil['omitted']})"
    return line + "."


def partition_line(report: dict) -> str | None:
    """Where the idle time went, in the words of the partition: findings, instrumentation, unexplained."""
    p = report["summary"].get("idle_partition")
    if not p or not p.get("idle_us"):
        return None
    parts = [f"{fmt_us(p['findings_us'])} explained by the findings below"]
    if p.get("instrumentation_us"):
        parts.append(f"{fmt_us(p['instrumentation_us'])} in the profiler's own code")
    if abs(p.get("unexplained_us") or 0) >= 0.001:
        parts.append(f"{fmt_us(p['unexplained_us'])} unexplained (the launch of the work after the gap is not in "
                     f"the trace)")
    return f"Of the {fmt_us(p['idle_us'])} idle: " + "; ".join(parts) + "."


def render_markdown(report: dict) -> str:
    report = one_line(report)
    lines = _header(report) + _findings(report) + _serving(report) + _steps(report) + _gap_details(report)
    lines += _sync_details(report)
    lines += _allocator_details(report) + _hta(report)
    lines.append(f"<sub>gpu-idle-analyzer {report['tool']['version']} · analysis {report['analysis_seconds']} s"
                 f" · {cell(report['source']['trace'])}</sub>")
    text = finish(lines)
    if len(text) > MAX_CHARS:  # keep the head (summary, findings, steps); say what was cut
        text = text[: MAX_CHARS - 200].rsplit("\n", 1)[0] + "\n\n_(report truncated to fit a GitHub comment; " \
               "see report.json / report.html for the rest)_\n"
    return text


def _header(report: dict) -> list[str]:
    run = report.get("run")
    if run:
        title = (f"### GPU idle report: {cell(run.get('workload') or run.get('script'))} — {cell(run.get('model'))}"
                 f" ({run.get('layers')} layers, {run.get('dtype')}, batch {run.get('batch_size')}, "
                 f"{run.get('mode')}) on {cell(run.get('device'))}, torch {run.get('torch')}")
    else:
        title = f"### GPU idle report: `{cell(report['source']['trace'])}`"
    lines = [title, "", headline(report), ""]
    if check := validity_line(report):
        lines += [check, ""]
        lines += [f"- **{MARK[status]}** `{name}`: {one_line(text)}" for status, name, text in validity_items(report)]
        lines += [""] if validity_items(report) else []
    if part := partition_line(report):
        lines += [part, ""]
    if buys := summary_line(report):
        lines += [buys, ""]
    by_cause = report["gaps"]["by_cause"]
    if any(by_cause.values()):
        lines += ["Idle time by cause: " + ", ".join(f"{k} {fmt_us(v)}" for k, v in by_cause.items() if v) + ".", ""]
    if comm := report["summary"].get("communication"):
        lines += [f"Of the busy time, {fmt_us(comm['comm_us'])} ({fmt_pct(comm['share_of_busy'])}) was communication "
                  f"({plural(comm['kernels'], 'NCCL/RCCL kernel')}; {fmt_us(comm['overlap_us'])} of it overlapped "
                  f"compute): a rank waiting inside a collective for a late one counts as busy here; "
                  f"`analyze-many` over all the ranks measures those waits.", ""]
    if notes := trace_notes(report):
        lines += [notes, ""]
    notes = report["trace"].get("notes")
    if notes:
        lines += ["Trace notes (not faults): " + "; ".join(f"{k} ({v})" for k, v in notes.items()), ""]
    warnings = report["trace"].get("warnings")
    if warnings:
        lines += ["Trace warnings: " + "; ".join(f"{k} ({v})" for k, v in warnings.items()), ""]
    return lines


def trace_notes(report: dict) -> str | None:
    """What kind of run this is, where it changes the reading: training, CUDA/HIP graphs, HIP."""
    traits = report["summary"].get("traits") or {}
    graphs = traits.get("graphs") or {}
    notes = []
    if traits.get("training"):
        notes.append("a training run (autograd backward / optimizer ops)")
    if traits.get("runtime") == "HIP":
        notes.append("ROCm (HIP runtime)")
    if graphs.get("replays"):
        notes.append(f"{graphs['replays']} graph replays running {graphs['replay_gpu_activities']} GPU activities, "
                     f"{graphs['eager_launches']} eager launches")
    if graphs.get("captures"):
        notes.append(f"{graphs['captures']} graph captures ({graphs['captured_launches']} launches recorded into "
                     f"graphs, not executed)")
    return "This trace: " + "; ".join(notes) + "." if notes else None


def numbered(findings: list[dict]) -> list[tuple[str, dict]]:
    """("1", f), ("1.1", child), ("2", f) ...: findings that refine another are numbered under it."""
    out, top, sub = [], 0, 0
    for f in findings:
        if f.get("parent"):
            sub += 1
            out.append((f"{top}.{sub}", f))
        else:
            top, sub = top + 1, 0
            out.append((str(top), f))
    return out


def where(f: dict) -> str:
    """The call site, and the library code inside it, as one table cell."""
    call, lib = f.get("call_site"), f.get("library_site")
    if call and lib:
        return f"{code(call)} → {code(lib)}"
    return code(call or lib)


def _allocating(g: dict) -> str:
    """A cudaMalloc/cudaFree gap's exact line from the allocator's records, when a snapshot was joined."""
    if not g.get("allocating_line"):
        return ""
    what = "reserve" if g["segment_action"] in ("segment_alloc", "segment_map") else "release"
    return f"; {fmt_bytes(g['segment_bytes'])} segment {what} at {code(g['allocating_line'])}"


def _findings(report: dict) -> list[str]:
    findings = report["findings"]
    if not findings:
        if report["summary"].get("gpu_utilization") is None:
            return ["No findings: with no GPU activity recorded, there is no GPU idle time to explain.", ""]
        return ["No findings: nothing in this trace left the GPU measurably idle.", ""]
    shown = numbered(ranked(findings))[:MAX_FINDINGS]
    rows = [[n, f["severity"], f.get("confidence", "–"), f["kind"], ("↳ " if f.get("parent") else "") + f["title"],
             where(f), f["count"], saving_cell(f), fmt_us(f["impact_us"])] for n, f in shown]
    w = report.get("what_if") or {}
    order = ("ranked by what fixing each saves over the profiled window (a per-step saving in every step, a one-time "
             "cost once)" if w.get("available") else "ranked by GPU idle explained: no what-if estimates for this trace")
    lines = [f"#### Findings ({order}; ↳ rows refine the finding above them)", ""]
    lines += _table(["#", "severity", "confidence", "kind", "finding", "where (your code → library)", "count",
                     "saving", "GPU idle"], rows)
    lines.append("")
    advice = [f"{n}. **{cell(f['title'])}** — {f['advice']} {what_if_line(f, report.get('what_if'))}".rstrip()
              for n, f in shown if not f.get("parent")]
    return lines + _details("What to do about each finding, and what it buys", advice)


def _steps(report: dict) -> list[str]:
    steps = report["gaps"]["per_step"]
    if not steps:
        return []
    shown = steps if len(steps) <= MAX_STEP_ROWS else steps[: MAX_STEP_ROWS // 2] + steps[-MAX_STEP_ROWS // 2:]
    causes = _causes_shown(report)
    batches = any(s.get("batch") for s in shown)
    rows = [[s["step"], *([batch_text(s.get("batch"))] if batches else []), fmt_us(s["cpu_us"]),
             fmt_us(s.get("gpu_span_us")), fmt_us(s["busy_us"]), fmt_pct(s["gpu_utilization"]),
             *(fmt_us(s["idle_by_cause_us"].get(c)) for c in causes), s["launches"]]
            for s in shown]
    lines = [f"#### Per step ({len(steps)} step{'' if len(steps) == 1 else 's'}, from {report['gaps']['step_source']})",
             "",
             "A step's GPU work is what it launched (matched by correlation id), wherever it ran; its idle time is "
             "the wait before that work. Utilization = busy / (busy + idle).", ""]
    lines += _table(["step", *(["batch"] if batches else []), "CPU span", "GPU span", "GPU busy", "util",
                     *(f"idle: {CAUSE_HEADERS.get(c, c)}" for c in causes), "launches"], rows)
    if len(shown) < len(steps):
        lines.append(f"_({len(steps) - len(shown)} middle steps omitted)_")
    return lines + [""]


def batch_text(batch: dict | None) -> str:
    """A serving engine's step batch in a few words: `prefill 1 req / 888 tok + decode 37 req / 37 tok`."""
    if not batch:
        return "–"
    parts = [f"{phase} {batch[f'{phase}_requests']} req" + (f" / {batch[f'{phase}_tokens']} tok"
                                                             if batch.get(f"{phase}_tokens") is not None else "")
             for phase in ("prefill", "decode") if batch.get(f"{phase}_requests")]
    if parts:
        return " + ".join(parts)
    if "new_requests" in batch:
        return f"{batch['new_requests']} new + {batch['cached_requests']} cached req"
    return f"{batch.get('phase') or '?'} {batch.get('requests') or '?'} req"


def _causes_shown(report: dict) -> list[str]:
    """The base causes always; the others where this trace has them."""
    by_cause = report["gaps"]["by_cause"]
    return [*BASE_CAUSES, *(c for c in by_cause if c not in BASE_CAUSES and by_cause[c])]


def _spread_ms(spread: dict | None) -> str:
    if not spread:
        return "–"
    return f"p50 {spread['p50']:.1f} ms, p90 {spread['p90']:.1f} ms"


def _serving(report: dict) -> list[str]:
    serving = report.get("serving") or {}
    latency = serving.get("latency")
    loop, hops = serving.get("event_loop_idle") or {}, serving.get("thread_hops") or {}
    if not serving.get("is_serving", latency or loop.get("count")):
        return []
    lines = ["#### Serving: per-request latency and per-step GPU utilization", ""]
    if engine := engine_steps_text(serving.get("engine")):
        lines += [engine, ""]
    if latency:
        opts = latency.get("options") or {}
        lines += [f"{latency['requests']} requests ({opts.get('arrival')} arrivals at {opts.get('rate')}/s, at most "
                  f"{latency.get('max_batch')} in a batch; engine: yield {opts.get('yield_s')} s, to_thread "
                  f"{opts.get('to_thread')}, token readback {opts.get('token_readback')}). Without the profiler: "
                  f"TTFT {_spread_ms(latency.get('ttft_ms'))}; TPOT {_spread_ms(latency.get('tpot_ms'))}; "
                  f"{latency.get('throughput_tokens_per_s')} output tokens/s; mean batch {latency.get('mean_batch')}"
                  f" over {latency.get('engine_steps')} engine steps.", ""]
    parked = [f"{name} {fmt_us(part['idle_us'])} in {part['count']} gaps"
              + (f" (most after `{cell(site)}`)" if (site := named_site(part)) else "")
              for name, part in (("event loop parked", loop), ("thread hand-offs", hops)) if part.get("count")]
    if parked:
        lines += ["GPU idle with the launching thread parked: " + "; ".join(parked) + ".", ""]
    requests = (latency or {}).get("per_request") or []
    if requests:
        rows = [[r["id"], r["prompt_tokens"], r["output_tokens"], fmt_ms_value(r["queue_ms"]), fmt_ms_value(r["ttft_ms"]),
                 fmt_ms_value(r["tpot_ms"]), fmt_ms_value(r["latency_ms"])] for r in requests[:MAX_REQUEST_ROWS]]
        body = _table(["request", "prompt", "output", "queued", "TTFT", "TPOT", "latency"], rows)
        if len(requests) > MAX_REQUEST_ROWS:
            body.append(f"_({len(requests) - MAX_REQUEST_ROWS} more requests in report.json)_")
        lines += _details(f"Per request, without the profiler ({len(requests)} requests)", body)
    in_batch = {s["step"]: s for s in serving.get("steps") or []}
    steps = [s for s in report["gaps"]["per_step"] if s["step"] in in_batch]
    if steps:
        shown = steps if len(steps) <= MAX_STEP_ROWS else steps[: MAX_STEP_ROWS // 2] + steps[-MAX_STEP_ROWS // 2:]
        rows = [[s["step"], fmt_us(s["wall_us"]), fmt_pct(s["gpu_utilization"]), in_batch[s["step"]]["in_batch"],
                 in_batch[s["step"]]["waiting"], fmt_us(s["idle_by_cause_us"].get("event_loop_idle")),
                 fmt_us(s["idle_by_cause_us"].get("thread_hop")), fmt_us(s["idle_by_cause_us"].get("sync"))]
                for s in shown]
        body = _table(["step", "wall", "GPU util", "requests in batch", "waiting", "idle: event loop",
                       "idle: thread hop", "idle: sync"], rows)
        lines += _details(f"Per engine step, profiled ({len(steps)} steps)", body)
    return lines


def engine_steps_text(engine: dict | None) -> str | None:
    """A serving engine's annotated steps by phase in one sentence (report.json serving.engine)."""
    if not engine:
        return None
    phases = [f"{p['steps']} {phase} step{'' if p['steps'] == 1 else 's'} ("
              + ", ".join(f"{p[f'{k}_tokens']} {k} tokens" for k in ("prefill", "decode") if p[f"{k}_tokens"])
              + f"{', ' if p['prefill_tokens'] or p['decode_tokens'] else ''}GPU utilization "
              f"{fmt_pct(p['gpu_utilization'])}, {fmt_us(p['wall_us'])} of CPU span)"
              for phase, p in engine["by_phase"].items()]
    name = ENGINE_NAMES.get(engine["engine"], engine["engine"])
    return f"Engine steps from {name}'s own annotations: " + "; ".join(phases) + "."


def named_site(part: dict) -> str | None:
    """The serving cause's site that explains the most idle time, skipping gaps it could not attribute."""
    return next((s["call_site"] for s in part.get("sites") or [] if s["call_site"] != "(unknown)"), None)


def _gap_details(report: dict) -> list[str]:
    gaps = report["gaps"]
    body = []
    if gaps["top"]:
        body += ["Largest idle intervals (a gap cut by cause is listed piece by piece):", ""]
        body += _table(["idle", "cause", "step", "op", "where (your code → library)"],
                       [[fmt_us(g["dur_us"]), g["cause"], g["step"], code(g["op"]), where(g) + _allocating(g)]
                        for g in gaps["top"][:15]])
        body += ["", "Idle time by call site (the code that launched the awaited work, or that blocked):", ""]
        body += _table(["cause", "where (your code → library)", "pieces", "idle", "max"],
                       [[s["cause"], where(s), s["count"], fmt_us(s["idle_us"]), fmt_us(s["max_us"])]
                        for s in gaps["sites"][:15]])
    stats = gaps["launch_stats"]
    if stats["launches"]:
        body += ["", f"Launches: {stats['launches']} ({', '.join(f'{k} {v}' for k, v in stats['by_api'].items())});"
                 f" launch call p50 {fmt_us(stats['launch_call_us']['p50'])}, launch-to-start p50 "
                 f"{fmt_us((stats['launch_to_start_us'] or {}).get('p50'))}; "
                 f"{fmt_pct(stats['kernels_shorter_than_launch_share'])} of GPU activities ran shorter than "
                 f"their own launch call."]
    graph = gaps.get("cuda_graph_estimate")
    if graph:
        basis = f" ({graph['graph_step_basis']})" if graph.get("graph_step_basis") else ""
        line = (f"CUDA-graph estimate: GPU busy {fmt_us(graph['gpu_busy_per_step_us'])} per step vs eager step "
                f"{fmt_us(graph['eager_step_us'])} ({graph['eager_step_source']}); as a graph "
                f"{fmt_us(graph['estimated_graph_step_us'])}{basis}: about {graph['estimated_speedup']}x")
        if graph.get("measured"):
            m = graph["measured"]
            line += (f"; measured by the capture: eager {fmt_us(m['eager_step_us'])} vs graph "
                     f"{fmt_us(m['cuda_graph_step_us'])} = {m['speedup']}x")
        body += ["", line + "."]
    return _details("Idle intervals, launch statistics and the CUDA-graph estimate", body) if body else []


def _sync_details(report: dict) -> list[str]:
    sites = report["syncs"]
    if not sites:
        return []
    rows = [[where(s), s["kind"], s["api"], code(s["op"]), s["count"], fmt_us(s["wait_us"]),
             fmt_us(s["drain_us"])] for s in sites[:20]]
    body = _table(["where (your code → library)", "kind", "blocking API", "op", "blocks", "CPU wait",
                   "GPU idle while blocked"], rows)
    for s in sites[:20]:
        for line in s.get("source_lines", []):
            body.append(f"\n`{line['file']}:{line['line']}`: `{cell(line['code'])}`")
    return _details(f"Host syncs: {plural(sum(s['count'] for s in sites), 'blocking call')} at "
                    f"{plural(len(sites), 'call site')}", body)


def _allocator_details(report: dict) -> list[str]:
    a = report["allocator"]
    names = a.get("api_names") or {"malloc": "cudaMalloc", "free": "cudaFree"}
    calls = (f"{a['cuda_malloc']} {names['malloc']} / {a['cuda_free']} {names['free']} "
             f"({a.get('warmup_calls', 0)} of them first allocations"
             + (f", {a['capture_calls']} inside graph captures" if a.get("capture_calls") else "") + ")")
    if not a.get("devices", True):
        recorded = "no GPU memory events (the host's only)" if report["trace"].get("has_memory_events") \
            else "no memory events"
        body = [f"The trace records {recorded} (torch.profiler's profile_memory=True adds them): reserved and "
                f"allocated memory and the allocations the cache served are not known. {calls} recorded."]
    else:
        body = [f"Peak reserved {fmt_bytes(a['reserved_peak_bytes'])}, peak allocated "
                f"{fmt_bytes(a['allocated_peak_bytes'])}; {calls}; "
                f"{a['allocations']} allocations served, cache hit share {fmt_pct(a['cache_hit_share'])}; reserved "
                f"grew {a['reserved_growth']['count']}x ({fmt_bytes(a['reserved_growth']['bytes'])}) and dropped "
                f"{a['reserved_drops']['count']}x ({fmt_bytes(a['reserved_drops']['bytes'])})."]
    if a["sites"]:
        body += [""] + _table(["where (your code → library)", names["malloc"], names["free"], "call time",
                               "GPU idle", "steps"],
                              [[where(s), s["cuda_malloc"], s["cuda_free"], fmt_us(s["total_us"]),
                                fmt_us(s.get("gpu_idle_us")), s["steps_with_calls"]] for s in a["sites"][:15]])
    if a.get("memory_stats_delta"):
        body += ["", "memory_stats over the profiled window: " +
                 ", ".join(f"{k} +{v}" for k, v in a["memory_stats_delta"].items())]
    if a.get("memory_stats_process"):
        body += ["", "memory_stats of the whole process at the window's end: " +
                 ", ".join(f"{k} {v}" for k, v in a["memory_stats_process"].items())]
    out = _details("Caching allocator", body)
    if a.get("snapshot"):
        out += _snapshot_details(a["snapshot"], names)
    return out


def _snapshot_details(snap: dict, names: dict) -> list[str]:
    """The allocator's own records: exact allocating lines, the segments at the reserved peak, empty_cache."""
    entries, align = snap["entries"], snap["alignment"]
    body = [f"{sum(entries.values())} history entries, from before the trace window to the snapshot ({entries.get('alloc', 0)} allocations, "
            f"{entries.get('segment_alloc', 0) + entries.get('segment_map', 0)} segment reserves, "
            f"{entries.get('segment_free', 0) + entries.get('segment_unmap', 0)} segment releases); "
            f"{align['matched']} of {align['calls']} {names['malloc']}/{names['free']} calls in the trace found "
            f"their entry ({align['clock']})."]
    if not snap.get("has_history"):
        body.append("The snapshot holds segments only, no history: allocating lines and timing are unknown.")
    elif not snap.get("history_consistent", True):
        body.append("The history does not add up to the snapshot's final segments (was it taken in another process?): "
                    "the replayed reserved and allocated bytes below are clamped at zero.")
    sites = [s for s in snap["sites"] if s["segment_allocs"] or s["segment_frees"]]
    if sites:
        body += [""] + _table(
            ["allocating line (allocator records)", "library line", "segment reserves", "releases",
             "in the trace window", f"{names['malloc']}/{names['free']} time", "GPU idle", "request sizes",
             "steps"],
            [[code(s["call_site"]), code(s["library_site"] or ""),
              f"{s['segment_allocs']} ({fmt_bytes(s['bytes_reserved'])})",
              f"{s['segment_frees']} ({fmt_bytes(s['bytes_released'])})", s.get("in_window", "–"),
              fmt_us(s["cuda_call_us"]), fmt_us(s["gpu_idle_us"]), s["request_sizes"],
              s.get("steps_with_segment_change", "–")] for s in sites[:15]])
    peak, frag = snap.get("peak"), snap["fragmentation"]
    for label, state in (("At the reserved peak", peak), ("When the snapshot was taken", frag["at_end"])):
        if not state:
            continue
        at = peak if state is peak else None
        body.append(f"\n{label}: " + (f"{fmt_bytes(at['reserved_bytes'])} reserved over {at['segments']} segments, "
                                       f"{fmt_bytes(at['allocated_bytes'])} allocated; " if at else "")
                    + f"{fmt_bytes(state.get('inactive_split_bytes'))} free inside segments that hold live blocks, "
                    f"{fmt_bytes(state.get('free_segment_bytes'))} in segments with none; the largest free block "
                    f"{fmt_bytes(state.get('largest_free_block_bytes'))}.")
    if frag.get("largest_missed_request_bytes"):
        where = frag.get("largest_missed_request_site")
        body.append(f"The largest request that found no cached block: {fmt_bytes(frag['largest_missed_request_bytes'])}"
                    + (f" at {code(where)}." if where else "."))
    ec = snap["empty_cache"]
    if ec["segments_released"]:
        body.append(f"\ntorch.cuda.empty_cache() released {ec['segments_released']} segments "
                    f"({fmt_bytes(ec['bytes_released'])}) from {', '.join(code(x) for x in ec['sites'])}; "
                    f"{ec['segment_allocs_after']} segment reserves followed, {fmt_us(ec['cuda_malloc_us_after'])} of "
                    f"{names['malloc']} and {fmt_us(ec['gpu_idle_us_after'])} of GPU idle.")
    steps = snap.get("per_step") or []
    if steps:
        hits = [s["cache_hits"] / s["allocs"] for s in steps if s["allocs"]]
        body.append(f"\nPer step: {min(s['segment_allocs'] for s in steps)} to "
                    f"{max(s['segment_allocs'] for s in steps)} segment reserves; cache hit share "
                    f"{fmt_pct(min(hits, default=None))} to {fmt_pct(max(hits, default=None))}.")
    return _details(f"Allocator records ({cell(os.path.basename(snap['source']))})", body)


def _hta(report: dict) -> list[str]:
    hta = report.get("hta")
    if not hta:
        return []
    if hta.get("error"):
        return [f"HTA: failed ({cell(hta['error'])}).", ""]
    body = [f"- {k}: {cell(v)}" for k, v in hta.items() if not isinstance(v, (dict, list))]
    return _details("HolisticTraceAnalysis, side by side", body)
