#!/usr/bin/env bash
# Traces of user-style scripts (scripts/foreign/, plain torch.profiler) where the host's time has a reason the
# trace must name: set-up per new shape (cuDNN attention plans, cuDNN's benchmark search), another thread holding
# the GIL, Python between steps, kernels loaded at the window's start, a cold process recorded on the GPU side only.
# Each in a fresh python3 process; OUT_DIR/<name>/ holds trace.json.gz and truth.json (unprofiled timings of the
# variants, measured in interleaved rounds by the script itself; twins run with --rounds 0):
#   bash scripts/make_host_reason_fixtures.sh OUT_DIR [NAME ...]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: make_host_reason_fixtures.sh OUT_DIR [NAME ...]}"
shift
only=" $* "
want() { [ "$only" = "  " ] || [[ "$only" == *" $1 "* ]]; }
run() {  # NAME SCRIPT ARGS...
  local name="$1" script="$2"
  shift 2
  want "$name" || return 0
  echo "== $name"
  python3 "scripts/foreign/$script.py" "$out/$name" "$@"
}
run sdpa_growing_cache sdpa_growing_cache --variant growing
run sdpa_fixed_cache sdpa_growing_cache --variant fixed --rounds 0
run cudnn_benchmark_new_shapes cudnn_benchmark_shapes --shapes new
run cudnn_benchmark_few_shapes cudnn_benchmark_shapes --shapes few --rounds 0
run cudnn_benchmark_fixed_shape cudnn_benchmark_shapes --shapes fixed --rounds 0
run tokenizer_threads tokenizer_threads --pool thread
run tokenizer_processes tokenizer_threads --pool process --rounds 0
run detokenize_steps detokenize_steps --detok step
run detokenize_at_end detokenize_steps --detok end --rounds 0
run first_launch_window first_launch_window
if want cold_first_forward_cuda_only; then
  echo "== cold_first_forward_cuda_only"
  mkdir -p "$out/cold_first_forward_cuda_only"
  python3 scripts/foreign/cold_first_forward.py "$out/cold_first_forward_cuda_only/trace.json.gz" --cuda-only
fi
