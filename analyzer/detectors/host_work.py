"""Host work: launch-gap pieces of at least a millisecond (analyzer.views.host_during.LONG_NS), grouped by the function
responsible: the innermost user function that covers at least half of the piece on the launching thread, else the
op that ran, else the launch site; with the library code it ran in, and what the thread did there (recorded work, or
untraced host time). Owns the long pieces of cause cpu_launch (but a graph break's, which graph_breaks owns)."""
from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from analyzer.detectors.base import AnalysisContext, DetectorResult, Finding, severity_for, share_text
from analyzer.detectors.host_work_text import HOST_RELEASE_ADVICE, UNTRACED_ADVICE, held_by_text, \
    host_release_text, host_work_advice, tail_op_advice
from analyzer.trace.joins import Intervals, holding_any, thread_keys
from analyzer.units import us
from analyzer.views import apis
from analyzer.views.frames import FrameKind, describe_frame
from analyzer.views.host_during import LONG_NS
from analyzer.views.idle import HOST_WORK
from analyzer.views.sites import KIND_OP, describe_site, frames_key, op_key, piece_site_keys, site_keys
from analyzer.views.timeline import merge_intervals
from analyzer.views.traits import TraceTraits
from analyzer.views.whatif import Fix

PIN_MEMORY_FRAME = re.compile(r"(?:^|/)torch/utils/data/_utils/pin_memory\.py\(\d+\): _pin_memory_loop$")
EVENT_QUERY = frozenset({"cudaEventQuery", "hipEventQuery", "cuEventQuery"})
ALLOCATION_OP = re.compile(r"^aten::(new_)?empty")
CHILD_SHARE = 0.10  # a library is shown under the host-work finding when it holds this share
MAX_LIBRARIES = 4  # library children under one host-work finding


def long_pieces(ctx: AnalysisContext) -> np.ndarray:
    """The pieces this detector owns: cause host_work (launch gaps of at least LONG_NS outside graph breaks)."""
    return np.flatnonzero(ctx.idle.cause == HOST_WORK)


def detect(ctx: AnalysisContext) -> DetectorResult:
    host_work, fixes = _host_work(ctx, long_pieces(ctx))
    findings = _host_work_findings(host_work, fixes, ctx.timeline.window_ns / 1e3, LONG_NS / 1e3, ctx.traits)
    return DetectorResult({"host_work": host_work}, tuple(findings))


