"""Generate tests/corpus/: bad and odd Kineto traces derived from the real H200 fixtures, plus manifest.json with
each entry's expected `python -m analyzer analyze` outcome.

    python tests/make_corpus.py          # rewrites tests/corpus/ (deterministic: same fixtures, same bytes)

Every trace entry starts from one profiled decode step of a fixture (a couple of thousand events), so the corpus
stays small. Expected numbers are counted here from the generated events with the standard library only, by the
rules below, independently of the analyzer:
- kernels: `X` events of cat `kernel` whose ts and dur are finite numbers and dur >= 0;
- launches: such valid `X` events of cat cuda_runtime / cuda_driver named one of LAUNCH_APIS;
- blocking_syncs: such valid runtime events named one of SYNC_APIS (the fixtures copy into pinned memory, so every
  blocking call is one synchronize).
"""
from __future__ import annotations

import copy
import gzip
import hashlib
import json
import math
import random
import shutil
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FIX = TESTS / "fixtures" / "h200"
CORPUS = TESTS / "corpus"
MANIFEST = CORPUS / "manifest.json"

LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
               "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel", "hipGraphLaunch")
SYNC_APIS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "hipDeviceSynchronize",
             "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpyWithStream")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
LINKED_CATS = (*RUNTIME_CATS, "kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")
# CUDA -> HIP names as ROCm traces write them (mi250 trace in ../shared/traces/external)
HIP_NAMES = {"cudaLaunchKernel": "hipLaunchKernel", "cudaLaunchKernelExC": "hipLaunchKernel", "cuLaunchKernelEx": "hipExtModuleLaunchKernel",
             "cuLaunchKernel": "hipModuleLaunchKernel", "cudaMemcpyAsync": "hipMemcpyAsync",
             "cudaMemsetAsync": "hipMemsetAsync", "cudaStreamSynchronize": "hipStreamSynchronize",
             "cudaStreamIsCapturing": "hipStreamIsCapturing", "cudaMalloc": "hipMalloc", "cudaFree": "hipFree",
             "cudaHostAlloc": "hipHostMalloc", "cudaDeviceSynchronize": "hipDeviceSynchronize",
             "cudaFuncGetAttributes": "hipFuncGetAttributes", "cudaEventRecord": "hipEventRecord"}


# ---- reading and cutting the fixtures (also used by test_fuzz_traces.py) ----

def load_fixture(name: str) -> dict:
    with gzip.open(FIX / name / "rank0.trace.json.gz", "rt") as f:
        return json.load(f)


def _number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def cut_trace(top: dict, annotation: str = "decode_step#1", last: float = 1.0) -> dict:
    """The events that overlap the last `last` share of one annotation's interval (with their enclosing ops,
    steps and frames), plus the `M` metadata events and the top-level keys: a real trace cut down to one step (a
    couple of thousand events) or less."""
    events = top["traceEvents"]
    window = next(e for e in events if e.get("cat") == "user_annotation" and e.get("name") == annotation)
    t0, t1 = window["ts"] + (1 - last) * window["dur"], window["ts"] + window["dur"]
    keep = [e for e in events if e.get("ph") == "M" or (
        _number(e.get("ts")) and e["ts"] < t1 and e["ts"] + (e.get("dur") if _number(e.get("dur")) else 0) >= t0)]
    # and both ends of every launch cut through: the runtime call and its GPU work (same correlation)
    linked = {e["args"]["correlation"] for e in keep if e.get("ph") == "X" and "correlation" in e.get("args", {})}
    kept = {id(e) for e in keep}
    keep = [e for e in events if id(e) in kept or (
        e.get("ph") == "X" and e.get("cat") in LINKED_CATS and e.get("args", {}).get("correlation") in linked)]
    return dict(top, traceEvents=keep)


def small_fixture(name: str, annotation: str = "decode_step#1", last: float = 1.0) -> dict:
    return cut_trace(load_fixture(name), annotation, last)


