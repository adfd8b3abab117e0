"""report.json's allocator.snapshot and its findings, from the caching allocator's own records (analyzer.views.
allocations): allocating lines, cache hits per step, the segments at the reserved peak and at the end, what
empty_cache() released and what it cost, and fragmentation."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from analyzer.detectors.base import AnalysisContext, Finding, SiteTable, severity_for
from analyzer.trace.snapshot import (ACTIONS, ALLOC, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP,
                                     SEGMENT_UNMAP)
from analyzer.units import fmt_bytes, us
from analyzer.views.idle import ALLOCATOR

MAX_SEGMENTS = 50
MAX_BLOCKS = 64  # per segment in report.json
SMALL_POOL_SEGMENT = 2 << 20  # the caching allocator's kSmallBuffer: the segment size of its <= 1 MiB pool
FRAGMENTED_SHARE = 0.25  # cached-but-free share of the reserved peak that makes a fragmentation finding
VARYING_SIZES = 3  # distinct request sizes at one line that make "sizes vary per step"


def snapshot_section(ctx: AnalysisContext) -> dict | None:
    records = ctx.allocator_records
    if records is None:
        return None
    snap, e = records.snapshot, records.snapshot.entries
    counts = {name: int((e.action == code).sum()) for code, name in enumerate(ACTIONS)}
    peak, end = _peak(records), _end(records)
    idle_by_row = defaultdict(float)
    idle = ctx.idle
    for i in np.flatnonzero(idle.cause == ALLOCATOR).tolist():
        idle_by_row[int(idle.row[i])] += (idle.end_ns[i] - idle.start_ns[i]) / 1e3
    rt = ctx.model.runtime
    call_of_entry = {int(entry): int(row) for row, entry in zip(records.call_rows.tolist(),
                                                                records.call_entry.tolist()) if entry >= 0}
    sites = SiteTable(sums=("cuda_call_us", "gpu_idle_us"), count=None)
    sizes: dict[str, set] = defaultdict(set)
    steps = ctx.steps
    step_of = steps.index_at(records.entry_ns) if len(steps) and len(e) else np.full(len(e), -1)
    per_step = defaultdict(lambda: {"allocs": 0, "segment_allocs": 0})
    lo_ns = min(d.window_start_ns for d in ctx.timeline.devices) if ctx.timeline.devices else 0
    hi_ns = max(d.window_end_ns for d in ctx.timeline.devices) if ctx.timeline.devices else -1
    interesting = np.flatnonzero(np.isin(e.action, (ALLOC, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP,
                                                    SEGMENT_UNMAP)))
    for k in interesting.tolist():
        action, stack = int(e.action[k]), int(e.stack[k])
        site = records.site(stack)
        if step_of[k] >= 0 and action in (ALLOC, SEGMENT_ALLOC):
            per_step[int(step_of[k])]["allocs" if action == ALLOC else "segment_allocs"] += 1
        if action == ALLOC:
            row = sites.add(site.label, lambda site=site: _new_site(site), allocs=1, bytes_allocated=int(e.size[k]))
            sizes[site.label].add(int(e.size[k]))
            continue
        call = call_of_entry.get(k, -1)
        reserve = action in (SEGMENT_ALLOC, SEGMENT_MAP)
        row = sites.add(site.label, lambda site=site: _new_site(site),
                        (*_when(records, k, call), int(e.size[k]), ACTIONS[action]),
                        **{"segment_allocs" if reserve else "segment_frees": 1,
                           "bytes_reserved" if reserve else "bytes_released": int(e.size[k])},
                        cuda_call_us=(rt.end_ns[call] - rt.start_ns[call]) / 1e3 if call >= 0 else 0.0,
                        gpu_idle_us=idle_by_row.get(call, 0.0),
                        in_window=int(lo_ns <= records.entry_ns[k] <= hi_ns))
        if step_of[k] >= 0:
            row["steps"].add(int(step_of[k]))
    site_list = sites.rows(lambda s: (-(s["segment_allocs"] + s["segment_frees"]), -s["allocs"]))
    for s in site_list:
        s["request_sizes"] = len(sizes.get(s["call_site"], ()))
        s["steps_with_segment_change"] = len(s.pop("steps"))
    return {
        "source": snap.path, "has_history": snap.has_history,
        "history_consistent": all(s["consistent"] for s in records.series.values()), "entries": counts, "alignment": records.alignment,
        "sites": site_list[:50],
        "per_step": [{"step": steps.names[k], **v, "cache_hits": v["allocs"] - v["segment_allocs"]}
                     for k, v in sorted(per_step.items())],
        "peak": peak[0] if peak else None,
        "segments": {"at_peak": _segment_rows(records, peak[1]) if peak else [],
                     "at_end": _segment_rows(records, end[1])},
        "fragmentation": {"at_peak": _fragmentation(peak[0]) if peak else None, "at_end": _fragmentation(end[0]),
                          **_largest_missed(records), **_reserves_despite_cache(records)},
        "empty_cache": _empty_cache(records, call_of_entry, idle_by_row),
        "settings": snap.settings,
    }


def _when(records, entry: int, call: int) -> tuple[float | None, float | None]:
    """An entry's span on the trace clock: its cudaMalloc/cudaFree call when joined, else its own instant."""
    if call >= 0:
        rt = records.model.runtime
        return us(rt.start_ns[call]), us(rt.end_ns[call])
    t = records.entry_ns[entry]
    return (us(t), us(t)) if t >= 0 else (None, None)


