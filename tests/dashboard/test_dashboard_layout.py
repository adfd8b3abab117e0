"""Issue 49's dashboard points in headless Chromium at a desktop's and a laptop's window (1500x1000, 1280x800), over
real captures: the run list fits the window and cuts no number or badge; a run page cuts none either and names the
device the list shows; selecting a one-time finding keeps the x range inside the trace; a trace without memory curves
draws no memory panel (one line says why) and one without steps no steps lane; step names never run into each
other; host work has its own colour; values quoted back from a link are cut; /diff asks for two runs, shows changes
at the precision it prints them, colours only those beyond the noise, and says first what else differs."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from analyzer import api
from analyzer.api import RunStore, what_if_line
from analyzer.compare.diff import compare
from analyzer.report.palette import CAUSE_COLORS
from analyzer.units import fmt_pct, fmt_us
from conftest import analysis_of, report_of
from dashboard.app import create_app
from dashboard.figures import steps_figure
from dashboard.pages import diff as diff_page
from dashboard.pages import run as run_page
from test_dashboard import CHROMIUM, LAUNCH_ARGS, graph_js, needs_browser, open_run, sync_playwright

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures"
EXTERNAL = REPO.parent / "shared" / "traces" / "external"
VIEWPORTS = [(1500, 1000), (1280, 800)]
LONG_ID = "cuda_activity_only-captured-on-the-h100-node-after-the-driver-update"
RUNS = {  # run folder -> (fixture, what it holds)
    "item_sync": "h200/item_sync",  # meta.json, [memory] events, 7 steps
    "decode-rerun-2026-12-08": "h200/decode",  # its workload ("decode") is not its folder's name
    "host_work": "h200_extra/host_work",  # a host-work finding: position_checksum() between steps
    "cold_first_forward": "h200_foreign/cold_first_forward",  # bare trace; one-time costs of 1.08 s in 3.2 s
    "dataloader_bound": "h200_foreign/dataloader_bound",  # bare; steps but no memory events; input waits
    LONG_ID: "h200_foreign/cuda_activity_only",  # bare; neither steps nor memory; medium badges
    "compile_in_window_cuda_only": "h200_foreign/compile_in_window_cuda_only",  # bare; no steps; host work
    "compile_graph_break": "h100_compile/compile_graph_break",  # H100: utilization 7.53%
    "serve_no_sleep": "h200_serve/serve_no_sleep",  # H200: utilization 7.47%, printed as the same 7.5%
}
A100 = "a100-particle-transformer-first-forward"  # external: a 630 ms first launch in a 979 ms window, no steps
external = pytest.mark.skipif(not (EXTERNAL / f"{A100}.json.gz").is_file(), reason="needs ../shared/traces/external")


def source(name: str) -> Path:
    """The fixture (or external trace) a run of the test's folder is a copy of: analyzed once per test session."""
    return EXTERNAL / f"{A100}.json.gz" if name == A100 else FIX / RUNS[name]


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("issue49") / "runs"
    for name, fixture in RUNS.items():
        shutil.copytree(FIX / fixture, runs / name, ignore=shutil.ignore_patterns("*.report", ".gpu-idle-cache"))
    if (EXTERNAL / f"{A100}.json.gz").is_file():  # copied into the test's folder only, never the repo
        (runs / A100).mkdir()
        shutil.copy(EXTERNAL / f"{A100}.json.gz", runs / A100)
    return runs


@pytest.fixture(scope="module")
def base_url(runs_dir):
    from werkzeug.serving import make_server
    server = make_server("127.0.0.1", 0, create_app(runs_dir).server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.port}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        yield b
        b.close()


@pytest.fixture(params=VIEWPORTS, ids=[f"{w}x{h}" for w, h in VIEWPORTS])
def page(request, browser):
    width, height = request.param
    context = browser.new_context(viewport={"width": width, "height": height})
    pg = context.new_page()
    pg.errors = []
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    pg.viewport = (width, height)
    yield pg
    context.close()


# Whether an element's text is cut: wider than its box (scrollWidth), an ellipsis, or (an inline element) outside
# its table cell or broken over two lines.
CUT_JS = """el => {
    const style = getComputedStyle(el);
    if (style.display !== 'inline') { return el.scrollWidth > el.clientWidth + 0.5; }
    const cell = el.closest('td').getBoundingClientRect(), r = el.getBoundingClientRect();
    return el.getClientRects().length > 1 || r.left < cell.left - 0.5 || r.right > cell.right + 0.5;
}"""
NO_SCROLL_JS = "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"


