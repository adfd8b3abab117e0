"""The replay model (analyzer/views/replay.py) on real traces: replayed unchanged it reproduces each trace's GPU
timeline exactly, taking CPU time out never makes anything later, and the all-fixed replay never beats the GPU's own
busy time. External traces are skipped where ../shared/traces/external is absent."""
import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest

from analyzer.trace import load_trace
from analyzer.views.context import AnalysisContext
from analyzer.views.idle import CPU_LAUNCH

HERE = Path(__file__).resolve().parents[1]
FIXTURES = sorted(p.parent for p in (HERE / "fixtures").glob("*/*/rank0.trace.json.gz"))
EXTERNAL = HERE.parents[1] / "shared" / "traces" / "external"
EXTERNAL_TRACES = sorted(EXTERNAL.glob("*.json.gz")) if EXTERNAL.is_dir() else []
TRACES = FIXTURES + EXTERNAL_TRACES
IDS = [f"{p.parent.name}/{p.name}" for p in TRACES]

# What the model cannot see, and says so: no GPU work. (A stream fed by two threads, a backward pass on the autograd
# thread or a model call on a worker thread, is replayed with the hand-offs between them: test_handoffs_*.)
REFUSED = {
    "external/cpu-only.json.gz": "no GPU activity",
    "external/mtia-inference-no-gpu.json.gz": "no GPU activity",
    "external/a100-particle-transformer-cpu-device-forward-no-kernels.json.gz": "no GPU activity",
}
# Traces where another thread launches into the primary's stream while the primary waits for it
HANDOFF_TRACES = ["h200_serve/serve_to_thread", "external/rtx3080-toy-mlp-dataloader-no-workers.json.gz",
                  "external/v100-ddp-training-with-memory.json.gz", "external/mi250-toy-training-rocm.json.gz",
                  "external/v100-resnet50-torch18-categories.json.gz"]


@functools.lru_cache(maxsize=4)
def context(path: Path) -> AnalysisContext:
    trace = path / "rank0.trace.json.gz" if path.is_dir() else path
    return AnalysisContext(load_trace(trace))


def trace_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_unchanged_replay_reproduces_the_trace(path):
    ctx = context(path)
    model, replayed = ctx.model, ctx.replay.run()
    if trace_id(path) in REFUSED:
        assert any(REFUSED[trace_id(path)] in limit for limit in replayed.limits), replayed.limits
        assert replayed.gpu_start_ns is None and replayed.step_gpu_period_ns is None  # no numbers where it is blind
        return
    assert replayed.limits == ()
    assert np.array_equal(replayed.gpu_start_ns, model.gpu.start_ns)
    assert np.array_equal(replayed.gpu_end_ns, model.gpu.end_ns)
    assert np.array_equal(replayed.runtime_start_ns, model.runtime.start_ns)
    assert np.array_equal(replayed.runtime_end_ns, model.runtime.end_ns)
    assert np.array_equal(replayed.step_cpu_wall_ns, ctx.steps.hi_ns - ctx.steps.lo_ns)
    assert np.array_equal(replayed.step_cpu_end_ns, ctx.steps.hi_ns)
    for row, period in zip(ctx.step_table, replayed.step_gpu_period_ns.tolist(), strict=True):
        if row["gpu_period_us"] is None:
            assert period == -1
        else:
            assert period / 1e3 == pytest.approx(row["gpu_period_us"], rel=0.01)


def host_work_pieces(ctx, cause=None) -> np.ndarray:
    """(tid, start, end) of the idle pieces (of one cause, or all) whose responsible runtime row is known: CPU time
    on that row's thread while the GPU waited."""
    idle, rt = ctx.idle, ctx.model.runtime
    rows = np.flatnonzero((idle.row >= 0) & ((idle.cause == cause) if cause is not None else True))
    return np.stack([rt.tid[idle.row[rows]], idle.start_ns[rows], idle.end_ns[rows]], axis=1)


