"""The job report: many traces of one job (one per rank) or of a fleet, compared with each other.

Input: four pandas tables, one row per trace / step / collective / finding, each row with `job`, `rank` and
`content_key` (the Parquet dataset that `analyze-many` writes, or `analyzer.fleet.job_tables` without it):
    traces       job, rank, world_size, utilization, span_us, busy_us, idle_us, comm_us, compute_us, overlap_us,
                 step_ms_median, error, source
    steps        job, rank, step (index in the trace), step_name, start_us, dur_us, gpu_busy_us, idle_us,
                 idle_<cause>_us
    collectives  job, rank and analyzer.fleet.collectives.collective_table's columns
    findings     job, rank, kind, title, site, gpu_idle_us, parent
The dataset's own column names (position, ts_us, wall_us, busy_us, call_site, impact_us, window_us, ...) are
accepted too (`normalise`).

The rules, each robust to a few odd values (MAD: median absolute deviation, scaled by 1.4826 to a standard deviation):
- **Matching a collective across ranks**: by (process group, collective, Seq) when every rank's collectives carry
  Seq (record_param_comms, torch >= 2.1; the group is named with its ranks where the trace lists them); else by
  (process group, step, ordinal in the step), since every rank issues a group's collectives in the same order.
  A send and its recv are not matched (their kernels differ in name): point-to-point waits are not measured.
- **Wait inside a collective**: a collective's kernel on one rank lasts from that rank's arrival until the last rank
  has arrived, plus the transfer. So the rank that arrived last has the shortest kernel, and for each matched
  collective: wait on rank r = its duration - the shortest duration across ranks; arrival lateness of rank r
  (how much later than the first rank it arrived) = the longest duration - its duration. Durations, not start
  times: each rank's trace is on its own host clock, and clocks of different hosts disagree by more than the waits
  we look for (milliseconds of skew are common without PTP); a duration needs no common clock. It assumes the
  transfer takes as long on every rank, true for ring/tree all-reduce and all-gather of equal shards.
- **Straggler (late arrival)**: per (rank, step), its lateness = the largest arrival lateness among its collectives
  in the step. A (rank, step) is late when its lateness exceeds the median lateness of all the job's matched
  collectives (on every rank) by more than 3 MADs of them and by more than 5% of the job's median step time. The
  baseline is per collective, not per (rank, step): a delay is absorbed by the first collective after it and the
  ranks are aligned again for the rest, so most collectives show only the jitter, even in a 2-rank job whose one
  rank is late in every step.
- **Straggler (step time)**: per (rank, step), the step's time minus the median over ranks of that step; the same
  rule (> 3 MADs above the median of these residuals and > 5% of the median step). Needs 3 or more ranks.
- **Cause on the straggler**: in its late steps, the idle cause whose time on that rank exceeds the other ranks'
  median in the same steps the most, and that rank's top finding.
- **Slow collective**: a matched collective whose transfer (its shortest duration across ranks: no rank waited)
  exceeds the median transfer of the same collective in the other steps (same group, name, size, ordinal) by more
  than 3 MADs and 5% of the median step: the link or the collective itself was slow, no rank was late.
- **Findings population**: per (kind, site), the share of analysed traces that have such a finding.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analyzer.views.idle import CAUSES

TABLES = ("traces", "steps", "collectives", "findings")
COLUMNS = {
    "traces": ("job", "rank", "content_key", "world_size", "utilization", "span_us", "busy_us", "idle_us", "comm_us",
               "compute_us", "overlap_us", "step_ms_median", "error", "source"),
    "steps": ("job", "rank", "content_key", "step", "step_name", "start_us", "dur_us", "gpu_busy_us", "idle_us"),
    "collectives": ("job", "rank", "content_key", "seq", "name", "pg", "group_size", "bytes", "step", "ordinal",
                    "stream", "device", "start_us", "end_us", "dur_us"),
    "findings": ("job", "rank", "content_key", "kind", "title", "site", "gpu_idle_us", "parent"),
}
# the dataset's names (analyzer/fleet/tables.py) -> ours
ALIASES = {
    "traces": {"window_us": "span_us", "comm_overlap_us": "overlap_us"},
    "steps": {"ts_us": "start_us", "wall_us": "dur_us", "busy_us": "gpu_busy_us"},
    "findings": {"call_site": "site", "impact_us": "gpu_idle_us"},
}
MADS = 3.0
MIN_SHARE_OF_STEP = 0.05
MAD_SCALE = 1.4826
SCHEMA = "gpu-idle-analyzer/job-report/1"
_TEXT = {"job", "content_key", "error", "source", "step_name", "name", "pg", "kind", "title", "site", "parent"}
_INTS = ("rank", "step", "seq", "ordinal", "bytes", "group_size", "stream", "device")


# ---------------------------------------------------------------- tables

def normalise(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Our column names and every column present (missing ones as NA), whatever wrote the tables."""
    out = {}
    for name in TABLES:
        df = tables.get(name)
        df = pd.DataFrame() if df is None else df.copy()
        if name == "steps" and "position" in df.columns:  # the dataset: position the index, step the label
            df = df.rename(columns={"step_name": "step_word"}).rename(columns={"step": "step_name"}).rename(
                columns={"position": "step"})
        df = df.rename(columns={k: v for k, v in ALIASES.get(name, {}).items() if k in df.columns and v not in df})
        if name == "traces" and "step_ms_median" not in df.columns and "step_median_us" in df.columns:
            df["step_ms_median"] = df["step_median_us"] / 1e3
        for col in COLUMNS[name]:
            if col not in df.columns:
                df[col] = None if col in _TEXT else np.nan
            elif col not in _TEXT:
                df[col] = pd.to_numeric(df[col], errors="coerce")
        for col in _INTS:
            if col in df.columns:
                df[col] = df[col].fillna(-1).astype(np.int64)
        for col in _TEXT & set(df.columns):
            df[col] = df[col].astype(object).where(df[col].notna(), None)
        df["job"] = [("" if j is None else str(j)) for j in df["job"]]
        out[name] = df.reset_index(drop=True)
    return out


