"""The dashboard over copies of the committed H200 runs plus a corrupt one, in headless Chromium (no mocks): the run
list and its error card, a run's findings, finding -> timeline zoom, memory_reserved peak, refine on zoom, the diff
page, downloads, and path tricks refused on every route."""
from __future__ import annotations

import base64
import http.client
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from analyzer import api
from analyzer.api import predicted_text
from analyzer.compare.diff import compare
from analyzer.report.figures import mem_unit, window_start_us
from analyzer.units import fmt_bytes, fmt_us
from dashboard.app import create_app, exposure_warning, main
from dashboard.figures import SEGMENTS_BEFORE_GROUPING, SMALL_SEGMENT_SHARE, segments_figure
from analyzer.api import CACHE_DIR_NAME, RunStore
from analyzer.api import BINS, EXACT_LIMIT, MARKER_LIMIT

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "h200"
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
RUNS = ("item_sync", "decode", "alloc_churn")
RECORDS = REPO / "tests" / "fixtures" / "h200_alloc" / "alloc_churn"  # with memory_snapshot.pickle.gz
SECRET = "TOP-SECRET-OUTSIDE-THE-TRACES-FOLDER"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - CI installs it
    sync_playwright = None
needs_browser = pytest.mark.skipif(sync_playwright is None or not CHROMIUM.exists(),
                                   reason="needs playwright and /usr/bin/chromium")