def _host_work(ctx: AnalysisContext, sel: np.ndarray) -> tuple[list[dict], list[Fix]]:
    """Long CPU pieces grouped by the function responsible: the innermost user function that covers at least half
    of the piece on the launching thread (a helper, not the generator expression inside it, nor its caller when
    the helper alone ran), else the op that ran, else the launch site. With each group, its fix: the responsible
    function's (or op's) whole run taken out, or only the idle piece where that run is over twice as long."""
    model, idle = ctx.model, ctx.idle
    if not len(sel):
        return [], []
    rows = ctx.gaps.thread_row[idle.gap[sel]]  # the launching thread's (the tail's: the last work's) runtime rows
    lo, hi = idle.start_ns[sel], idle.end_ns[sel]
    middle = lo + (hi - lo) // 2
    at_middle = _innermost_at(ctx, rows, middle)
    op_at_middle = _outer_op_at(ctx, rows, middle)
    launch_keys = piece_site_keys(ctx, sel).tolist()
    tids = model.runtime.tid[rows]
    groups: dict[int, list[int]] = defaultdict(list)
    work: dict[int, set] = defaultdict(set)
    owners: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # (user frame, piece start, piece end)
    untraced: dict[int, int] = defaultdict(int)  # ns of the group's pieces that nothing recorded inside covers
    bare: dict[int, bool] = {}  # the group's pieces have no recorded context at all (named by the next launch)
    at_end: dict[int, bool] = {}  # the group's pieces are all the window's tail (after its last GPU work)
    during = ctx.host_during
    owner_of: dict[int, int] = {}
    host_memory: dict[int, list[tuple[int, int]]] = defaultdict(list)  # (piece, [memory] row) in untraced pieces
    held: dict[tuple[int, int], list[int]] = defaultdict(list)  # (thread, its site) -> untraced pieces it held
    for i, (piece, frame) in enumerate(zip(sel.tolist(), at_middle.tolist())):
        d = during.of(piece)
        if d >= 0 and during.held[d]:
            other = int(during.other_frame[d])
            held[(int(model.frames.tid[other]), _frame_site_key(ctx, other))].append(piece)
            continue
        key, span, owner = _responsible(ctx, frame, int(lo[i]), int(hi[i]), launch_keys[i], int(op_at_middle[i]))
        groups[key].append(piece)
        owner_of[piece] = owner
        # an op's own time is its C++ code running (e.g. cuDNN's heuristics), not time the trace failed to record;
        # an op that only launched the work after the piece (the key came from the launch: no span) did not run in it
        if d >= 0 and during.untraced[d] and (key >> 60 != KIND_OP or span is None):
            untraced[key] += int(hi[i] - lo[i])
            if during.host_memory[d] >= 0:
                host_memory[key].append((piece, int(during.host_memory[d])))
        bare[key] = bare.get(key, True) and span is None
        at_end[key] = at_end.get(key, True) and bool(ctx.gaps.tail[idle.gap[piece]])
        if owner >= 0:
            owners[key].append((owner, int(lo[i]), int(hi[i])))
        a, b = span if span and span[1] - span[0] <= 2 * (hi[i] - lo[i]) else (int(lo[i]), int(hi[i]))
        work[key].add((int(tids[i]), a, b))
    out = []
    for key, members in groups.items():
        members.sort(key=lambda p: -(idle.end_ns[p] - idle.start_ns[p]))
        lead = members[0]
        lead_frame = int(at_middle[np.searchsorted(sel, lead)])
        site = describe_site(ctx, key, lead_frame)
        durations = [us(idle.end_ns[p] - idle.start_ns[p]) for p in members]
        d = during.of(lead)
        inner = int(during.frame[d]) if d >= 0 else -1  # the innermost frame spanning the longest piece
        inner_name = model.names[model.frames.name[inner]] if inner >= 0 else ""
        # (Kineto also records a call through a function object as `<function f at 0x...>`: the same function)
        innermost = describe_frame(inner_name) if inner >= 0 and not inner_name.startswith("<function ") \
            and _below(model.frames, inner, owner_of[lead]) else None
        out.append(({"call_site": site["label"], "site": site, "count": len(members),
                     "idle_us": round(sum(durations), 3), "max_us": max(durations),
                     "untraced_us": us(untraced[key]), "recorded_context": not bare[key],
                     "window_end": at_end[key],
                     "innermost": innermost if innermost != site["label"] else None,
                     "context": model.frame_chain(lead_frame, 8) if lead_frame >= 0 else [],
                     "launch_site": describe_site(ctx, int(piece_site_keys(ctx, np.array([lead]))[0]))["label"],
                     "libraries": _library_children(ctx, owners.get(key, [])),
                     "host_memory": _host_memory(ctx, host_memory.get(key, [])),
                     "tail_op": _tail_op(ctx, lead) if not untraced[key] else None,
                     "occurrences": [(us(idle.start_ns[p]), us(idle.end_ns[p])) for p in members[:16]]},
                    Fix(f"{site['label']} taken out of the step (or overlapped with GPU work)",
                        np.asarray(sorted(work[key]), np.int64).reshape(-1, 3), python_code=key >> 60 != KIND_OP)))
    out += [_held_by_another_thread(ctx, tid, key, members) for (tid, key), members in held.items()]
    out.sort(key=lambda h: -h[0]["idle_us"])
    return [h for h, _ in out], [f for _, f in out]


def _frame_site_key(ctx: AnalysisContext, frame: int) -> int:
    """A frame's site: its user function (and the library frame inside), else the frame itself."""
    return int(site_keys(ctx, np.array([frame]), np.array([-1]), np.array([-1]))[0])