def read_dataset(out_dir: Path) -> dict[str, pd.DataFrame]:
    """The four tables of the Parquet dataset under out_dir (`<table>/job=J/rank=R/*.parquet`; the partition values
    become columns where the files lack them)."""
    import pyarrow.parquet as pq
    tables = {}
    for name in TABLES:
        frames = []
        root = Path(out_dir) / name
        for f in sorted(root.glob("**/*.parquet")) if root.is_dir() else []:
            df = pq.read_table(f).to_pandas()
            for part in f.relative_to(root).parts[:-1]:
                key, sep, value = part.partition("=")
                if sep and key not in df.columns:
                    df[key] = value
            frames.append(df)
        tables[name] = pd.concat(frames, ignore_index=True) if frames else None
    return normalise(tables)


# ---------------------------------------------------------------- rules

def _robust_outliers(values: np.ndarray, floor: float, baseline: np.ndarray | None = None
                     ) -> tuple[np.ndarray, float, float]:
    """Bool per value: above the median of `baseline` (default: the values) by more than MADS scaled MADs and more
    than `floor`; and that (median, MAD)."""
    base = values if baseline is None else baseline
    if not len(values) or not len(base):
        return np.zeros(len(values), bool), 0.0, 0.0
    med = float(np.median(base))
    mad = float(np.median(np.abs(base - med))) * MAD_SCALE
    excess = values - med
    return (excess > MADS * mad) & (excess > floor), med, mad


def match_collectives(coll: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The job's collectives that ran on 2 or more ranks, each with its match `key`, `wait_us` and `late_us`
    (see the module's rules), and how they were matched ("seq" or "ordinal")."""
    if coll.empty:
        return coll.assign(key=pd.Series(dtype=object), wait_us=pd.Series(dtype=float),
                           late_us=pd.Series(dtype=float)), "none"
    by_seq = bool((coll["seq"] >= 0).all())
    cols = ["pg", "name", "seq"] if by_seq else ["pg", "step", "ordinal"]  # name: P2P ops count their own Seq
    df = coll.copy()
    df["key"] = df.groupby(cols, sort=False, dropna=False).ngroup()
    df = df.drop_duplicates(["rank", "key"])
    ranks = df.groupby("key")["rank"].transform("size")
    df = df[ranks >= 2].copy()
    lo = df.groupby("key")["dur_us"].transform("min")
    hi = df.groupby("key")["dur_us"].transform("max")
    df["wait_us"] = df["dur_us"] - lo
    df["late_us"] = hi - df["dur_us"]
    df["transfer_us"] = lo
    return df, "seq" if by_seq else "ordinal"


def _stats(values) -> dict:
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], float)
    if not len(v):
        return {"n": 0, "min": None, "median": None, "max": None}
    return {"n": int(len(v)), "min": round(float(v.min()), 3), "median": round(float(np.median(v)), 3),
            "max": round(float(v.max()), 3)}


