"""Host work as a cause of its own wherever the dashboard draws causes (issue 49, item 10), checked against the
analyzer's own idle pieces on real captures: the window's split, each step's, and the timeline's device lane; and the
palette's colours, which must stay apart where they are drawn side by side (CIEDE2000)."""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from analyzer import api
from analyzer.detectors import host_work
from analyzer.report.palette import CAUSE_COLORS
from conftest import analysis_of, report_of
from dashboard.causes import (HOST_WORK, host_work_spans_us, host_work_us, per_step_host_work_us, spans_complete,
                              split_by_cause)
from dashboard.figures import (GPU_STATES, HOST_WORK_STATE, LAUNCH_STATE, STATE_COLORS, host_work_lanes,
                               steps_figure, timeline_figure, with_host_work)
from dashboard.pages.common import window_parts

FIX = Path(__file__).resolve().parents[1] / "fixtures"
EXTERNAL = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "external"
# runs whose host-work pieces fall in different steps than where they ran: the piece after decode step k is
# counted in step k+1, whose launch ended it (host_work), and one that gets two in its last step (graph_sync_big_host)
HOST_WORK_RUNS = ("h200_extra/host_work", "h100_compile/numpy_sampler", "h100_stackless/graph_sync_big_host",
                  "h200_extra/hf_generate")


