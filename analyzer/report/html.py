"""report.html: one self-contained page (plotly.js inlined once, no network) with the findings, a zoomable
GPU timeline sharing one time axis with the memory curves, per-step bars and the supporting tables."""
from __future__ import annotations

import html
import json

from analyzer.report.figures import _x, figure_dicts, window_start_us
from analyzer.report.markdown import engine_steps_text, named_site, numbered, partition_line, trace_notes
from analyzer.report.validity_text import MARK, validity_items, validity_line
from analyzer.report.whatif_text import ranked, saving_cell, summary_line, what_if_line
from analyzer.report.palette import CAUSE_COLORS, SEVERITY_COLORS
from analyzer.report.plotly_json import plotly_js, plotly_json
from analyzer.units import fmt_bytes, fmt_factor, fmt_ms, fmt_pct, fmt_us, plural
from analyzer.views.idle import CAUSES

TIMELINE_HINT = ("<p class=hint>Drag to zoom (both panels share the time axis), double-click to reset; hover an "
                 "interval for its cause, op and call site.</p>")
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False,
               "modeBarButtonsToRemove": ["lasso2d", "select2d"]}


# ---------------------------------------------------------------- units

def esc(value) -> str:
    return "–" if value is None or value == "" else html.escape(str(value))


# ---------------------------------------------------------------- page

def render_html(report: dict) -> str:
    timeline_fig, steps_fig = figure_dicts(report)
    body = [
        _header(report),
        section("Findings", _findings_table(report)),
        _serving_section(report),
        section("Timeline", TIMELINE_HINT + figure_html(timeline_fig, "timeline") + _bounded_note(report)),
        section("Steps", figure_html(steps_fig, "steps")),
        section("Largest idle gaps", _top_gaps_table(report)),
        section("Kernel launches and CUDA-graph estimate", _launch_tables(report)),
        section("Host synchronizations", _sync_table(report)),
        section("Caching allocator", _allocator_tables(report)),
        _footer(report),
    ]
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>{esc(_title(report))}</title><style>{CSS}</style>"
            f"<script>{plotly_js()}</script></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")


def _bounded_note(report: dict) -> str:
    """Say so when the report kept only part of the intervals, so that a sparse lane is not misread."""
    notes = []
    for dev, d in ((report.get("timeline") or {}).get("devices") or {}).items():
        if d.get("idle_total", 0) > len(d.get("idle_us") or []):
            notes.append(f"GPU {esc(dev)}: the {len(d['idle_us'])} longest of {d['idle_total']} idle intervals")
        if d.get("busy_total", 0) > len(d.get("busy_us") or []):
            notes.append(f"GPU {esc(dev)}: {d['busy_total']} busy intervals merged into {len(d['busy_us'])}")
    return f"<p class=hint>Shown: {'; '.join(notes)}.</p>" if notes else ""


# As plotly.io.to_html(fig, include_plotlyjs=False, full_html=False, config=..., div_id=...) writes a figure.
_FIGURE_DIV = """\
<div style="height:{height}; width:100%;">\
                \
            <div id="{id}" class="plotly-graph-div" \
style="height:100%; width:100%;"></div>\
            <script>\
                window.PLOTLYENV=window.PLOTLYENV || {{}};\
                \
                if (document.getElementById("{id}")) {{\
                    Plotly.newPlot(\
                        "{id}",\
                        {data},\
                        {layout},\
                        {config}\
                    )\
                }};\
            </script>\
        </div>"""


def figure_html(figure: dict, div_id: str) -> str:
    return _FIGURE_DIV.format(height=f"{figure['layout']['height']}px", id=div_id, data=plotly_json(figure["data"]),
                              layout=plotly_json(figure["layout"]), config=json.dumps(PLOT_CONFIG))


def section(title: str, content: str) -> str:
    return f"<section><h2>{html.escape(title)}</h2>\n{content}\n</section>"


def _title(report: dict) -> str:
    run = report.get("run")
    if run:
        parts = [run.get("workload"), run.get("model"), run.get("device")]
        return "GPU idle report: " + " · ".join(str(p) for p in parts if p)
    return "GPU idle report: " + str((report.get("source") or {}).get("trace") or "trace")


