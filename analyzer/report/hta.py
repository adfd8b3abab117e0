"""HolisticTraceAnalysis on the same trace, for its numbers beside ours (`analyze --hta`).

HTA is published today as `traceinsight` (0.6.x, works with pandas 3); the older `HolisticTraceAnalysis` 0.5.0
(pandas < 3) installs the same `hta` package and serves as a fallback. The report says which one ran. HTA is
optional and slow on large traces: it is imported only here, and any failure becomes the report's `hta.error`
instead of stopping the analysis.
"""
from __future__ import annotations

import contextlib
import io
import logging
import time
from pathlib import Path

INSTALL_HINT = "pip install -e '.[hta]' (traceinsight 0.6.1)"
DISTRIBUTIONS = ("traceinsight", "HolisticTraceAnalysis")  # both install the `hta` package; the first found ran


def _distribution() -> tuple[str | None, str | None]:
    from importlib import metadata
    for name in DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None, None


def _ours(report: dict) -> dict:
    s, g = report["summary"], report["gaps"]
    stats = g["launch_stats"]
    return {"gpu_idle_us": s["gpu_idle_us"], "gpu_utilization": s["gpu_utilization"],
            # HTA's host wait holds every launch gap, the long ones (host work) too
            "idle_cpu_launch_us": round(g["by_cause"]["cpu_launch"] + g["by_cause"].get("host_work", 0.0), 3),
            "launches": stats["launches"],
            "launch_call_mean_us": (stats["launch_call_us"] or {}).get("mean"),
            "launch_to_start_mean_us": (stats["launch_to_start_us"] or {}).get("mean")}


def run_hta(trace: Path, report: dict) -> dict:
    started = time.perf_counter()
    try:
        import hta  # noqa: F401 (fails here when the install is broken, before any work)
        from hta.trace_analysis import TraceAnalysis
    except Exception as exc:  # ImportError, or a broken install (HTA 0.5.0 needs psutil and pandas < 3)
        return {"error": f"HTA unavailable ({exc.__class__.__name__}: {exc}); install with {INSTALL_HINT}"}
    dist, version = _distribution()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            logging.disable(logging.WARNING)
            analysis = TraceAnalysis(trace_files={0: str(Path(trace).resolve())}, trace_dir=str(Path(trace).parent))
            loaded_s = time.perf_counter() - started
            temporal = analysis.get_temporal_breakdown(visualize=False)
            idle, _ = analysis.get_idle_time_breakdown(ranks=[0], visualize=False)
            launches = analysis.get_cuda_kernel_launch_stats(ranks=[0], visualize=False).get(0)
    except Exception as exc:
        return {"error": f"{exc.__class__.__name__}: {exc}", "distribution": dist, "version": version,
                "seconds": round(time.perf_counter() - started, 3)}
    finally:
        logging.disable(logging.NOTSET)
    row = temporal.iloc[0].to_dict() if len(temporal) else {}
    by_category = idle.groupby("idle_category")["idle_time"].sum().to_dict() if len(idle) else {}
    out = {
        "distribution": dist, "version": version, "seconds": round(time.perf_counter() - started, 3),
        "load_seconds": round(loaded_s, 3),
        "temporal": {k: (float(v) if isinstance(v, (int, float)) else str(v)) for k, v in row.items()},
        "idle_by_category_us": {str(k): float(v) for k, v in by_category.items()},
        "idle_definition": "per stream: host_wait = next kernel launched after the previous kernel ended; "
                           "kernel_wait = other gaps under 30 µs; summed over streams (ours: union over streams)",
    }
    if launches is not None and len(launches):
        out["launch_stats"] = {"launches": int(len(launches)),
                               "launch_call_mean_us": round(float(launches["cpu_duration"].mean()), 3),
                               "launch_delay_mean_us": round(float(launches["launch_delay"].mean()), 3),
                               "short_kernels": int((launches["gpu_duration"] < launches["cpu_duration"]).sum()),
                               "matched_apis": "cudaLaunchKernel/ExC, cudaMemcpyAsync, cudaMemsetAsync"}
    out["side_by_side"] = {"ours": _ours(report),
                           "hta": {"gpu_idle_us": out["temporal"].get("idle_time(us)"),
                                   "idle_host_wait_us": out["idle_by_category_us"].get("host_wait"),
                                   "launches": out.get("launch_stats", {}).get("launches"),
                                   "launch_call_mean_us": out.get("launch_stats", {}).get("launch_call_mean_us"),
                                   "launch_delay_mean_us": out.get("launch_stats", {}).get("launch_delay_mean_us")}}
    return out