def cut_texts(page, selector: str) -> list[str]:
    return page.locator(selector).evaluate_all(f"els => els.filter({CUT_JS}).map(e => e.innerText)")


def assert_no_horizontal_scroll(page) -> None:
    scroll, client = page.evaluate(NO_SCROLL_JS)
    assert scroll <= client, (scroll, client)


def wait_analyzed(page, base_url: str) -> None:
    page.goto(base_url + "/")
    page.wait_for_selector("table.runs")
    page.wait_for_function("() => [...document.querySelectorAll('tr.run-row')].every("
                           "r => ['analyzed', 'error'].includes(r.dataset.status))", timeout=600_000)


# ---------------------------------------------------------------------- run list (item 8, item 7)

@needs_browser
def test_the_run_list_fits_the_window_and_cuts_no_number_or_badge(page, base_url, runs_dir):
    wait_analyzed(page, base_url)
    rows = page.locator("tr.run-row")
    assert rows.count() == len(RUNS) + (runs_dir / A100).is_dir()
    assert_no_horizontal_scroll(page)
    width = page.viewport[0]
    assert page.locator("table.runs").bounding_box()["x"] + page.locator("table.runs").bounding_box()["width"] \
        <= width
    cells = page.locator("table.runs td").evaluate_all("tds => tds.filter(td => td.scrollWidth > td.clientWidth + 0.5)"
                                                       ".map(td => td.innerText)")
    assert not cells
    # (a saving over the window may wrap before "over the window": its number and its share may not)
    assert not cut_texts(page, "table.runs td.util, table.runs td.best-saving .impact .nowrap, "
                               "table.runs td.other-finding .impact, table.runs .badge")
    utils = page.locator("td.util").all_inner_texts()
    assert len(utils) == rows.count() and all(u.endswith("%") for u in utils)
    # the workload: meta.json's, under the run id where it differs from it; a bare trace repeats no file name
    store = RunStore(runs_dir)
    for name in RUNS:
        row = page.locator(f"tr.run-row[data-run='{name}']")
        text = row.inner_text()
        assert ".json" not in text, text
        listed = store.row(store.find(name))
        assert listed.device and listed.device in row.locator("td.device").inner_text()
    assert page.locator("tr.run-row[data-run='decode-rerun-2026-12-08'] .workload").inner_text() == "decode"
    assert page.locator("tr.run-row[data-run='item_sync'] .workload").count() == 0
    # a long run id wraps inside its cell
    long_cell = page.locator(f"tr.run-row[data-run='{LONG_ID}'] td.run-id").bounding_box()
    assert long_cell["x"] + long_cell["width"] <= width
    assert not page.errors


# ---------------------------------------------------------------------- run page (items 7, 8, 11)

@needs_browser
@pytest.mark.parametrize("name", [LONG_ID, "cold_first_forward", "host_work"])
def test_a_run_pages_numbers_and_badges_are_whole_and_it_names_the_listed_device(page, base_url, runs_dir, name):
    report = report_of(source(name))
    open_run(page, base_url, name)
    assert_no_horizontal_scroll(page)
    assert not cut_texts(page, "table.findings td.num, table.findings .badge")
    sev = page.locator("tr.finding-row td:nth-child(2)").evaluate_all(
        "tds => tds.map(td => [td.innerText.trim(), td.scrollWidth <= td.clientWidth])")
    assert [s for s, _ in sev] and all(whole for _, whole in sev)
    assert {s for s, _ in sev} == {f["severity"] for f in report["findings"]}
    # the device the run list shows, also for a bare trace (its report.json's run section names none)
    store = RunStore(runs_dir)
    device = store.row(store.find(name)).device
    assert device and device in page.locator("header h1").inner_text()
    # the saving's unit: per step, or over the profiled window
    for f in report["findings"]:
        w = f.get("what_if") or {}
        if f.get("parent") or w.get("saving_ms") is None:
            continue
        cell = page.locator(f"tr.finding-row[data-finding='{f['id']}'] td.saving").inner_text()
        unit = "/step" if w["measure"] == "step" else "/window"
        assert cell.startswith(fmt_us(w["saving_ms"] * 1e3) + unit), cell
    assert "profiled window" in page.locator("header .summary").inner_text()
    assert not page.errors


