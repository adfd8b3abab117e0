"""report.html from reports built on the committed H200 fixtures, the way the CLI builds them."""
import functools
import html
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

from analyzer.report.figures import figure_dicts, mem_unit
from analyzer.report.html import render_html
from conftest import report_of

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "h200"
CPU_ONLY = Path(__file__).resolve().parents[3] / "shared/traces/external/cpu-only.json.gz"
RUNS = sorted(p.name for p in FIX.iterdir() if (p / "meta.json").exists())
CHROMIUM = Path("/usr/bin/chromium")


def build_figures(report: dict):
    """(timeline, steps) as plotly Figures: plotly validates every property of the dictionaries the page embeds."""
    return tuple(go.Figure(figure) for figure in figure_dicts(report))


def report_for(name):
    return report_of(FIX / name)


@functools.lru_cache(maxsize=None)
def page_for(name):
    return render_html(report_for(name))


def traces(fig, kind):
    return [t for t in fig.data if (t.meta or {}).get("kind") == kind]


def intervals_in(trace):
    """Intervals are drawn as (start, end, gap) triples; the gap is NaN (numpy arrays) or None (lists)."""
    return sum(1 for x in trace.x if x is None or x != x)


def test_fixtures_present():
    assert {"alloc_churn", "item_sync", "graph_decode"} <= set(RUNS)


@pytest.mark.parametrize("name", ["item_sync", "alloc_churn"])
def test_page_is_offline_and_embeds_plotly_once(name):
    page = page_for(name)
    js = get_plotlyjs()
    assert page.count(js) == 1
    assert page.startswith("<!DOCTYPE html>")
    assert 'src="http' not in page
    rest = page.replace(js, "")
    assert not re.search(r"<script[^>]*\ssrc=", rest)
    assert not re.search(r"<link[^>]*href=", rest)
    assert "@import" not in rest and "url(http" not in rest
    assert rest.count("Plotly.newPlot(") == 2
    # plotly.js dominates; the report's own data stays small
    assert len(page) - len(js) < 600_000


@pytest.mark.parametrize("name", RUNS)
def test_findings_table_lists_every_title_escaped(name):
    report, page = report_for(name), page_for(name)
    assert report["findings"]
    findings = page.split("<h2>Findings</h2>", 1)[1].split("</section>", 1)[0]
    for f in report["findings"]:
        assert html.escape(f["title"]) in findings
        assert html.escape(f["advice"]) in findings
    assert findings.count("<details>") >= len(report["findings"])


def test_header_names_the_run():
    report, page = report_for("item_sync"), page_for("item_sync")
    head = page.split("</header>", 1)[0]
    for key in ("workload", "model", "device"):
        assert html.escape(report["run"][key]) in head
    assert f"{100 * report['summary']['gpu_utilization']:.1f}%" in head
    assert "profiler dilation" in head
    # frame names such as "<built-in method item ...>" never reach the page unescaped
    assert "<built-in" not in page.replace(get_plotlyjs(), "")
    assert "&lt;built-in method item" in page


@pytest.mark.parametrize("name", ["item_sync", "alloc_churn", "graph_decode"])
def test_memory_series_peak_matches_report(name):
    report = report_for(name)
    fig, _ = build_figures(report)
    reserved = traces(fig, "reserved")
    allocated = traces(fig, "allocated")
    assert len(reserved) == len(allocated) == len(report["allocator"]["timeline"]) >= 1
    unit, div = mem_unit(report["allocator"]["reserved_peak_bytes"])
    assert unit == "MiB"  # the fixtures peak well below 1 GiB
    assert reserved[0].meta["unit"] == unit
    assert max(reserved[0].y) == pytest.approx(report["allocator"]["reserved_peak_bytes"] / div, abs=1e-3)
    assert max(allocated[0].y) == pytest.approx(report["allocator"]["allocated_peak_bytes"] / div, abs=1e-3)
    assert f"memory ({unit})" == fig.layout.yaxis2.title.text
    # the same series is what the page plots
    page = page_for(name) if name in ("item_sync", "alloc_churn") else render_html(report)
    assert f'"reserved GPU {reserved[0].meta["device"]}"' in page


@pytest.mark.parametrize("name", RUNS)
def test_idle_and_busy_traces_hold_every_interval(name):
    report = report_for(name)
    fig, _ = build_figures(report)
    for dev, data in report["timeline"]["devices"].items():
        for cause in report["timeline"]["causes"]:
            [trace] = [t for t in traces(fig, "idle") if t.meta["cause"] == cause and t.meta["device"] == dev]
            assert intervals_in(trace) == sum(1 for iv in data["idle_us"] if iv[2] == cause)
        [busy] = [t for t in traces(fig, "busy") if t.meta["device"] == dev]
        assert intervals_in(busy) == len(data["busy_us"])
    # plotly.js would otherwise drop sub-pixel segments and draw a busy GPU as mostly blank
    assert all(t.line.simplify is False for t in traces(fig, "idle") + traces(fig, "busy"))
    # a handful of line traces, never one trace or shape per interval
    assert len(fig.data) < 40
    assert len(fig.layout.shapes) <= len(report["gaps"]["per_step"]) + 1


def test_x_axis_is_shared_and_in_ms():
    fig, steps = build_figures(report_for("item_sync"))
    assert fig.layout.xaxis.matches == "x2" or fig.layout.xaxis2.matches == "x"
    assert "(ms)" in fig.layout.xaxis2.title.text
    assert "(ms)" in steps.layout.yaxis.title.text
    report = report_for("item_sync")
    lanes = [t for t in fig.data if t.name == "GPU busy" or str(t.name).startswith("idle: ")]
    xs = [x for t in lanes for x in t.x if x is not None and x == x]
    window_ms = report["summary"]["window_us"] / 1e3
    # the device lane covers the window the user profiled, from its first host event (the head before any GPU
    # work included) to its end
    assert min(xs) == pytest.approx(0.0, abs=1e-3)
    assert max(xs) == pytest.approx(window_ms, rel=1e-3)
    busy = [x for x in traces(fig, "busy")[0].x if x is not None and x == x]
    assert 0 < min(busy) and max(busy) <= window_ms


