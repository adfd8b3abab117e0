"""Benchmark the run page on a large trace in headless Chromium (not a test).

    python benchmarks/bench_page.py                      # replicate tests/fixtures/h200/decode to ~150 MB
    python benchmarks/bench_page.py --size-mb 400
    python benchmarks/bench_page.py traces/my-run        # or any run folder / trace file you have

Prints the first open (empty browser cache), the time to a painted timeline once the analysis is cached (same server,
and a fresh server that reloads the trace; the median of --repeat page loads each, in one browser profile on disk as a
user's), the page load's payload (data responses vs static JS), and for zooms from half the trace down to a few µs:
the refine response size and the time until the new figure is drawn.
"""
from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dashboard.app import create_app  # noqa: E402

LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
GD = "document.querySelector('#timeline .js-plotly-plot')"
ZOOMS = (0.5, 0.1, 0.01, 1e-3, 1e-4, 1e-5)


def build_big_run(work: Path, size_mb: float) -> Path:
    run = work / "runs" / "decode-replicated"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "replicate_trace.py"),
                    str(REPO / "tests" / "fixtures" / "h200" / "decode"), "--size-mb", str(size_mb), "--out", str(run)],
                   check=True, stdout=subprocess.DEVNULL)
    return run


def serve(traces_dir: Path, port: int = 0):
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from werkzeug.serving import make_server
    app = create_app(traces_dir)
    server = make_server("127.0.0.1", port, app.server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return app, server


def open_page(context, url: str) -> dict:
    page = context.new_page()
    sizes = {"data": 0, "static": 0}

    def count(response):
        try:
            n = len(response.body())
        except Exception:  # redirects and 304s have no body
            return
        static = any(part in response.url for part in ("component-suites", "/assets/", "favicon", "_plotly-lite.js"))
        sizes["static" if static else "data"] += n

    page.on("response", count)
    start = time.perf_counter()
    page.goto(url)
    page.wait_for_function(f"{GD} && {GD}._fullData && {GD}._fullData.length > 10", timeout=600_000)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    painted = time.perf_counter() - start
    page.wait_for_load_state("networkidle")
    return {"page": page, "painted_s": painted, **sizes}


def zoom(page, lo: float, hi: float) -> tuple[int, float]:
    start = time.perf_counter()
    with page.expect_response(lambda r: "_dash-update-component" in r.url and "timeline-relayout" in (
            r.request.post_data or "") and r.status == 200) as info:
        page.evaluate(f"Plotly.relayout({GD}, {{'xaxis.range': [{lo!r}, {hi!r}]}})")
    size = len(info.value.body())
    page.wait_for_function(f"Math.abs({GD}.layout.meta.window_ms[0] - ({lo!r})) < 1e-9", timeout=120_000)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    return size, time.perf_counter() - start


def _spread(loads: list[dict]) -> str:
    times = sorted(x["painted_s"] for x in loads)
    return f"median {statistics.median(times):.2f} s (min {times[0]:.2f}, max {times[-1]:.2f}, {len(times)} loads)"


def middle_step_ms(traces_dir: Path, run_id: str, t0_us: float) -> float | None:
    """The middle of the middle step (zooms centred there show work, not a gap between steps)."""
    from analyzer.api import RunStore
    store = RunStore(traces_dir)
    run = store.find(run_id)
    steps = (store.cached_report(run) or {}).get("gaps", {}).get("per_step") if run else None
    if not steps:
        return None
    step = steps[len(steps) // 2]
    return (step["ts_us"] + step["wall_us"] / 2 - t0_us) / 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, help="run folder or trace file (default: build one)")
    parser.add_argument("--size-mb", type=float, default=150, help="size of the replicated trace (default 150)")
    parser.add_argument("--repeat", type=int, default=5, help="page loads per measurement, median reported (default 5)")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright
    work = Path(tempfile.mkdtemp(prefix="dash-bench-"))
    try:
        if args.source is None:
            t = time.perf_counter()
            run_dir = build_big_run(work, args.size_mb)
            print(f"built {run_dir} in {time.perf_counter() - t:.1f} s")
        else:
            run_dir = args.source.resolve() if args.source.is_dir() else args.source.resolve().parent
        traces_dir = run_dir.parent
        app, server = serve(traces_dir)
        base = f"http://127.0.0.1:{server.port}"
        size = sum(p.stat().st_size for p in run_dir.iterdir() if p.name.startswith("rank") or p.suffix == ".gz")
        print(f"trace: {run_dir} ({size / 1e6:.0f} MB on disk)")
        with sync_playwright() as p:
            # one browser profile on disk throughout, as a user's (an incognito context keeps no compiled-code
            # cache): the static JS is fetched and compiled on the first visit and comes from the browser's caches
            # after that (the fresh server listens on the same port)
            context = p.chromium.launch_persistent_context(str(work / "profile"), executable_path="/usr/bin/chromium",
                                                           args=LAUNCH_ARGS, viewport={"width": 1400, "height": 900})
            first = open_page(context, f"{base}/run/{run_dir.name}")
            print(f"first open (analysis + page, empty browser cache): {first['painted_s']:.2f} s")
            first["page"].close()
            warm = []
            for _ in range(args.repeat):
                warm.append(open_page(context, f"{base}/run/{run_dir.name}"))
                warm[-1]["page"].close()
            print(f"painted timeline, analysis cached, same server: {_spread(warm)}; page load payload "
                  f"{warm[0]['data'] / 1e3:.0f} kB data + {warm[0]['static'] / 1e3:.0f} kB static JS/CSS (cacheable)")
            port = server.port
            cold = []
            for n in range(args.repeat):
                server.shutdown()
                server.server_close()
                app, server = serve(traces_dir, port)
                cold.append(open_page(context, f"{base}/run/{run_dir.name}"))
                if n + 1 < args.repeat:
                    cold[-1]["page"].close()
            print(f"painted timeline, fresh server (report.json and the lanes on disk, trace model memory-mapped): "
                  f"{_spread(cold)}; payload {cold[0]['data'] / 1e3:.0f} kB data")
            cold = cold[-1]
            page = cold["page"]
            full, t0_us = page.evaluate(f"[{GD}.layout.meta.window_ms, {GD}.layout.meta.t0_us]")
            span = full[1] - full[0]
            mid = middle_step_ms(traces_dir, run_dir.name, t0_us) or (full[0] + full[1]) / 2
            print(f"{'zoom':>10} {'window':>12} {'response':>10} {'to drawn':>9}")
            for share in ZOOMS:
                lo, hi = mid - span * share / 2, mid + span * share / 2
                nbytes, seconds = zoom(page, lo, hi)
                print(f"{share:>10.0e} {hi - lo:>9.3f} ms {nbytes / 1e3:>7.0f} kB {seconds:>7.2f} s")
            context.close()
            server.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