def _new_site(site) -> dict:
    return {"call_site": site.label, "line": site.line, "function": site.code, "library_site": site.library_line,
            "stack": list(site.stack), "allocs": 0, "bytes_allocated": 0, "segment_allocs": 0, "segment_frees": 0,
            "bytes_reserved": 0, "bytes_released": 0, "in_window": 0, "steps": set()}


def _peak(records) -> tuple[dict, list[dict]] | None:
    """The moment reserved bytes peaked (over every device's history) and the segments then: of the entries at the
    peak, the one with the most allocated, so that the segment just reserved already holds the request it was for."""
    best = None
    for device, s in records.series.items():
        if not len(s["rows"]):
            continue
        at_peak = s["reserved"] == s["reserved"].max()
        i = int(np.argmax(np.where(at_peak, s["allocated"], -1)))
        if best is None or s["reserved"][i] > best[2]:
            best = (device, int(s["rows"][i]), int(s["reserved"][i]))
    if best is None:
        return None
    device, row, _ = best
    t = records.entry_ns[row]
    segments = [{"device": device, **seg} for seg in records.segments_at(device, row)]
    return {"device": device, "ts_us": us(t) if t >= 0 else None, **_totals(segments)}, segments


def _end(records) -> tuple[dict, list[dict]]:
    """The segments when the snapshot was taken, from its own blocks (with their requested sizes)."""
    segments = []
    for seg in records.snapshot.segments:
        blocks = [{"address": b.address, "size": b.size, "requested": b.requested_size, "stack": b.stack}
                  for b in seg.blocks if b.state != "inactive"]
        allocated = sum(b["size"] for b in blocks)
        segments.append({"device": seg.device, "address": seg.address, "total": seg.total_size,
                         "allocated": allocated, "inactive": seg.total_size - allocated if allocated else 0,
                         "free": 0 if allocated else seg.total_size, "blocks": blocks})
    segments.sort(key=lambda s: (-s["total"], s["address"]))
    return _totals(segments), segments


def _totals(segments: list[dict]) -> dict:
    reserved = sum(s["total"] for s in segments)
    allocated = sum(s["allocated"] for s in segments)
    return {"reserved_bytes": reserved, "allocated_bytes": allocated, "cached_bytes": reserved - allocated,
            "segments": len(segments), "inactive_split_bytes": sum(s["inactive"] for s in segments),
            "free_segment_bytes": sum(s["free"] for s in segments),
            "largest_free_block_bytes": max((_largest_hole(s) for s in segments), default=0)}


def _largest_hole(seg: dict) -> int:
    """The largest contiguous free span of a segment: between its live blocks, or before or after them."""
    edges = [seg["address"]] + [x for b in seg["blocks"] for x in (b["address"], b["address"] + b["size"])] \
        + [seg["address"] + seg["total"]]
    return max(edges[k + 1] - edges[k] for k in range(0, len(edges), 2))