def assert_no_later(base, replayed):
    assert (replayed.gpu_start_ns <= base.gpu_start_ns).all()
    assert (replayed.gpu_end_ns <= base.gpu_end_ns).all()
    assert (replayed.runtime_end_ns <= base.runtime_end_ns).all()
    # not each step's period: a step whose first work moves earlier than the next one's (the GPU, the next step's
    # bound, is not done sooner) gets a longer period, as a step's span can grow below
    # a step's end, not its span: a wait taken out of one step can move into the next (the CPU reaches the next
    # blocking call earlier while the GPU, the bound, is not done sooner), so that step's span grows
    assert (replayed.step_cpu_end_ns <= base.step_cpu_end_ns).all()


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_taking_cpu_time_out_never_makes_anything_later(path):
    ctx = context(path)
    replay = ctx.replay
    base = replay.run()
    if base.limits:
        return
    launch_pieces = host_work_pieces(ctx, CPU_LAUNCH)
    every_piece = host_work_pieces(ctx)
    runs = [replay.run(no_wait=replay.sync_rows), replay.run(removed=launch_pieces),
            replay.run(removed=every_piece, no_wait=replay.sync_rows)]
    runs += [replay.run(no_wait=[row]) for row in replay.sync_rows[:20].tolist()]
    sample = np.linspace(0, len(launch_pieces) - 1, min(len(launch_pieces), 20)).astype(int)
    runs += [replay.run(removed=launch_pieces[i:i + 1]) for i in sample.tolist()]
    for replayed in runs:
        assert_no_later(base, replayed)
    # with everything the GPU waited for taken out, a step still takes at least its GPU busy time, less the
    # overlap of kernels that start just before the one ahead of them ends (programmatic dependent launch on an
    # H100: cuBLAS's nvjet kernels and their split-K reduction, ~0.1 µs each), which back to back they keep
    every = runs[2]
    for row, period in zip(ctx.step_table, every.step_gpu_period_ns.tolist()):
        if row["gpu_period_us"] is not None:
            assert period >= round(row["busy_us"] * 1e3 * 0.995) - 1, row["step"]


def decode_steps(ctx) -> np.ndarray:
    """The decode steps that have a next step (the last one's period is only its own GPU span)."""
    steps = np.flatnonzero([name.startswith("decode_step") for name in ctx.steps.names])
    return steps[:-1]


def test_item_sync_waits_buy_almost_nothing_in_a_launch_bound_loop():
    """`.item()` every step while the CPU is the bottleneck: the GPU has drained long before the sync, so the wait
    is a few µs and removing it saves just that."""
    ctx = context(HERE / "fixtures" / "h200" / "item_sync")
    model, replay = ctx.model, ctx.replay
    item = [row for row in replay.sync_rows.tolist()
            if any(name.startswith("<built-in method item") for name in model.frame_chain(model.runtime.frame[row]))]
    assert len(item) == 6  # one per decode step
    base, replayed = replay.run(), replay.run(no_wait=item)
    saving = (base.step_gpu_period_ns - replayed.step_gpu_period_ns)[decode_steps(ctx)]
    waits = replay.sync_wait_ns[np.isin(replay.sync_rows, item)]
    assert (saving >= 0).all() and saving.max() <= waits.max()
    assert (saving < 0.01 * base.step_gpu_period_ns[decode_steps(ctx)]).all()


def test_host_work_removed_shortens_each_step_by_its_time():
    ctx = context(HERE / "fixtures" / "h200_extra" / "host_work")
    model, replay = ctx.model, ctx.replay
    frames = model.frames
    codes = [c for c, name in enumerate(model.names) if name.endswith("): position_checksum")]
    rows = np.flatnonzero(np.isin(frames.name, codes))
    removed = np.stack([frames.tid[rows], frames.start_ns[rows], frames.end_ns[rows]], axis=1)
    per_step = np.zeros(len(ctx.steps), np.int64)
    np.add.at(per_step, ctx.steps.index_at(frames.start_ns[rows]), frames.end_ns[rows] - frames.start_ns[rows])
    base, replayed = replay.run(), replay.run(removed=removed)
    steps = decode_steps(ctx)
    assert (per_step[steps] > 0).all()
    saving = base.step_gpu_period_ns[steps] - replayed.step_gpu_period_ns[steps]
    assert saving == pytest.approx(per_step[steps], rel=0.1)


