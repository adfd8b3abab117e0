"""Trace checks for the profiler settings a rule depends on: Python stacks (with_stack), input shapes (record_shapes),
step annotations (a schedule's ProfilerStep, record_function step ranges) and memory events (profile_memory). All
are off by default in torch.profiler, so most traces users bring lack some: each check says what cannot be told
without its setting, and lowers the confidence of the findings that rest on it (analyzer.views.validity)."""
from __future__ import annotations

import numpy as np

from analyzer.arrays import distinct
from analyzer.trace.joins import thread_keys
from analyzer.units import plural
from analyzer.views.setup import SHAPES_RECORDED
from analyzer.views.waits import present_codes


def setting_checks(ctx, check) -> list:
    """The four checks, where the host side is recorded at all (without CPU ops, host_side_recorded says it)."""
    model = ctx.model
    if not len(model.ops):
        return []
    return [_python_stacks(model, check), _input_shapes(model, check), _step_annotations(ctx, check),
            _memory_events(model, check)]


def _python_stacks(model, check):
    frames, rt = model.frames, model.runtime
    linked = rt.gpu >= 0
    launching, framed = thread_keys([rt.pid[linked], frames.pid], [rt.tid[linked], frames.tid])
    threads = distinct(launching)
    on_launching = int(np.isin(threads, distinct(framed)).sum())
    measured = {"python_frames": int(len(frames)), "launching_threads": int(len(threads)),
                "launching_threads_with_frames": on_launching}
    if len(frames) and (on_launching or not len(threads)):
        return check("python_stacks", "ok", measured,
                     f"Python stacks are recorded ({plural(len(frames), 'frame')}): gaps are named by the code that "
                     f"ran", frozenset())
    return check("python_stacks", "warn", measured,
                 "no Python stacks on the threads that launch GPU work (with_stack=False, torch.profiler's default): "
                 "a gap is named by the op running in it or by the launch that ended it, not by the code that ran; "
                 "time spent in pure Python is untraced, and another thread holding the GIL cannot be seen. Record "
                 "with with_stack=True", frozenset({"host_work"}))


def _input_shapes(model, check):
    ops, names = model.ops, model.names
    library = np.zeros(len(names), bool)
    for code in present_codes(ops.name, len(names)).tolist():
        library[code] = "::" in names[code]
    lib = ~ops.is_annotation.astype(bool) & library[ops.name] if len(ops) else np.zeros(0, bool)
    with_shape = int((lib & (ops.shape >= 0)).sum())
    measured = {"library_ops": int(lib.sum()), "with_input_dims": with_shape}
    if lib.sum() and with_shape >= SHAPES_RECORDED * lib.sum():
        return check("input_shapes", "ok", measured,
                     f"input shapes are recorded ({with_shape} of {int(lib.sum())} library ops): a slow first call at "
                     f"a new shape is named set-up", frozenset())
    return check("input_shapes", "warn", measured,
                 "no input shapes (record_shapes=False, torch.profiler's default): a library op's slow call cannot be "
                 "told to be its first at a new shape (cuDNN / cuBLAS set-up, paid once per shape) rather than a "
                 "thread that lost its core, so no set-up per shape is named. Record with record_shapes=True",
                 frozenset({"host_work"}))


def _step_annotations(ctx, check):
    steps = ctx.steps
    measured = {"steps": len(steps), "source": steps.source if len(steps) else None}
    if len(steps) >= 2:
        return check("step_annotations", "ok", measured,
                     f"{plural(len(steps), 'step')} from {steps.source}: costs are stated per step, and what recurs "
                     f"is told from what is paid once", frozenset())
    return check("step_annotations", "warn", measured,
                 ("one step" if len(steps) else "no step annotations") +
                 " (no ProfilerStep from a torch.profiler schedule with prof.step(), no record_function step "
                 "ranges): whether a cost recurs or is paid once cannot be told from repeated steps, and savings are "
                 "stated over the window. Profile with schedule(wait=1, warmup=1, active=N) and call prof.step() each "
                 "iteration", frozenset({"warmup", "shape_setup"}))


def _memory_events(model, check):
    mem = model.memory
    device = int((mem.device_type == 1).sum()) if len(mem) else 0
    measured = {"memory_events": int(len(mem)), "device_memory_events": device}
    if len(mem):
        return check("memory_events", "ok", measured,
                     f"memory events are recorded ({plural(len(mem), 'event')}): allocation sizes, peaks and growth "
                     f"are known", frozenset())
    return check("memory_events", "warn", measured,
                 "no memory events (profile_memory=False, torch.profiler's default): allocation sizes, reserved "
                 "memory, its peak and a buffer that grows are unknown; churn is judged from the allocator's "
                 "runtime calls alone. Record with profile_memory=True", frozenset({"allocator_fragmentation"}))
