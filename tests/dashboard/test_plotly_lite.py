"""dashboard/plotly_lite.py on the installed plotly.js: only the trace types the dashboard draws stay registered,
anything it cannot read is served whole, and a run page really loads the lite bundle and draws with it."""
from __future__ import annotations

import re
import threading


from dashboard import plotly_lite
from test_dashboard import CHROMIUM, LAUNCH_ARGS, copy_run, needs_browser, sync_playwright

FULL = plotly_lite.FULL.read_text(encoding="utf-8")


def _registered(text: str) -> list[str | None]:
    (call,) = plotly_lite._REGISTER.finditer(text)
    return [plotly_lite._trace_name(text, entry[:-2]) for entry in call.group(1).split(",")]


def test_the_installed_bundle_keeps_only_the_dashboards_trace_types():
    full = _registered(FULL)
    assert {"bar", "heatmap", "box", "scattergl", "scatter3d"} <= set(full) and len(full) > 30
    lite = plotly_lite.lite_bundle(FULL)
    kept = _registered(lite)
    assert {n for n in kept if n is not None} == set(plotly_lite.KEEP)
    assert kept.count(None) == full.count(None)  # what is not a trace type (calendars) stays
    assert len(lite) < len(FULL) and lite.replace(",", "") != FULL.replace(",", "")


def test_every_trace_type_the_figures_make_is_kept():
    source = (plotly_lite.Path(plotly_lite.__file__).parent / "figures.py").read_text()
    made = set(re.findall(r'"type": "([a-z]+)", "(?:x|z|xaxis)"', source))  # trace dicts (shapes say "x0")
    made |= {m.lower() for m in re.findall(r"go\.([A-Z][a-z]+)\(", source)} - {"figure"}
    made |= set(re.findall(r"\.add_([a-z]+)\(", source)) - {"annotation"}
    assert made and made <= set(plotly_lite.KEEP) | {"scatter"}, made


def test_a_bundle_laid_out_otherwise_is_not_cut():
    assert plotly_lite.lite_bundle(FULL.replace(".register([", ".register( [", 1)) is None
    assert plotly_lite.lite_bundle(FULL, keep=("bar", "no-such-trace")) is None


@needs_browser
def test_a_run_page_draws_with_the_lite_bundle(tmp_path):
    from werkzeug.serving import make_server
    from dashboard.app import create_app
    copy_run("item_sync", tmp_path / "runs" / "item_sync")
    server = make_server("127.0.0.1", 0, create_app(tmp_path / "runs").server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
            page = browser.new_page()
            scripts = []
            page.on("response", lambda r: scripts.append(r.url) if "plotly" in r.url else None)
            page.goto(f"http://127.0.0.1:{server.port}/run/item_sync")
            page.wait_for_selector("#steps-graph .trace.bars .point path", timeout=60_000)
            assert any(u.endswith("/_plotly-lite.js") for u in scripts), scripts
            assert not any("plotly.min.js" in u for u in scripts), scripts  # one plotly, the lite one
            assert page.evaluate("document.querySelector('#timeline .js-plotly-plot')._fullData.length") > 10
            # reached from the run list without a reload: dcc.Graph loads plotly itself, the lite bundle too
            page = browser.new_page()
            scripts.clear()
            page.on("response", lambda r: scripts.append(r.url) if "plotly" in r.url else None)
            page.goto(f"http://127.0.0.1:{server.port}/")
            page.click("td.run-id a")
            page.wait_for_selector("#steps-graph .trace.bars .point path", timeout=60_000)
            assert any(u.endswith("/_plotly-lite.js") for u in scripts), scripts
            assert not any("plotly.min.js" in u for u in scripts), scripts
            browser.close()
    finally:
        server.shutdown()