def test_cpu_time_taken_out_of_a_gpu_bound_loop_buys_nothing():
    """A CUDA-graph decode whose CPU runs ahead of the GPU: taking out every CPU interval the GPU waited for (the
    eager prefill's) and every wait shortens the prefill, while the decode steps, held by the GPU, keep their time."""
    ctx = context(HERE / "fixtures" / "h200_extra" / "graph_decode_24")
    replay = ctx.replay
    base = replay.run()
    replayed = replay.run(removed=host_work_pieces(ctx), no_wait=replay.sync_rows)
    steps = decode_steps(ctx)
    assert replayed.step_gpu_period_ns[steps] == pytest.approx(base.step_gpu_period_ns[steps], rel=0.001)
    prefill = ctx.steps.names.index("prefill")
    assert replayed.step_gpu_period_ns[prefill] < 0.2 * base.step_gpu_period_ns[prefill]


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_a_replay_stopped_at_a_horizon_gives_the_same_periods_before_it(path):
    """run(until_ns=T) replays only up to the first blocking call at or after T: every step whose period ends
    before T (the next step's GPU work launched before the step after it began, at or before T) keeps the period
    the whole replay gives it."""
    ctx = context(path)
    replay, steps = ctx.replay, ctx.steps
    if replay.limits or len(steps) < 4:
        return
    removed, no_wait = host_work_pieces(ctx, CPU_LAUNCH), replay.sync_rows[::2]
    whole = replay.run(removed, no_wait, cpu=False)
    for k in range(len(steps) - 2):
        until = int(steps.lo_ns[k + 2])
        stopped = replay.run(removed, no_wait, cpu=False, until_ns=until)
        assert np.array_equal(stopped.step_gpu_period_ns[:k + 1], whole.step_gpu_period_ns[:k + 1]), k


def _handoff_path(name: str) -> Path:
    path = HERE / "fixtures" / name if name.startswith("h200") else EXTERNAL / name.split("/", 1)[1]
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


@pytest.mark.parametrize("name", HANDOFF_TRACES)
def test_handoffs_move_the_other_thread_with_the_one_that_handed_off(name):
    """Each run of the helper thread is a pair of joins (the helper at its start, the primary at its end). Taking
    CPU time out of the primary just before it handed over starts the helper's run that much earlier; taking it out of
    the helper's run resumes the primary that much earlier. Before the joins, neither thread moved the other."""
    ctx = context(_handoff_path(name))
    rp, rt = ctx.replay, ctx.model.runtime
    joins = np.flatnonzero(rp.sync_follows >= 0)
    assert len(joins) >= 2 and len(joins) % 2 == 0
    helper_starts = joins[rp.sync_follows[joins] == rp.step_thread] if rp.step_thread >= 0 else joins[::2]
    # a run of the helper with runtime calls of its own, after a stretch of primary time to take out
    moved = 0
    for k in helper_starts.tolist():
        helper, primary = int(rp.sync_thread[k]), int(rp.sync_follows[k])
        at = int(rp.sync_start_ns[k])
        end = joins[(rp.sync_thread[joins] == primary) & (rp.sync_start_ns[joins] > at)]
        if not len(end):
            continue
        run_end = int(rp.sync_start_ns[end[0]])
        calls = rp.runtime_rows[helper]
        inside = calls[(rt.start_ns[calls] >= at) & (rt.start_ns[calls] < run_end)]
        before = rp.sync_start_ns[(rp.sync_thread == helper) & (rp.sync_follows < 0) & (rp.sync_start_ns >= at)
                                  & (rp.sync_start_ns < run_end)]
        first_call = int(rt.start_ns[inside].min()) if len(inside) else None
        if first_call is None or (len(before) and before.min() < first_call):
            continue
        # the helper had been idle long enough that the primary's hand-off, not its own last run, placed it
        if rp.sync_ready_ns[k] > at - 2_000_000:
            continue
        cut = 1_000_000
        base = rp.run()
        handed = int(rp.sync_handed_ns[k])  # the primary's last event before the run
        out = rp.run(np.array([[rp.tids[primary], handed - cut, handed]]))
        first = inside[np.argmin(rt.start_ns[inside])]
        assert base.runtime_start_ns[first] - out.runtime_start_ns[first] == cut
        # the hand-off's own latency (the primary's last event to the helper's run), taken out of the helper
        latency = rp.run(np.array([[rp.tids[helper], handed, at]]))
        assert base.runtime_start_ns[first] - latency.runtime_start_ns[first] == at - handed
        moved += 1
        # and the helper's own time taken out of that run resumes the primary earlier by as much
        span = rt.end_ns[inside].max() - rt.start_ns[inside].min()
        if span > cut:
            later = rp.runtime_rows[primary]
            later = later[rt.start_ns[later] >= run_end]
            if len(later):
                back = rp.run(np.array([[rp.tids[helper], first_call, first_call + cut]]))
                nxt = later[np.argmin(rt.start_ns[later])]
                assert base.runtime_start_ns[nxt] - back.runtime_start_ns[nxt] == cut
        break
    assert moved, "no hand-off with a helper idle before it"