def _segment_rows(records, segments: list[dict]) -> list[dict]:
    """report.json's segments: offsets within the segment and each live block's allocating line."""
    return [{"device": s["device"], "address": s["address"], "total": s["total"], "allocated": s["allocated"],
             "inactive": s["inactive"], "free": s["free"], "blocks_shown": min(len(s["blocks"]), MAX_BLOCKS),
             "blocks": [{"offset": b["address"] - s["address"], "size": b["size"],
                         **({"requested": b["requested"]} if "requested" in b else {}),
                         "line": records.site(b["stack"]).label if b["stack"] >= 0 else None}
                        for b in s["blocks"][:MAX_BLOCKS]]}
            for s in segments[:MAX_SEGMENTS]]


def _fragmentation(totals: dict) -> dict:
    reserved = totals["reserved_bytes"]
    return {"cached_free_bytes": totals["cached_bytes"], "cached_free_share": round(totals["cached_bytes"] / reserved, 4)
            if reserved else None, "inactive_split_bytes": totals["inactive_split_bytes"],
            "free_segment_bytes": totals["free_segment_bytes"],
            "largest_free_block_bytes": totals["largest_free_block_bytes"]}


def _largest_missed(records) -> dict:
    """The largest request that found no cached block (the alloc right after each segment_alloc) and its line."""
    e = records.snapshot.entries
    reserves = np.flatnonzero(np.isin(e.action, (SEGMENT_ALLOC, SEGMENT_MAP)))
    allocs = np.flatnonzero(e.action == ALLOC)
    nxt = np.searchsorted(allocs, reserves) if len(allocs) else np.zeros(0, dtype=np.int64)
    nxt = allocs[nxt[nxt < len(allocs)]]
    if not len(nxt):
        return {"largest_missed_request_bytes": None, "largest_missed_request_site": None}
    k = int(nxt[np.argmax(e.size[nxt])])
    return {"largest_missed_request_bytes": int(e.size[k]),
            "largest_missed_request_site": records.site(int(e.stack[k])).label if e.stack[k] >= 0 else None}


def _reserves_despite_cache(records) -> dict:
    """Segment reserves made while the cache already held at least the reserved size free: the free memory was
    there but in pieces (or on other streams) that the request could not use."""
    e, count, worst = records.snapshot.entries, 0, None
    for s in records.series.values():
        pos = np.flatnonzero(np.isin(e.action[s["rows"]], (SEGMENT_ALLOC, SEGMENT_MAP)))
        size = e.size[s["rows"][pos]]
        cached_before = s["reserved"][pos] - size - s["allocated"][pos]
        # a 2 MiB segment is the small-object pool's, which cached large blocks never serve
        hit = (cached_before >= size) & (size > SMALL_POOL_SEGMENT)
        count += int(hit.sum())
        if hit.any():
            k = int(np.argmax(np.where(hit, cached_before, -1)))
            if worst is None or cached_before[k] > worst[1]:
                worst = (int(size[k]), int(cached_before[k]))
    return {"reserves_despite_cache": count,
            "reserve_despite_cache": {"segment_bytes": worst[0], "cached_free_bytes": worst[1]} if worst else None}


def _empty_cache(records, call_of_entry: dict, idle_by_row: dict) -> dict:
    """Segments released by torch.cuda.empty_cache(), where it was called, and the cudaMallocs that followed."""
    e, snap = records.snapshot.entries, records.snapshot
    frees = [k for k in np.flatnonzero(e.action == SEGMENT_FREE).tolist()
             if e.stack[k] >= 0 and any(f[2] == "empty_cache" for f in snap.stacks[e.stack[k]])]
    if not frees:
        return {"segments_released": 0}
    first = frees[0]
    later = [k for k in np.flatnonzero(np.isin(e.action, (SEGMENT_ALLOC, SEGMENT_MAP))).tolist() if k > first]
    calls = [call_of_entry[k] for k in later if k in call_of_entry]
    rt = records.model.runtime
    return {"segments_released": len(frees), "bytes_released": int(e.size[frees].sum()),
            "sites": sorted({records.site(int(e.stack[k])).label for k in frees}),
            "segment_allocs_after": len(later),
            "cuda_malloc_us_after": round(sum((rt.end_ns[c] - rt.start_ns[c]) / 1e3 for c in calls), 3),
            "gpu_idle_us_after": round(sum(idle_by_row.get(c, 0.0) for c in calls), 3)}