def _held_by_another_thread(ctx: AnalysisContext, tid: int, key: int, pieces: list[int]) -> tuple[dict, Fix]:
    """Untraced pieces of the launching thread while another thread of the process ran Python (host_during's
    other_frame): one group per (thread, its code), the launching thread's stalls as its fix."""
    idle, during, model = ctx.idle, ctx.host_during, ctx.model
    pieces.sort(key=lambda p: -(idle.end_ns[p] - idle.start_ns[p]))
    lead = pieces[0]
    other, binding = int(during.other_frame[during.of(lead)]), int(during.binding[during.of(lead)])
    site = describe_site(ctx, key, other)
    durations = [us(idle.end_ns[p] - idle.start_ns[p]) for p in pieces]
    thread = ctx.gaps.thread_row[idle.gap[pieces]]
    launching = {int(t) for t in model.runtime.tid[thread].tolist()}
    work = np.array([(model.runtime.tid[r], idle.start_ns[p], idle.end_ns[p]) for r, p in zip(thread, pieces)],
                    np.int64).reshape(-1, 3)
    group = {"call_site": site["label"], "site": site, "count": len(pieces), "idle_us": round(sum(durations), 3),
             "max_us": max(durations), "untraced_us": round(sum(durations), 3), "recorded_context": True,
             "innermost": None, "context": model.frame_chain(other, 8), "launch_site": None, "libraries": [],
             "host_memory": None, "tail_op": None,
             "held_by": {"tid": tid, "role": _thread_role(ctx, tid), "launching_tids": sorted(launching),
                         "frame": model.names[model.frames.name[other]],
                         "binding": model.names[model.frames.name[binding]] if binding >= 0 else None},
             "occurrences": [(us(idle.start_ns[p]), us(idle.end_ns[p])) for p in pieces[:16]]}
    return group, Fix(f"{site['label']} moved off the GIL (another process, or native code that releases it; "
                      f"averaged over the steps, as that thread's work falls in some of them)", work, averaged=True,
                      python_code=True)


def _thread_role(ctx: AnalysisContext, tid: int) -> str:
    """What another thread is, where the trace says: autograd's backward thread (it runs the autograd engine's ops),
    DataLoader's pin-memory thread (its loop's frames), else a thread of the user's."""
    model = ctx.model
    ops = np.flatnonzero(model.ops.tid == tid)
    if len(ops) and any(model.names[c].startswith("autograd::engine::") for c in np.unique(model.ops.name[ops])):
        return "autograd's backward thread"
    frames = np.flatnonzero(model.frames.tid == tid)
    if len(frames) and any(PIN_MEMORY_FRAME.search(model.names[c]) for c in np.unique(model.frames.name[frames])):
        return "DataLoader's pin-memory thread"
    return "another thread"


def _tail_op(ctx: AnalysisContext, piece: int) -> dict | None:
    """The library op the launching thread was inside for at least half of the piece, up to the launch that ended
    it (host_during.tail_op), with the CPU time of its other calls in the window to compare."""
    during, idle, ops = ctx.host_during, ctx.idle, ctx.model.ops
    d = during.of(piece)
    row = int(during.tail_op[d]) if d >= 0 else -1
    lo, hi = int(idle.start_ns[piece]), int(idle.end_ns[piece])
    if row < 0 or 2 * (hi - int(ops.start_ns[row])) < hi - lo:
        return None
    same = np.flatnonzero((ops.name == ops.name[row]) & ~ops.is_annotation.astype(bool))
    others = same[same != row]
    durations = ops.end_ns[others] - ops.start_ns[others]
    return {"op": ctx.model.names[ops.name[row]], "in_gap_us": us(hi - int(ops.start_ns[row])),
            "cpu_us": us(int(ops.end_ns[row] - ops.start_ns[row])), "other_calls": int(len(others)),
            "other_median_us": us(float(np.median(durations))) if len(others) else None,
            **_calls_inside(ctx, row, hi)}