def _job_summary(job: str, traces: pd.DataFrame, steps: pd.DataFrame, coll: pd.DataFrame,
                 findings: pd.DataFrame) -> dict:
    ok = traces[traces["error"].isna()] if len(traces) else traces
    duplicates = sorted(int(r) for r in ok.loc[ok["rank"].duplicated(), "rank"].unique())
    if duplicates:  # two traces claim one rank (two windows of a run, or unrelated traces): keep the first of each
        ok = ok.drop_duplicates("rank")
        keys = set(zip(ok["rank"], ok["content_key"]))
        # a boolean array, not a list: an empty list would select no columns rather than no rows
        keep = lambda df: df[np.array([k in keys for k in zip(df["rank"], df["content_key"])], bool)]  # noqa: E731
        steps, coll, findings = keep(steps), keep(coll), keep(findings)
    ranks = sorted(int(r) for r in ok["rank"].unique())
    steps = steps[steps["rank"].isin(ranks)]
    step_dur = steps["dur_us"].astype(float)
    median_step = float(np.median(step_dur)) if len(step_dur) else None
    floor = MIN_SHARE_OF_STEP * median_step if median_step else 0.0
    matched, matched_by = match_collectives(coll[coll["rank"].isin(ranks)])
    spans = ok["span_us"].dropna()
    if not median_step and len(spans):  # no steps: 5% of the median span stands for the step
        floor = MIN_SHARE_OF_STEP * float(np.median(spans))

    by_rank = ok.drop_duplicates("rank").set_index("rank")
    waits = matched.groupby("rank")[["wait_us", "late_us"]].sum()
    counts = coll["rank"].value_counts()
    step_groups = {r: g for r, g in steps.groupby("rank")["dur_us"]}
    tops = _top_findings(findings)
    per_rank = []
    for r in ranks:
        t = by_rank.loc[r]
        top = tops.get(r)
        busy, comm = _num(t["busy_us"]), _num(t["comm_us"])
        per_rank.append({
            "rank": r, "source": _str(t["source"]), "utilization": _num(t["utilization"]), "span_us": _num(t["span_us"]),
            "busy_us": busy, "idle_us": _num(t["idle_us"]), "comm_us": comm, "compute_us": _num(t["compute_us"]),
            "overlap_us": _num(t["overlap_us"]), "comm_share": round(comm / busy, 4) if busy and comm is not None else None,
            "step_us": _stats(step_groups.get(r, [])), "collectives": int(counts.get(r, 0)),
            "wait_us": round(float(waits["wait_us"].get(r, 0.0)), 3),
            "late_us": round(float(waits["late_us"].get(r, 0.0)), 3),
            "top_finding": None if top is None else {"kind": _str(top["kind"]), "title": _str(top["title"]),
                                                     "site": _str(top["site"]),
                                                     "gpu_idle_us": _num(top["gpu_idle_us"])}})

    step_ids = sorted(int(s) for s in steps["step"].unique())
    grid = steps.pivot_table(index="rank", columns="step", values="idle_us", aggfunc="sum").reindex(
        index=ranks, columns=step_ids)
    names = steps.drop_duplicates("step").set_index("step")["step_name"].reindex(step_ids)
    heatmap = {"ranks": ranks, "steps": step_ids, "step_names": [_str(n) or str(s) for s, n in names.items()],
               "idle_us": [[None if pd.isna(v) else round(float(v), 3) for v in row] for row in grid.to_numpy()]}
    stragglers = _stragglers(steps, matched, findings, ranks, floor)
    return {"job": job, "world_size": _world(ok, ranks), "ranks": ranks, "traces": int(len(traces)),
            "failed": int((traces["error"].notna()).sum()), "duplicate_ranks": duplicates,
            "median_step_us": round(median_step, 3) if median_step else None,
            "threshold_us": round(floor, 3), "per_rank": per_rank, "heatmap": heatmap,
            "collectives": {"matched_by": matched_by, "matched": int(matched["key"].nunique()) if len(matched) else 0,
                            "wait_us": round(float(matched["wait_us"].sum()), 3) if len(matched) else 0.0},
            "stragglers": stragglers, "slow_collectives": _slow_collectives(matched, floor)}


