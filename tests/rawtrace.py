"""Independent counts from a trace's raw JSON (standard library only), to check the analyzer against."""
import gzip
import json
from decimal import Decimal

GPU_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}
OLD_GPU_WORK = {"memcpy", "memset"}  # torch 1.8/1.9 wrote "Kernel", "Memcpy", "Memset"


def is_gpu_work(e):
    """A kernel, memcpy or memset slice, by today's category names or torch 1.8's (in any case)."""
    return e.get("ph") == "X" and "dur" in e and str(e.get("cat", "")).lower() in GPU_WORK | OLD_GPU_WORK


def raw_events(path, exact=False):
    """The trace's events; exact=True reads numbers with a fraction as Decimal (ns-resolution timestamps of
    epoch-based traces do not fit a float)."""
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rt") as f:
        data = json.load(f, parse_float=Decimal if exact else float)
    return data["traceEvents"] if isinstance(data, dict) else data


def count_named(events, name):
    return sum(1 for e in events if e.get("name") == name and e.get("ph") == "X")


HOST_CATEGORIES = {"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver",
                   "operator", "runtime", "driver", "python", "user annotation"}
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver", "runtime", "driver"}


def gpu_utilization(events):
    """busy / window, summed over devices. busy = union over all streams of a device's kernel, memcpy and memset
    intervals (ns); its window = the window the user profiled: from the first to the last host event (ops, Python
    frames, runtime calls) of the processes that launched its work (linked by args.correlation), clipped to the
    profiler's own span (cat Trace), widened to the device's own first and last work; the host side counts at an
    edge only where the work at that edge has its launch call in the trace, and only where the device's clock keeps
    up with the host's."""
    slices = [e for e in events if e.get("ph") == "X" and "dur" in e and _ns(e["dur"]) >= 0]
    work = [e for e in slices if is_gpu_work(e)]
    if not work:
        return None, 0
    launches = {(e.get("args") or {}).get("correlation"): e for e in slices
                if str(e.get("cat", "")).lower() in LAUNCH_CATEGORIES}
    launches.pop(None, None)
    spans = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in slices if str(e.get("cat", "")) == "Trace"]
    busy_total = window_total = 0
    for device in sorted({e["pid"] for e in work}, key=str):
        mine = [e for e in work if e["pid"] == device]
        intervals = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in mine)
        busy, cur_s, cur_e = 0, intervals[0][0], intervals[0][1]
        for s, e in intervals[1:]:
            if s > cur_e:
                busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        first = min(intervals)[0]
        last = max(e for _, e in intervals)
        linked = [launches.get((e.get("args") or {}).get("correlation")) for e in mine]
        pids = {str(c["pid"]) for c in linked if c is not None}
        host = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in slices
                if str(e.get("cat", "")).lower() in HOST_CATEGORIES and str(e.get("pid")) in pids]
        lo, hi = first, last
        # a device whose first work starts over a millisecond after its launch returned runs on a clock behind the
        # host's: its window stays its own first to last work
        first_row = min(range(len(mine)), key=lambda i: (_ns(mine[i]["ts"]), i))
        call = linked[first_row]
        if host and call is not None and _ns(mine[first_row]["ts"]) - _ns(call["ts"]) - _ns(call["dur"]) < 1_000_000:
            h_lo, h_hi = min(s for s, _ in host), max(e for _, e in host)
            if spans:
                h_lo, h_hi = max(h_lo, min(s for s, _ in spans)), min(h_hi, max(e for _, e in spans))
            last_row = max(range(len(mine)), key=lambda i: (_ns(mine[i]["ts"]) + _ns(mine[i]["dur"]), -i))
            if h_hi > h_lo and linked[first_row] is not None:
                lo = min(lo, h_lo)
            if h_hi > h_lo and linked[last_row] is not None:
                hi = max(hi, h_hi)
        busy_total += busy
        window_total += hi - lo
    return busy_total / window_total, window_total


def _ns(value):
    """µs -> integer ns without float rounding (epoch-based timestamps reach 1.7e15 µs)."""
    return int((Decimal(str(value)) * 1000).to_integral_value())


def raw_gaps(events):
    """Per GPU device: the idle gaps between the union of its kernels, memcpys and memsets, each with the event that
    ends it and whether that event's launch call (same args.correlation) had returned before the gap began, or
    the event is a later node of a replayed graph (queued: nothing on the CPU was late). Kineto overhead
    intervals are left in; callers skip gaps that touch one."""
    launches = {}
    for e in events:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver", "runtime"):
            corr = (e.get("args") or {}).get("correlation")
            if isinstance(corr, int) and corr not in launches:
                launches[corr] = e
    by_device = {}
    for e in events:
        if is_gpu_work(e):
            by_device.setdefault(e.get("pid"), []).append(e)
    first_of_corr = {}
    for device_events in by_device.values():
        for e in sorted(device_events, key=lambda e: float(e["ts"])):
            first_of_corr.setdefault((e.get("args") or {}).get("correlation"), e)
    gaps = []
    for device, device_events in by_device.items():
        device_events.sort(key=lambda e: float(e["ts"]))
        reach = _ns(device_events[0]["ts"]) + _ns(device_events[0]["dur"])
        for e in device_events[1:]:
            start, end = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
            if start > reach:
                corr = (e.get("args") or {}).get("correlation")
                launch = launches.get(corr)
                queued = None
                if launch is not None:
                    graph = launch["name"] in ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")
                    later_node = graph and first_of_corr.get(corr) is not e
                    queued = later_node or _ns(launch["ts"]) + _ns(launch["dur"]) <= reach
                gaps.append({"device": device, "start_ns": reach, "end_ns": start, "next": e, "launch": launch,
                             "queued": queued})
            reach = max(reach, end)
    return gaps


def overhead_spans(events):
    return [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in events
            if e.get("cat") == "overhead" and e.get("ph") == "X"]
