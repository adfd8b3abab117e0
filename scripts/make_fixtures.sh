#!/usr/bin/env bash
# How tests/fixtures/ was made (on one NVIDIA H200, torch 2.11 + CUDA 13): each shipped workload captured with
# 4 of the 24 decoder layers of the Qwen2-0.5B shape and a short profiled window (the serve workloads: a
# 10-request session), so each trace stays < 2 MB gzip.
#   bash scripts/make_fixtures.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: make_fixtures.sh OUT_DIR}"
small=(--set model.layers=4 --set prompt_length=64 --set decode_steps=16 --set timing.warmup_steps=3
       --set profiler.warmup=2 --set profiler.active=6)
for name in decode item_sync print_tensor alloc_churn graph_decode batch_decode prefill; do
  python3 -m analyzer capture "workloads/$name.yaml" --out "$out" "${small[@]}"
done
serve=(--set model.layers=4 --set serve.requests=10 --set serve.prompt_min=16 --set serve.prompt_max=64
       --set serve.output_min=4 --set serve.output_max=12 --set serve.rate=200)
for name in serve serve_item_sync serve_to_thread serve_no_sleep; do
  python3 -m analyzer capture "workloads/$name.yaml" --out "$out" "${serve[@]}"
done