def _calls_inside(ctx: AnalysisContext, op: int, hi: int) -> dict:
    """The runtime calls the op's thread made from the op's start to hi: by API, launches aside, most time first (at
    most three, each of at least a microsecond); and how many were event queries inside an allocation op
    (aten::empty*), the caching allocator checking the events of blocks another stream used before it reuses them."""
    rt, ops, names = ctx.model.runtime, ctx.model.ops, ctx.model.names
    inside = np.flatnonzero((rt.pid == ops.pid[op]) & (rt.tid == ops.tid[op]) & (rt.start_ns >= ops.start_ns[op])
                            & (rt.start_ns < hi)) if len(rt) else np.zeros(0, np.int64)
    totals: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    polls = 0
    for r in inside.tolist():
        api = names[rt.name[r]]
        polls += api in EVENT_QUERY and rt.op[r] >= 0 and bool(ALLOCATION_OP.match(names[ops.name[rt.op[r]]]))
        if api not in apis.LAUNCH:
            totals[int(rt.name[r])][0] += 1
            totals[int(rt.name[r])][1] += int(min(rt.end_ns[r], hi) - rt.start_ns[r])
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:3]
    return {"runtime_calls": [{"api": names[code], "count": n, "us": us(ns)} for code, (n, ns) in ranked
                              if ns >= 1000],
            "allocator_event_queries": int(polls)}


def _host_memory(ctx: AnalysisContext, found: list[tuple[int, int]]) -> dict | None:
    """The largest host allocation or release recorded inside the group's untraced pieces (host_during): its size,
    where in its piece it was recorded, and how many of the pieces hold one."""
    if not found:
        return None
    mem, idle = ctx.model.memory, ctx.idle
    piece, row = max(found, key=lambda f: abs(int(mem.bytes[f[1]])))
    lo, hi, at = int(idle.start_ns[piece]), int(idle.end_ns[piece]), int(mem.ts_ns[row])
    edge = (hi - lo) // 10
    return {"bytes": int(mem.bytes[row]), "pieces": len(found), "at_us": us(at),
            "where": "end" if at >= hi - edge else "start" if at <= lo + edge else "middle"}


def _below(frames, row: int, ancestor: int) -> bool:
    """Whether the frame row runs inside (strictly below) the ancestor frame row."""
    hops, row = 0, int(frames.parent[row])
    while row >= 0 and hops < 256:  # the bound also guards a malformed (cyclic) parent chain
        if row == ancestor:
            return True
        row, hops = int(frames.parent[row]), hops + 1
    return False


def _library_children(ctx: AnalysisContext, owned: list[tuple[int, int, int]]) -> list[dict]:
    """The idle of one host-work group by the third-party library code its function ran in: the outermost library
    frames called from that function (directly or through its own helpers), each one's overlap with the group's idle
    pieces, summed by library function, largest first."""
    if not owned:
        return []
    fr, index = ctx.model.frames, ctx.frames
    owner = np.array([o for o, _, _ in owned], np.int64)
    lo, hi = np.array([a for _, a, _ in owned], np.int64), np.array([b for _, _, b in owned], np.int64)
    found = np.zeros(0, np.int64)
    if len(fr):
        s, e = merge_intervals(lo, hi)
        i = np.maximum(np.searchsorted(s, fr.start_ns, side="right") - 1, 0)
        near = holding_any(fr.start_ns, fr.end_ns, np.r_[lo, hi - 1]) | ((fr.start_ns >= s[i]) & (fr.start_ns < e[i]))
        rows = np.flatnonzero(near & (index.kind == FrameKind.LIBRARY))
        parent = fr.parent[rows]
        outer = (parent < 0) | (index.kind[np.maximum(parent, 0)] != FrameKind.LIBRARY)
        found = rows[outer]
        # a library frame under user code that a library called (a callback, a module's forward) is inside an outer
        # library frame's time already: only the outermost in time count
        order = np.lexsort((-fr.end_ns[found], fr.start_ns[found], fr.tid[found], fr.pid[found]))
        found = found[order]
        same = np.r_[False, (fr.pid[found][1:] == fr.pid[found][:-1]) & (fr.tid[found][1:] == fr.tid[found][:-1])]
        keep = np.ones(len(found), bool)
        reach = -1
        for k, row in enumerate(found.tolist()):
            if same[k] and fr.start_ns[row] < reach:
                keep[k] = False
                continue
            reach = int(fr.end_ns[row]) if not same[k] else max(reach, int(fr.end_ns[row]))
        found = found[keep]
    totals: dict[int, int] = defaultdict(int)
    for row in found.tolist():
        user, hops = index.user_frame_of(row), 0
        while user >= 0 and hops < 64 and user not in owner:  # a helper of the owner's still counts for it
            parent = int(fr.parent[user])
            user, hops = (index.user_frame_of(parent) if parent >= 0 else -1), hops + 1
        if user < 0:
            continue
        k = np.flatnonzero(owner == user)
        overlap = np.minimum(hi[k], fr.end_ns[row]) - np.maximum(lo[k], fr.start_ns[row])
        totals[int(fr.name[row])] += int(overlap[overlap > 0].sum())
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return [{"library_site": describe_frame(ctx.model.names[code]), "idle_us": us(ns)} for code, ns in ranked if ns]


