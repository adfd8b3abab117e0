#!/usr/bin/env bash
# How traces/examples/ was made (on one NVIDIA H200): the fixtures' 4-layer captures of each example workload with
# the current capture (so each run has the allocator's own history beside its trace), the snapshot gzipped, the
# folder renamed to the workload's name.
#   bash scripts/make_examples.sh OUT_DIR [RUN_NAME ...]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: make_examples.sh OUT_DIR [RUN_NAME ...]}"
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(decode batch_decode prefill graph_decode item_sync print_tensor alloc_churn
                                 fragmentation host_work serve serve_to_thread)
mkdir -p "$out"
for name in "${names[@]}"; do
  tmp=$(mktemp -d)
  bash scripts/make_fixtures.sh "$tmp" "$name"
  run=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -n 1)
  [ -f "$run/memory_snapshot.pickle" ] && gzip -9 "$run/memory_snapshot.pickle"
  rm -rf "${out:?}/$name"
  mv "$run" "$out/$name"
  rmdir "$tmp"
done
