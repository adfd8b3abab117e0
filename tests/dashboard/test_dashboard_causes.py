"""Host work as a cause of its own (issue 49, item 10): report.json counts the host-work detector's idle pieces as
`host_work` in its window, per-step and timeline data, checked against those pieces on real captures, and the dashboard
draws what it says; and the palette's colours, which must stay apart where they are drawn side by side (CIEDE2000)."""
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
from dashboard.figures import GPU_STATES, STATE_COLORS, steps_figure, timeline_figure
from dashboard.pages.common import window_parts

FIX = Path(__file__).resolve().parents[1] / "fixtures"
HOST_WORK = "host_work"
HOST_WORK_STATE, LAUNCH_STATE = "idle: host_work", "idle: cpu_launch"
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
def test_host_work_is_its_own_cause_in_the_window_each_step_and_the_charts(name):
    """report.json's by_cause and per-step table count the host-work detector's pieces as `host_work`, no longer in
    cpu_launch, and the dashboard draws what they say: the window bar, the per-step bars in host work's colour."""
    analysis = analysis_of(FIX / name)
    report = analysis.report
    starts, ends, per_step = truth(analysis)
    by_cause = report["gaps"]["by_cause"]
    pieces_us = float((ends - starts).sum()) / 1e3
    assert pieces_us > 1000 and by_cause[HOST_WORK] == pytest.approx(pieces_us, abs=0.01)
    host = [s["idle_by_cause_us"][HOST_WORK] for s in report["gaps"]["per_step"]]
    assert host == pytest.approx(per_step.tolist(), abs=0.01)
    assert sum(f["impact_us"] for f in report["findings"] if f["kind"] == HOST_WORK and not f.get("parent")) \
        == pytest.approx(pieces_us, abs=0.01)  # the findings own exactly the cause's pieces

    figure = steps_figure(report)
    bars = {t["name"]: t["y"] for t in figure["data"]}
    assert bars["idle: host_work"] == pytest.approx((per_step / 1e3).tolist(), abs=1e-5)
    colours = {t["name"]: t["marker"]["color"] for t in figure["data"]}
    assert colours["idle: host_work"] == CAUSE_COLORS[HOST_WORK] != colours["idle: cpu_launch"]

    busy, window = report["summary"]["gpu_busy_us"], report["summary"]["window_us"]
    bar = {part: us for part, us, _ in window_parts(busy, {c: v for c, v in by_cause.items() if v})}
    assert bar["idle: host_work"] == pytest.approx(pieces_us, abs=0.01) and sum(bar.values()) <= window + 0.01


@pytest.mark.external
@pytest.mark.skipif(not EXTERNAL.is_dir(), reason="needs ../shared/traces/external")
def test_a_training_trace_places_every_host_work_piece_in_its_step():
    """14 long gaps in a DDP training trace, more than the report's list of the longest pieces holds: each step's
    host work is the analyzer's per-step count, drawn in the per-step bars (the dashboard's own split, from the
    findings' occurrences, could not place them)."""
    report = report_of(EXTERNAL / "v100-ddp-training-with-memory.json.gz")
    assert report["gaps"]["by_cause"][HOST_WORK] > 50_000
    placed = [s["idle_by_cause_us"][HOST_WORK] for s in report["gaps"]["per_step"]]
    assert sum(v > 0 for v in placed) >= 2
    bars = {t["name"]: t["y"] for t in steps_figure(report)["data"]}
    assert sum(bars["idle: host_work"]) > 0


@pytest.mark.parametrize("name", ["h200_extra/host_work", "h100_stackless/graph_sync_big_host"])
def test_the_timelines_device_lane_draws_the_host_work_pieces_in_their_own_state(name):
    analysis = analysis_of(FIX / name)
    report, data = analysis.report, api.timeline(analysis)
    starts, ends, _ = truth(analysis)
    lane = next(lane for lane in data.gpu_lanes if lane.key == "gpu0")
    hs, he, _ = lane.merged[lane.states.index(HOST_WORK_STATE)]
    t0 = data.t0_ns
    order = np.argsort(starts)
    assert np.asarray(hs).tolist() == (starts[order] - t0).astype(float).tolist()  # the pieces themselves, to the ns
    assert np.asarray(he).tolist() == (ends[order] - t0).astype(float).tolist()
    lo, hi = data.full_range()
    view = data.view(lo, hi)
    gpu0 = next(lv for lv in view.lanes if lv.lane.key == "gpu0")
    width_us = (hi - lo) / (len(gpu0.edges) - 1) / 1e3
    shares = {state: gpu0.shares[:, k].sum() * width_us for k, state in enumerate(gpu0.lane.states)}
    by_cause = report["gaps"]["by_cause"]
    assert shares[HOST_WORK_STATE] == pytest.approx(by_cause[HOST_WORK], rel=1e-3)
    assert shares[LAUNCH_STATE] == pytest.approx(by_cause["cpu_launch"], rel=1e-3)
    # the figure: a legend entry in host work's colour, an area of that state on the device lane
    figure = timeline_figure(data, view)
    legend = {t["name"]: t["marker"]["color"] for t in figure["data"] if t.get("showlegend")}
    assert legend[HOST_WORK_STATE] == CAUSE_COLORS[HOST_WORK]
    assert any((t.get("meta") or {}).get("state") == HOST_WORK_STATE and (t.get("meta") or {}).get("lane") == "gpu0"
               for t in figure["data"])


def test_a_run_without_host_work_draws_no_host_work():
    analysis = analysis_of(FIX / "h200" / "item_sync")
    report, data = analysis.report, api.timeline(analysis)
    assert report["gaps"]["by_cause"][HOST_WORK] == 0
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