# ---- independent counts ----

def _valid_slice(e: dict) -> bool:
    return (isinstance(e, dict) and e.get("ph") == "X" and _number(e.get("ts")) and _number(e.get("dur"))
            and e["dur"] >= 0)


def expected_counts(events: list) -> dict:
    valid = [e for e in events if _valid_slice(e)]
    runtime = [e for e in valid if e.get("cat") in RUNTIME_CATS]
    return {
        "kernels": sum(1 for e in valid if e.get("cat") == "kernel"),
        "launches": sum(1 for e in runtime if e.get("name") in LAUNCH_APIS),
        "blocking_syncs": sum(1 for e in runtime if e.get("name") in SYNC_APIS),
    }


# ---- writing ----

def kineto_text(top: dict | list) -> str:
    """JSON laid out one event per line, as kineto writes it (names never span lines)."""
    def events_text(events):
        return "[\n" + ",\n".join("  " + json.dumps(e) for e in events) + "\n]"
    if isinstance(top, list):
        return events_text(top) + "\n"
    head = {k: v for k, v in top.items() if k != "traceEvents"}
    body = json.dumps(head, indent=1)[:-2]
    return body + ',\n "traceEvents": ' + events_text(top["traceEvents"]) + "\n}\n"


_OUT = CORPUS  # where write() puts entries (generate() points it elsewhere)


def write(name: str, data: bytes | str, gz: bool | None = None) -> Path:
    path = _OUT / name
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    if gz if gz is not None else name.endswith(".gz"):
        raw = gzip.compress(raw, compresslevel=9, mtime=0)
    path.write_bytes(raw)
    return path


def report(events, warning_contains=None, **extra) -> dict:
    return {"outcome": "report", "warning_contains": warning_contains, **expected_counts(events), **extra}


def error(message_contains: str) -> dict:
    return {"outcome": "error", "message_contains": message_contains}


# ---- the entries ----

def every(events: list, cat: str | tuple, step: int, offset: int = 0) -> list[dict]:
    cats = (cat,) if isinstance(cat, str) else cat
    rows = [e for e in events if e.get("cat") in cats]
    return rows[offset::step]