def _header(report: dict) -> str:
    s, run = report.get("summary") or {}, report.get("run")
    facts = [f"GPU utilization <b>{fmt_pct(s.get('gpu_utilization'))}</b>",
             f"busy <b>{fmt_ms(s.get('gpu_busy_us'))} ms</b>", f"idle <b>{fmt_ms(s.get('gpu_idle_us'))} ms</b>",
             f"window <b>{fmt_ms(s.get('window_us'))} ms</b>", f"steps <b>{esc(s.get('steps'))}</b>"]
    st = s.get("step_time_us")
    if st and st.get("profiler_dilation") is not None:
        facts.append(f"profiler dilation <b>{esc(st.get('profiler_dilation'))}×</b> (step p50 "
                     f"{fmt_ms(st.get('profiled_p50'))} ms profiled vs {fmt_ms(st.get('unprofiled_p50'))} ms unprofiled)")
    out = [f"<header><h1>{esc(_title(report))}</h1>", f"<p class=summary>{' · '.join(facts)}</p>"]
    if check := validity_line(report):
        items = "".join(f"<li><b>{esc(MARK[status])}</b> <code>{esc(name)}</code>: {esc(text)}</li>"
                        for status, name, text in validity_items(report))
        out.append(f"<section class=validity><p>{esc(check)}</p>" + (f"<ul>{items}</ul>" if items else "")
                   + "</section>")
    for line in (partition_line(report), summary_line(report), trace_notes(report)):
        if line:
            out.append(f"<p class=run>{esc(line)}</p>")
    if run:
        keys = ("dtype", "layers", "batch_size", "mode", "torch", "cuda_runtime", "created_utc")
        out.append("<p class=run>" + " · ".join(f"{k} <code>{esc(run.get(k))}</code>" for k in keys
                                               if run.get(k) is not None) + "</p>")
    out.append(f"<p class=run>trace <code>{esc((report.get('source') or {}).get('trace'))}</code></p>")
    if s.get("note"):
        out.append(f"<p class=note>{esc(s['note'])}</p>")
    out.append(_cause_legend(report))
    return "\n".join(out) + "</header>"


def _cause_legend(report: dict) -> str:
    gaps = report.get("gaps") or {}
    by, count = gaps.get("by_cause") or {}, gaps.get("count_by_cause") or {}
    chips = [f"<span class=chip style='--c:{CAUSE_COLORS.get(c, '#999')}'>idle: {html.escape(c)} "
             f"<b>{fmt_ms(by.get(c))} ms</b> ({plural(count.get(c, 0), 'gap')})</span>" for c in CAUSES if by.get(c)]
    return "<p class=chips>" + "".join(chips) + "</p>" if chips else ""


def table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    """Cells are HTML already (escaped by the caller)."""
    if not rows:
        return "<p class=empty>none</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _where(item: dict) -> str:
    call, lib = item.get("call_site"), item.get("library_site")
    cells = [f"<code>{esc(call)}</code>" if call else "", f"→ <code>{esc(lib)}</code>" if lib else ""]
    return " ".join(c for c in cells if c) or "–"


def _findings_table(report: dict) -> str:
    rows = []
    for n, f in numbered(ranked(report.get("findings") or [])):
        sev = f.get("severity")
        child = bool(f.get("parent"))
        buys = what_if_line(f, report.get("what_if"))
        title = (("↳ " if child else "") + f"{esc(f.get('title'))}<details><summary>advice</summary><p>"
                 f"{esc(f.get('advice'))}</p>" + (f"<p>{esc(buys)}</p>" if buys else "")
                 + f"{_context(f.get('detail', {}).get('context'))}</details>")
        rows.append([n, f"<span class=sev style='--c:{SEVERITY_COLORS.get(sev, '#999')}'>{esc(sev)}</span>",
                     esc(f.get("confidence", "–")), esc(f.get("kind")), title, _where(f), esc(f.get("count")),
                     f"<span class=num>{esc(saving_cell(f))}</span>",
                     f"<span class=num>{fmt_ms(f.get('impact_us'))}</span>"])
    return table(["#", "severity", "confidence", "kind", "finding", "where (your code → library)", "count", "saving",
                  "GPU idle (ms)"], rows, "findings")