def _stragglers(steps: pd.DataFrame, matched: pd.DataFrame, findings: pd.DataFrame, ranks: list[int],
                floor: float) -> list[dict]:
    flagged: dict[int, dict] = {}
    if len(matched):
        late = matched.groupby(["rank", "step"])["late_us"].max().reset_index()
        # the noise: every matched collective's lateness (most come after the ranks realigned, so ~0 plus jitter)
        hit, med, _ = _robust_outliers(late["late_us"].to_numpy(float), floor, matched["late_us"].to_numpy(float))
        for row in late[hit].itertuples():
            others = matched[(matched["step"] == row.step) & (matched["rank"] != row.rank)]
            entry = _flag(flagged, int(row.rank))
            entry["steps"].append(int(row.step))
            entry["late_us"] = round(max(entry["late_us"], float(row.late_us) - med), 3)
            per_rank_wait = others.groupby("rank")["wait_us"].sum()
            entry["others_waited_us"] = round(entry["others_waited_us"] + float(per_rank_wait.median()), 3) \
                if len(per_rank_wait) else entry["others_waited_us"]
    if len(ranks) >= 3 and len(steps):
        resid = steps["dur_us"].astype(float) - steps.groupby("step")["dur_us"].transform("median").astype(float)
        hit, _, _ = _robust_outliers(resid.to_numpy(float), floor)
        for (_, row), excess in zip(steps[hit].iterrows(), resid[hit]):
            entry = _flag(flagged, int(row["rank"]))
            if int(row["step"]) not in entry["steps"]:
                entry["steps"].append(int(row["step"]))
            entry["step_excess_us"] = round(max(entry["step_excess_us"], float(excess)), 3)
    out = []
    for r, entry in sorted(flagged.items()):
        entry["steps"].sort()
        entry["kind"] = "late_arrival" if entry["late_us"] else "step_time"
        entry["cause"] = _cause(steps, findings, r, entry["steps"])
        out.append(entry)
    return sorted(out, key=lambda e: -(e["late_us"] or e["step_excess_us"]))


def _flag(flagged: dict[int, dict], rank: int) -> dict:
    return flagged.setdefault(rank, {"rank": rank, "steps": [], "late_us": 0.0, "others_waited_us": 0.0,
                                     "step_excess_us": 0.0})


def _cause(steps: pd.DataFrame, findings: pd.DataFrame, rank: int, late_steps: list[int]) -> dict:
    """The idle cause in the late steps that this rank has most in excess of the other ranks, and its top finding."""
    cause_cols = [c for c in (f"idle_{c}_us" for c in CAUSES) if c in steps.columns]
    cols = cause_cols or ["idle_us"]
    in_steps = steps[steps["step"].isin(late_steps)]
    mine = in_steps[in_steps["rank"] == rank][cols].astype(float).sum()
    others = in_steps[in_steps["rank"] != rank].groupby("rank")[cols].sum().astype(float)
    excess = (mine - (others.median() if len(others) else 0.0)).dropna()
    best = excess.idxmax() if len(excess) else None
    top = _top_findings(findings[findings["rank"] == rank]).get(rank)
    return {"idle_cause": best.removeprefix("idle_").removesuffix("_us") if best and cause_cols else None,
            "idle_excess_us": round(float(excess[best]), 3) if best else None,
            "top_finding": None if top is None else f"{_str(top['title'])}" + (f" at {top['site']}"
                                                                                 if _str(top["site"]) else "")}


def _top_findings(findings: pd.DataFrame) -> dict[int, pd.Series]:
    """Per rank: its top-level finding with the most GPU idle (a row)."""
    top = findings[findings["parent"].isna()].sort_values("gpu_idle_us", ascending=False, kind="stable")
    return {int(row["rank"]): row for _, row in top.drop_duplicates("rank").iterrows()}