def test_the_what_if_sentence_names_its_basis_beside_the_profiled_header():
    """The b200 vLLM report said the window 'goes from 62.75 ms' under a header of a 87.41 ms window: the first is
    the estimated unprofiled window, the second the profiled one. The sentence now says which (here on a bare
    trace whose what-if is priced in an estimated unprofiled window too)."""
    report = report_of(FIX / "h200_foreign" / "compile_in_window_cuda_only")
    assert report["what_if"]["basis"] == "estimated"
    f = next(f for f in report["findings"] if (f.get("what_if") or {}).get("saving_ms") is not None
             and "step_ms" in f["what_if"] and not f.get("parent"))
    text = " ".join(str(x) for x in _texts(run_page._detail(f, 0, None, None, report["what_if"])))
    assert what_if_line(f, report["what_if"]) in text
    assert f"the estimated unprofiled {'step' if f['what_if']['measure'] == 'step' else 'window'} goes from " \
           f"{fmt_us(f['what_if']['step_ms'] * 1e3)}" in text
    header = " ".join(_texts(run_page._header(report, "x", "NVIDIA H100 80GB HBM3")))
    assert f"of a {fmt_us(report['summary']['window_us'])} profiled window" in header


def _texts(component) -> list[str]:
    """Every string in a Dash component tree."""
    if isinstance(component, str):
        return [component]
    if isinstance(component, (list, tuple)):
        return [t for c in component for t in _texts(c)]
    children = getattr(component, "children", None)
    return _texts(children) if children is not None else []


# ---------------------------------------------------------------------- selection stays inside (item 9)

@needs_browser
@pytest.mark.parametrize("name", ["cold_first_forward", pytest.param(A100, marks=[pytest.mark.external, external])])
def test_selecting_a_one_time_finding_keeps_the_x_range_inside_the_trace(page, base_url, runs_dir, name):
    analysis = analysis_of(source(name))
    report, data = analysis.report, api.timeline(analysis)
    lo, hi = (v / 1e6 for v in data.full_range())
    once = next(f for f in report["findings"] if f["kind"] == "warmup" and not f.get("parent"))
    start, end = (max(once["occurrences_us"], key=lambda o: o[1] - o[0]))
    assert 2 * (end - start) / 1e3 > (hi - lo) / 3  # long enough that padding it by twice its length left the trace
    open_run(page, base_url, name)
    page.locator(f"tr.finding-row[data-finding='{once['id']}']").click()
    # the refined figure has come when the finding's occurrences are shaded on it
    page.wait_for_function(graph_js("(gd.layout.shapes || []).some(s => s.type === 'rect')"), timeout=60_000)
    for expr in ("gd.layout.xaxis.range", "gd._fullLayout.xaxis.range", "gd.layout.meta.window_ms"):
        r0, r1 = page.evaluate(graph_js(f"{expr}.slice()"))
        assert lo - 1e-6 <= r0 < r1 <= hi + 1e-6, (expr, r0, r1, lo, hi)
    t0 = data.t0_us
    s, e = (start - t0) / 1e3, (end - t0) / 1e3
    r0, r1 = page.evaluate(graph_js("gd.layout.xaxis.range.slice()"))
    assert r0 <= s and e <= r1  # the occurrence is still in view
    assert not page.errors


@pytest.mark.parametrize("name", ["cold_first_forward", "compile_in_window_cuda_only", "host_work", "item_sync"])
def test_every_zoom_a_finding_asks_for_is_inside_the_trace(name):
    """Each finding's zoom (its largest occurrence, padded) and each occurrence's: inside the trace's whole range,
    no wider, and still holding the occurrence whenever the occurrence fits."""
    analysis = analysis_of(source(name))
    report, data = analysis.report, api.timeline(analysis)
    lo, hi = data.full_range()
    asked = 0
    for f in report["findings"]:
        for occ in f.get("occurrences_us") or []:
            for window in (run_page._window_ns(data, [occ]), run_page._window_ns(data, [occ], 0.0)):
                z0, z1 = run_page._zoom(window, [occ], data)["window_ns"]
                s, e = ((x - data.t0_us) * 1e3 for x in occ)
                assert lo <= z0 < z1 <= hi and (z0 <= max(s, lo) and min(e, hi) <= z1)
                asked += 1
    assert asked


# ---------------------------------------------------------------------- memory panel, steps lane, names (item 9)

@needs_browser
@pytest.mark.parametrize("name,memory,steps", [(LONG_ID, False, False), ("dataloader_bound", False, True),
                                               ("compile_in_window_cuda_only", False, False),
                                               ("item_sync", True, True)])
