"""A bounded load test of the real dashboard server (`python -m dashboard` in a subprocess on 127.0.0.1): 8 clients
at once, each loading the run list, opening a run and zooming its timeline through the same Dash callback requests a
browser sends. Every answer is checked against the trace model (analyzer.trace.load_trace on the same trace): the
intervals a zoomed window shows are exactly that run's GPU work in that window. The server's memory stays bounded by
its timeline cache (--cache-mb) while the runs the clients open add up to several times that limit."""
from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from analyzer.views.timeline import activity_mask, build_timeline
from analyzer.trace import load_trace
from analyzer.api import EXACT_LIMIT

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "h200"
# fixture -> how many times its profiled window is played back to back: traces of ~150k events, a timeline of about
# 11 MB each, so that the runs the clients open add up to several times the cache limit
SOURCES = {"item_sync": 12, "decode": 12, "alloc_churn": 12, "print_tensor": 12, "prefill": 12, "batch_decode": 12,
           "graph_decode": 36}
FIRST = ["no_meta", "item_sync", "decode", "alloc_churn"]
SECOND = ["print_tensor", "prefill", "batch_decode", "graph_decode"]
# clients' runs per round: two clients on each of four runs (the first time they are opened), four other runs, all
ROUNDS = [FIRST * 2, SECOND * 2, FIRST + SECOND]
CLIENTS = 8
ZOOMS = 5
CACHE_MB = 16  # about one run's timeline
# What 8 requests in flight may leave to the allocator (a trace parse at a time, figures being built, per-thread
# malloc arenas), on top of the cache: 170-270 MB over the idle server here (it varies from run to run); with no
# cache limit the same load ends about 150 MB higher. The LRU itself is checked exactly, through /_cache.
IN_FLIGHT_MB = 45 * CLIENTS
ID_ARGS = ("correlation", "External id", "Python id", "Python parent id", "Ev Idx", "Record function id")
SERVER_START_S = 60


# ---------------------------------------------------------------------- the runs

def repeated_trace(src: Path, repeats: int) -> bytes:
    """The trace with its events played `repeats` times back to back (ids offset so each copy is its own work)."""
    top = json.loads(gzip.decompress(src.read_bytes()))
    timed = [e for e in top["traceEvents"] if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    span = int(max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed)) + 100
    events = [e for e in top["traceEvents"] if e.get("ph") == "M"]
    for k in range(repeats):
        for e in timed:
            e = dict(e, ts=e["ts"] + k * span, args=dict(e.get("args", {})))
            if "id" in e:
                e["id"] += k * 10_000_000
            for key in ID_ARGS:
                if type(e["args"].get(key)) is int and e["args"][key] > 0:
                    e["args"][key] += k * 10_000_000
            events.append(e)
    return gzip.compress(json.dumps(dict(top, traceEvents=events)).encode(), compresslevel=1)


class Expected:
    """What the model says a run's stream lanes hold: every kernel / memcpy / memset, ns since the window's start
    (the host's first recorded event where it precedes the GPU's first work)."""

    def __init__(self, trace: Path):
        model = load_trace(trace)
        gpu, active = model.gpu, activity_mask(model)
        start, end = gpu.start_ns[active], gpu.end_ns[active]
        self.t0_ns = min(d.window_start_ns for d in build_timeline(model).devices)
        assert self.t0_ns <= int(start.min())
        self.starts = (start - self.t0_ns).astype(np.float64)
        self.ends = (end - self.t0_ns).astype(np.float64)
        self.extent = (float(self.starts.min()), float(self.ends.max()))

    def visible(self, lo: float, hi: float) -> np.ndarray:
        return np.flatnonzero((self.starts < hi) & (self.ends > lo))