def build() -> dict:
    rng = random.Random(146900)
    item = small_fixture("item_sync", last=0.3)  # the step's end: launches, a .item() copy and its sync
    graph = small_fixture("graph_decode")
    entries: dict[str, dict] = {}

    def add(name, expected, description):
        entries[name] = {"description": description, **expected}

    # files that are not traces at all
    write("zero_bytes.json", b"")
    add("zero_bytes.json", error("empty file"), "a zero-byte file")
    whole = kineto_text(item).encode()
    write("truncated_gzip.json.gz", gzip.compress(whole, 9, mtime=0)[:6000], gz=False)
    add("truncated_gzip.json.gz", error("corrupt or truncated gzip"), "a gzip stream cut after 6000 bytes")
    write("truncated_json.json", whole[:20000])
    add("truncated_json.json", error("invalid JSON at line"), "a trace cut mid-event after 20000 bytes")
    write("gzip_not_json.json.gz", b"\x00\x01 this is a gzip of binary junk, not JSON \xff\xfe" * 8)
    add("gzip_not_json.json.gz", error("invalid JSON at line 1, column 1"), "a valid gzip stream holding no JSON")
    write("not_a_trace.json", (FIX / "item_sync" / "meta.json").read_bytes())
    add("not_a_trace.json", error("traceEvents"), "a JSON object without traceEvents (a run's meta.json)")
    write("events_not_a_list.json", json.dumps({"traceEvents": {"ph": "X"}}))
    add("events_not_a_list.json", error("not a Kineto trace"), "traceEvents is an object, not a list")
    write("no_events.json", json.dumps({"schemaVersion": 1, "deviceProperties": [], "traceEvents": []}))
    add("no_events.json", error("trace has no events"), "a trace object with an empty event list")

    # valid traces in other shapes
    bare = copy.deepcopy(item["traceEvents"])
    write("bare_event_array.json.gz", kineto_text(bare))
    add("bare_event_array.json.gz", report(bare), "kineto's events as a bare JSON array, no top-level object")
    legacy = legacy_export(item["traceEvents"])
    write("legacy_exporter.json", json.dumps(legacy))
    add("legacy_exporter.json",
        {"outcome": "report", "warning_contains": None,  # an older layout, not a fault: a note, not a warning
         "kernels": sum(1 for e in legacy if e.get("pid") == "CUDA functions" and e["ph"] == "X"),
         "launches": 0, "blocking_syncs": 0},
        "torch.autograd.profiler's legacy export: a bare array, ops and kernels on pids 'CPU functions' / "
        "'CUDA functions', cpu_to_cuda flows, no categories")

    # older kineto with with_stack: double quotes inside names written unescaped (pytorch#146900)
    quoted = copy.deepcopy(item)
    frames = every(quoted["traceEvents"], "python_function", 40, 3)
    marks = []
    for i, e in enumerate(frames):
        e["name"] = f"@@QUOTED{i}@@"
        marks.append([f'<eval_with_key>.{i}({10 + i}): "forward"', f'nn.Module: Wrapper["{i}"]_{i}',
                      f'test.py({i}): f(x="a", y="b")', f'<built-in method get of dict object at 0x{i:x}> "k"'][i % 4])
    text = kineto_text(quoted)
    for i, name in enumerate(marks):
        text = text.replace(f'"@@QUOTED{i}@@"', f'"{name}"')
    for e, name in zip(frames, marks):
        e["name"] = name
    write("unescaped_quotes.json.gz", text)
    add("unescaped_quotes.json.gz", report(quoted["traceEvents"], "unescaped double quotes", repaired_names=len(marks)),
        f"{len(marks)} python_function names with bare double quotes; the loader repairs them")
    broken = kineto_text(item).replace('"Concrete Inputs": ["', '"Concrete Inputs": ["say "hi" ', 1)
    line = next(n for n, text_line in enumerate(broken.splitlines(), 1) if 'say "hi"' in text_line)
    write("unescaped_quote_in_args.json.gz", broken)
    add("unescaped_quote_in_args.json.gz", error(f"invalid JSON at line {line}, column"),
        "a bare double quote inside an args string (not a name): not repairable, the error says where")

    # odd values in events
    pids = copy.deepcopy(item)
    for e in every(pids["traceEvents"], "kernel", 1):
        e["tid"] = f"stream {e['tid']}"
    for e in every(pids["traceEvents"], "cpu_op", 7):
        e["pid"], e["tid"] = "Spans", "Traces"
    write("string_pids.json.gz", kineto_text(pids))
    add("string_pids.json.gz", report(pids["traceEvents"]),
        'string pids/tids: every kernel on tid "stream 7", some ops on pid "Spans" / tid "Traces"')

    missing = copy.deepcopy(item)
    for e in every(missing["traceEvents"], "cpu_op", 9):
        del e["ts"]
    for e in every(missing["traceEvents"], "kernel", 10):
        del e["dur"]
    for e in every(missing["traceEvents"], ("cuda_runtime", "cuda_driver"), 11):
        del e["args"]
    for e in every(missing["traceEvents"], "cpu_instant_event", 12):
        e.pop("args", None)
    write("missing_ts_dur_args.json.gz", kineto_text(missing))
    add("missing_ts_dur_args.json.gz", report(missing["traceEvents"], "rows with missing or invalid ts"),
        "ops without ts, kernels without dur, runtime calls and [memory] events without args")

    durations = copy.deepcopy(item)
    for e in every(durations["traceEvents"], ("kernel", "cpu_op", "cuda_runtime"), 13):
        e["dur"] = -abs(e["dur"]) - 1
    for e in every(durations["traceEvents"], ("kernel", "cpu_op"), 17, 5):
        e["dur"] = 0
    write("negative_zero_dur.json.gz", kineto_text(durations))
    add("negative_zero_dur.json.gz", report(durations["traceEvents"], "rows with negative dur"),
        "negative durations (skipped) and zero durations (kept)")

    corr = copy.deepcopy(item)
    events = corr["traceEvents"]
    dup = every(events, "kernel", 8)
    events.extend(copy.deepcopy(dup))
    for e in every(events, ("cuda_runtime", "cuda_driver"), 5, 1):
        e["args"].pop("correlation", None)
    for e in every(events, "kernel", 6, 2):
        e["args"].pop("correlation", None)
    runtime = [e for e in every(events, "cuda_runtime", 9, 4) if "correlation" in e["args"]]
    for a, b in zip(runtime[::2], runtime[1::2]):
        b["args"]["correlation"] = a["args"]["correlation"]
    write("duplicate_missing_correlation.json.gz", kineto_text(corr))
    add("duplicate_missing_correlation.json.gz", report(events, "repeated correlation id"),
        "duplicated kernel events, runtime calls sharing a correlation id, correlation missing on some calls "
        "and kernels")

    odd = copy.deepcopy(item)
    for e in every(odd["traceEvents"], "kernel", 2):
        e["args"]["blocks per SM"] = "inf"
    for e in every(odd["traceEvents"], "gpu_memcpy", 1):
        e["args"]["memory bandwidth (GB/s)"] = "N/A"
    for e in every(odd["traceEvents"], "cpu_op", 15):
        e["ts"] = "inf"
    for e in every(odd["traceEvents"], "kernel", 12, 3):
        e["dur"] = "N/A"
    for e in every(odd["traceEvents"], "cuda_runtime", 14):
        e["args"]["correlation"] = "N/A"
    write("inf_na_strings.json.gz", kineto_text(odd))
    add("inf_na_strings.json.gz", report(odd["traceEvents"], "cuda_runtime: args.correlation not an integer"),
        'the strings "inf" / "N/A" in number fields (blocks per SM, bandwidth, ts, dur, correlation)')

    orphans = copy.deepcopy(item)
    events = orphans["traceEvents"]
    launches = [e for e in events if e.get("cat") in RUNTIME_CATS and e.get("name") in LAUNCH_APIS]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    drop = {id(e) for e in launches[::7]} | {id(e) for e in kernels[3::8]}
    orphans["traceEvents"] = [e for e in events if id(e) not in drop]
    write("orphan_kernels_and_launches.json.gz", kineto_text(orphans))
    add("orphan_kernels_and_launches.json.gz",
        report(orphans["traceEvents"], "no runtime call of their correlation id"),
        "kernels whose launch call is missing and launch calls whose kernel is missing")

    cpu_only = copy.deepcopy(item)
    cpu_only["deviceProperties"] = []
    gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation", "cuda_runtime",
                "cuda_driver", "ac2g"}
    cpu_only["traceEvents"] = [e for e in cpu_only["traceEvents"] if e.get("cat") not in gpu_cats
                               and not (e.get("cat") == "cpu_instant_event" and e.get("args", {}).get("Device Type") == 1)]
    write("cpu_only.json.gz", kineto_text(cpu_only))
    add("cpu_only.json.gz", report(cpu_only["traceEvents"]), "every GPU, runtime and flow event removed")

    hip = copy.deepcopy(item)
    for e in hip["traceEvents"]:
        if e.get("cat") in RUNTIME_CATS:
            e["cat"] = "cuda_runtime"
            e["name"] = HIP_NAMES.get(e["name"], e["name"].replace("cuda", "hip", 1))
            e["args"].pop("cbid", None)
            e["args"]["stream"] = "0x0"
        elif e.get("cat") == "gpu_memcpy":
            e["name"] = e["name"].replace("Pinned", "Host").replace("Pageable", "Host")
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            e["args"]["kind"] = "Dispatch Kernel" if e["cat"] == "kernel" else "Memcpy"
    hip["deviceProperties"] = [{"id": 0, "name": "AMD Instinct MI250X", "totalGlobalMem": 68702699520}]
    write("amd_hip_names.json.gz", kineto_text(hip))
    add("amd_hip_names.json.gz", report(hip["traceEvents"]),
        "a ROCm-style trace: hipLaunchKernel / hipExtModuleLaunchKernel / hipMemcpyAsync / hipStreamSynchronize, "
        "stream as a hex string")

    junk = copy.deepcopy(graph)
    events = junk["traceEvents"]
    for i, item_junk in enumerate([1, "x", None, [], {}, {"ph": 5}, {"ph": "X", "cat": ["kernel"]},
                                   {"ph": "X", "cat": "kernel", "args": [1, 2]}]):
        events.insert(rng.randrange(len(events)), item_junk)
    write("junk_events.json.gz", kineto_text(junk))
    add("junk_events.json.gz", report(events, "not a JSON object"),
        "numbers, strings, null, lists and malformed objects mixed into a CUDA-graph decode step's events")

    # folders
    write("no_traces/meta.json", (FIX / "item_sync" / "meta.json").read_bytes())
    write("no_traces/notes.txt", "a run folder whose capture wrote no trace\n")
    add("no_traces", error("no trace files"), "a folder holding a meta.json but no trace")
    rank0, rank1 = item, graph
    write("several_ranks/rank0.trace.json.gz", kineto_text(rank0))
    write("several_ranks/rank1.trace.json.gz", kineto_text(rank1))
    add("several_ranks", {"outcome": "report",
                          "ranks": {"rank0.trace.json.gz": report(rank0["traceEvents"]),
                                    # a CUDA graph launch owns many kernels under one correlation id: no warning
                                    "rank1.trace.json.gz": report(rank1["traceEvents"], None)}},
        "a folder with two rank traces: one report folder each")
    meta_entries(item, add)
    write("bad_rank/rank0.trace.json.gz", kineto_text(graph))
    write("bad_rank/rank1.trace.json.gz", gzip.compress(kineto_text(graph).encode(), 9, mtime=0)[:3000], gz=False)
    add("bad_rank", error("rank1.trace.json.gz: corrupt or truncated gzip"),
        "two ranks, the second truncated: no report at all, not even the first rank's")
    return entries