def test_a_batch_already_queued_by_workers_is_no_barrier():
    """8 DataLoader workers ahead of a toy model: each `__next__` of the multiprocessing iterator took 28-97 µs and its
    wait frames (the pin-memory queue's lock) under 50 µs: the batch was there when asked. The replay holds none of
    them as a barrier, so CPU time taken out before one moves it (and the call keeps its own time)."""
    from analyzer.views.idle import worker_input_waits
    from analyzer.views.replay import NEVER
    path = _handoff_path("external/rtx3080-toy-mlp-dataloader-8-workers.json.gz")
    ctx = context(path)
    waits = worker_input_waits(ctx.model)
    assert len(waits) == 3 and (waits[:, 3] == NEVER).all()
    rp = ctx.replay
    mine = np.flatnonzero((rp.sync_rows < 0) & (rp.sync_follows < 0))
    assert len(mine) == 3 and (rp.sync_wait_ns[mine] == 0).all()
    k = mine[-1]
    tid, start = rp.tids[rp.sync_thread[k]], int(rp.sync_start_ns[k])
    base = rp.run()
    out = rp.run(np.array([[tid, start - 20_000, start]]))
    calls = rp.runtime_rows[rp.sync_thread[k]]
    after = calls[ctx.model.runtime.start_ns[calls] > rp.sync_end_ns[k]]
    first = after[np.argmin(ctx.model.runtime.start_ns[after])]
    assert base.runtime_start_ns[first] - out.runtime_start_ns[first] == 20_000


def test_a_guessed_profiler_cost_takes_only_time_recorded_events_cover():
    """A trace with no probe of its own (the project's probes stand in): the cost taken out of each thread lies
    inside the time its recorded ops, Python calls and runtime calls span; what no event covers is the program's.
    The same trace with a probe of its own (this capture's, measured) is not clipped."""
    from analyzer.views.profiler_cost import ProfilerCost, event_costs
    from analyzer.views.timeline import intersect_intervals
    ctx = context(_handoff_path("external/a100-particle-transformer-warm-forward.json.gz"))
    costs = event_costs(ctx)
    assert costs.estimated
    cost = ProfilerCost(ctx, ctx.replay, costs)
    for scale in (1.0, 3.0):
        for code, (s, e, _) in enumerate(cost.cut(scale)):
            inside_s, inside_e = intersect_intervals(s, e, *cost.covered[code])
            assert (inside_e - inside_s).sum() == (e - s).sum()
    probed = dataclasses.replace(costs, source="probe")
    unclipped = ProfilerCost(ctx, ctx.replay, probed)
    assert unclipped.covered is None
    assert sum((e - s).sum() for s, e, _ in unclipped.cut()) > sum((e - s).sum() for s, e, _ in cost.cut())
