"""Independent counts from a trace's raw JSON (standard library only), to check the analyzer against."""
import gzip
import json

GPU_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}


def raw_events(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def count_named(events, name):
    return sum(1 for e in events if e.get("name") == name and e.get("ph") == "X")


def gpu_utilization(events):
    """busy / window with busy = union over all streams of kernel, memcpy and memset intervals (ns)."""
    spans = sorted((round(float(e["ts"]) * 1000), round((float(e["ts"]) + float(e["dur"])) * 1000))
                   for e in events if e.get("cat") in GPU_WORK and e.get("ph") == "X" and "dur" in e)
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
