"""The allocator's own records joined to the trace: which recorded action each cudaMalloc / cudaFree of the trace
was, with its exact Python stack; the allocating lines; the cache's state at the reserved peak and at the end.

Clocks: snapshot entries carry `time_us` on the Unix epoch; the trace's `ts` counts from `baseTimeNanoseconds`. So
trace ns = entry epoch ns - baseTimeNanoseconds. The join proves it: a segment_alloc is recorded right after the
cudaMalloc it made returns, and `alignment` reports how many calls found their entry and how far apart they were.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from analyzer.arrays import distinct
from analyzer.codepaths import FrameKind, path_kind
from analyzer.trace import TraceModel
from analyzer.trace.snapshot import (ACTIONS, ALLOC, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP,
                                     SEGMENT_UNMAP, MemorySnapshot)
from analyzer.views import apis

JOIN_TOLERANCE_NS = 200_000  # an entry is recorded within the call (it returns, then the allocator logs it)
RESERVE_ACTIONS = (SEGMENT_ALLOC, SEGMENT_MAP)
RELEASE_ACTIONS = (SEGMENT_FREE, SEGMENT_UNMAP)


@dataclasses.dataclass(frozen=True)
class StackSite:
    """Where an allocator action came from: the user's exact line and the library line under it."""
    line: str | None  # "workloads/decode_alloc_churn.py:25"
    code: str | None  # the function holding that line
    library_line: str | None
    stack: tuple[str, ...]  # "file:line in func", innermost first, at most 12

    @property
    def label(self) -> str:
        return self.line or self.library_line or (self.stack[0] if self.stack else "(no stack)")


