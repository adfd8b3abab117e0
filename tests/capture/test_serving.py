"""The serving engine on the CPU: the scheduler's admission, batching and completion (deterministic, no torch), the
engine's tokens against decoding each request alone, and a real capture + analysis of the serve workload."""
import json

import pytest

from workloads.serving.requests import Request, make_requests
from workloads.serving.scheduler import Scheduler


def _req(i, prompt=4, output=3, arrival=0.0):
    return Request(i, arrival, prompt, output)


def test_admission_is_first_come_first_served_into_the_lowest_free_rows():
    s = Scheduler(max_batch=2, capacity=16)
    for i in range(4):
        s.submit(_req(i), now=float(i))
    admitted = s.admit(now=10.0)
    assert [(r.id, r.slot) for r in admitted] == [(0, 0), (1, 1)]
    assert [r.id for r in s.waiting] == [2, 3] and s.live_rows == 2
    assert s.admit(now=11.0) == []  # no free row: nobody joins mid-batch


def test_a_finished_request_frees_its_row_for_the_next_admission():
    s = Scheduler(max_batch=3, capacity=16)
    a, b, c, d = _req(0, output=1), _req(1, output=3), _req(2, output=2), _req(3)
    for r in (a, b, c):
        s.submit(r, now=0.0)
    s.admit(now=0.0)
    for r in (a, b, c):  # step 1: every running request gets a token; a is done
        s.add_token(r, 7, now=1.0)
    assert [r.id for r in s.retire(now=1.0)] == [0]
    assert a.finished_at == 1.0 and a.tokens == [7] and a.first_token_at == 1.0
    s.submit(d, now=1.5)
    assert [(r.id, r.slot) for r in s.admit(now=2.0)] == [(3, 0)]  # row 0 reused
    for r in (b, c):
        s.add_token(r, 8, now=3.0)
    assert [r.id for r in s.retire(now=3.0)] == [2]
    assert s.live_rows == 2  # rows 0 (d) and 1 (b) still live; row 2 free
    s.add_token(b, 9, now=4.0)
    assert [r.id for r in s.retire(now=4.0)] == [1] and s.live_rows == 1
    assert not s.idle  # d still running


def test_tokens_past_the_output_length_are_dropped():
    s = Scheduler(max_batch=1, capacity=8)
    r = _req(0, output=1)
    s.submit(r, 0.0)
    s.admit(0.0)
    s.add_token(r, 1, 1.0)  # the prefill's token
    s.add_token(r, 2, 1.0)  # the same step's decode token: one too many
    assert r.tokens == [1]


def test_a_request_that_cannot_fit_the_cache_is_refused():
    s = Scheduler(max_batch=1, capacity=8)
    with pytest.raises(ValueError, match="request 5: 6 prompt \\+ 3 output tokens exceed the KV cache's 8"):
        s.submit(_req(5, prompt=6, output=3), 0.0)


def test_arrivals_and_lengths_are_seeded():
    a = make_requests(20, "poisson", 50.0, (4, 9), (1, 5), seed=3)
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in a] == \
           [(r.arrival_s, r.prompt_len, r.output_len) for r in make_requests(20, "poisson", 50.0, (4, 9), (1, 5), 3)]
    assert a[0].arrival_s == 0 and all(x.arrival_s < y.arrival_s for x, y in zip(a, a[1:]))
    assert all(4 <= r.prompt_len <= 9 and 1 <= r.output_len <= 5 for r in a)
    assert [r.arrival_s for r in make_requests(3, "uniform", 4.0, (1, 1), (1, 1), 0)] == [0, 0.25, 0.5]
    assert {r.arrival_s for r in make_requests(3, "burst", 4.0, (1, 1), (1, 1), 0)} == {0.0}
    with pytest.raises(ValueError, match="arrival 'gamma'"):
        make_requests(1, "gamma", 1.0, (1, 1), (1, 1), 0)


torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_model():
    from workloads.qwen2 import PRESETS, random_model
    return random_model(PRESETS["tiny"], torch.device("cpu"), torch.float32, 0)


def _serving(model, **options):
    from workloads.qwen2 import Sampling
    from workloads.serving.workload import ServingWorkload
    settings = dict(max_batch=3, sampling=Sampling(), seed=1, requests=7, arrival="burst", rate=1.0,
                    prompt_len=(3, 12), output_len=(1, 9), yield_s=0.0, to_thread=False, readback="batched")
    return ServingWorkload(model, **(settings | options))