def _innermost_at(ctx: AnalysisContext, rows: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """The innermost Python frame active at t on the thread of each runtime row (-1 where none)."""
    frames = ctx.model.frames
    return _enclosing_at(ctx, frames, np.arange(len(frames)), rows, t_ns)


def _enclosing_at(ctx: AnalysisContext, table, candidates: np.ndarray, rows: np.ndarray,
                  t_ns: np.ndarray) -> np.ndarray:
    """Per runtime row: the innermost of the table's candidate rows on its thread that encloses the instant t (-1
    where none). Only the candidates holding one of the instants are searched (joins.holding_any)."""
    rt = ctx.model.runtime
    if not len(candidates) or not len(rows) or not len(rt):
        return np.full(len(rows), -1, np.int64)
    near = candidates[holding_any(table.start_ns[candidates], table.end_ns[candidates], t_ns)]
    safe = np.maximum(rows, 0)
    keys, query_keys = thread_keys([table.pid[near], rt.pid[safe]], [table.tid[near], rt.tid[safe]])
    found = Intervals(keys, table.start_ns[near], table.end_ns[near], sorted_by_start=True).innermost_enclosing(
        np.where(rows >= 0, query_keys, -1), t_ns, t_ns + 1)
    return np.where((rows >= 0) & (found >= 0), near[np.maximum(found, 0)] if len(near) else -1, -1)


def _responsible(ctx: AnalysisContext, frame: int, lo: int, hi: int, launch_key: int,
                 op: int) -> tuple[int, tuple[int, int] | None, int]:
    """The site key of what ran during [lo, hi), that function's (or op's) whole run where known, and the user
    frame row responsible (-1 none). A user function is one site whatever library it was in at the middle: the
    library frames are its children (_library_children)."""
    model, index = ctx.model, ctx.frames
    fr = model.frames
    if frame >= 0:
        user = index.user_frame_of(frame)
        chosen, outermost, hops = -1, -1, 0
        while user >= 0 and hops < 256:  # the bound also guards a malformed (cyclic) parent chain
            hops += 1
            covered = min(int(fr.end_ns[user]), hi) - max(int(fr.start_ns[user]), lo)
            outermost = user
            if covered * 2 >= hi - lo:
                chosen = user
                break
            parent = int(fr.parent[user])
            user = index.user_frame_of(parent) if parent >= 0 else -1
        chosen = chosen if chosen >= 0 else outermost
        lib = index.library_frame_of(frame)  # inside the user frame at the middle, so inside `chosen` too
        lib_code = int(fr.name[lib]) if lib >= 0 else -1
        if chosen >= 0 or lib >= 0:
            run = chosen if chosen >= 0 else lib
            key = frames_key(int(fr.name[chosen]), -1) if chosen >= 0 else frames_key(-1, lib_code)
            return key, (int(fr.start_ns[run]), int(fr.end_ns[run])), chosen
    if op >= 0:
        return op_key(int(model.ops.name[op])), (int(model.ops.start_ns[op]), int(model.ops.end_ns[op])), -1
    return launch_key, None, -1


def _outer_op_at(ctx: AnalysisContext, rows: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """The outermost op running at t on the thread of each runtime row (-1 where none)."""
    ops = ctx.model.ops
    found = _enclosing_at(ctx, ops, np.flatnonzero(~ops.is_annotation.astype(bool)), rows, t_ns)
    return np.where(found >= 0, ctx.outermost_ops[np.maximum(found, 0)], -1) if len(ops) else found


def _host_work_findings(host_work: list[dict], fixes: list[Fix], window_us: float,
                        long_gap_us: float, traits: TraceTraits) -> list[Finding]:
    out = []
    for k, (h, fix) in enumerate(zip(host_work, fixes)):
        libraries = [lib for lib in h["libraries"] if lib["idle_us"] >= CHILD_SHARE * h["idle_us"]][:MAX_LIBRARIES]
        untraced = h["untraced_us"] * 2 >= h["idle_us"]
        if h.get("held_by"):
            what, advice = held_by_text(h, long_gap_us)
        elif not untraced and h["tail_op"]:
            what, advice = f"while the CPU ran {h['tail_op']['op']} in {h['call_site']}", tail_op_advice(h, traits.hip)
        elif not untraced:
            what, advice = f"while the CPU ran {h['call_site']}", host_work_advice(h["site"], traits.graphs.replayed)
        elif h["host_memory"] and h["host_memory"]["bytes"] < 0 and h["host_memory"]["where"] != "middle":
            # (the event is written at one end of the release: one in the middle of a gap does not account for it)
            inner = f" → {h['innermost']}" if h.get("innermost") else ""
            title, first = host_release_text(h)
            what, advice = f"inside {h['call_site']}{inner}{title}", first + HOST_RELEASE_ADVICE
        elif h["recorded_context"]:
            inner = f" → {h['innermost']}" if h.get("innermost") else ""
            what = f"in untraced host time inside {h['call_site']}{inner} (nothing recorded under it)"
            advice = UNTRACED_ADVICE
        elif h.get("window_end"):
            what = "after the window's last GPU work, in untraced host time (nothing recorded on the launching thread)"
            advice = UNTRACED_ADVICE
        else:
            what = f"in untraced host time (nothing recorded on the launching thread) before {h['call_site']}"
            advice = UNTRACED_ADVICE
        out.append(Finding(
            kind="host_work", severity=severity_for(h["idle_us"], window_us),
            title=f"GPU idle {h['count']}x for over {long_gap_us / 1e3:g} ms (max {h['max_us'] / 1e3:.1f} ms) {what}",
            call_site=h["call_site"], library_site=None if libraries else h["site"]["library_below"],
            impact_us=h["idle_us"], count=h["count"], id=f"host_work.{k}",
            advice=advice,
            detail={"context": h["context"], "launch_site": h["launch_site"], "site": h["site"],
                    "libraries": h["libraries"], "host_memory": h["host_memory"], "tail_op": h["tail_op"],
                    "held_by": h.get("held_by")},
            occurrences_us=tuple(tuple(o) for o in h["occurrences"]), fix=fix))
        for j, lib in enumerate(libraries):
            out.append(Finding(
                kind="host_work", severity=severity_for(lib["idle_us"], window_us),
                title=f"of which {share_text(lib['idle_us'], h['idle_us'])} in {lib['library_site']}",
                call_site=h["call_site"], library_site=lib["library_site"], impact_us=lib["idle_us"],
                id=f"host_work.{k}.{j}", parent=f"host_work.{k}",
                advice="Library code the function above called: a cheaper call, a smaller input, or the same work "
                       "on the GPU (torch ops on the device) removes this part.",
                detail={}))
    return out