def snapshot_findings(ctx: AnalysisContext, section: dict, parent: Finding | None) -> list[Finding]:
    """Children of the allocator finding by exact line (they split its GPU idle), and a fragmentation finding
    whose cost is memory (its GPU idle, 0, is left to the allocator finding)."""
    out = []
    window_us = ctx.timeline.window_ns / 1e3
    if parent is not None:
        for k, s in enumerate(x for x in section["sites"] if x["gpu_idle_us"] > 0):
            what = (f"{_n(s['segment_allocs'], 'segment reserve')} ({fmt_bytes(s['bytes_reserved'])})"
                    if s["segment_allocs"] else
                    f"{_n(s['segment_frees'], 'segment release')} ({fmt_bytes(s['bytes_released'])})")
            via = " through torch.cuda.empty_cache()" if any("in empty_cache" in f for f in s["stack"]) else ""
            out.append(Finding(
                kind="allocator_churn", severity=severity_for(s["gpu_idle_us"], window_us),
                title=f"of which {what}{via} at {s['call_site']}", call_site=s["call_site"],
                library_site=s["library_site"], impact_us=s["gpu_idle_us"],
                count=s["segment_allocs"] + s["segment_frees"], id=f"allocator.{k}", parent=parent.id,
                advice="The allocator's own records name this line exactly (memory_snapshot.pickle).",
                detail={"stack": s["stack"], "cuda_call_us": s["cuda_call_us"], "request_sizes": s["request_sizes"]},
                occurrences_us=tuple((o[0], o[1]) for o in s["occurrences"] if o[0] is not None)))
    peak, frag = section["peak"], section["fragmentation"]
    if peak and peak["reserved_bytes"] and section["history_consistent"]:
        share = peak["cached_bytes"] / peak["reserved_bytes"]
        varying = sorted((s for s in section["sites"] if s["request_sizes"] >= VARYING_SIZES and s["segment_allocs"]),
                         key=lambda s: -s["bytes_reserved"])
        grew = sum(s["segment_allocs"] for s in section["sites"])
        if grew and (share >= FRAGMENTED_SHARE or frag["reserves_despite_cache"]):
            out.append(_fragmentation_finding(ctx, peak, frag, varying, grew, share))
    return out


def _fragmentation_finding(ctx: AnalysisContext, peak: dict, frag: dict, varying: list[dict], grew: int,
                           share: float) -> Finding:
    cached, missed = peak["cached_bytes"], frag["largest_missed_request_bytes"]
    split, whole = peak["inactive_split_bytes"], peak["free_segment_bytes"]
    how = []
    if whole:
        how.append(f"{fmt_bytes(whole)} in segments with no live block")
    if split:
        how.append(f"{fmt_bytes(split)} free inside segments that hold live blocks")
    despite = frag["reserve_despite_cache"]
    advice = (f"The allocator reserved {_n(grew, 'new segment')} while cached memory sat free: requests found no cached "
              f"block large enough" + (f" (the largest that missed was {fmt_bytes(missed)}, the largest free block at "
                                       f"the peak {fmt_bytes(peak['largest_free_block_bytes'])})" if missed else "")
              + (f"; {_n(frag['reserves_despite_cache'], 'reserve')} came while the cache held at least as much free "
                 f"(at worst a {fmt_bytes(despite['segment_bytes'])} segment next to "
                 f"{fmt_bytes(despite['cached_free_bytes'])} cached free)" if despite else "")
              + ". This memory is lost to the next large allocation and brings an OOM closer; "
              f"{ctx.traits.alloc_conf}=expandable_segments:True lets one segment grow in place instead of new ones "
              f"piling up.")
    if varying:
        advice += (f" Request sizes vary at {varying[0]['call_site']} ({varying[0]['request_sizes']} sizes): pad or "
                   f"bucket them to a few values, or allocate the largest buffer once and reuse it.")
    return Finding(
        kind="allocator_fragmentation", severity="medium" if share < 0.5 else "high",
        title=f"Fragmented cache: at the reserved peak {fmt_bytes(cached)} of {fmt_bytes(peak['reserved_bytes'])} "
              f"reserved was cached but free ({'; '.join(how)}), over {peak['segments']} segments",
        call_site=varying[0]["call_site"] if varying else frag.get("largest_missed_request_site"),
        library_site=varying[0]["library_site"] if varying else None, impact_us=0.0, count=grew,
        id="allocator_fragmentation", advice=advice,
        detail={"wasted_bytes": cached, "gpu_idle_us": 0.0, "peak": peak, "fragmentation": frag})


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")