def _context(frames) -> str:
    if not frames:
        return ""
    return "<pre>" + "\n".join(html.escape(str(f)) for f in frames) + "</pre>"


def _top_gaps_table(report: dict, limit: int = 10) -> str:
    t0 = window_start_us(report)
    rows = [[f"<span class=num>{_x(g['ts_us'], t0):.3f}</span>", f"<span class=num>{fmt_ms(g.get('dur_us'))}</span>",
             f"<span class=chip style='--c:{CAUSE_COLORS.get(g.get('cause'), '#999')}'>{esc(g.get('cause'))}</span>",
             esc(g.get("step")), esc(g.get("op")), esc(g.get("runtime_call")),
             f"{_where(g)}" + (f"<br>{fmt_bytes(g.get('segment_bytes'))} {esc(g.get('segment_action'))} at "
                               f"<code>{esc(g['allocating_line'])}</code>" if g.get("allocating_line") else "")
             + f"<details><summary>stack</summary>{_context(g.get('context'))}"
             f"</details>"] for g in ((report.get("gaps") or {}).get("top") or [])[:limit]]
    return table(["at (ms)", "duration (ms)", "cause", "step", "op", "runtime call", "where"], rows)


def _stats_cell(stats: dict | None) -> str:
    if not stats:
        return "–"
    return " · ".join(f"{k} {fmt_us(v)}" for k, v in stats.items())


def _launch_tables(report: dict) -> str:
    gaps = report.get("gaps") or {}
    ls, cg = gaps.get("launch_stats") or {}, gaps.get("cuda_graph_estimate") or {}
    launch_rows = [
        ["launches", esc(ls.get("launches"))],
        ["by API", esc(", ".join(f"{k} {v}" for k, v in (ls.get("by_api") or {}).items()) or None)],
        ["launch call", _stats_cell(ls.get("launch_call_us"))],
        ["launch → GPU start", _stats_cell(ls.get("launch_to_start_us"))],
        ["kernel duration", _stats_cell(ls.get("kernel_us"))],
        ["kernels shorter than their launch call", fmt_pct(ls.get("kernels_shorter_than_launch_share"))],
    ]
    graph_rows = [
        ["steps used", esc(cg.get("steps_used"))],
        ["GPU busy per step", fmt_us(cg.get("gpu_busy_per_step_us"))],
        ["profiled step", fmt_us(cg.get("profiled_step_us"))],
        ["eager step", f"{fmt_us(cg.get('eager_step_us'))} ({esc(cg.get('eager_step_source'))})"],
        ["estimated CUDA-graph step", fmt_us(cg.get("estimated_graph_step_us"))
         + (f" ({esc(cg['graph_step_basis'])})" if cg.get("graph_step_basis") else "")],
        ["estimated speedup", fmt_factor(cg.get("estimated_speedup"))],
        ["recoverable per step", fmt_us(cg.get("recoverable_us_per_step"))],
    ]
    measured = cg.get("measured")
    if measured:
        graph_rows.append(["measured (meta.json)", f"eager {fmt_us(measured.get('eager_step_us'))} → CUDA graph "
                           f"{fmt_us(measured.get('cuda_graph_step_us'))}, {fmt_factor(measured.get('speedup'))}"])
    if not cg:
        mc = (report.get("run") or {}).get("mode_comparison") or {}
        graphs = gaps.get("graphs") or {}
        graph_rows = [["estimate", "none: the run already replays graphs" if graphs.get("replays") else
                       "none for this trace (a graph capture, a training step, or no steps)"]]
        if mc.get("eager_over_graph"):
            graph_rows.append(["measured by the capture (meta.json)",
                               f"eager {fmt_us(mc['eager_step_ms'] * 1e3)} → CUDA graph "
                               f"{fmt_us(mc['cuda_graph_step_ms'] * 1e3)}, {mc['eager_over_graph']:.2f}×"])
    definition = f"<p class=hint>{esc(ls.get('definition'))}</p>" if ls.get("definition") else ""
    return ("<div class=cols><div><h3>Launch statistics</h3>" + table(["metric", "value"], launch_rows, "kv")
            + definition + "</div><div><h3>CUDA-graph estimate</h3>" + table(["metric", "value"], graph_rows, "kv")
            + "</div></div>")


