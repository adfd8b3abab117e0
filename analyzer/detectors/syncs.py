"""Implicit (and explicit) host syncs: each blocking call, its cause (.item(), print, .cpu(), nonzero, pageable
copies, synchronize), the time the CPU waited, and the GPU drain it caused, grouped by the user's call site."""
from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from analyzer.views import apis
from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, SiteTable, severity_for
from analyzer.units import fmt_us, us
from analyzer.views.frames import op_chain, outermost_op, parse_frame
from analyzer.views.idle import SYNC
from analyzer.views.instrumentation import PROFILER_FRAME
from analyzer.views.sites import describe_site, site_keys, site_phrase
from analyzer.trace import GpuKind
from analyzer.views.whatif import Fix

_MASK_OPS = {"aten::nonzero", "aten::nonzero_static", "aten::masked_select", "aten::unique", "aten::_unique2",
             "aten::unique_consecutive", "aten::repeat_interleave", "aten::masked_scatter",
             "aten::argwhere", "aten::bincount", "aten::histc"}
ADVICE = {
    "branch": "A Python `if` / `while` / `and` / `or` / `bool()` on a CUDA tensor (e.g. `if logits.max() > limit:`) "
              "copies the value to the host and waits for the GPU to drain, so the CPU stops launching. Keep the "
              "decision on the GPU (torch.where, masked_fill, clamp), check the condition every N steps or on "
              "values already copied to the host, or decide from host-side state you already have.",
    "item": "`.item()` copies one value to the host and waits for the GPU to drain. Keep the value on the GPU "
            "(compare, select and accumulate with tensor ops) and read results once at the end, or copy with "
            "non_blocking=True into pinned memory and read it a step later.",
    "print": "Printing or formatting a CUDA tensor copies it to the host and synchronizes (several times per "
             "print). Log only every N steps, or log values already copied to the host asynchronously.",
    "copy_to_host": "A device-to-host copy (.tolist() / .cpu() / .numpy() / .to('cpu')) waits for the GPU. Batch "
                    "the reads into one copy per step (or per run), into pinned memory with non_blocking=True.",
    "nonzero": "nonzero / boolean-mask indexing needs the result size on the host, so it syncs. Use fixed-size "
               "alternatives (torch.where with a fill value, masked_fill, gather with precomputed indices) or "
               "nonzero_static with a size bound.",
    "pageable_h2d": "A host-to-device copy from pageable memory (torch.tensor(python_data, device='cuda'), "
                    ".to('cuda') of an unpinned tensor) blocks the CPU. Build inputs once, or pin them "
                    "(.pin_memory()) and copy with non_blocking=True.",
    "explicit_sync": "An explicit synchronize drains the GPU queue. Remove it from the hot loop; where ordering is "
                     "needed, use CUDA events or stream waits instead.",
    "other": "A call here blocks the CPU until the GPU finishes. Move it out of the step or make it asynchronous.",
}
IDLE_FREE = (" In this window it cost no GPU idle time: the GPU kept running work queued after what the call waited "
             "for, or had nothing left before the call (that idle is another finding's). It costs when the GPU runs "
             "its queue dry while the CPU waits.")
UNRECORDED_WAIT_ADVICE = (
    "{idle} of the GPU idle in these {api} calls began with nothing left running on the GPU and lasted far longer "
    "than the GPU work the calls issued: they waited for something this trace does not show (another process's work "
    "on the GPU, a first-time initialization in the runtime). Look at it in Nsight Systems before changing the code; "
    "the saving below counts only what the recorded work explains. ")
LABEL = {"branch": "`if` / bool() on a GPU tensor", "item": ".item()", "print": "print(tensor)",
         "copy_to_host": "device-to-host copy",
         "nonzero": "nonzero / boolean mask", "pageable_h2d": "pageable host-to-device copy",
         "explicit_sync": "explicit synchronize", "profiler": "profiler", "other": "synchronizing call"}
DETAIL_LABEL = {("print", "format"): "formatting a tensor (f-string / format())",
                ("print", "repr"): "str() / repr() of a tensor", ("copy_to_host", "tolist"): ".tolist()",
                ("copy_to_host", "numpy"): ".numpy()", ("copy_to_host", "cpu"): ".cpu()",
                ("copy_to_host", "to"): ".to('cpu')"}


def label(kind: str, detail: str | None) -> str:
    """What the Python did, as precisely as the op and frame chains say."""
    return DETAIL_LABEL.get((kind, detail), LABEL[kind])


