#!/usr/bin/env bash
# How tests/fixtures/ was made (on one NVIDIA H200, torch 2.11 + CUDA 13): each shipped workload captured with
# 4 of the 24 decoder layers of the Qwen2-0.5B shape and a short profiled window (the serve workloads: a
# 10-request session), so each trace stays < 2 MB gzip.
#   bash scripts/make_fixtures.sh OUT_DIR [RUN_NAME ...]
# With run names (e.g. hf_generate compile_decode compile_decode_reduce_overhead), only those are captured.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: make_fixtures.sh OUT_DIR [RUN_NAME ...]}"
shift
only=" $* "
want() { [ "$only" = "  " ] || [[ "$only" == *" $1 "* ]]; }
small=(--set model.layers=4 --set prompt_length=64 --set decode_steps=16 --set timing.warmup_steps=3
       --set profiler.warmup=2 --set profiler.active=6)
# compile_recompile, compile_graph_break and numpy_sampler: issue 23's classes (h200_compile/ in tests/fixtures)
for name in decode item_sync print_tensor alloc_churn graph_decode batch_decode prefill host_work fragmentation \
            compile_recompile compile_graph_break numpy_sampler; do
  want "$name" || continue
  python3 -m analyzer capture "workloads/$name.yaml" --out "$out" "${small[@]}"
done
serve=(--set model.layers=4 --set serve.requests=10 --set serve.prompt_min=16 --set serve.prompt_max=64
       --set serve.output_min=4 --set serve.output_max=12 --set serve.rate=200)
for name in serve serve_item_sync serve_to_thread serve_no_sleep; do
  want "$name" || continue
  python3 -m analyzer capture "workloads/$name.yaml" --out "$out" "${serve[@]}"
done
# Third-party code: transformers' generate() (needs transformers; each step is one generate() call, here of 6 tokens,
# 2 calls recorded) and torch.compile of the decode step (compile and CUDA-graph recording in the warm-up steps).
if want hf_generate; then
  python3 -m analyzer capture workloads/hf_generate.yaml --out "$out" --set model.layers=4 --set prompt_length=64 \
    --set decode_steps=16 --set timing.warmup_steps=3 --set profiler.warmup=1 --set profiler.active=2 \
    --set hf.max_new_tokens=6
fi
for spec in compile_decode:default compile_decode_reduce_overhead:reduce-overhead; do
  name="${spec%%:*}" mode="${spec#*:}"
  want "$name" || continue
  python3 -m analyzer capture workloads/compile_decode.yaml --out "$out" "${small[@]}" --set compile.mode="$mode" \
    --set name="$name"
done