def _sync_table(report: dict) -> str:
    rows = [[_where(s) + _source_lines(s.get("source_lines")),
             esc(s.get("kind")), esc(s.get("api")), esc(s.get("op")), esc(s.get("count")),
             f"<span class=num>{fmt_ms(s.get('wait_us'))}</span>", f"<span class=num>{fmt_ms(s.get('drain_us'))}</span>"]
            for s in report.get("syncs") or []]
    totals = report.get("sync_totals") or {}
    note = (f"<p class=hint>{esc(totals.get('total_blocking_calls'))} blocking calls; wait = host time inside "
            "the blocking call, GPU idle = the idle time while the CPU was blocked there.</p>") if totals else ""
    return table(["where", "kind", "blocking api", "op", "count", "wait (ms)", "GPU idle (ms)"], rows) + note


def _source_lines(lines) -> str:
    if not lines:
        return ""
    return "<pre>" + "\n".join(f"{esc(l.get('file'))}:{esc(l.get('line'))}: {esc(l.get('code'))}"
                               for l in lines) + "</pre>"


def _allocator_tables(report: dict) -> str:
    a = report.get("allocator") or {}
    names = a.get("api_names") or {"malloc": "cudaMalloc", "free": "cudaFree"}
    growth, drops = a.get("reserved_growth") or {}, a.get("reserved_drops") or {}
    memory = bool(a.get("devices", True))  # the GPUs whose memory events the trace records
    unknown = "not known: the trace records no GPU memory events (profile_memory=True)"
    rows = [["reserved peak", fmt_bytes(a.get("reserved_peak_bytes")) if memory else unknown],
            ["allocated peak", fmt_bytes(a.get("allocated_peak_bytes")) if memory else unknown],
            [f"{names['malloc']} / {names['free']}", f"{esc(a.get('cuda_malloc'))} / {esc(a.get('cuda_free'))}"
                                                      f" ({esc(a.get('warmup_calls'))} first allocations"
                                                      + (f", {esc(a['capture_calls'])} inside graph captures"
                                                         if a.get("capture_calls") else "") + ")"],
            ["allocations (cache hit share)", f"{esc(a.get('allocations'))} ({fmt_pct(a.get('cache_hit_share'))})"
             if memory else unknown],
            ["reserved grew / dropped", f"{esc(growth.get('count'))}× {fmt_bytes(growth.get('bytes'))} / "
                                        f"{esc(drops.get('count'))}× {fmt_bytes(drops.get('bytes'))}"
             if memory else unknown],
            ["GPU idle attributed to the allocator", fmt_us(a.get("gpu_idle_us"))],
            ["OOM events", esc(a.get("oom_events"))]]
    delta = a.get("memory_stats_delta")
    if delta:
        rows.append(["torch.cuda.memory_stats delta", esc(", ".join(f"{k} {v}" for k, v in delta.items()))])
    process = a.get("memory_stats_process")
    if process:
        rows.append(["torch.cuda.memory_stats of the process at the window's end",
                     esc(", ".join(f"{k} {v}" for k, v in process.items()))])
    sites = [[_where(s), esc(s.get("op")), esc(s.get("cuda_malloc")),
              esc(s.get("cuda_free")), f"<span class=num>{fmt_ms(s.get('total_us'))}</span>",
              fmt_bytes(s.get("bytes_reserved")), fmt_bytes(s.get("bytes_released"))] for s in a.get("sites") or []]
    return ("<div class=cols><div><h3>Summary</h3>" + table(["metric", "value"], rows, "kv") + "</div></div>"
            + f"<h3>{names['malloc']} / {names['free']} call sites</h3>"
            + table(["where", "op", names["malloc"], names["free"], "call time (ms)", "reserved", "released"], sites)
            + _snapshot_tables(a.get("snapshot"), names))


