#!/usr/bin/env bash
# Tensor-parallel decode on the GPUs of one host (issue 16), in one command from the repo root:
#
#     bash workloads/tp_bench.sh                 # tp 1, 2, 4 (those the GPUs allow) x bfloat16, float32
#     TPS="1 2" DTYPES=bfloat16 OUT=traces/tp bash workloads/tp_bench.sh
#
# Captures workloads/tp_decode.yaml (Qwen2-0.5B shape, 4 layers, random weights, eager) at each tp and dtype, plus
# tp=2 bfloat16 with the planted straggler (rank 1, 2 ms), then prints per run the unprofiled eager decode step time
# (p50, rank 0 and the slowest rank), the share of the profiled decode steps' GPU time in NCCL all-reduce kernels,
# and whether the generated tokens equal tp=1's (digest of every token of the last sequence, script_info.tokens_sha1).
# Exit status 1 when tokens differ across world sizes or a capture fails. NVLink multicast stays off.
set -u -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PYTHON=${PYTHON:-python3}
OUT=${OUT:-traces/tp_bench}
TPS=${TPS:-1 2 4}
DTYPES=${DTYPES:-bfloat16 float32}
# GPUS: how many ranks may run (default: the GPUs torch sees); EXTRA: more --set arguments for every capture, e.g.
# a CPU dry run over gloo: GPUS=2 TPS="1 2" DTYPES=float32 EXTRA="--set model.preset=tiny --set decode_steps=4"
GPUS=${GPUS:-$($PYTHON -c "import torch; print(torch.cuda.device_count())")}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
mkdir -p "$OUT"
status=0
capture() {  # name, then --set arguments
    local name=$1; shift
    echo "== $name" >&2
    if ! $PYTHON -m analyzer capture workloads/tp_decode.yaml --out "$OUT" --set "name=$name" "$@" \
            ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"} >&2; then
        echo "capture $name failed" >&2
        status=1
    fi
}
for dtype in $DTYPES; do
    for tp in $TPS; do
        if [ "$tp" -gt "$GPUS" ]; then
            echo "skip tp=$tp: $GPUS GPU(s)" >&2
            continue
        fi
        capture "tp${tp}-${dtype}" --set "tp=$tp" --set "dtype=$dtype"
    done
done
if [ "$GPUS" -ge 2 ]; then
    capture "tp2-bfloat16-straggler" --set tp=2 --set dtype=bfloat16 --set straggler.rank=1 --set straggler.delay_ms=2
fi
$PYTHON - "$OUT" <<'EOF' || status=1
"""The table: one row per run folder under OUT (newest of each name)."""
import gzip
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {}
for meta_path in sorted(out.glob("*/meta.json")):
    meta = json.loads(meta_path.read_text())
    runs[meta["workload"]["name"]] = (meta_path.parent, meta)  # sorted by timestamp: the newest wins


def comm_share(trace: Path) -> tuple[float, float]:
    """(all-reduce share, all-gather share) of the decode steps' GPU time: NCCL kernel time inside the steps' GPU
    annotation windows over those windows (CPU annotation windows when the trace has no GPU ones)."""
    events = json.load(gzip.open(trace))["traceEvents"]
    steps = [e for e in events if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("decode_step#")]
    if not steps:
        steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("decode_step#")]
    total = sum(e["dur"] for e in steps) or float("nan")
    sums = {"AllReduce": 0.0, "AllGather": 0.0}
    for e in events:
        if e.get("cat") != "kernel" or "nccl" not in e["name"].lower():
            continue
        for s in steps:
            if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]:
                for kind in sums:
                    if kind in e["name"]:
                        sums[kind] += min(e["dur"], s["ts"] + s["dur"] - e["ts"])
                break
    return sums["AllReduce"] / total, sums["AllGather"] / total


print(f"{'run':<26} {'tp':>2} {'step p50 ms':>11} {'slowest rank':>12} {'all-reduce':>10} {'all-gather':>10}  tokens")
print("(step p50: unprofiled eager decode step, rank 0 and the slowest rank; all-reduce / all-gather: share of the "
      "profiled decode steps' GPU time in NCCL kernels, mean over ranks)")
reference, failed = {}, False
for name, (folder, meta) in sorted(runs.items(), key=lambda kv: (kv[1][1]["workload"]["dtype"],
                                                                  kv[1][1]["workload"]["tp"], kv[0])):
    w = meta["workload"]
    ranks = meta.get("distributed", {}).get("ranks") or [{"rank": 0, **meta}]
    p50 = [r["unprofiled"]["step_ms"]["p50"] for r in ranks]
    shares = [comm_share(folder / r["profiled"]["trace"]) for r in ranks]
    digests = {r["script_info"]["tokens_sha1"] for r in ranks}
    key = w["dtype"]  # a straggler only delays: the tokens stay those of tp=1
    if w["tp"] == 1:
        reference[key] = digests
    same = "n/a (no tp=1 run)" if key not in reference else ("same as tp=1" if digests == reference[key]
                                                              else "DIFFER from tp=1")
    if len(digests) > 1:
        same = "DIFFER between ranks"
    failed = failed or "DIFFER" in same
    mean = [sum(s[i] for s in shares) / len(shares) for i in (0, 1)]
    print(f"{name:<26} {w['tp']:>2} {p50[0]:>11.3f} {max(p50):>12.3f} {mean[0]:>10.1%} {mean[1]:>10.1%}  {same}  "
          f"{folder}")
sys.exit(1 if failed else 0)
EOF
exit $status