def _classify(ctx: AnalysisContext, row: int, copy_name: str | None) -> tuple[str, str | None]:
    """(kind, api detail) from the op chain, the frame chain and the copy direction."""
    model = ctx.model
    frames = model.frame_chain(int(model.runtime.frame[row])) if model.runtime.frame[row] >= 0 else []
    ops = op_chain(model, int(model.runtime.op[row])) if model.runtime.op[row] >= 0 else []
    joined = " ".join(frames)
    if ctx.instrumentation[row] or any(PROFILER_FRAME.search(f) for f in frames):
        return "profiler", None
    dunder = [f.rsplit(": ", 1)[-1] for f in frames if "torch/_tensor.py" in f and
              f.endswith(("): __repr__", "): __format__", "): __str__"))]
    if "<built-in function print>" in joined:
        return "print", "print"
    if dunder or "_tensor_str.py" in joined:
        return "print", "format" if "__format__" in dunder else "repr"
    if "aten::is_nonzero" in ops:  # bool(tensor): a Python if / while / and / or on it
        return "branch", None
    if {"aten::item", "aten::_local_scalar_dense"} & set(ops):
        return "item", None
    mask_ops = _MASK_OPS & set(ops)
    if mask_ops or ("aten::index" in ops and "aten::nonzero" in joined):
        return "nonzero", sorted(mask_ops)[0] if mask_ops else "aten::index"
    if copy_name:
        direction = apis.copy_direction(copy_name)
        if direction and direction[0] == "DtoH":
            api = next((w for w in ("tolist", "numpy", "cpu", "to") if f"method {w} of" in joined), None)
            return "copy_to_host", api
        if direction and direction[0] == "HtoD" and direction[1] in ("Pageable", "Host"):
            return "pageable_h2d", None  # ROCm names pageable host memory "Host"
    name = model.names[model.runtime.name[row]]
    if name in apis.SYNC and ("synchronize" in joined or model.runtime.op[row] < 0):
        return "explicit_sync", name
    return "other", None


def _blocking_events(ctx: AnalysisContext) -> list[list[int]]:
    """Groups of runtime rows that block the CPU once: a copy and the stream sync it forces count once."""
    model = ctx.model
    rt = model.runtime
    classes = ctx.runtime_classes
    copies = ctx.blocking & (classes != apis.IS_SYNC) & (classes != apis.IS_SYNC_COPY)  # pageable async copies
    blocking_copies = set(np.flatnonzero(copies).tolist())
    rows = sorted(np.flatnonzero(ctx.blocking).tolist(), key=lambda r: rt.start_ns[r])
    # D2H copies into pinned memory do not block by themselves but say what the following sync was for
    groups: list[list[int]] = []
    # op row (or, on a thread the profiler records no ops for, the Python frame) -> blocking copies not yet followed
    # by a sync
    pending_copy: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r in rows:
        key = ("op", int(rt.op[r])) if rt.op[r] >= 0 else ("frame", int(rt.frame[r]))
        if key[1] < 0:
            groups.append([r])
            continue
        if r in blocking_copies:
            pending_copy[key].append(r)
            continue
        groups.append(pending_copy.pop(key, []) + [r])
    for copies in pending_copy.values():
        groups.extend([c] for c in copies)
    groups.sort(key=lambda g: rt.start_ns[g[0]])
    return groups


def _copies_by_op(ctx: AnalysisContext) -> dict[int, str]:
    """For every op that launched a memcpy: the first memcpy's GPU name."""
    model = ctx.model
    rt, gpu = model.runtime, model.gpu
    rows = np.flatnonzero((rt.gpu >= 0) & (rt.op >= 0))
    rows = rows[gpu.kind[rt.gpu[rows]] == GpuKind.MEMCPY]
    out: dict[int, str] = {}
    for r in rows.tolist():
        out.setdefault(int(rt.op[r]), model.names[gpu.name[rt.gpu[r]]])
    return out


def _copy_for(ctx: AnalysisContext, group: list[int], copies_by_op: dict[int, str]) -> str | None:
    """The memcpy (by GPU name) this blocking group waits for: its own copy, or a copy launched by the same op."""
    model = ctx.model
    rt, gpu = model.runtime, model.gpu
    for r in group:
        g = int(rt.gpu[r])
        if g >= 0 and gpu.kind[g] == GpuKind.MEMCPY:
            return model.names[gpu.name[g]]
    return copies_by_op.get(int(rt.op[group[-1]]))