def _snapshot_tables(snap: dict | None, names: dict) -> str:
    """The allocator's own records (memory_snapshot.pickle): exact lines, the cache at its peak and at the end."""
    if not snap:
        return ""
    align, peak, ec = snap["alignment"], snap.get("peak") or {}, snap["empty_cache"]
    frag, end = snap["fragmentation"], snap["fragmentation"]["at_end"]
    rows = [["history entries", esc(", ".join(f"{k} {v}" for k, v in snap["entries"].items() if v))],
            [f"{names['malloc']}/{names['free']} calls matched to an entry",
             f"{esc(align['matched'])} of {esc(align['calls'])} (median entry "
             f"{fmt_us(align.get('median_entry_after_call_end_us'))} after the call's end)"],
            ["at the reserved peak", f"{fmt_bytes(peak.get('reserved_bytes'))} reserved, "
                                     f"{fmt_bytes(peak.get('allocated_bytes'))} allocated, "
                                     f"{fmt_bytes(peak.get('cached_bytes'))} cached but free over "
                                     f"{esc(peak.get('segments'))} segments ({fmt_bytes(peak.get('inactive_split_bytes'))}"
                                     f" inside segments with live blocks)"],
            ["at the end", f"{esc(len(snap['segments']['at_end']))} segments, "
                           f"{fmt_bytes(end['inactive_split_bytes'])} free inside segments with live blocks, "
                           f"{fmt_bytes(end['free_segment_bytes'])} in segments with none"],
            ["largest request that found no cached block", fmt_bytes(frag.get("largest_missed_request_bytes"))
             + (f" at <code>{esc(frag['largest_missed_request_site'])}</code>"
                if frag.get("largest_missed_request_site") else "")]]
    if ec["segments_released"]:
        rows.append(["torch.cuda.empty_cache()", f"released {esc(ec['segments_released'])} segments "
                     f"({fmt_bytes(ec['bytes_released'])}); {esc(ec['segment_allocs_after'])} reserves followed "
                     f"({fmt_us(ec['cuda_malloc_us_after'])})"])
    if not snap.get("history_consistent", True):
        rows.append(["note", "the history does not add up to the final segments: replayed bytes clamped at zero"])
    sites = [[f"<code>{esc(s['call_site'])}</code>", f"<code>{esc(s['library_site'])}</code>",
              f"{esc(s['segment_allocs'])} ({fmt_bytes(s['bytes_reserved'])})",
              f"{esc(s['segment_frees'])} ({fmt_bytes(s['bytes_released'])})", esc(s.get("in_window")),
              f"<span class=num>{fmt_ms(s['cuda_call_us'])}</span>", f"<span class=num>{fmt_ms(s['gpu_idle_us'])}</span>",
              esc(s["allocs"]), esc(s["request_sizes"])]
             for s in snap["sites"][:30]]
    return (f"<h3>Allocator records <small>({esc(snap['source'].rsplit('/', 1)[-1])})</small></h3>"
            + table(["metric", "value"], rows, "kv")
            + table(["allocating line", "library line", "segment reserves", "releases", "in the trace window",
                      "call time (ms)",
                      "GPU idle (ms)", "allocations", "request sizes"], sites))


def _footer(report: dict) -> str:
    tool = report.get("tool") or {}
    return (f"<footer>{esc(tool.get('name'))} {esc(tool.get('version'))} · schema "
            f"<code>{esc(report.get('schema'))}</code> · analysis {esc(report.get('analysis_seconds'))} s · "
            f"data: <code>report.json</code></footer>")


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;padding:16px 28px;
 max-width:1800px;color:#1a1a1a;background:#fff;font-size:14px;line-height:1.45}
h1{font-size:22px;margin:4px 0 6px}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid #ddd;
 padding-bottom:4px}h3{font-size:15px;margin:10px 0 6px}