def test_no_memory_panel_without_memory_and_no_steps_lane_without_steps(page, base_url, name, memory, steps):
    open_run(page, base_url, name)
    panels, has_lane = page.evaluate(graph_js("[gd.layout.meta.panels, gd.layout.meta.steps_lane]"))
    labels = page.evaluate(graph_js("gd._fullLayout.yaxis.ticktext"))
    assert panels == (3 if memory else 2) and has_lane == steps and ("steps" in labels) == steps
    assert page.evaluate(graph_js("!!gd._fullLayout.yaxis3")) == memory
    note = page.locator("p.no-memory")
    assert note.count() == (0 if memory else 1)
    if not memory:  # one line, no chart: the timeline's height holds two panels
        line = page.evaluate("parseFloat(getComputedStyle(document.querySelector('p.no-memory')).lineHeight)")
        assert note.bounding_box()["height"] < 1.5 * line and "[memory] events" in note.inner_text()
        assert not page.locator("#memory-fit").is_visible()
        assert page.evaluate(graph_js("gd._fullData.some(t => t.meta && String(t.meta.kind).startsWith('memory'))")) \
            is False
    assert page.locator("#steps-graph").count() == (1 if steps else 0)
    assert page.locator("p.no-steps").count() == (0 if steps else 1)
    assert_no_horizontal_scroll(page)
    assert not page.errors


BOXES_JS = """sel => [...document.querySelectorAll(sel)].filter(e => {
    const r = e.getBoundingClientRect(), s = getComputedStyle(e);
    return r.width > 0 && s.display !== 'none' && s.visibility !== 'hidden' && parseFloat(s.opacity || 1) > 0;
}).map(e => { const r = e.getBoundingClientRect(); return [e.textContent, r.left, r.right, r.top, r.bottom]; })"""


def overlapping(boxes: list) -> list:
    return [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a[1] < b[2] - 0.5 and b[1] < a[2] - 0.5 and a[3] < b[4] - 0.5 and b[3] < a[4] - 0.5]


@needs_browser
@pytest.mark.parametrize("name", ["item_sync", "host_work"])
def test_step_names_never_run_into_each_other(page, base_url, name):
    """On the timeline's steps lane a name is drawn only inside its own step's bar; the per-step chart's names
    do not overlap (decode_step#0 and decode_step#1 drew as 'decode_step#0code_step#1')."""
    open_run(page, base_url, name)
    names = page.evaluate(BOXES_JS, "#timeline .barlayer .bartext")
    bars = page.evaluate(BOXES_JS, "#timeline .barlayer .point path")
    report = report_of(source(name))
    steps = [s["step"] for s in report["gaps"]["per_step"]]
    assert names and len(bars) == len(steps)
    assert not overlapping(names)
    for text, left, right, *_ in names:
        k = steps.index(text)
        assert bars[k][1] - 0.5 <= left and right <= bars[k][2] + 0.5, (text, left, right, bars[k])
    page.locator("#steps-graph").scroll_into_view_if_needed()
    page.wait_for_function("() => document.querySelectorAll('#steps-graph .xtick text').length > 0", timeout=30_000)
    ticks = page.evaluate(BOXES_JS, "#steps-graph .xtick text")
    every = steps_figure(report)["layout"]["meta"]["names_every"]
    assert [t[0] for t in ticks] == steps[::every] and not overlapping(ticks)
    assert not page.errors


# ---------------------------------------------------------------------- host work's colour (item 10)

@needs_browser
def test_host_work_has_its_own_colour_and_legend_entry_on_the_run_page(page, base_url):
    report = report_of(source("host_work"))
    open_run(page, base_url, "host_work")
    part = page.locator(".window-bar.wide .seg[data-part='idle: host_work']")
    assert float(part.get_attribute("data-us")) == pytest.approx(report["gaps"]["by_cause"]["host_work"], abs=0.01)
    colour = part.evaluate("e => getComputedStyle(e).backgroundColor")
    r, g, b = (int(CAUSE_COLORS["host_work"][i:i + 2], 16) for i in (1, 3, 5))
    assert colour == f"rgb({r}, {g}, {b})"
    assert "host_work" in page.locator(".chips").inner_text()
    legend = page.evaluate(graph_js("gd._fullData.filter(t => t.showlegend).map(t => t.name)"))
    assert "idle: host_work" in legend and "idle: cpu_launch" in legend
    page.wait_for_function("() => { const gd = document.querySelector('#steps-graph .js-plotly-plot');"
                           " return gd && gd._fullData && gd._fullData.some(t => t.name === 'idle: host_work'); }",
                           timeout=30_000)
    assert not page.errors


# ---------------------------------------------------------------------- values quoted back (item 11)

@needs_browser
@pytest.mark.parametrize("path,count", [("/run/item_sync?finding=" + "x" * 20_000, "20,002 characters"),
                                        ("/diff?before=" + "y" * 20_000 + "&after=item_sync", "20,002 characters"),
                                        ("/" + "z" * 20_000, "20,001 characters")])