def _solo_tokens(model, workload, request):
    from workloads.qwen2 import Generator, Sampling
    gen = Generator(model, 1, request.prompt_len + request.output_len + 1, Sampling())
    gen.prefill(workload.prompt(request))
    for _ in range(request.output_len - 1):
        gen.step()
    return gen.tokens()[0, request.prompt_len:].tolist()


@pytest.mark.parametrize("options", [{}, {"readback": "item"}, {"to_thread": True}, {"yield_s": 0.001}],
                         ids=["batched", "item", "to_thread", "sleep"])
def test_continuous_batching_gives_each_request_its_solo_tokens(tiny_model, options):
    workload = _serving(tiny_model, **options)
    session = workload.session()
    assert all(r.done and r.finished_at is not None for r in session.requests)
    for request in session.requests:  # rows of different lengths share every decode step
        assert request.tokens == _solo_tokens(tiny_model, workload, request), request.id
    steps = session.steps
    assert sum(s.admitted for s in steps) == 7 and sum(s.finished for s in steps) == 7
    assert max(s.running for s in steps) == 3 and all(s.rows <= 3 for s in steps)
    # all 7 arrive at once: 3 are admitted at the first step, the others only as rows free up
    assert steps[0].admitted == 3


def test_session_metrics_are_consistent(tiny_model):
    from workloads.serving.metrics import lifetimes_unix_ns, summarize
    session = _serving(tiny_model).session()
    summary = summarize(session)
    rows = summary["per_request"]
    assert summary["requests"] == 7 and summary["output_tokens"] == sum(r.output_len for r in session.requests)
    for row in rows:
        assert 0 <= row["arrived_ms"] <= row["admitted_ms"] <= row["first_token_ms"] <= row["finished_ms"]
        assert row["ttft_ms"] == pytest.approx(row["first_token_ms"] - row["arrived_ms"], abs=1e-3)
        assert (row["tpot_ms"] is None) == (row["output_tokens"] == 1)
    assert summary["throughput_tokens_per_s"] > 0 and 1 <= summary["mean_batch"] <= 3
    lifetimes = lifetimes_unix_ns(session)
    assert all(r["arrived"] <= r["admitted"] <= r["first_token"] <= r["finished"] for r in lifetimes)


@pytest.fixture(scope="module")
def serve_run(tmp_path_factory):
    from conftest import run_cli
    out = tmp_path_factory.mktemp("traces")
    result = run_cli("capture", "workloads/serve_tiny.yaml", "--out", str(out))
    assert result.returncode == 0, result.stderr
    (run,) = out.iterdir()
    return run, result


def test_serve_capture_records_latency_and_lifetimes(serve_run):
    run, result = serve_run
    assert "serving: 6 requests, TTFT p50" in result.stdout
    meta = json.loads((run / "meta.json").read_text())
    assert meta["complete"] is True
    served = meta["serving"]["unprofiled"]
    assert served["requests"] == 6 and len(served["per_request"]) == 6
    assert served["ttft_ms"]["p50"] > 0 and served["throughput_tokens_per_s"] > 0
    assert meta["serving"]["options"]["token_readback"] == "batched"
    lifetimes = meta["serving"]["profiled"]["lifetimes_unix_ns"]
    assert len(lifetimes) == 6 and all(r["finished"] > r["arrived"] for r in lifetimes)
    steps = meta["profiled"]["annotations"]
    assert steps[0] == "engine_step#0" and len(steps) == meta["serving"]["profiled"]["engine_steps"]


def test_serve_run_analyzes_with_requests_on_the_trace_clock(serve_run, tmp_path):
    from conftest import run_cli
    run, _ = serve_run
    result = run_cli("analyze", str(run), "--out", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    serving = report["serving"]
    assert serving["latency"]["requests"] == 6
    trace = json.loads(__import__("gzip").open(run / "rank0.trace.json.gz").read())
    steps = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("engine_step#")]
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    for r in serving["requests"]:  # wall-clock lifetimes land inside the profiled engine steps
        assert lo - 5_000 <= r["admitted_us"] <= r["first_token_us"] <= r["finished_us"] <= hi + 5_000
    assert [s["step"] for s in serving["steps"]][:2] == ["engine_step#0", "engine_step#1"]
    assert "#### Serving: per-request latency" in (tmp_path / "r" / "report.md").read_text()