def _meta_lines(ctx: AnalysisContext, user_frame: str | None, library_frame: str | None) -> list[dict]:
    """Sync sites that the capture's sync-debug pass recorded inside this trace site's user function (and, when the
    site is inside a library, inside the same library function)."""
    if not ctx.meta or not user_frame:
        return []
    parsed = parse_frame(user_frame)
    if not parsed:
        return []
    file, _, func = parsed
    lib = parse_frame(library_frame) if library_frame else None
    out = []
    for site in ctx.meta.sync_sites:
        f = str(site.get("file", ""))
        if not (site.get("function") == func and f and (file.endswith(f) or f.endswith(file))):
            continue
        lib_file = site.get("library_file")
        if lib and lib_file and not (site.get("library_function") == lib[2] and
                                     (lib[0].endswith(lib_file) or lib_file.endswith(lib[0]))):
            continue
        out.append(site)
    return out


def _exact_site(ctx: AnalysisContext, key: int, frame: int, lines: list[dict]) -> dict:
    """describe_site, with the exact user (and library) line when the sync-debug pass pinned it down."""
    line = lines[0] if len(lines) == 1 else None
    site = describe_site(ctx, key, frame, f"{line['file']}:{line['line']}" if line else None)
    if line and line.get("library_file") and site["library_frame"]:
        site["library_site"] = f"{line['library_file']}:{line['library_line']} in {line['library_function']}()"
        site["library_below"] = site["library_site"]
        site["phrase"] = site_phrase(site)
    return site


def _drains_by_row(ctx: AnalysisContext) -> dict[int, list[tuple[int, int]]]:
    """The idle pieces of cause `sync`, by the blocking runtime row they were cut for, so the drain per call site
    adds up to `gaps.by_cause.sync` exactly."""
    idle = ctx.idle
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for i in np.flatnonzero(idle.cause == SYNC).tolist():
        out[int(idle.row[i])].append((int(idle.start_ns[i]), int(idle.end_ns[i])))
    return out


# A blocking call that begins while the GPU is already idle waits for no recorded work. Its normal cost is its own:
# a pageable copy stages its bytes through a pinned buffer (CPU time of the order of the copy's DMA). A call that
# idles the GPU for over NOTHING_QUEUED_NS, and over STAGING_FACTOR times the GPU work it issued, waited for something
# the trace does not show (another process on the GPU, a first-time initialization in the runtime): said in the
# finding, since the trace cannot tell what pinning or removing it would buy.
NOTHING_QUEUED_NS = 1_000_000
STAGING_FACTOR = 20


def _gpu_ns_by_call(model) -> np.ndarray:
    """Per runtime row: ns of GPU work it launched (copies, kernels)."""
    gpu = model.gpu
    mine = gpu.launch >= 0
    return np.bincount(gpu.launch[mine], weights=(gpu.end_ns[mine] - gpu.start_ns[mine]).astype(np.float64),
                       minlength=len(model.runtime))


def _unrecorded_wait(ctx: AnalysisContext, spans_by_row: dict[int, list[tuple[int, int]]], group: list[int],
                     gpu_ns: np.ndarray) -> int:
    """ns of the group's sync idle in calls that began with the GPU idle and idled it far longer than their own GPU
    work explains."""
    start = ctx.model.runtime.start_ns
    total = 0
    for r in group:
        idle = sum(e - s for s, e in spans_by_row.get(r, ()) if s <= int(start[r]))
        if idle >= NOTHING_QUEUED_NS and idle > STAGING_FACTOR * gpu_ns[r]:
            total += idle
    return total


# the fix removes the whole call for these, not only its wait
WHOLE_CONSTRUCT = ("branch", "item", "copy_to_host", "print", "explicit_sync")
PRINT_FRAME = re.compile(r"<built-in function print>|torch/_tensor\.py\(\d+\): __(format|repr|str)__")


def _construct(ctx: AnalysisContext, kind: str, row: int) -> tuple[int, int] | None:
    """The CPU interval of the Python construct that made this blocking call: the print (or the tensor's
    formatting), the outermost op (aten::item, aten::to), the synchronize call itself."""
    model = ctx.model
    rt = model.runtime
    if kind == "explicit_sync":
        return int(rt.start_ns[row]), int(rt.end_ns[row])
    if kind == "print":
        frames, found, f = model.frames, None, int(rt.frame[row])
        for _ in range(256):
            if f < 0:
                break
            if PRINT_FRAME.search(model.names[frames.name[f]]):
                found = f
            f = int(frames.parent[f])
        if found is not None:
            return int(frames.start_ns[found]), int(frames.end_ns[found])
    op = int(rt.op[row])
    if op >= 0:
        outer = _read_back_op(ctx, op, row)
        if outer >= 0:
            return int(model.ops.start_ns[outer]), int(model.ops.end_ns[outer])
    return None