META_RUN = {"model": "qwen2-0.5b", "device": "NVIDIA H200", "batch_size": 1, "mode": "eager"}


def compact_meta() -> dict:
    """The fixture's meta.json without the parts the analyzer never reads (the corpus stays small)."""
    meta = json.loads((FIX / "item_sync" / "meta.json").read_text())
    for key in ("command", "memory_per_step", "sample_tokens"):
        meta.pop(key, None)
    meta["unprofiled"].pop("per_step_ms", None)
    meta["profiled"] = {"memory_stats_delta": {k: v for k, v in meta["profiled"]["memory_stats_delta"].items()
                                               if k.endswith(".all.allocated")}}
    return meta


def meta_entries(item: dict, add) -> None:
    """Run folders (a valid trace, rank0.trace.json.gz) whose meta.json is odd: the report is made all the same,
    and one `warning: RUN/meta.json: ...` line names what was ignored."""
    trace = kineto_text(item)

    def run(name: str, meta: str | bytes | None, meta_warning: str | None, run_info: dict | None,
            step_time: bool, description: str) -> None:
        write(f"{name}/rank0.trace.json.gz", trace)
        if meta is not None:
            write(f"{name}/meta.json", meta)
        add(name, report(item["traceEvents"], meta_warning_contains=meta_warning, run=run_info,
                         step_time=step_time), description)

    good = json.dumps(compact_meta(), indent=1)
    run("meta_missing", None, None, None, False, "a run folder whose capture wrote no meta.json (optional)")
    run("meta_not_json", good[:300], "ignored: not readable JSON", None, False,
        "meta.json cut mid-object: ignored whole")
    run("meta_is_list", json.dumps([compact_meta()]), "ignored: a list, not a JSON object", None, False,
        "meta.json holding a list (of the right object): ignored whole")
    wrong = compact_meta()
    wrong["unprofiled"]["steps"] = "16"
    wrong["unprofiled"]["step_ms"]["p50"] = "1.618"
    wrong["environment"] = "NVIDIA H200"
    wrong["workload"]["batch_size"] = 1.5
    wrong["mode_comparison"] = {"eager_step_ms": 1.6}
    wrong["sync_sites"] = [*wrong.get("sync_sites", []), "decode.py:12"]
    run("meta_wrong_types", json.dumps(wrong, indent=1), "ignored unprofiled.steps (a string, not an integer)",
        dict(META_RUN, device=None, batch_size=None), False,
        "steps and the step time p50 as strings, environment a string, batch size 1.5, mode_comparison without "
        "its graph timing, a string among sync_sites: those are ignored, the rest is used")
    unknown = compact_meta()
    unknown["written_by_a_newer_capture"] = {"anything": [1, 2]}
    unknown["workload"]["new_knob"] = True
    run("meta_unknown_keys", json.dumps(unknown, indent=1), None, META_RUN, True,
        "keys the analyzer does not read (a newer capture's): kept, ignored without a warning")