def copy_run(name: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for f in ("rank0.trace.json.gz", "meta.json"):
        shutil.copy(FIX / name / f, dest / f)
    return dest


def report_of(name: str) -> dict:
    return api.analyze(api.load(FIX / name)).report


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """DIR/runs with three real runs, a truncated gzip trace, and a symlink to a run outside DIR; a secret beside."""
    root = tmp_path_factory.mktemp("dash")
    runs = root / "runs"
    for name in RUNS:
        copy_run(name, runs / name)
    broken = runs / "broken"
    broken.mkdir()
    data = (FIX / "decode" / "rank0.trace.json.gz").read_bytes()
    (broken / "rank0.trace.json.gz").write_bytes(data[: len(data) // 3])
    shutil.copytree(RECORDS, runs / "alloc_records")
    copy_run("prefill", root / "outside")
    (root / "outside" / "secret.txt").write_text(SECRET)
    (root / "secret.txt").write_text(SECRET)
    (runs / "outside").symlink_to(root / "outside", target_is_directory=True)
    return root


@pytest.fixture(scope="module")
def base_url(workdir):
    from werkzeug.serving import make_server
    app = create_app(workdir / "runs")
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.port}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.errors = []
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    yield pg
    context.close()


def screenshot(page, name: str) -> None:
    """Save a full-page PNG and check it has content: decoded in the browser, many colours, little white."""
    ARTIFACTS.mkdir(exist_ok=True)
    png = page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    colours, non_white = page.evaluate("""async (b64) => {
        const img = new Image(); img.src = 'data:image/png;base64,' + b64; await img.decode();
        const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
        const g = c.getContext('2d'); g.drawImage(img, 0, 0);
        const d = g.getImageData(0, 0, c.width, c.height).data; const seen = new Set(); let ink = 0;
        for (let i = 0; i < d.length; i += 4) {
            seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
            if (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240) ink++;
        }
        return [seen.size, ink / (d.length / 4)];
    }""", base64.b64encode(png).decode())
    assert colours > 60 and non_white > 0.03, (name, colours, non_white)


def graph_js(expr: str) -> str:
    return f"() => {{ const gd = document.querySelector('#timeline .js-plotly-plot'); return {expr}; }}"


def open_run(page, base_url: str, run_id: str) -> None:
    """Open a run page and wait until the timeline is drawn and plotly's first autosize relayout happened (the
    app keeps it from the server, so that a zoom made before it is not lost)."""
    page.goto(f"{base_url}/run/{run_id}")
    page.wait_for_function(graph_js("gd && gd._fullData && gd._fullData.length > 10 && gd._fullLayout"),
                           timeout=60_000)
    page.wait_for_load_state("networkidle")


# ---------------------------------------------------------------------- browser

@needs_browser
def test_run_list_shows_runs_newest_first_and_the_corrupt_one_as_an_error_card(page, base_url):
    page.goto(base_url + "/")
    page.wait_for_selector("table.runs")
    rows = page.locator("tr.run-row")
    ids = [rows.nth(i).get_attribute("data-run") for i in range(rows.count())]
    assert sorted(ids) == sorted([*RUNS, "alloc_records", "broken"])  # a symlink leading outside DIR is not a run
    card = page.locator("tr.run-row[data-run=broken] .error-card")
    assert "corrupt or truncated gzip data" in card.inner_text()
    assert "\n" not in card.locator(".error-message").inner_text()
    for name in RUNS:
        row = page.locator(f"tr.run-row[data-run={name}]")
        assert row.get_attribute("data-status") in ("not analyzed", "queued", "analyzing", "analyzed")
        assert "NVIDIA H200" in row.inner_text()
    dated = [i for i in ids if i not in ("broken", "alloc_records")]  # newest first by meta.json's created_utc
    created = {n: report_of_meta(n) for n in dated}
    assert dated == sorted(dated, key=lambda n: created[n], reverse=True)
    # every run is analyzed in the background, and the list says so without a reload
    page.wait_for_function("() => [...document.querySelectorAll('tr.run-row')].every("
                           "r => ['analyzed', 'error'].includes(r.dataset.status))", timeout=120_000)
    assert page.locator("tr.run-row[data-run=item_sync] td.num").inner_text().endswith("%")
    screenshot(page, "run-list")
    page.locator("tr.run-row[data-run=broken] a").click()  # its page says why, in one line
    assert "corrupt or truncated gzip data" in page.locator(".error-card").inner_text(timeout=20_000)
    assert not page.errors


def report_of_meta(name: str) -> str:
    import json
    return json.loads((FIX / name / "meta.json").read_text())["created_utc"]


@needs_browser
def test_run_page_findings_memory_and_zoom_to_a_finding(page, base_url):
    expected = report_of("item_sync")
    responses: list[int] = []
    page.on("response", lambda r: responses.append(len(r.body())) if "_dash-" in r.url and r.status == 200
            and "component-suites" not in r.url else None)
    open_run(page, base_url, "item_sync")
    assert sum(responses) < 1_000_000, responses  # the data of the page load (JS bundles aside)
    first = page.locator("tr.finding-row").first
    assert expected["findings"][0]["title"] in first.inner_text()
    assert expected["findings"][0]["severity"] in first.inner_text()

    unit, div = mem_unit(expected["allocator"]["reserved_peak_bytes"])
    reserved = page.evaluate(graph_js(
        "gd._fullData.filter(t => t.meta && t.meta.kind === 'memory_reserved').map(t => Array.from(t.y))"))
    assert reserved and max(max(y) for y in reserved) == pytest.approx(
        expected["allocator"]["reserved_peak_bytes"] / div, rel=1e-6)
    titles = page.evaluate(graph_js("[gd._fullLayout.yaxis3.title.text, gd._fullLayout.xaxis3.title.text]"))
    assert titles == [f"memory ({unit})", "time since GPU window start (ms)"]

    before = page.evaluate(graph_js("gd.layout.xaxis.range.slice()"))
    sync = next(f for f in expected["findings"] if f["kind"] == "sync" and ".item()" in f["title"])
    t0 = window_start_us(expected)
    s, e = ((x - t0) / 1e3 for x in max(sync["occurrences_us"], key=lambda o: o[1] - o[0]))  # the largest
    page.locator("tr.finding-row", has_text=".item()").click()
    page.wait_for_function(
        f"""() => {{ const gd = document.querySelector('#timeline .js-plotly-plot');
                     const r = gd.layout.xaxis.range, f = gd._fullLayout.xaxis.range;
                     return r[0] !== {before[0]} && r[0] <= {s} && {e} <= r[1] && f[0] <= {s} && {e} <= f[1]; }}""",
        timeout=20_000)
    detail = page.locator("#finding-detail").inner_text()
    assert sync["call_site"] in detail and sync["advice"][:40] in detail
    assert sync["detail"]["context"][1] in detail  # the Python frame chain
    screenshot(page, "run-item_sync")

    # a zoom refines on the server: a narrow window gets one hover point per interval (exact mode)
    page.evaluate(graph_js(f"Plotly.relayout(gd, {{'xaxis.range': [{s - 0.3}, {e + 0.3}]}})"))
    page.wait_for_function(graph_js(
        f"gd.layout.meta && Math.abs(gd.layout.meta.window_ms[0] - {s - 0.3}) < 1e-6 && "
        "gd._fullData.some(t => t.meta && t.meta.kind === 'hover' && t.meta.lane === 'gpu0' "
        "&& (t.hovertemplate || '').includes('µs at'))"), timeout=20_000)

    # clicking a step's bar zooms the timeline to that step
    step = expected["gaps"]["per_step"][2]
    s, e = (step["ts_us"] - t0) / 1e3, (step["ts_us"] + step["wall_us"] - t0) / 1e3
    bar = page.locator("#steps-graph .trace.bars .point path").nth(2)
    bar.scroll_into_view_if_needed()
    bar = bar.bounding_box()  # clicked by position: plotly's drag layer lies over the bars
    page.mouse.click(bar["x"] + bar["width"] / 2, bar["y"] + bar["height"] / 2)
    page.wait_for_function(graph_js(f"gd.layout.xaxis.range[0] <= {s} && {e} <= gd.layout.xaxis.range[1] && "
                                    f"gd.layout.xaxis.range[1] - gd.layout.xaxis.range[0] < 1.2 * {e - s}"),
                           timeout=20_000)
    assert not page.errors


def test_segment_view_groups_small_segments_and_labels_each_in_its_own_unit():
    """fragmentation (13 segments at the highest memory_reserved: 260 MiB down to 2 MiB): the 2 MiB ones share one
    bar whose parts are their summed bytes; every label reads a non-zero size; the order is largest first."""
    analysis = api.analyze(api.load(REPO / "tests" / "fixtures" / "h200_alloc" / "fragmentation"))
    state = api.timeline(analysis).allocator_segments()
    fig = segments_figure(state)
    small = [seg for seg in state["segments"] if seg["total"] < state["segments"][0]["total"] * SMALL_SEGMENT_SHARE]
    assert len(state["segments"]) > SEGMENTS_BEFORE_GROUPING and small
    order = list(fig.layout.yaxis.categoryarray)
    assert len(order) == len(state["segments"]) - len(small) + 1
    assert order[-1] == f"{len(small)} smaller: {fmt_bytes(sum(seg['total'] for seg in small))}"
    assert all(not label.split(": ")[1].startswith("0.00") for label in order)
    sizes = [seg["total"] for seg in state["segments"]]
    assert sizes == sorted(sizes, reverse=True)
    grouped = [t for t in fig.data if t.meta and t.meta.get("kind") == "small_segments"]
    mib = float(1 << 20)
    assert sum(t.x[0] for t in grouped) * mib == pytest.approx(sum(seg["total"] for seg in small))


def segments_js(expr: str) -> str:
    return f"() => {{ const gd = document.querySelector('#segments-graph .js-plotly-plot'); return {expr}; }}"


SEGMENTS = "gd && gd.layout && gd.layout.meta ? gd.layout.meta.segments : -1"
SEGMENT_ROWS = "gd && gd._fullData ? new Set(gd._fullData.flatMap(t => Array.from(t.y || []))).size : -1"


@needs_browser
def test_allocator_records_segment_view_fit_toggle_and_a_findings_calls(page, base_url):
    """A run with the allocator's snapshot: the segment view at the highest memory_reserved on the timeline (a
    time on its axis, not the report's peak before the window), then at a clicked time on the memory lane; the
    fit-y toggle; a churn finding selects its own cudaMalloc/cudaFree markers."""
    analysis = api.analyze(api.load(RECORDS))
    report, data = analysis.report, api.timeline(analysis)
    first = data.allocator_segments()
    lo, hi = data.extent
    assert lo <= first["t_ns"] <= hi and first["why"] == "peak"
    reserved_then = sum(s["total"] for s in first["segments"])
    assert all(sum(s["total"] for s in data.allocator_segments(t)["segments"]) <= reserved_then
               for t in np.linspace(lo, hi, 200))
    open_run(page, base_url, "alloc_records")
    page.wait_for_function(segments_js(f"{SEGMENTS} === {len(first['segments'])} && {SEGMENT_ROWS} === "
                                       f"{len(first['segments'])}"), timeout=20_000)
    title = page.evaluate(segments_js("gd._fullLayout.title.text"))
    assert f"at {first['t_ns'] / 1e6:.3f} ms (the highest memory_reserved on the timeline)" in title

    # the memory lane's hover points, clicked where the cache holds another number of segments than at the peak
    points = page.evaluate(graph_js(
        "gd._fullData.map((t, c) => [c, t.customdata && t.customdata[0] && t.customdata[0][0], Array.from(t.x || [])])"
        ".filter(t => t[1] === 'memory')"))
    assert points and all(len(xs) > 50 for _, _, xs in points)  # hover reads the lines anywhere, not at changes only
    curve, _, xs = points[0]
    counts = [len(data.allocator_segments(float(x) * 1e6)["segments"]) for x in xs]
    k = next(i for i, n in enumerate(counts) if n != len(first["segments"]))
    page.evaluate(graph_js(f"gd.emit('plotly_click', {{points: [{{curveNumber: {curve}, pointNumber: {k}, "
                           f"x: {xs[k]}, y: 0, customdata: ['memory', 0], data: gd.data[{curve}], "
                           f"fullData: gd._fullData[{curve}]}}]}}) || true"))
    page.wait_for_function(segments_js(f"{SEGMENTS} === {counts[k]}"), timeout=20_000)

    # fit-y: the memory axis fits memory_reserved in the window (above 0 here), and comes back to 0
    reserved = [y for t in page.evaluate(graph_js(
        "gd._fullData.filter(t => t.meta && t.meta.kind === 'memory_reserved').map(t => Array.from(t.y))")) for y in t]
    assert page.evaluate(graph_js("gd._fullLayout.yaxis3.range[0]")) == 0
    page.locator("#memory-fit input").check()
    page.wait_for_function(graph_js(f"gd._fullLayout.yaxis3.range[0] > 0 && gd._fullLayout.yaxis3.range[0] <= "
                                    f"{min(reserved)} && gd._fullLayout.yaxis3.range[1] >= {max(reserved)}"),
                           timeout=20_000)
    page.locator("#memory-fit input").uncheck()
    page.wait_for_function(graph_js("gd._fullLayout.yaxis3.range[0] === 0"), timeout=20_000)

    # the churn finding selects its calls' markers and shows the allocating stack from the allocator's records
    child = next(f for f in report["findings"] if f["id"].startswith("allocator.") and f["impact_us"] > 0)
    page.locator("tr.finding-row", has_text=child["title"]).click()
    page.wait_for_function(graph_js(
        "gd._fullData.some(t => t.meta && t.meta.kind === 'alloc_call' && t.meta.selected > 0)"), timeout=20_000)
    detail = page.locator("#finding-detail").inner_text()
    assert "Allocating stack" in detail and child["detail"]["stack"][0] in detail
    screenshot(page, "run-alloc_records")
    assert not page.errors


@needs_browser
def test_diff_page_shows_the_item_sync_finding_fixed_in_decode(page, base_url):
    d = compare("item_sync", report_of("item_sync"), "decode", report_of("decode"))
    fixed = [f["title_before"] for f in d["findings"] if f["status"] == "fixed"]
    assert any(".item()" in t for t in fixed)
    page.goto(f"{base_url}/diff?before=item_sync&after=decode")
    page.wait_for_selector("tr.diff-finding", timeout=60_000)
    shown = page.locator("tr.diff-finding[data-status=fixed]").all_inner_texts()
    assert sorted(t.split("\t")[1].strip() for t in shown) == sorted(fixed)
    # a fixed finding carries the saving the run before predicted for it, beside the measured change
    item = next(f for f in d["findings"] if f["status"] == "fixed" and ".item()" in f["title_before"])
    assert item["saving_before_ms"] is not None and predicted_text(item) != "–"
    row = page.locator("tr.diff-finding[data-status=fixed]").filter(has_text=".item()")
    assert row.locator("td").last.inner_text().strip() == predicted_text(item)
    summary = page.locator(".diff-summary").inner_text()
    assert "GPU utilization" in summary and "step time p50, unprofiled" in summary
    verdict = page.locator("p.verdict")
    # the outcome is the analyzer's (tests/compare): the step grew against the fixed .item(), "mixed" since 0d2a4f4
    assert verdict.get_attribute("data-outcome") == d["verdict"]["outcome"]
    assert verdict.inner_text() == d["verdict"]["verdict_line"] and ".item()" in d["verdict"]["verdict_line"]
    assert d["verdict"]["headline"].endswith(d["verdict"]["verdict_line"])  # led by the differences, shown once
    assert "differ" not in verdict.inner_text()
    # what else differs between the runs (their workloads here) is said first, above the verdict
    warning = page.locator("p.diff-warning")
    assert "workload" in warning.inner_text() and "decode" in warning.inner_text()
    assert warning.bounding_box()["y"] < verdict.bounding_box()["y"]
    # utilization rose: green; the blocking syncs went away: green
    util = page.locator("tr[data-metric=gpu_utilization] .delta")
    assert util.get_attribute("class") == "delta good"
    assert page.locator("tr[data-metric=blocking_calls] .delta").get_attribute("class") == "delta good"
    # per-step overlay: each run's steps, wall and idle, as its report has them
    page.wait_for_function("() => document.querySelector('#diff-steps .js-plotly-plot') && "
                           "document.querySelector('#diff-steps .js-plotly-plot')._fullData", timeout=60_000)
    overlay = page.evaluate("""() => document.querySelector('#diff-steps .js-plotly-plot').data
                               .map(t => [t.meta.side, t.meta.key, Array.from(t.y)])""")
    for side, name in (("before", "item_sync"), ("after", "decode")):
        steps = report_of(name)["gaps"]["per_step"]
        for key in ("wall_us", "idle_us"):
            (ys,) = [y for s, k, y in overlay if s == side and k == key]
            assert ys == pytest.approx([x[key] / 1e3 for x in steps])
    # both timelines on one axis from each run's GPU window start; a zoom refines both
    lanes = page.evaluate("""() => { const gd = document.querySelector('#diff-timeline .js-plotly-plot');
                                     return gd && gd.layout.yaxis.ticktext; }""")
    assert "before · GPU 0" in lanes and "after · GPU 0" in lanes and "after · steps" in lanes
    page.evaluate("Plotly.relayout(document.querySelector('#diff-timeline .js-plotly-plot'), "
                  "{'xaxis.range': [1, 2]})")
    page.wait_for_function("() => { const m = document.querySelector('#diff-timeline .js-plotly-plot').layout.meta;"
                           " return m && m.window_ms[0] === 1 && m.window_ms[1] === 2; }", timeout=60_000)
    screenshot(page, "diff-item_sync-decode")

    # the pickers write the pair into the URL; Back returns to the previous pair
    page.locator("#diff-after").click()
    page.get_by_role("option", name="alloc_churn", exact=True).click()  # the list opens in a portal
    page.wait_for_url("**/diff?before=item_sync&after=alloc_churn", timeout=20_000)
    page.wait_for_function("() => document.querySelector('p.verdict') && "
                           "document.querySelector('.diff-title').innerText.includes('alloc_churn')", timeout=60_000)
    page.go_back()
    page.wait_for_url("**/diff?before=item_sync&after=decode", timeout=20_000)
    page.wait_for_function("() => document.querySelector('.diff-title') && "
                           "document.querySelector('.diff-title').innerText.includes('decode')", timeout=60_000)
    assert not page.errors


@needs_browser
def test_run_list_tells_launch_bound_runs_apart(page, base_url):
    """Every eager run's top finding is launch overhead: the list shows each run's window split into busy and idle
    by cause (a bar whose parts are the report's numbers) and its largest finding of another kind."""
    page.goto(base_url + "/")
    page.wait_for_function("() => document.querySelectorAll('tr.run-row[data-status=analyzed]').length === 4",
                           timeout=120_000)
    for name, kind in (("item_sync", "sync"), ("alloc_churn", "allocator_churn")):
        report = report_of(name)
        row = page.locator(f"tr.run-row[data-run={name}]")
        parts = row.locator(".window-bar .seg").evaluate_all(
            "ss => ss.map(s => [s.dataset.part, parseFloat(s.dataset.us), parseFloat(s.style.width)])")
        expected = {"busy": report["summary"]["gpu_busy_us"],
                    **{f"idle: {c}": us for c, us in report["gaps"]["by_cause"].items() if us}}
        assert {part: us for part, us, _ in parts} == pytest.approx(expected, rel=1e-6)
        window = report["summary"]["window_us"]
        assert [width for *_, width in parts] == pytest.approx([100 * us / window for _, us, _ in parts], abs=1e-3)
        assert sum(width for *_, width in parts) == pytest.approx(100, abs=0.5)  # the parts make up the window
        others = [f for f in report["findings"] if not f.get("parent") and f["kind"] != "launch_gap"]
        best = max(others, key=lambda f: f["impact_us"])
        assert best["kind"] == kind and best["title"] in row.locator("td.other-finding").inner_text()
        # the biggest saving: the top-level finding whose fix buys the most, with its number from report.json
        priced = [f for f in report["findings"] if not f.get("parent") and f["what_if"].get("saving_ms") is not None]
        top = max(priced, key=lambda f: f["what_if"]["saving_ms"])
        cell = row.locator("td.best-saving").inner_text()
        assert fmt_us(top["what_if"]["saving_ms"] * 1e3) in cell and top["title"] in cell
    assert not page.errors


@needs_browser
def test_run_list_filters_sorts_and_compares_two_ticked_runs(page, base_url):
    page.goto(base_url + "/")
    page.wait_for_selector("table.runs")
    page.locator("#runs-filter").fill("alloc")
    page.locator("#runs-filter").press("Enter")
    page.wait_for_function("() => document.querySelectorAll('tr.run-row').length === 2", timeout=20_000)
    assert sorted(page.locator("tr.run-row").evaluate_all("rs => rs.map(r => r.dataset.run)")) == [
        "alloc_churn", "alloc_records"]
    page.locator("#runs-filter").fill("")
    page.locator("#runs-filter").press("Enter")
    page.locator("#runs-sort").click()
    page.get_by_role("option", name="lowest GPU utilization first").click()
    # the table the sort answered (a poll's redraw or the filter's may still be on the page until it comes)
    page.wait_for_selector("table.runs[data-sort=util-low][data-query='']", timeout=20_000)
    assert page.locator("tr.run-row").count() == 5
    shown = page.locator("tr.run-row").evaluate_all(
        "rs => rs.map(r => [r.dataset.status, (r.querySelector('td.util') || r.cells[4]).innerText])")
    analyzed = [float(u.rstrip("%")) for status, u in shown if status == "analyzed"]
    assert analyzed == sorted(analyzed) and all(st != "analyzed" for st, _ in shown[len(analyzed):])
    page.locator("tr.run-row[data-run=item_sync] .pick input").check()
    page.locator("tr.run-row[data-run=decode] .pick input").check()
    link = page.locator("#compare-picked")
    link.wait_for(timeout=20_000)
    older, newer = sorted(("item_sync", "decode"), key=report_of_meta)  # by meta.json's created_utc
    assert link.get_attribute("href") == f"/diff?before={older}&after={newer}"
    link.click()
    page.wait_for_selector("p.verdict", timeout=60_000)
    assert not page.errors


def wait_detail_shows(page, title: str) -> None:
    """Wait until the detail column's heading is `title` (an earlier detail or the overview stays until then)."""
    page.wait_for_function("t => { const h = document.querySelector('#finding-detail h3');"
                           " return h !== null && h.innerText === t; }", arg=title, timeout=20_000)


def boxes(page) -> dict:
    """Bounding boxes (viewport coordinates) of the run page's parts."""
    return page.evaluate("""() => Object.fromEntries([['header', 'header'], ['findings', '.findings-scroll'],
        ['first', 'tr.finding-row'], ['timeline', '#timeline-box'], ['gpu', '#timeline .js-plotly-plot'],
        ['detail', '#finding-detail']].map(([k, sel]) => {
            const r = document.querySelector(sel).getBoundingClientRect();
            return [k, {top: r.top, bottom: r.bottom, left: r.left, right: r.right, height: r.height}];
        }))""")


@needs_browser
@pytest.mark.parametrize("width,height", [(1500, 1000), (1280, 800)])
def test_run_page_shows_header_findings_timeline_and_detail_on_one_screen(browser, base_url, width, height):
    """As opened: the header, every finding on one line, the detail column and the top of the timeline are all in
    the window; a click on a finding puts its detail beside a timeline that is in view."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        open_run(page, base_url, "item_sync")
        b = boxes(page)
        assert b["header"]["top"] >= 0 and b["findings"]["bottom"] <= height
        assert b["timeline"]["top"] < height * 0.6  # the GPU lanes are above the fold
        assert b["detail"]["left"] > b["timeline"]["right"] - 1 and b["detail"]["right"] <= width
        assert b["detail"]["top"] < height / 2
        line = page.evaluate("parseFloat(getComputedStyle(document.querySelector('tr.finding-row td')).lineHeight)")
        heights = page.locator("tr.finding-row").evaluate_all("rs => rs.map(r => r.getBoundingClientRect().height)")
        assert heights and max(heights) < 2 * line  # one line each: the whole text is in the title and the detail
        report = report_of("item_sync")
        sync = next(f for f in report["findings"] if f["kind"] == "sync")
        row = page.locator(f"tr.finding-row[data-finding='{sync['id']}']")
        assert row.locator("td.title").get_attribute("title").endswith(sync["title"])
        row.click()
        wait_detail_shows(page, sync["title"])  # the overview's heading is there until the click's answer comes
        assert page.locator("#finding-detail h3").inner_text() == sync["title"]
        page.wait_for_function(f"() => {{ const t = document.getElementById('timeline-box').getBoundingClientRect()"
                               f".top; return t >= -1 && t <= {height} * 0.5; }}", timeout=20_000)
        b = boxes(page)
        assert b["detail"]["top"] >= 0 and b["detail"]["top"] < height / 2 and b["detail"]["right"] <= width
    finally:
        context.close()


@needs_browser
def test_cpu_context_lanes_show_the_op_and_code_that_ran_in_a_gap(page, base_url):
    """The largest launch gap of item_sync: the report names the op whose launch ended it; zoomed in, the thread's
    ops lane has that op across the gap, and the finding's detail lists what ran during its occurrences."""
    expected = report_of("item_sync")
    t0 = window_start_us(expected)
    gap = next(g for g in expected["gaps"]["top"] if g["cause"] == "cpu_launch" and g["op"])
    s, e = (gap["ts_us"] - t0) / 1e3, (gap["ts_us"] + gap["dur_us"] - t0) / 1e3
    open_run(page, base_url, "item_sync")
    legends = page.evaluate(graph_js("Object.fromEntries(gd._fullData.filter(t => t.showlegend && t.name)"
                                     ".map(t => [t.name, t.legend || 'legend']))"))
    assert legends["launch call"] == legends["cpu op"] == "legend3" and legends["busy"] == "legend"  # per panel
    labels = page.evaluate(graph_js("gd._fullLayout.yaxis2.ticktext"))
    assert any(lbl.endswith("· ops") for lbl in labels) and any(lbl.endswith("· your code") for lbl in labels)
    page.evaluate(graph_js(f"Plotly.relayout(gd, {{'xaxis.range': [{s - 0.05}, {e + 0.05}]}})"))
    page.wait_for_function(graph_js(
        f"gd.layout.meta && Math.abs(gd.layout.meta.window_ms[0] - {s - 0.05}) < 1e-6"), timeout=20_000)
    ops = page.evaluate(graph_js(
        "gd._fullData.filter(t => t.meta && t.meta.kind === 'hover' && String(t.meta.lane).startsWith('ops'))"
        ".map(t => [t.hovertemplate || '', Array.from(t.x), (t.text || [])])"))
    named = [xs for template, xs, texts in ops if gap["op"] in template or any(gap["op"] in t for t in texts)]
    assert named, [t[0][:80] for t in ops]
    row = page.locator("tr.finding-row").first
    row.click()
    page.wait_for_selector("ul.covering li", timeout=20_000)
    assert "aten::" in page.locator("ul.covering").inner_text()
    assert not page.errors


@needs_browser
def test_keyboard_zooms_and_pans_the_timeline(page, base_url):
    open_run(page, base_url, "decode")
    lo, hi = page.evaluate(graph_js("gd.layout.xaxis.range.slice()"))
    page.locator("h2", has_text="Timeline").click()  # focus on the page, not an input
    page.keyboard.press("+")
    page.wait_for_function(graph_js(f"gd.layout.meta && Math.abs((gd.layout.meta.window_ms[1] - "
                                    f"gd.layout.meta.window_ms[0]) - {(hi - lo) / 2}) < 1e-6"), timeout=20_000)
    page.keyboard.press("ArrowRight")
    page.wait_for_function(graph_js(f"Math.abs(gd.layout.meta.window_ms[0] - {lo + (hi - lo) / 4 + (hi - lo) / 8})"
                                    " < 1e-6"), timeout=20_000)
    page.keyboard.press("0")
    page.wait_for_function(graph_js(f"gd.layout.meta.window_ms[1] - gd.layout.meta.window_ms[0] >= {hi - lo} - 1e-6"),
                           timeout=20_000)
    assert not page.errors


@needs_browser
def test_copy_as_markdown_copies_the_report_while_folded(browser, base_url):
    context = browser.new_context(permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    try:
        open_run(page, base_url, "item_sync")
        assert page.locator(".markdown-block details").get_attribute("open") is None  # folded
        page.locator("#report-md-copy").click()
        copied = ""
        for _ in range(100):  # the copy happens after the click returns (wait_for_function does not await)
            copied = page.evaluate("async () => await navigator.clipboard.readText()")
            if copied:
                break
            page.wait_for_timeout(200)
        assert copied.startswith("<!-- gpu-idle-analyzer report -->") and ".item()" in copied
    finally:
        context.close()


@needs_browser
def test_run_page_state_lives_in_the_url(page, base_url):
    """Selecting a finding and zooming write the address; reload restores the same detail and window; Back walks
    the selections; a link naming nothing says so."""
    expected = report_of("item_sync")
    sync = next(f for f in expected["findings"] if f["kind"] == "sync")
    open_run(page, base_url, "item_sync")
    row = page.locator("tr.finding-row", has_text=".item()")
    assert row.locator("a.permalink").get_attribute("href") == f"/run/item_sync?finding={sync['id']}"
    row.click()
    page.wait_for_url(f"**/run/item_sync?finding={sync['id']}&t0=*", timeout=20_000)
    url = page.url
    window = page.evaluate(graph_js("gd.layout.xaxis.range.slice()"))
    query = dict(kv.split("=") for kv in url.split("?", 1)[1].split("&"))
    assert [float(query["t0"]), float(query["t1"])] == pytest.approx(window, abs=2e-3)

    page.reload()
    page.wait_for_function(graph_js("gd && gd._fullData && gd._fullData.length > 10"), timeout=60_000)
    wait_detail_shows(page, sync["title"])
    assert page.evaluate(graph_js("gd.layout.xaxis.range.slice()")) == pytest.approx(window, abs=2e-3)

    page.locator("button.occurrence").nth(1).click()
    page.wait_for_url(f"**/run/item_sync?finding={sync['id']}&occ=2&t0=*", timeout=20_000)
    page.go_back()
    page.wait_for_url(url, timeout=20_000)
    page.wait_for_function(graph_js(f"gd && gd.layout.xaxis.range && Math.abs(gd.layout.xaxis.range[0] - "
                                    f"{window[0]}) < 2e-3"), timeout=60_000)
    wait_detail_shows(page, sync["title"])

    page.goto(f"{base_url}/run/item_sync?finding=nope&t0=x")
    page.wait_for_function("() => [...document.querySelectorAll('.error-card')].some("
                           "c => c.innerText.includes(\"no finding 'nope'\"))", timeout=60_000)
    assert not page.errors


@needs_browser
def test_diff_page_names_unknown_runs_instead_of_showing_others(page, base_url):
    page.goto(f"{base_url}/diff?before=nope&after=decode")
    page.wait_for_function("() => [...document.querySelectorAll('.error-card')].some("
                           "c => c.innerText.includes(\"no such run: before='nope'\"))", timeout=20_000)
    assert page.locator("p.verdict").count() == 0
    assert not page.errors


@needs_browser
def test_two_tabs_zoom_independently(browser, base_url):
    tabs = []
    for run_id in ("item_sync", "decode"):
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        tab = context.new_page()
        open_run(tab, base_url, run_id)
        tabs.append((context, tab, tab.evaluate(graph_js("gd.layout.meta.window_ms.slice()"))))
    (_, a, a_full), (_, b, b_full) = tabs
    a.evaluate(graph_js("Plotly.relayout(gd, {'xaxis.range': [2, 3]})"))
    a.wait_for_function(graph_js("gd.layout.meta.window_ms[0] === 2 && gd.layout.meta.window_ms[1] === 3"))
    b.evaluate(graph_js("Plotly.relayout(gd, {'xaxis.range': [5, 9]})"))
    b.wait_for_function(graph_js("gd.layout.meta.window_ms[0] === 5 && gd.layout.meta.window_ms[1] === 9"))
    assert a.evaluate(graph_js("gd.layout.meta.window_ms")) == [2, 3]
    assert a_full != b_full  # each tab shows its own run
    for context, _, _ in tabs:
        context.close()


# ---------------------------------------------------------------------- HTTP

def get(base_url: str, raw_path: str) -> tuple[int, bytes]:
    """A GET with the path sent byte for byte (no client-side normalisation of .. or %2F)."""
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("GET", raw_path, skip_accept_encoding=True)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body


def test_downloads_by_run_id(base_url):
    status, md = get(base_url, "/download/item_sync/report.md")
    assert status == 200 and md.startswith(b"<!-- gpu-idle-analyzer report -->")
    status, page = get(base_url, "/download/item_sync/report.html")
    assert status == 200 and b"gpu-idle-analyzer" in page[:2000]
    status, trace = get(base_url, "/download/item_sync/trace")
    assert status == 200 and trace == (FIX / "item_sync" / "rank0.trace.json.gz").read_bytes()
    assert get(base_url, "/download/item_sync/meta.json")[0] == 404
    assert get(base_url, "/download/no-such-run/trace")[0] == 404


@pytest.mark.parametrize("path", [
    "/download/..%2F..%2Fetc%2Fpasswd",
    "/download/..%2F..%2Fetc%2Fpasswd/trace",
    "/download/%2e%2e/%2e%2e/etc/passwd",
    "/download/%252e%252e%252f%252e%252e%252fsecret.txt/trace",
    "/download/../../etc/passwd",
    "/download/../secret.txt",
    "/download//etc/passwd",
    "/download/%2Fetc%2Fpasswd/trace",
    "/download/item_sync/..%2F..%2F..%2Fsecret.txt",
    "/download/item_sync/../../secret.txt",
    "/download/..\\..\\secret.txt",
    "/download/outside/trace",  # a symlink leading outside DIR
    "/download/outside/secret.txt",
    "/run/..%2F..%2Fsecret.txt",
    "/run/../../etc/passwd",
    "/diff/..%2F..%2Fetc%2Fpasswd",
    "/assets/..%2F..%2Fapp.py",
    "/assets/../../../secret.txt",
    "/_dash-component-suites/dash/..%2F..%2F..%2F..%2Fetc%2Fpasswd",
    "/_dash-component-suites/dash/../../../../etc/passwd",
])
def test_path_tricks_are_refused(base_url, path):
    status, body = get(base_url, path)
    assert status in (403, 404), (path, status)
    assert SECRET.encode() not in body and b"root:x:0:0" not in body and b"def create_app" not in body


def test_exposure_warning_for_non_local_hosts(tmp_path):
    assert "readable by anyone" in exposure_warning("0.0.0.0", tmp_path)
    assert "readable by anyone" in exposure_warning("192.168.1.20", tmp_path)
    for host in ("127.0.0.1", "::1", "localhost"):
        assert exposure_warning(host, tmp_path) is None
    assert main(["--traces", str(tmp_path / "missing")]) == 2


# ---------------------------------------------------------------------- server side

def test_report_cached_beside_foreign_files_and_reused(tmp_path):
    run = copy_run("alloc_churn", tmp_path / "runs" / "alloc_churn")
    (run / "report.json").write_text('{"mine": true}')  # not ours: never overwritten
    store = RunStore(tmp_path / "runs")
    assert store.row(store.find("alloc_churn")).status == "not analyzed"
    report = store.report(store.find("alloc_churn"))
    assert (run / "report.json").read_text() == '{"mine": true}'
    assert (tmp_path / "runs" / CACHE_DIR_NAME / "alloc_churn" / "report.md").is_file()
    fresh = RunStore(tmp_path / "runs")  # a new server process reads the cached report
    row = fresh.row(fresh.find("alloc_churn"))
    assert row.status == "analyzed" and row.top_finding == report["findings"][0]["title"]


def test_views_stay_bounded_and_sum_to_the_reports_idle_time():
    analysis = api.analyze(api.load(FIX / "decode"))
    report, data = analysis.report, api.timeline(analysis)
    lo, hi = data.full_range()
    view = data.view(lo, hi)
    gpu0 = next(lv for lv in view.lanes if lv.lane.key == "gpu0")
    width_us = (hi - lo) / BINS / 1e3
    assert gpu0.shares[:, 1:].sum() * width_us == pytest.approx(report["summary"]["gpu_idle_us"], rel=1e-3)
    assert gpu0.shares[:, 0].sum() * width_us == pytest.approx(report["summary"]["gpu_busy_us"], rel=1e-3)
    for lv in view.lanes:
        assert lv.shares.shape[0] == BINS and (lv.rows is None or len(lv.rows) <= EXACT_LIMIT)
    assert len(view.syncs.rows) <= MARKER_LIMIT and all(len(m.ts) <= 4 * BINS + 2 for m in view.memory)


def test_serving_run_shows_request_lifetimes_as_lanes_on_the_shared_axis():
    from dashboard.figures import timeline_figure
    analysis = api.analyze(api.load(REPO / "tests" / "fixtures" / "h200_serve" / "serve"))
    report, data = analysis.report, api.timeline(analysis)
    requests = report["serving"]["requests"]
    rows = sorted({r["row"] for r in requests})
    lanes = [lane for lane in data.gpu_lanes if lane.kind == "request"]
    assert [lane.label for lane in lanes] == ["requests waiting", *(f"batch row {r}" for r in rows)]
    lo, hi = data.full_range()
    view = data.view(lo, hi)
    width_us = (hi - lo) / BINS / 1e3
    for lane_view in view.lanes:
        if lane_view.lane.kind != "request" or lane_view.lane.label == "requests waiting":
            continue
        row = int(lane_view.lane.label.rsplit(" ", 1)[1])
        decoding_us = sum(r["finished_us"] - r["first_token_us"] for r in requests if r["row"] == row)
        assert lane_view.shares[:, 2].sum() * width_us == pytest.approx(decoding_us, rel=1e-3)
    figure = timeline_figure(data, view)
    assert "batch row 0" in figure["layout"]["yaxis"]["ticktext"]
    hover = data.hover_key(lanes[1], 0)
    assert "TTFT" in hover and "request" in hover