p{margin:4px 0}.summary{font-size:15px}.validity{background:#fdf0f0;border-left:4px solid #D55E00;padding:2px 8px;margin:6px 0}
.validity ul{margin:2px 0;padding-left:18px}.run{color:#444}.note{background:#fff4e0;border-left:4px solid #E69F00;
 padding:6px 10px}.hint{color:#555;font-size:13px}.empty{color:#777;font-style:italic}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{font-size:12px;background:#f6f6f6;padding:6px 8px;margin:4px 0;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;margin:4px 0 8px;width:100%}th,td{border:1px solid #ddd;padding:4px 8px;
 vertical-align:top;text-align:left}th{background:#f2f2f2;font-weight:600}tbody tr:nth-child(even){background:#fafafa}
table.kv td:first-child{white-space:nowrap;color:#333;width:16em}.num{font-variant-numeric:tabular-nums}
td .num{display:block;text-align:right}
details summary{cursor:pointer;color:#0072B2;font-size:13px}details p{margin:4px 0;max-width:110ch}
.sev,.chip{display:inline-block;border-left:10px solid var(--c);padding:0 6px;background:#f4f4f4;
 white-space:nowrap}.chips .chip{margin:4px 8px 0 0}
.cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:18px}.cols>div{min-width:0}
td code{overflow-wrap:anywhere}
footer{margin:28px 0 8px;color:#666;font-size:12px;border-top:1px solid #ddd;padding-top:6px}
"""


def _serving_section(report: dict) -> str:
    """Serving runs: the capture's unprofiled per-request latency next to the profiled steps' GPU utilization."""
    serving = report.get("serving") or {}
    latency = serving.get("latency")
    parked = [(label, serving.get(key) or {}) for label, key in (("event loop parked", "event_loop_idle"),
                                                                 ("thread hand-offs", "thread_hops"))]
    if not serving.get("is_serving", latency or any(part.get("count") for _, part in parked)):
        return ""
    parts = []
    if engine := engine_steps_text(serving.get("engine")):
        parts.append(f"<p>{esc(engine)}</p>")
    if latency:
        opts = latency.get("options") or {}
        spread = lambda s: (f"p50 {s['p50']:.1f} ms, p90 {s['p90']:.1f} ms" if s else "–")  # noqa: E731
        parts.append(f"<p>{esc(latency.get('requests'))} requests ({esc(opts.get('arrival'))} arrivals at "
                     f"{esc(opts.get('rate'))}/s, at most {esc(latency.get('max_batch'))} in a batch; engine: yield "
                     f"{esc(opts.get('yield_s'))} s, to_thread {esc(opts.get('to_thread'))}, token readback "
                     f"{esc(opts.get('token_readback'))}). Without the profiler: TTFT "
                     f"<b>{esc(spread(latency.get('ttft_ms')))}</b>; TPOT <b>{esc(spread(latency.get('tpot_ms')))}</b>;"
                     f" <b>{esc(latency.get('throughput_tokens_per_s'))}</b> output tokens/s; mean batch "
                     f"{esc(latency.get('mean_batch'))}.</p>")
    for label, part in parked:
        if part.get("count"):
            site = named_site(part)
            parts.append(f"<p>GPU idle with the launching thread parked ({esc(label)}): <b>{fmt_ms(part['idle_us'])} ms"
                         f"</b> in {esc(part['count'])} gaps" + (f", most after <code>{esc(site)}</code>" if site
                                                                  else "") + ".</p>")
    fmt = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
    requests = (latency or {}).get("per_request") or []
    if requests:
        parts.append("<h3>Per request, without the profiler (ms)</h3>" + table(
            ["request", "prompt", "output", "queued", "TTFT", "TPOT", "latency"],
            [[esc(r["id"]), esc(r["prompt_tokens"]), esc(r["output_tokens"]), fmt(r["queue_ms"]),
              fmt(r["ttft_ms"]), fmt(r["tpot_ms"]), fmt(r["latency_ms"])] for r in requests]))
    in_batch = {s["step"]: s for s in serving.get("steps") or []}
    steps = [s for s in (report.get("gaps") or {}).get("per_step") or [] if s["step"] in in_batch]
    if steps:
        parts.append("<h3>Per engine step, profiled</h3>" + table(
            ["step", "wall", "GPU util", "requests in batch", "waiting", "idle: event loop", "idle: thread hop",
             "idle: sync"],
            [[esc(s["step"]), fmt_us(s["wall_us"]), fmt_pct(s["gpu_utilization"]),
              esc(in_batch[s["step"]]["in_batch"]), esc(in_batch[s["step"]]["waiting"]),
              fmt_us(s["idle_by_cause_us"].get("event_loop_idle")), fmt_us(s["idle_by_cause_us"].get("thread_hop")),
              fmt_us(s["idle_by_cause_us"].get("sync"))] for s in steps]))
    return section("Serving: per-request latency and per-step GPU utilization", "\n".join(parts))