def truth(analysis: api.Analysis) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The host_work detector's own idle pieces (start ns, end ns), and each step's share as report.json's per-step
    table counts idle time (the step of the launch that ended the piece), in µs."""
    ctx = analysis.context
    sel = host_work.long_pieces(ctx)
    steps, rt, idle = ctx.steps, ctx.model.runtime, ctx.idle
    launch = ctx.gaps.launch[idle.gap[sel]]
    owner = np.where(launch >= 0, steps.index_at(rt.start_ns)[np.maximum(launch, 0)], -1)
    owner[launch < 0] = steps.index_at(idle.start_ns[sel][launch < 0])
    per_step = np.zeros(len(steps.names))
    np.add.at(per_step, owner[owner >= 0], idle.duration_ns[sel][owner >= 0] / 1e3)
    return idle.start_ns[sel], idle.end_ns[sel], per_step


@pytest.mark.parametrize("name", HOST_WORK_RUNS)
def test_the_window_and_each_step_split_host_work_from_launch_overhead_as_the_analyzer_counts_it(name):
    analysis = analysis_of(FIX / name)
    report = analysis.report
    starts, ends, per_step = truth(analysis)
    by_cause = report["gaps"]["by_cause"]
    parts = split_by_cause(by_cause, report["findings"])
    pieces_us = float((ends - starts).sum()) / 1e3
    assert pieces_us > 1000 and parts[HOST_WORK] == pytest.approx(pieces_us, abs=0.01)
    assert parts["cpu_launch"] == pytest.approx(by_cause["cpu_launch"] - pieces_us, abs=0.01)
    assert list(parts).index(HOST_WORK) == list(parts).index("cpu_launch") + 1
    assert sum(parts.values()) == pytest.approx(sum(by_cause.values()), abs=0.01)
    assert per_step_host_work_us(report) == pytest.approx(per_step.tolist(), abs=0.01)

    figure = steps_figure(report)
    bars = {t["name"]: t["y"] for t in figure["data"]}
    assert bars["idle: host_work"] == pytest.approx((per_step / 1e3).tolist(), abs=1e-5)
    launch = [s["idle_by_cause_us"]["cpu_launch"] / 1e3 for s in report["gaps"]["per_step"]]
    assert [a + b for a, b in zip(bars["idle: cpu_launch"], bars["idle: host_work"])] == pytest.approx(launch)
    colours = {t["name"]: t["marker"]["color"] for t in figure["data"]}
    assert colours["idle: host_work"] == CAUSE_COLORS[HOST_WORK] != colours["idle: cpu_launch"]

    busy, split, window = report["summary"]["gpu_busy_us"], parts, report["summary"]["window_us"]
    bar = {part: us for part, us, _ in window_parts(busy, split)}
    assert bar["idle: host_work"] == pytest.approx(pieces_us, abs=0.01) and sum(bar.values()) <= window + 0.01


def test_a_step_split_the_report_cannot_place_is_said_not_guessed():
    """With the longest pieces' list (gaps.top) cut to three, the report no longer says in which step four of the
    six host-work pieces were launched: the per-step bars keep them in cpu_launch and say so."""
    report = report_of(FIX / "h200_extra" / "host_work")
    report["gaps"]["top"] = report["gaps"]["top"][:3]
    assert per_step_host_work_us(report) is None
    figure = steps_figure(report)
    assert "idle: host_work" not in {t["name"] for t in figure["data"]}
    assert "host work is counted in idle: cpu_launch here" in figure["layout"]["title"]["text"]


@pytest.mark.external
@pytest.mark.skipif(not EXTERNAL.is_dir(), reason="needs ../shared/traces/external")
def test_a_training_trace_with_more_long_gaps_than_the_report_lists_keeps_its_steps_unsplit():
    report = report_of(EXTERNAL / "v100-ddp-training-with-memory.json.gz")
    assert host_work_us(report["findings"]) > 50_000 and spans_complete(report["findings"])
    assert per_step_host_work_us(report) is None  # 14 pieces, not all among the 25 longest of the trace


@pytest.mark.parametrize("name", ["h200_extra/host_work", "h100_stackless/graph_sync_big_host"])
def test_the_timelines_device_lane_draws_the_host_work_pieces_in_their_own_state(name):
    analysis = analysis_of(FIX / name)
    report, data = analysis.report, api.timeline(analysis)
    starts, ends, _ = truth(analysis)
    spans = host_work_spans_us(report["findings"])
    split = host_work_lanes(data, spans)
    lane, (hs, he, _) = split["gpu0"]
    t0 = data.t0_ns
    order = np.argsort(starts)
    assert hs.tolist() == (starts[order] - t0).astype(float).tolist()  # the pieces themselves, to the ns
    assert he.tolist() == (ends[order] - t0).astype(float).tolist()
    assert lane.states.index(HOST_WORK_STATE) == lane.states.index(LAUNCH_STATE) + 1
    lo, hi = data.full_range()
    view = data.view(lo, hi)
    gpu0 = with_host_work(next(lv for lv in view.lanes if lv.lane.key == "gpu0"), split["gpu0"])
    width_us = (hi - lo) / (len(gpu0.edges) - 1) / 1e3
    shares = {state: gpu0.shares[:, k].sum() * width_us for k, state in enumerate(gpu0.lane.states)}
    host_us = host_work_us(report["findings"])
    by_cause = report["gaps"]["by_cause"]
    assert shares[HOST_WORK_STATE] == pytest.approx(host_us, rel=1e-3)
    assert shares[LAUNCH_STATE] == pytest.approx(by_cause["cpu_launch"] - host_us, rel=1e-3)
    # the figure: a legend entry in host work's colour, an area of that state on the device lane
    figure = timeline_figure(data, view, host_work_us=spans)
    legend = {t["name"]: t["marker"]["color"] for t in figure["data"] if t.get("showlegend")}
    assert legend[HOST_WORK_STATE] == CAUSE_COLORS[HOST_WORK]
    assert any((t.get("meta") or {}).get("state") == HOST_WORK_STATE and (t.get("meta") or {}).get("lane") == "gpu0"
               for t in figure["data"])


def test_a_run_without_host_work_draws_no_host_work():
    analysis = analysis_of(FIX / "h200" / "item_sync")
    report, data = analysis.report, api.timeline(analysis)
    assert host_work_spans_us(report["findings"]) == []
    assert HOST_WORK not in split_by_cause(report["gaps"]["by_cause"], report["findings"])
    figure = timeline_figure(data, data.view(*data.full_range()))
    assert HOST_WORK_STATE not in {t.get("name") for t in figure["data"] if t.get("showlegend")}


# ---------------------------------------------------------------------- the palette

def _lab(hex_colour: str) -> tuple[float, float, float]:
    rgb = [int(hex_colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb)
    xyz = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    f = [t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116 for t in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def ciede2000(c1: str, c2: str) -> float:
    """The CIEDE2000 colour difference (Sharma, Wu and Dalal's formulation): about 2 is just noticeable, the
    Okabe-Ito colours are 15-50 apart."""
    (l1, a1, b1), (l2, a2, b2) = _lab(c1), _lab(c2)
    cbar = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(cbar ** 7 / (cbar ** 7 + 25 ** 7)))
    a1, a2 = a1 * (1 + g), a2 * (1 + g)
    c1p, c2p = math.hypot(a1, b1), math.hypot(a2, b2)
    h1, h2 = math.degrees(math.atan2(b1, a1)) % 360, math.degrees(math.atan2(b2, a2)) % 360
    dh = 0.0 if c1p * c2p == 0 else (h2 - h1 + 180) % 360 - 180
    dl, dc, dhh = l2 - l1, c2p - c1p, 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh / 2))
    lbar, cbarp = (l1 + l2) / 2, (c1p + c2p) / 2
    hbar = h1 + h2 if c1p * c2p == 0 else (h1 + h2) / 2 if abs(h1 - h2) <= 180 else (h1 + h2 + 360) / 2 \
        if h1 + h2 < 360 else (h1 + h2 - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(hbar - 30)) + 0.24 * math.cos(math.radians(2 * hbar))
         + 0.32 * math.cos(math.radians(3 * hbar + 6)) - 0.20 * math.cos(math.radians(4 * hbar - 63)))
    sl = 1 + 0.015 * (lbar - 50) ** 2 / math.sqrt(20 + (lbar - 50) ** 2)
    sc, sh = 1 + 0.045 * cbarp, 1 + 0.015 * cbarp * t
    rt = -2 * math.sqrt(cbarp ** 7 / (cbarp ** 7 + 25 ** 7)) * math.sin(
        math.radians(60 * math.exp(-(((hbar - 275) / 25) ** 2))))
    return math.sqrt((dl / sl) ** 2 + (dc / sc) ** 2 + (dhh / sh) ** 2 + rt * (dc / sc) * (dhh / sh))


def test_ciede2000_reads_black_and_white_as_the_scale_ends():
    assert ciede2000("#000000", "#000000") == 0
    assert ciede2000("#FFFFFF", "#000000") == pytest.approx(100.0, abs=0.1)


def test_the_colours_of_the_gpu_panel_stay_apart():
    """Every state of the timeline's GPU legend (busy, each idle cause with host work, kernel / memcpy / memset) is
    at least 15 apart from every other (about the Okabe-Ito palette's own closest pair), but kernel, which is busy
    time by design, and queued / profiler, two greys for idle that is not the program's (never side by side: the
    window bar orders causes as report.json does). host work and input_wait, the two new or changed, stand 20 apart
    from everything; input_wait was 16 from memcpy and memcpy 10 from thread_hop."""
    colours = {state: STATE_COLORS[state] for state in GPU_STATES if state != "kernel"}
    greys = {"idle: queued", "idle: profiler"}
    close = [(round(ciede2000(colours[a], colours[b]), 1), a, b) for a, b in itertools.combinations(colours, 2)
             if {a, b} != greys and ciede2000(colours[a], colours[b]) < 15]
    assert not close
    for state in ("idle: host_work", "idle: input_wait", "memcpy"):
        nearest = min((ciede2000(colours[state], c), other) for other, c in colours.items() if other != state)
        assert nearest[0] >= 20, (state, nearest)
