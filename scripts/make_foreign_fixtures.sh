#!/usr/bin/env bash
# Traces from code written the way a user outside this project would write it (scripts/foreign/*.py: plain
# torch.profiler, no import from analyzer/ or workloads/), each in its own fresh python3 process:
#   bash scripts/make_foreign_fixtures.sh OUT_DIR [NAME ...]
# writes OUT_DIR/<name>/trace.json.gz; tests/fixtures/h200_foreign/ holds what it made (see its README section).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: make_foreign_fixtures.sh OUT_DIR [NAME ...]}"
shift
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=(cold_first_forward dataloader_bound host_math_step compile_in_window compile_in_window_cuda_only
         cuda_activity_only launches_without_gpu_activity)
fi
for name in "${names[@]}"; do
  mkdir -p "$out/$name"
  echo "== $name"
  if [ "$name" = compile_in_window_cuda_only ]; then
    python3 scripts/foreign/compile_in_window.py "$out/$name/trace.json.gz" --cuda-only
  else
    python3 "scripts/foreign/$name.py" "$out/$name/trace.json.gz"
  fi
done