@pytest.fixture(scope="module")
def traces_dir(tmp_path_factory) -> Path:
    """Seven different real runs made long, short ones without meta.json and with a broken one, and a run whose
    trace is corrupt."""
    root = tmp_path_factory.mktemp("load") / "runs"
    for name, repeats in SOURCES.items():
        (root / name).mkdir(parents=True)
        (root / name / "rank0.trace.json.gz").write_bytes(repeated_trace(FIX / name / "rank0.trace.json.gz", repeats))
        shutil.copy(FIX / name / "meta.json", root / name / "meta.json")
    (root / "broken").mkdir()
    data = (FIX / "decode" / "rank0.trace.json.gz").read_bytes()
    (root / "broken" / "rank0.trace.json.gz").write_bytes(data[: len(data) // 2])
    (root / "no_meta").mkdir()
    shutil.copy(FIX / "graph_decode" / "rank0.trace.json.gz", root / "no_meta")
    (root / "bad_meta").mkdir()
    shutil.copy(FIX / "prefill" / "rank0.trace.json.gz", root / "bad_meta")
    (root / "bad_meta" / "meta.json").write_text('{"created_utc": "2026')
    return root


@pytest.fixture(scope="module")
def expected(traces_dir) -> dict[str, Expected]:
    return {name: Expected(traces_dir / name / "rank0.trace.json.gz") for name in (*SOURCES, "no_meta", "bad_meta")}


# ---------------------------------------------------------------------- the server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_mb(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


@pytest.fixture(scope="module")
def server(traces_dir):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "dashboard", "--traces", str(traces_dir), "--port", str(port),
                             "--cache-mb", str(CACHE_MB)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + SERVER_START_S
    while True:
        try:
            if Client(port).get("/")[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the dashboard did not start: {proc.communicate()[1]}")
        time.sleep(0.2)
    yield proc, port
    proc.terminate()
    try:
        stderr = proc.communicate(timeout=10)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        stderr = proc.communicate()[1]
    assert "Traceback" not in stderr, stderr


# ---------------------------------------------------------------------- a client, as a browser talks to Dash

class Client:
    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.statuses: list[int] = []

    def get(self, path: str) -> tuple[int, bytes]:
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        body = resp.read()
        self.statuses.append(resp.status)
        return resp.status, body

    def callback(self, payload: dict) -> tuple[int, dict | None]:
        self.conn.request("POST", "/_dash-update-component", body=json.dumps(payload),
                          headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        body = resp.read()
        self.statuses.append(resp.status)
        return resp.status, json.loads(body) if resp.status == 200 else None

    def page(self, pathname: str) -> dict:
        """The route callback (url.pathname -> page.children), as sent on every navigation."""
        status, answer = self.callback({
            "output": "page.children", "outputs": {"id": "page", "property": "children"},
            "inputs": [{"id": "url", "property": "pathname", "value": pathname}], "changedPropIds": ["url.pathname"],
            "parsedChangedPropsIds": ["url.pathname"], "state": [{"id": "url", "property": "search", "value": ""}]})
        assert status == 200, (pathname, status)
        return answer["response"]["page"]["children"]

    def refine(self, run_id: str, relayout: dict | None) -> tuple[int, dict | None]:
        """The timeline callback after a zoom or pan (relayout) or, with None, as the page's first draw sends it."""
        relayout_input = {"id": "timeline-relayout", "property": "data"}
        changed = ["timeline-relayout.data"]
        if relayout is None:
            changed = ["zoom.data", "timeline-relayout.data"]
        else:
            relayout_input["value"] = relayout
        status, answer = self.callback({
            "output": "..timeline.figure...shown-window.data..",
            "outputs": [{"id": "timeline", "property": "figure"}, {"id": "shown-window", "property": "data"}],
            "inputs": [relayout_input, {"id": "zoom", "property": "data"},
                       {"id": "memory-fit", "property": "value", "value": []}],
            "changedPropIds": changed, "parsedChangedPropsIds": changed,
            "state": [{"id": "shown-window", "property": "data"},
                      {"id": "run-id", "property": "data", "value": run_id}]})
        return status, answer["response"]["timeline"]["figure"] if answer else None


def find_component(tree, component_id: str) -> dict | None:
    if isinstance(tree, list):
        return next((c for c in (find_component(t, component_id) for t in tree) if c), None)
    if not isinstance(tree, dict):
        return None
    props = tree.get("props") or {}
    if props.get("id") == component_id:
        return tree
    return find_component(props.get("children"), component_id)


def unpack(value) -> np.ndarray:
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    return np.asarray(value, np.float64)


# ---------------------------------------------------------------------- checks

def cache_stats(port: int) -> dict:
    status, body = Client(port).get("/_cache")
    assert status == 200
    return json.loads(body)


def check_window(fig: dict, exp: Expected, lo_ms: float, hi_ms: float) -> int:
    """The figure shows [lo, hi] of this run, with one hover point per kernel / memcpy / memset the model has in
    the window (stream lanes), at the same times and durations. Returns how many there are."""
    meta = fig["layout"]["meta"]
    assert meta["window_ms"] == pytest.approx([lo_ms, hi_ms], rel=1e-12, abs=1e-9)
    assert round(meta["t0_us"] * 1000) == exp.t0_ns
    lo, hi = lo_ms * 1e6, hi_ms * 1e6
    rows = exp.visible(lo, hi)
    points = [t for t in fig["data"] if (t.get("meta") or {}).get("kind") == "hover" and " · " in t["meta"]["lane"]]
    durations = np.concatenate([unpack(t["customdata"]) for t in points]) if points else np.zeros(0)
    mids = np.concatenate([unpack(t["x"]) for t in points]) if points else np.zeros(0)
    want_mids = (np.maximum(exp.starts[rows], lo) + np.minimum(exp.ends[rows], hi)) / 2e6
    assert len(durations) == len(rows)
    assert np.sort(durations) == pytest.approx(np.sort((exp.ends[rows] - exp.starts[rows]) / 1e3), rel=1e-6,
                                               abs=1e-3)
    assert np.sort(mids) == pytest.approx(np.sort(want_mids), rel=1e-12, abs=1e-9)
    return len(rows)


def zoom_windows(exp: Expected, rng: random.Random) -> list[tuple[float, float]]:
    """ZOOMS windows (ms) at random places, each narrow enough that every interval in it gets its own hover point,
    and holding at least one interval."""
    first, last = exp.extent
    windows = []
    while len(windows) < ZOOMS:
        width = (last - first) * rng.choice((0.08, 0.02, 0.005))
        lo = rng.uniform(first - width / 2, last - width / 2)
        while len(exp.visible(lo, lo + width)) > EXACT_LIMIT:
            width /= 2
        if len(exp.visible(lo, lo + width)):
            windows.append((lo / 1e6, (lo + width) / 1e6))
    return windows


def session(port: int, run_id: str, exp: Expected, seed: int) -> dict:
    """One user: the run list, one run's page, its first timeline draw, zooms, a double-click back to all of it."""
    c = Client(port)
    status, shell = c.get("/")
    assert status == 200 and b"_dash-config" in shell
    listing = json.dumps(c.page("/"))
    for name in (*SOURCES, "no_meta", "bad_meta", "broken"):
        assert f'"data-run": "{name}"' in listing
    assert listing.count('"error-card"') == 1  # the corrupt trace's row only

    page = c.page(f"/run/{run_id}")
    text = json.dumps(page)
    assert "error-card" not in text, text[:2000]
    assert find_component(page, "run-id")["props"]["data"] == run_id
    assert ("meta.json: ignored: not readable JSON" in text) == (run_id == "bad_meta")
    full = find_component(page, "timeline")["props"]["figure"]
    assert round(full["layout"]["meta"]["t0_us"] * 1000) == exp.t0_ns
    full_window = full["layout"]["meta"]["window_ms"]
    assert c.refine(run_id, None) == (204, None)  # no zoom yet: nothing to redraw

    shown = []
    for lo_ms, hi_ms in zoom_windows(exp, random.Random(seed)):
        status, fig = c.refine(run_id, {"xaxis.range[0]": lo_ms, "xaxis.range[1]": hi_ms} if len(shown) % 2
                               else {"xaxis.range": [lo_ms, hi_ms]})
        assert status == 200
        shown.append(check_window(fig, exp, lo_ms, hi_ms))
    status, fig = c.refine(run_id, {"xaxis.autorange": True, "xaxis2.autorange": True})
    assert status == 200 and fig["layout"]["meta"]["window_ms"] == full_window
    c.conn.close()
    return {"statuses": c.statuses, "intervals_checked": sum(shown)}


def test_eight_clients_get_their_own_runs_and_memory_stays_bounded(server, expected):
    proc, port = server
    idle = memory_mb(proc.pid)
    for run_id in ("no_meta", "bad_meta"):  # every code path imported, small runs cached
        session(port, run_id, expected[run_id], seed=0)
    warm = memory_mb(proc.pid)
    after_rounds, statuses, checked = [], [], 0
    with ThreadPoolExecutor(CLIENTS) as pool:
        for r, picks in enumerate(ROUNDS):
            for result in pool.map(lambda i: session(port, picks[i], expected[picks[i]], seed=100 * r + i),
                                   range(CLIENTS)):
                statuses += result["statuses"]
                checked += result["intervals_checked"]
            after_rounds.append(memory_mb(proc.pid))
    stats = cache_stats(port)
    print(f"\n{len(statuses)} requests, {checked} intervals checked; server memory (MB): idle {idle}, warm {warm}, "
          f"after each round {after_rounds}; caches {stats}")
    assert proc.poll() is None
    assert all(s < 500 for s in statuses) and statuses.count(200) >= CLIENTS * len(ROUNDS) * (ZOOMS + 3)

    lru = stats["timelines"]
    assert lru["limit_bytes"] == CACHE_MB << 20
    assert lru["peak_bytes"] <= lru["limit_bytes"] and 1 <= lru["entries"] <= 2
    # RSS: the cache limit and what requests in flight leave behind, never one timeline per run opened
    for m in after_rounds:
        assert m["VmRSS"] < idle["VmRSS"] + CACHE_MB + IN_FLIGHT_MB, (idle, after_rounds)