def _slow_collectives(matched: pd.DataFrame, floor: float, limit: int = 20) -> list[dict]:
    if matched.empty:
        return []
    one = matched.drop_duplicates("key").copy()
    group = ["pg", "name", "bytes", "ordinal"]
    one["peers"] = one.groupby(group)["transfer_us"].transform("size")
    one["baseline_us"] = one.groupby(group)["transfer_us"].transform("median")
    one["mad_us"] = one.groupby(group)["transfer_us"].transform(
        lambda v: float(np.median(np.abs(v - np.median(v)))) * MAD_SCALE)
    excess = one["transfer_us"] - one["baseline_us"]
    hit = one[(one["peers"] >= 3) & (excess > MADS * one["mad_us"]) & (excess > floor)].copy()
    hit["excess_us"] = excess[hit.index]
    hit = hit.sort_values("excess_us", ascending=False, kind="stable").head(limit)
    return [{"seq": int(r.seq), "name": _str(r.name), "pg": _str(r.pg), "step": int(r.step), "ordinal": int(r.ordinal),
             "bytes": int(r.bytes), "transfer_us": round(float(r.transfer_us), 3),
             "baseline_us": round(float(r.baseline_us), 3), "excess_us": round(float(r.excess_us), 3)}
            for r in hit.itertuples()]


def _population(traces: pd.DataFrame, findings: pd.DataFrame, limit: int = 30) -> list[dict]:
    ok = traces[traces["error"].isna()]
    n = len(ok.drop_duplicates(["job", "rank", "content_key"]))
    if not n or findings.empty:
        return []
    f = findings.assign(site=findings["site"].astype(object).where(findings["site"].notna(), ""),
                        trace=list(zip(findings["job"], findings["rank"], findings["content_key"])))
    rows = []
    for (kind, site), g in f.groupby(["kind", "site"], sort=False):
        have = g["trace"].nunique()
        rows.append({"kind": _str(kind), "site": site or None, "title": _str(g["title"].iloc[0]), "traces": int(have),
                     "share": round(have / n, 4), "gpu_idle_us_median": _num(g["gpu_idle_us"].astype(float).median())})
    rows.sort(key=lambda r: (-r["share"], -(r["gpu_idle_us_median"] or 0)))
    return rows[:limit]


def job_summary(traces: pd.DataFrame, steps: pd.DataFrame, collectives: pd.DataFrame,
                findings: pd.DataFrame) -> dict:
    """report.json of the job report: per job its ranks, stragglers, comm and waits; across all traces the findings
    population. Tables as the module's docstring says (normalise() is applied)."""
    t = normalise({"traces": traces, "steps": steps, "collectives": collectives, "findings": findings})
    traces, steps, coll, findings = (t[n] for n in TABLES)
    jobs = [_job_summary(job, traces[traces["job"] == job], steps[steps["job"] == job], coll[coll["job"] == job],
                         findings[findings["job"] == job]) for job in sorted(traces["job"].unique())]
    failed = traces[traces["error"].notna()]
    return {"schema": SCHEMA, "generator": "gpu-idle-analyzer", "traces": int(len(traces)),
            "analysed": int(traces["error"].isna().sum()), "jobs": jobs,
            "errors": [{"job": _str(r.job), "rank": int(r.rank), "source": _str(r.source), "error": _str(r.error)}
                       for r in failed.itertuples()],
            "population": _population(traces, findings),
            "rules": {"mads": MADS, "min_share_of_step": MIN_SHARE_OF_STEP,
                      "wait": "duration - shortest duration of the same collective across ranks",
                      "late": "longest duration - duration (arrival after the first rank)"}}


def _world(ok: pd.DataFrame, ranks: list[int]) -> int:
    ws = pd.to_numeric(ok["world_size"], errors="coerce").dropna()
    return int(ws.max()) if len(ws) else len(ranks)


def _num(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if not np.isfinite(v) else round(v, 4)


def _str(value) -> str | None:
    return None if value is None or (not isinstance(value, str) and pd.isna(value)) else str(value)


# ---------------------------------------------------------------- output

def render_job_markdown(summary: dict) -> str:
    from analyzer.fleet.job_render import job_markdown
    return job_markdown(summary)


def render_job_html(summary: dict) -> str:
    from analyzer.fleet.job_render import job_html
    return job_html(summary)


def write_job_report(out_dir: Path) -> list[Path]:
    """report.md, report.html and report.json of the Parquet dataset under out_dir, written atomically beside it."""
    from analyzer.report.files import write_reports
    t = read_dataset(Path(out_dir))
    summary = job_summary(t["traces"], t["steps"], t["collectives"], t["findings"])
    return write_reports(Path(out_dir), {"report.json": json.dumps(summary, indent=1, allow_nan=False) + "\n",
                                         "report.md": render_job_markdown(summary),
                                         "report.html": render_job_html(summary)})
