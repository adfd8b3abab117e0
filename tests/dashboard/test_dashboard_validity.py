"""The trace checks on the dashboard's run page, in headless Chromium: a run whose graph launches' kernels were not
recorded (a synthetic cut of the 24-layer graph decode, tests/tracecuts.py) opens with the failed check spelled out
above its findings, and the launch finding marked unreliable; a whole run folds its checks into one line."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

import tracecuts
from dashboard.app import create_app
from test_dashboard import CHROMIUM, LAUNCH_ARGS, needs_browser, open_run, sync_playwright

FIX = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    from werkzeug.serving import make_server
    runs = tmp_path_factory.mktemp("validity") / "runs"
    cut, _ = tracecuts.drop_graph_kernels(tracecuts.read(FIX / "h200_extra" / "graph_decode_24" / "rank0.trace.json.gz"))
    (runs / "graph_missing").mkdir(parents=True)
    tracecuts.write(cut, runs / "graph_missing" / "rank0.trace.json.gz")
    shutil.copytree(FIX / "h200" / "decode", runs / "decode")
    app = create_app(runs)
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.port}"
    server.shutdown()


@pytest.fixture(scope="module")
def page():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        yield context.new_page()
        browser.close()


@needs_browser
def test_a_failed_check_is_open_above_the_findings_and_the_finding_says_it_is_unreliable(page, base_url):
    open_run(page, base_url, "graph_missing")
    box = page.locator("details.validity.failed")
    assert box.get_attribute("open") is not None
    text = box.inner_text()
    assert "1 failed" in text and "launches_without_gpu_work" in text and "8 cudaGraphLaunch calls" in text
    assert box.bounding_box()["y"] < page.locator("table.findings").bounding_box()["y"]
    row = page.locator("tr.finding-row[data-finding='launch_overhead']")
    assert row.locator("td.title").inner_text().startswith("[unreliable: GPU work missing from the trace]")
    assert "confidence low" in row.locator("td").nth(1).get_attribute("title")


@needs_browser
def test_a_run_whose_checks_only_warn_folds_them_into_one_line(page, base_url):
    open_run(page, base_url, "decode")
    box = page.locator("details.validity")
    assert box.get_attribute("open") is None and "failed" not in (box.get_attribute("class") or "")
    assert "1 warned" in box.locator("summary").inner_text()
    assert box.bounding_box()["height"] < 40