def test_a_long_value_in_a_link_is_cut_in_the_message(page, base_url, path, count):
    page.goto(base_url + path)
    page.wait_for_selector(".error-card", timeout=60_000)
    text = page.locator(".error-card").first.inner_text()
    assert count in text and len(text) < 400, len(text)
    assert not page.errors


# ---------------------------------------------------------------------- /diff (item 6)

@needs_browser
def test_compare_two_runs_without_runs_asks_for_two(page, base_url):
    page.goto(base_url + "/diff")
    page.wait_for_selector("p.pick-two", timeout=30_000)
    assert page.locator("p.verdict").count() == 0 and "before and after" in page.locator("p.pick-two").inner_text()
    assert page.url.endswith("/diff")
    page.locator("#diff-before").click()
    page.get_by_role("option", name="item_sync", exact=True).click()
    page.wait_for_url("**/diff?before=item_sync", timeout=20_000)
    page.wait_for_function("() => (document.querySelector('p.pick-two') || {}).innerText"
                           " && document.querySelector('p.pick-two').innerText.includes('after)')", timeout=20_000)
    page.locator("#diff-after").click()
    page.get_by_role("option", name="host_work", exact=True).click()
    page.wait_for_selector("p.verdict", timeout=60_000)
    assert page.url.endswith("/diff?before=item_sync&after=host_work")
    assert not page.errors


@needs_browser
def test_the_diff_says_first_what_differs_and_shows_changes_at_their_printed_precision(page, base_url):
    """An H100 run against an H200 one, 7.53% and 7.47% GPU utilization: both printed 7.5%, which read
    '(-1%)' in red. The runs' other differences (GPU, workload) come before the verdict."""
    a, b = report_of(source("compile_graph_break")), report_of(source("serve_no_sleep"))
    assert fmt_pct(a["summary"]["gpu_utilization"]) == fmt_pct(b["summary"]["gpu_utilization"])
    assert a["summary"]["gpu_utilization"] != b["summary"]["gpu_utilization"]
    page.goto(f"{base_url}/diff?before=compile_graph_break&after=serve_no_sleep")
    page.wait_for_selector("p.verdict", timeout=120_000)
    assert_no_horizontal_scroll(page)
    util = page.locator("tr[data-metric=gpu_utilization] td").nth(1)
    assert util.inner_text() == "7.5% → 7.5% (no change)"
    assert util.locator(".delta").count() == 0
    warning = page.locator("p.diff-warning")
    assert warning.count() == 1
    text = warning.inner_text()
    assert "NVIDIA H100 80GB HBM3" in text and "NVIDIA H200" in text and "workload" in text
    assert warning.bounding_box()["y"] < page.locator("p.verdict").bounding_box()["y"]
    # a coloured change is a real one: beyond the noise for times and shares, any change of a count
    d = compare("compile_graph_break", a, "serve_no_sleep", b)
    share, _ = diff_page.noise_share(d)
    for metric, cls, change in page.locator("tr[data-metric]").evaluate_all(
            "rs => rs.map(r => { const s = r.querySelector('[data-change]');"
            " return [r.dataset.metric, s ? s.className : null, s ? s.dataset.change : null]; })"):
        if cls and "delta" in cls:
            assert change == "beyond", metric
        if metric in ("gpu_utilization", "step_unprofiled_p50_us", "gpu_idle_us") and change:
            v = d["summary"][metric]
            beyond = abs(v["after"] - v["before"]) / abs(v["before"]) > share
            assert (change == "beyond") == beyond, metric
    assert not page.errors


def test_a_change_reads_at_the_precision_shown():
    noise = (0.05, "")
    same = diff_page._change(0.0753, 0.0747, fmt_pct, "gpu_utilization", noise)
    assert same[0] == "7.5% → 7.5%" and same[1].children == " (no change)" and same[1].className == "muted"
    small = diff_page._change(0.054, 0.055, fmt_pct, "gpu_utilization", noise)
    assert small[1].children == " (+0.1 pt)" and small[1].className == "muted"  # 1.9% of 5.4%: within 5%
    big = diff_page._change(0.054, 0.072, fmt_pct, "gpu_utilization", noise)
    assert big[1].children == " (+1.8 pt)" and big[1].className == "delta good"
    count = diff_page._change(7, 1, str, "blocking_calls", noise)
    assert count[1].children == " (-6)" and count[1].className == "delta good"  # a count: any change is real
    assert diff_page._change(1000.0, 1004.0, fmt_us, "gpu_idle_us", noise)[1].children == " (no change)"  # 1.00 ms
    assert diff_page._change(10000.0, 10040.0, fmt_us, "gpu_idle_us", noise)[1].children == " (+0.4%)"
