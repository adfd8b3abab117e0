"""The job page in headless Chromium: a 3-rank job made from the H200 decode fixture with collectives inserted and
rank 1 planted 3 ms late at one step, analysed by `analyze-many` into a dataset folder under the dashboard's
folder. The run list links the job report; the page names the planted straggler at the planted step, links each
rank to its run page, and a click on the straggler's heatmap cell opens that rank zoomed to that step."""
from __future__ import annotations

import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from analyzer import api
from analyzer.report.figures import window_start_us
from test_dashboard import CHROMIUM, LAUNCH_ARGS, needs_browser, sync_playwright

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "fixtures" / "h200" / "decode"
LATE_RANK, LATE_STEP, LATE_MS = 1, 3, 3.0

pytest.importorskip("dask.distributed")
pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jobs")
    job = root / "tp3"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "replicate_trace.py"), str(SOURCE), "--ranks", "3",
                    "--straggler", f"{LATE_RANK}:{LATE_STEP}:{LATE_MS}", "--insert-collectives", "60",
                    "--out", str(job)], check=True, cwd=REPO, capture_output=True)
    subprocess.run([sys.executable, "-m", "analyzer", "analyze-many", str(job), "--out", str(root / "fleet"),
                    "--threads"], check=True, cwd=REPO, capture_output=True)
    return root


@pytest.fixture(scope="module")
def base_url(root):
    from werkzeug.serving import make_server
    from dashboard.app import create_app
    server = make_server("127.0.0.1", 0, create_app(root).server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.port}"
    server.shutdown()


@needs_browser
def test_job_page_names_the_straggler_and_opens_its_step(root, base_url):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(base_url + "/")
        page.click("a.job-link")
        page.wait_for_selector(".js-plotly-plot .heatmaplayer", timeout=60_000)
        stragglers = page.locator("li.straggler")
        assert stragglers.count() == 1
        assert stragglers.first.get_attribute("data-rank") == str(LATE_RANK)
        text = stragglers.first.inner_text()
        assert "decode_step#2" in text and f"{LATE_MS:.2f} ms late" in text, text  # position 3: after the prefill
        links = page.locator("tr.rank-row a")
        assert [links.nth(i).get_attribute("href") for i in range(links.count())] == [
            f"/run/tp3/rank{r}.trace" for r in range(3)]
        # the straggler's cell: column LATE_STEP of 7, row LATE_RANK of 3
        box = page.locator(".js-plotly-plot .nsewdrag").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] * (LATE_STEP + 0.5) / 7,
                         box["y"] + box["height"] * (LATE_RANK + 0.5) / 3)
        page.wait_for_url(f"**/run/tp3/rank{LATE_RANK}.trace?t0=*", timeout=60_000)
        page.wait_for_function("(() => { const gd = document.querySelector('#timeline .js-plotly-plot');"
                               " return gd && gd._fullLayout; })()", timeout=60_000)
        lo, hi = page.evaluate("document.querySelector('#timeline .js-plotly-plot').layout.xaxis.range")
        report = api.analyze(api.load(root / "tp3" / f"rank{LATE_RANK}.trace.json.gz")).report
        step = report["gaps"]["per_step"][LATE_STEP]
        start = (step["ts_us"] - window_start_us(report)) / 1e3
        wall = step["wall_us"] / 1e3
        assert lo == pytest.approx(start - 0.02 * wall, abs=2e-3) and hi == pytest.approx(start + 1.02 * wall, abs=2e-3)
        assert not errors, errors
        browser.close()
    with urllib.request.urlopen(base_url + "/download/fleet/job-report.md") as answer:
        assert "Stragglers" in answer.read().decode()