class AllocatorRecords:
    """The snapshot's entries on the trace clock, joined to the trace's allocator calls."""

    def __init__(self, model: TraceModel, snapshot: MemorySnapshot, classes: np.ndarray):
        self.model, self.snapshot = model, snapshot
        base = model.metadata.get("baseTimeNanoseconds")
        self.base_ns = int(base) if isinstance(base, (int, float)) and not isinstance(base, bool) else None
        e = snapshot.entries
        self.entry_ns = np.where(e.time_ns >= 0, e.time_ns - (self.base_ns or 0), -1) if self.base_ns is not None \
            else np.full(len(e), -1, np.int64)
        self.call_rows, self.call_entry, self.alignment = self._join(classes)
        self._relative = _PathDisplay(model)

    # --- the join -------------------------------------------------------------------------------------------

    def _join(self, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
        """Per allocator call of the trace (cudaMalloc, cudaFree, cuMem*): the entry it made, -1 none."""
        rt, names = self.model.runtime, self.model.names
        calls = np.flatnonzero(classes == apis.IS_ALLOC)
        matched = np.full(len(calls), -1, np.int64)
        if self.base_ns is None or not len(calls) or not len(self.snapshot.entries):
            return calls, matched, {"calls": int(len(calls)), "matched": 0, "clock": self._clock()}
        reserve_codes = [c for c, n in enumerate(names) if n in apis.ALLOC_RESERVE]
        is_reserve = np.isin(rt.name[calls], reserve_codes)
        action = self.snapshot.entries.action
        offsets = []
        for want, actions in ((True, RESERVE_ACTIONS), (False, RELEASE_ACTIONS)):
            sel = calls[is_reserve == want]
            entries = np.flatnonzero(np.isin(action, actions) & (self.entry_ns >= 0))
            if not len(sel) or not len(entries):
                continue
            entries = entries[np.argsort(self.entry_ns[entries], kind="stable")]
            t = self.entry_ns[entries]
            taken = np.zeros(len(entries), bool)
            for call in sel[np.argsort(rt.end_ns[sel], kind="stable")].tolist():
                lo = np.searchsorted(t, rt.start_ns[call] - JOIN_TOLERANCE_NS, side="left")
                hi = np.searchsorted(t, rt.end_ns[call] + JOIN_TOLERANCE_NS, side="right")
                free = [k for k in range(lo, hi) if not taken[k]]
                if not free:
                    continue
                k = min(free, key=lambda k: abs(int(t[k]) - int(rt.end_ns[call])))
                taken[k] = True
                matched[np.searchsorted(calls, call)] = entries[k]
                offsets.append(int(t[k]) - int(rt.end_ns[call]))
        return calls, matched, {
            "calls": int(len(calls)), "matched": int((matched >= 0).sum()),
            "median_entry_after_call_end_us": round(float(np.median(offsets)) / 1e3, 3) if offsets else None,
            "max_abs_offset_us": round(float(np.abs(offsets).max()) / 1e3, 3) if offsets else None,
            "clock": self._clock()}

    def _clock(self) -> str:
        if self.base_ns is None:
            return "the trace has no baseTimeNanoseconds: snapshot entries cannot be placed on its clock"
        return "entry time_us (Unix epoch) - baseTimeNanoseconds = trace ts"

    def entry_of_call(self, runtime_row: int) -> int:
        i = int(np.searchsorted(self.call_rows, runtime_row))
        return int(self.call_entry[i]) if i < len(self.call_rows) and self.call_rows[i] == runtime_row else -1

    def record_of_call(self, runtime_row: int) -> dict | None:
        """A cudaMalloc/cudaFree's own record: its allocating line, the segment's size and the action; None when
        the call found no entry."""
        entry = self.entry_of_call(runtime_row) if runtime_row >= 0 else -1
        if entry < 0:
            return None
        e = self.snapshot.entries
        stack = int(e.stack[entry])
        return {"allocating_line": self.site(stack).label if stack >= 0 else None,
                "segment_bytes": int(e.size[entry]), "segment_action": ACTIONS[int(e.action[entry])]}

    # --- stacks ---------------------------------------------------------------------------------------------

    @functools.lru_cache(maxsize=None)
    def site(self, stack: int) -> StackSite:
        if stack < 0:
            return StackSite(None, None, None, ())
        frames = self.snapshot.stacks[stack]
        user = library = None
        for k, (file, line, func) in enumerate(frames):  # innermost first
            kind = path_kind(file)
            if kind == FrameKind.LIBRARY and library is None and user is None:
                library = (k, file, line, func)
            if kind == FrameKind.USER:
                user = (k, file, line, func)
                break
        show = self._relative
        return StackSite(
            f"{show(user[1])}:{user[2]}" if user else None, user[3] if user else None,
            f"{show(library[1])}:{library[2]} in {library[3]}()" if library else None,
            tuple(f"{show(f)}:{ln} in {fn}" for f, ln, fn in frames[:12]))

    # --- the cache over time --------------------------------------------------------------------------------

    @functools.cached_property
    def series(self) -> dict[int, dict[str, np.ndarray]]:
        """Per device, over the recorded entries: reserved and allocated bytes after each one, replayed backwards
        from the snapshot's final state (history may start after the process did)."""
        e, out = self.snapshot.entries, {}
        for device in sorted(set(e.device.tolist()) | {s.device for s in self.snapshot.segments}):
            rows = np.flatnonzero(e.device == device)
            segments = [s for s in self.snapshot.segments if s.device == device]
            reserved_end = sum(s.total_size for s in segments)
            # a block freed while a stream still used it stays allocated until its free_completed entry
            allocated_end = sum(b.size for s in segments for b in s.blocks if b.state != "inactive")
            a, size = e.action[rows], e.size[rows]
            d_res = np.where(np.isin(a, RESERVE_ACTIONS), size, np.where(np.isin(a, RELEASE_ACTIONS), -size, 0))
            d_all = np.where(a == ALLOC, size, np.where(a == FREE_COMPLETED, -size, 0))
            # value after entry i = end value - the changes after i
            after_res = reserved_end - (np.cumsum(d_res[::-1])[::-1] - d_res)
            after_all = allocated_end - (np.cumsum(d_all[::-1])[::-1] - d_all)
            # entries the snapshot's final state does not account for (a history from another process, a
            # hand-edited file) would replay below zero; the series keeps to what is physically possible
            consistent = bool(len(rows) == 0 or (after_res.min() >= 0 and after_all.min() >= 0))
            out[device] = {"rows": rows, "reserved": np.maximum(after_res, 0),
                           "allocated": np.minimum(np.maximum(after_all, 0), np.maximum(after_res, 0)),
                           "reserved_end": reserved_end, "allocated_end": allocated_end, "consistent": consistent}
        return out

    def segments_at(self, device: int, entry_row: int) -> list[dict]:
        """The device's segments right after entry `entry_row` (-1: before the first entry), largest first: the
        final segments minus those reserved later plus those released later, each with its live blocks then
        (address order; `stack` is the allocating stack's index) and its bytes allocated, free between live
        blocks (`inactive`) and, for a segment with no live block, `free` (what empty_cache() would return)."""
        e = self.snapshot.entries
        later = np.flatnonzero((e.device == device) & (np.arange(len(e)) > entry_row))
        a = e.action[later]
        spans = {s.address: s.total_size for s in self.snapshot.segments if s.device == device}
        # undo later reserves and releases, last first: an address can be released and reserved again
        for row in later[np.isin(a, RESERVE_ACTIONS + RELEASE_ACTIONS)][::-1].tolist():
            if e.action[row] in RESERVE_ACTIONS:
                spans.pop(int(e.addr[row]), None)
            else:
                spans[int(e.addr[row])] = int(e.size[row])
        live = {b.address: (b.size, b.stack) for s in self.snapshot.segments if s.device == device
                for b in s.blocks if b.state != "inactive"}
        alloc_stack = self._alloc_stack_of_free
        for row in later[np.isin(a, (ALLOC, FREE_COMPLETED))][::-1].tolist():  # undo what came later, last first
            if e.action[row] == ALLOC:
                live.pop(int(e.addr[row]), None)
            else:
                live[int(e.addr[row])] = (int(e.size[row]), alloc_stack.get(row, int(e.stack[row])))
        out = {addr: {"address": addr, "total": total, "blocks": []} for addr, total in spans.items()}
        starts = np.array(sorted(spans), np.int64)
        for addr in sorted(live):
            k = int(np.searchsorted(starts, addr, side="right")) - 1
            if k >= 0 and addr < starts[k] + spans[int(starts[k])]:
                size, stack = live[addr]
                out[int(starts[k])]["blocks"].append({"address": addr, "size": size, "stack": stack})
        for seg in out.values():
            allocated = min(sum(b["size"] for b in seg["blocks"]), seg["total"])
            seg.update(allocated=allocated, inactive=seg["total"] - allocated if allocated else 0,
                       free=0 if allocated else seg["total"])
        return sorted(out.values(), key=lambda s: (-s["total"], s["address"]))

    @functools.cached_property
    def _alloc_stack_of_free(self) -> dict[int, int]:
        """Per free_completed entry: the stack of the alloc it ends (the latest alloc at its address before it)."""
        e, last, out = self.snapshot.entries, {}, {}
        rows = np.flatnonzero(np.isin(e.action, (ALLOC, FREE_COMPLETED)))
        for row, action, device, addr, stack in zip(rows.tolist(), e.action[rows].tolist(), e.device[rows].tolist(),
                                                    e.addr[rows].tolist(), e.stack[rows].tolist()):
            if action == ALLOC:
                last[(device, addr)] = stack
            elif (device, addr) in last:
                out[row] = last.pop((device, addr))
        return out

    def entry_at(self, device: int, ts_ns: float) -> int:
        """The device's last entry at or before trace time `ts_ns` (-1: none)."""
        rows = np.flatnonzero((self.snapshot.entries.device == device) & (self.entry_ns >= 0))
        k = int(np.searchsorted(self.entry_ns[rows], ts_ns, side="right")) - 1
        return int(rows[k]) if k >= 0 else -1


class _PathDisplay:
    """Absolute source paths as the trace writes them: the suffix that a Kineto frame of the trace has (relative to
    its sys.path entry), else the part below site-packages, else the last three parts."""

    def __init__(self, model: TraceModel):
        files = set()
        for code in distinct(model.frames.name).tolist() if len(model.frames) else []:
            name = model.names[code]
            if "(" in name and not name.startswith("<"):
                files.add(name.rsplit("(", 1)[0])
        self.by_name: dict[str, list[str]] = {}
        for f in files:
            self.by_name.setdefault(f.rsplit("/", 1)[-1], []).append(f)

    @functools.lru_cache(maxsize=4096)
    def __call__(self, path: str) -> str:
        clean = path.replace("\\", "/")
        for candidate in sorted(self.by_name.get(clean.rsplit("/", 1)[-1], []), key=len, reverse=True):
            if clean.endswith("/" + candidate) or clean == candidate:
                return candidate
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in clean:
                return clean.rsplit(marker, 1)[1]
        return "/".join(clean.split("/")[-3:])