@pytest.mark.parametrize("name", ["item_sync", "print_tensor", "alloc_churn"])
def test_sync_markers_match_occurrences(name):
    report = report_for(name)
    fig, _ = build_figures(report)
    [markers] = traces(fig, "sync")
    expected = sum(len(s["occurrences"]) for s in report["syncs"])
    assert expected >= 1
    assert len(markers.x) == len(markers.text) == expected


def test_allocator_call_markers():
    report = report_for("alloc_churn")
    fig, _ = build_figures(report)
    calls = traces(fig, "alloc_call")
    assert sum(len(t.x) for t in calls) == sum(len(s["occurrences"]) for s in report["allocator"]["sites"]) > 0
    assert {t.meta["api"] for t in calls} == {"cudaMalloc", "cudaFree"}


@pytest.mark.parametrize("name", ["item_sync", "prefill"])
def test_step_bars(name):
    report = report_for(name)
    _, fig = build_figures(report)
    steps = report["gaps"]["per_step"]
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert fig.layout.barmode == "stack"
    assert list(bars["GPU busy"].x) == [s["step"] for s in steps]
    for cause in ("cpu_launch", "sync", "allocator", "queued"):
        total = sum(bars[f"idle: {cause}"].y)
        assert total == pytest.approx(sum(s["idle_by_cause_us"][cause] for s in steps) / 1e3, abs=1e-3)


def test_graph_estimate_shows_measured():
    report = report_for("alloc_churn")
    estimate = report["gaps"]["cuda_graph_estimate"]
    page = render_html(report)
    section = page.split("CUDA-graph estimate</h3>", 1)[1].split("</table>", 1)[0]
    assert f"{estimate['estimated_speedup']}×" in section
    graph_page = render_html(report_for("graph_decode"))  # a graph run: no estimate, the capture's measurement
    section = graph_page.split("CUDA-graph estimate</h3>", 1)[1].split("</table>", 1)[0]
    ratio = report_for("graph_decode")["run"]["mode_comparison"]["eager_over_graph"]
    assert "already replays" in section and f"{ratio:.2f}×" in section


def test_sync_and_allocator_tables():
    page = page_for("item_sync")
    sync = page.split("<h2>Host synchronizations</h2>", 1)[1].split("</section>", 1)[0]
    for site in report_for("item_sync")["syncs"]:
        assert html.escape(site["call_site"]) in sync
    alloc = page_for("alloc_churn").split("<h2>Caching allocator</h2>", 1)[1].split("</section>", 1)[0]
    peak = report_for("alloc_churn")["allocator"]["reserved_peak_bytes"]
    assert f"{peak / (1 << 20):.2f} MiB" in alloc
    for site in report_for("alloc_churn")["allocator"]["sites"]:
        assert html.escape(site["call_site"]) in alloc


def test_report_without_run_or_findings():
    report = dict(report_for("decode"), run=None, findings=[])
    page = render_html(report)
    assert html.escape(report["source"]["trace"]) in page.split("</h1>", 1)[0]
    findings = page.split("<h2>Findings</h2>", 1)[1].split("</section>", 1)[0]
    assert "none" in findings


def test_bounded_timeline_is_flagged():
    report = report_for("item_sync")
    dev = next(iter(report["timeline"]["devices"]))
    assert "longest of" not in page_for("item_sync")
    data = dict(report["timeline"]["devices"][dev], idle_total=99_999)
    bounded = dict(report, timeline=dict(report["timeline"], devices={dev: data}))
    assert f"the {len(data['idle_us'])} longest of 99999 idle intervals" in render_html(bounded)


@pytest.mark.skipif(not CPU_ONLY.exists(), reason="shared external traces not present")
def test_cpu_only_report_renders():
    report = report_of(CPU_ONLY)
    assert not report["timeline"]["devices"] and report["summary"].get("note")
    fig, steps = build_figures(report)
    assert not traces(fig, "busy") and not traces(fig, "reserved")
    assert len(traces(fig, "sync")[0].x) == 0
    page = render_html(report)
    assert html.escape(report["summary"]["note"]) in page
    assert "no GPU activity recorded" in page
    assert fig.layout.xaxis2.title.text == "time since first step start (ms)"
    assert page.count(get_plotlyjs()) == 1


@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium")
def test_screenshot_is_not_blank(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(page_for("alloc_churn"), encoding="utf-8")
    png = tmp_path / "shot.png"
    subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900",
                    f"--screenshot={png}", page.as_uri()], capture_output=True, timeout=120)
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)
    assert png.exists()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    assert len(set(png_pixels(png.read_bytes()))) > 50  # many distinct bytes: not one flat colour


def png_pixels(data: bytes) -> bytes:
    """The decompressed scanlines of a PNG (filter bytes included): enough to tell a blank page apart."""
    pos, idat = 8, b""
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        if data[pos + 4:pos + 8] == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(idat)


def test_png_pixels_tells_blank_from_drawn():
    width = height = 4
    blank = b"".join(b"\x00" + b"\xff" * 3 * width for _ in range(height))
    png = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", width.to_bytes(4, "big") + height.to_bytes(4, "big")
                                          + bytes([8, 2, 0, 0, 0])) + _chunk(b"IDAT", zlib.compress(blank))
    assert set(png_pixels(png + _chunk(b"IEND", b""))) == {0, 255}


def _chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