def _read_back_op(ctx: AnalysisContext, op: int, row: int) -> int:
    """The outermost op around the blocking call that launched no kernel besides the call's own (the read-back's
    copy and wait are no kernels): aten::item, aten::to. An op above it that launched kernels (a compiled graph's
    wrapper, a module's forward recorded as an op) is more than the read-back, and its kernels stay when the
    read-back goes."""
    ops, rt = ctx.model.ops, ctx.model.runtime
    launches = ctx.kernel_launch_starts(int(rt.tid[row]))
    best, cur = -1, op
    for _ in range(64):
        if cur < 0:
            break
        if not ops.is_annotation[cur]:
            lo, hi = np.searchsorted(launches, [ops.start_ns[cur], ops.end_ns[cur]])
            own = np.searchsorted(launches, [rt.start_ns[row], rt.end_ns[row]])
            if (hi - lo) - (own[1] - own[0]) > 0:
                break
            best = cur
        cur = int(ops.parent[cur])
    return best


def _sync_fix(ctx: AnalysisContext, kind: str, detail: str | None, groups: list[list[int]]) -> Fix:
    rt = ctx.model.runtime
    spans = [_construct(ctx, kind, g[-1]) if kind in WHOLE_CONSTRUCT else None for g in groups]
    whole = [(int(rt.tid[g[-1]]), *span) for g, span in zip(groups, spans) if span]
    waits = [r for g, span in zip(groups, spans) if not span for r in g]
    what = {"branch": "the conditions decided without reading the GPU", "print": "the prints removed",
            "item": "the .item() calls removed",
            "copy_to_host": "the device-to-host reads removed", "explicit_sync": "the synchronize calls removed"}
    if kind == "print" and detail in ("format", "repr"):
        what["print"] = "the tensor formatting removed" if detail == "format" else "the str() / repr() removed"
    elif kind == "copy_to_host" and (kind, detail) in DETAIL_LABEL:
        what["copy_to_host"] = f"the {DETAIL_LABEL[(kind, detail)]} reads removed"
    return Fix(what.get(kind, f"the {LABEL[kind]} calls no longer waiting for the GPU (their work still runs)"),
               np.asarray(whole, np.int64).reshape(-1, 3), np.asarray(waits, np.int64))


