"""Screenshots of every dashboard page, as a person first sees them, at a laptop's and a desktop's window size.

    .venv/bin/python scripts/screenshots.py OUT_DIR [--traces traces/examples] [--run item_sync] \
        [--compare item_sync decode] [--sizes 1500x1000 1280x800]

Serves the dashboard over --traces on 127.0.0.1, opens the run list (once every run is analyzed), one run page (as
opened, then with its first non-launch finding clicked), its segment view, the diff page of two runs and the first job
report (a folder that `analyze-many --out` wrote under --traces) in headless Debian chromium, and writes one PNG per
page and size: what is above the fold (the window) and the whole page. Each shot waits for what it shows (the
timeline drawn, the selection's zoom answered, the per-step chart drawn), never for a fixed time. For looking, not for
testing: tests/dashboard holds the checks.
"""
from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from playwright.sync_api import sync_playwright  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

from dashboard.app import create_app  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
DRAWN = "() => { const gd = document.querySelector('#timeline .js-plotly-plot'); return gd && gd._fullLayout; }"
# the run page's per-step chart is drawn after the timeline; a run without steps has none
STEPS_DRAWN = ("() => { const el = document.getElementById('steps-graph'); if (!el) { return true; }"
               " const gd = el.querySelector('.js-plotly-plot'); return gd && gd._fullData && gd._fullData.length; }")
# a selection's answer: the detail column names the finding and the timeline shades its occurrences
SELECTED = ("title => { const h = document.querySelector('#finding-detail h3');"
            " const gd = document.querySelector('#timeline .js-plotly-plot');"
            " return h && h.innerText === title && gd && (gd.layout.shapes || []).some(s => s.type === 'rect'); }")


FORMAT = {"png": {}, "jpeg": {"type": "jpeg", "quality": 70}}  # jpeg: a tenth of the bytes, to keep or send


def shoot(page, out: Path, name: str, fmt: str = "png") -> None:
    suffix = "jpg" if fmt == "jpeg" else fmt
    for path, full in ((out / f"{name}.{suffix}", False), (out / f"{name}-full.{suffix}", True)):
        page.screenshot(path=str(path), full_page=full, **FORMAT[fmt])
        print(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--traces", type=Path, default=REPO / "traces" / "examples")
    ap.add_argument("--run", default="item_sync")
    ap.add_argument("--compare", nargs=2, default=["item_sync", "decode"])
    ap.add_argument("--sizes", nargs="+", default=["1500x1000", "1280x800"])
    ap.add_argument("--format", choices=sorted(FORMAT), default="png")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server("127.0.0.1", 0, create_app(args.traces).server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.port}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for size in args.sizes:
            w, h = map(int, size.split("x"))
            page = browser.new_page(viewport={"width": w, "height": h})
            page.goto(base + "/")
            page.wait_for_selector("table.runs")
            page.wait_for_function("() => !document.querySelector('tr.run-row[data-status=queued],"
                                   " tr.run-row[data-status=analyzing]')", timeout=600_000)
            shoot(page, args.out, f"runs-{size}", args.format)
            page.goto(f"{base}/run/{args.run}")
            page.wait_for_function(DRAWN, timeout=120_000)
            page.wait_for_function(STEPS_DRAWN, timeout=120_000)
            page.wait_for_load_state("networkidle")
            shoot(page, args.out, f"run-{size}", args.format)
            others = page.locator("tr.finding-row:not([data-kind=launch_gap])")
            row = (others if others.count() else page.locator("tr.finding-row")).first
            title = row.locator("td.title").get_attribute("title").split(": ", 1)[1]
            row.click()
            page.wait_for_function(SELECTED, arg=title, timeout=120_000)
            page.wait_for_load_state("networkidle")
            shoot(page, args.out, f"run-selected-{size}", args.format)
            seg = page.locator("#segments-graph")
            if seg.count():
                seg.scroll_into_view_if_needed()
                shoot(page, args.out, f"run-segments-{size}", args.format)
            before, after = args.compare
            page.goto(f"{base}/diff?before={before}&after={after}")
            page.wait_for_selector("p.verdict", timeout=120_000)
            page.wait_for_function("() => [...document.querySelectorAll('.page-diff .js-plotly-plot')].every("
                                   "gd => gd._fullLayout)", timeout=120_000)
            page.wait_for_load_state("networkidle")
            shoot(page, args.out, f"diff-{size}", args.format)
            page.goto(f"{base}/diff")  # no runs named: it asks for two
            page.wait_for_selector("p.pick-two", timeout=60_000)
            shoot(page, args.out, f"diff-pick-{size}", args.format)
            page.goto(base + "/")
            page.wait_for_selector("table.runs")
            jobs = page.locator("a.job-link")
            if jobs.count():
                jobs.first.click()
                page.wait_for_selector(".page-job .js-plotly-plot", timeout=120_000)
                page.wait_for_load_state("networkidle")
                shoot(page, args.out, f"job-{size}", args.format)
            page.close()
        browser.close()
    server.shutdown()


if __name__ == "__main__":
    main()
