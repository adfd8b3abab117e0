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


def gpu_utilization(events):
    """busy / window with busy = union over all streams of kernel, memcpy and memset intervals (ns)."""
    spans = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in events if is_gpu_work(e))
    if not spans:
        return None, 0
    busy, cur_s, cur_e = 0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    window = max(e for _, e in spans) - spans[0][0]
    return busy / window, window


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