def detect(ctx: AnalysisContext) -> DetectorResult:
    model, timeline = ctx.model, ctx.timeline
    rt = model.runtime
    steps = ctx.steps
    drained = _drains_by_row(ctx)
    gpu_ns = _gpu_ns_by_call(model)
    sites = SiteTable(sums=("wait_us", "drain_us", "unrecorded_wait_us"))
    copies_by_op = _copies_by_op(ctx)
    groups = _blocking_events(ctx)
    groups_by_site: dict[tuple, list[list[int]]] = defaultdict(list)
    lasts = np.asarray([g[-1] for g in groups], np.int64)
    keys = site_keys(ctx, rt.frame[lasts], rt.op[lasts], rt.name[lasts]).tolist() if len(lasts) else []
    for group, key in zip(groups, keys):
        last = group[-1]
        blocked = max(group, key=lambda r: rt.end_ns[r] - rt.start_ns[r])  # the call the CPU actually waited in
        copy_name = _copy_for(ctx, group, copies_by_op)
        kind, api_detail = _classify(ctx, last, copy_name)
        frame = int(rt.frame[last])
        op = int(rt.op[last])
        op_name = model.names[model.ops.name[outermost_op(model, op)]] if op >= 0 else None
        wait = int(sum(rt.end_ns[r] - rt.start_ns[r] for r in group))
        spans = sorted(span for r in group for span in drained.get(r, ()))
        drain = sum(e - s for s, e in spans)
        unrecorded_wait = _unrecorded_wait(ctx, drained, group, gpu_ns)
        api = model.names[rt.name[blocked]]
        def new_site(frame=frame, key=key, kind=kind, api=api, op_name=op_name, api_detail=api_detail,
                     copy_name=copy_name) -> dict:
            lines = _meta_lines(ctx, ctx.frames.name(ctx.frames.user_frame_of(frame)),
                                ctx.frames.name(ctx.frames.library_frame_of(frame)))
            site = _exact_site(ctx, key, frame, lines)
            return {"call_site": site["label"], "library_site": site["library_below"], "site": site,
                    "frame": site["call_frame"], "kind": kind, "api": api, "apis": defaultdict(int), "op": op_name,
                    "api_detail": api_detail, "copy": copy_name, "per_step": defaultdict(int),
                    "source_lines": [{"file": s["file"], "line": s["line"], "code": s.get("code", "")} for s in lines],
                    "context": ctx.frames.context(frame), "drains_us": [], "_groups": groups_by_site[(key, kind)]}

        entry = sites.add((key, kind), new_site, (us(rt.start_ns[group[0]]), us(rt.end_ns[last])),  # the call(s)
                          wait_us=wait / 1e3, drain_us=drain / 1e3, unrecorded_wait_us=unrecorded_wait / 1e3)
        entry["apis"][api] += 1
        groups_by_site[(key, kind)].append(group)
        step = int(steps.index_at(int(rt.start_ns[last]))) if len(steps) else -1
        entry["per_step"][steps.names[step] if step >= 0 else "(outside steps)"] += 1
        if sites.kept and spans:
            entry["drains_us"].append((us(spans[0][0]), us(spans[-1][1])))  # the GPU idle it caused
    site_list = sites.rows(lambda s: (-s["drain_us"], -s["count"]))
    groups_of = [s.pop("_groups") for s in site_list]
    for s in site_list:
        s["per_step"] = dict(s["per_step"])
        s["apis"] = dict(s["apis"])
        s["api"] = max(s["apis"], key=s["apis"].get)
    window_us = timeline.window_ns / 1e3
    findings = []
    for k, (s, site_groups) in enumerate(zip(site_list, groups_of)):
        if s["kind"] == "profiler":
            continue
        per_step = [v for name, v in s["per_step"].items() if name != "(outside steps)"]
        every = _per_step_text(per_step, s["count"], len(steps), ctx.traits.step_word)
        unrecorded = s["unrecorded_wait_us"] >= s["drain_us"] / 2 > 0
        unseen = f", {fmt_us(s['unrecorded_wait_us'])} of it waiting for no recorded GPU work" if unrecorded else ""
        findings.append(Finding(
            kind="sync", severity=severity_for(s["drain_us"], window_us),
            title=f"{label(s['kind'], s['api_detail'])} blocks the CPU {s['count']}x{every} {s['site']['phrase']}"
                  f"{unseen}",
            call_site=s["call_site"], library_site=s["library_site"],
            impact_us=s["drain_us"], count=s["count"],
            advice=(UNRECORDED_WAIT_ADVICE.format(idle=fmt_us(s["unrecorded_wait_us"]), api=s["api"]) if unrecorded
                    else "") + ADVICE[s["kind"]] + (IDLE_FREE if s["drain_us"] <= 0 else ""), id=f"sync.{k}",
            detail={"kind": s["kind"], "api": s["api"], "op": s["op"], "wait_us": s["wait_us"],
                    "unrecorded_wait_us": s["unrecorded_wait_us"],
                    "context": s["context"], "source_lines": s["source_lines"], "site": s["site"]},
            occurrences_us=tuple(tuple(o) for o in (s["drains_us"] or s["occurrences"])),
            fix=_sync_fix(ctx, s["kind"], s["api_detail"], site_groups)))
    sync_events = int((model.gpu.kind == GpuKind.SYNC).sum())
    totals = {
        "total_blocking_calls": sum(s["count"] for s in site_list),
        "total_wait_us": round(sum(s["wait_us"] for s in site_list), 3),
        "total_drain_us": round(sum(s["drain_us"] for s in site_list), 3),
        "cuda_sync_events": sync_events,
        "meta_sync_sites": ctx.meta.sync_sites if ctx.meta else None,
    }
    # report.json's `syncs` is the list of call sites; the totals sit beside it
    return DetectorResult({"syncs": site_list, "sync_totals": totals}, tuple(findings))


def _per_step_text(per_step: list[int], count: int, steps: int, step_word: str) -> str:
    """How the blocks spread over the steps: ", 2x per step in 3 of 3 steps"; ", all in 1 of 2 steps" where one
    step holds them; nothing with one step (per step says nothing more then)."""
    if not per_step or steps <= 1:
        return ""
    if len(per_step) == 1:
        return f", {'all' if per_step[0] == count else f'{per_step[0]}x'} in 1 of {steps} steps"
    return f", {max(per_step)}x per {step_word} in {len(per_step)} of {steps} steps"