def legacy_export(events: list) -> list:
    """What torch.autograd.profiler's EventList.export_chrome_trace writes for the same ops and kernels."""
    out, next_id = [], 0
    by_corr = {e["args"].get("correlation"): e for e in events if e.get("cat") == "kernel"}
    for e in events:
        if e.get("cat") != "cpu_op":
            continue
        out.append({"name": e["name"], "ph": "X", "ts": e["ts"], "dur": e["dur"], "tid": e["tid"],
                    "pid": "CPU functions", "args": {}})
    for e in events:
        if e.get("cat") not in RUNTIME_CATS or e["args"].get("correlation") not in by_corr:
            continue
        k = by_corr[e["args"]["correlation"]]
        out.append({"name": e["name"], "ph": "s", "ts": e["ts"], "tid": e["tid"], "pid": "CPU functions",
                    "id": next_id, "cat": "cpu_to_cuda", "args": {}})
        out.append({"name": k["name"], "ph": "f", "ts": k["ts"], "tid": 0, "pid": "CUDA functions",
                    "id": next_id, "cat": "cpu_to_cuda", "args": {}})
        out.append({"name": k["name"], "ph": "X", "ts": k["ts"], "dur": k["dur"], "tid": 0,
                    "pid": "CUDA functions", "args": {}})
        next_id += 1
    return out


SOURCES = ("item_sync/rank0.trace.json.gz", "graph_decode/rank0.trace.json.gz", "item_sync/meta.json")


def source_digests() -> dict[str, str]:
    """sha256 of the fixture files the corpus is cut from: a recaptured fixture means regenerating the corpus."""
    return {name: hashlib.sha256((FIX / name).read_bytes()).hexdigest() for name in SOURCES}


def generate(target: Path) -> dict:
    """Write every entry and manifest.json into `target` (emptied first); returns the manifest."""
    global _OUT
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    _OUT = target
    try:
        manifest = {"generated_by": "tests/make_corpus.py", "sources": source_digests(), "entries": build()}
    finally:
        _OUT = CORPUS
    (target / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> int:
    manifest = generate(CORPUS)
    total = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    print(f"{len(manifest['entries'])} entries, {total / 1024:.0f} KiB in {CORPUS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
