#!/usr/bin/env bash
# Fix pairs in plain torch.profiler (scripts/foreign/pairkit.py): each script profiles its pathological variant
# without Python stacks (as most users' traces are) and times it against its fix in interleaved rounds without the
# profiler (truth.json beside the trace). benchmarks/what_if.py prices each pair's finding against that saving.
#   bash scripts/make_fix_pairs.sh OUT_DIR [NAME ...]
set -euo pipefail
cd "$(dirname "$0")/foreign"
out="${1:?usage: make_fix_pairs.sh OUT_DIR [NAME ...]}"
shift
rounds="${ROUNDS:-12}"
for name in "${@:-moe_routing_sync compiled_item_break training_readback dataloader_tokenize}"; do
  for one in $name; do
    echo "== $one"
    python3 "$one.py" "$out/$one" --rounds "$rounds"
  done
done
