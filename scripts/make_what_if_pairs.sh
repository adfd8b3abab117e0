#!/usr/bin/env bash
# How the what-if fixtures were made (issue "What a fix buys", on one NVIDIA H200): each pathology workload at the
# full 24 decoder layers of the Qwen2-0.5B shape, its fixed twin (`decode`) timed in the same process in rounds
# interleaved with it (timing.compare_fix: meta.json fix_comparison is the measured saving and its noise band), a
# short profiled window (prefill + 4 decode steps), no allocator history (it slows the profiled steps). The graph
# pairs: the eager decode (batch 1, and batch 8) against itself replayed as a CUDA graph (timing.compare_fix_mode),
# the fix for launch overhead. hf_generate: transformers' generate() against its own fix (static cache, forward compiled
# with mode=reduce-overhead: workloads/hf_generate_static.py), 4 new tokens per call and two profiled calls without
# Python stacks or memory events (24 layers with stacks do not fit a 2 MB fixture). compile_decode: torch.compile of
# the decode step with mode="default" against the same compiled with mode="reduce-overhead" (one graph per step).
#   bash scripts/make_what_if_pairs.sh OUT_DIR [RUN_NAME ...]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: make_what_if_pairs.sh OUT_DIR [RUN_NAME ...]}"
sessions="${SESSIONS:-12}"  # interleaved rounds of each pair: enough that the band is narrower than the saving
shift
only=" $* "
want() { [ "$only" = "  " ] || [[ "$only" == *" $1 "* ]]; }
for name in item_sync print_tensor alloc_churn alloc_steady host_work fragmentation numpy_sampler; do
  want "$name" || continue
  python3 -m analyzer capture "workloads/$name.yaml" --out "$out" --set timing.compare_fix=decode \
    --set timing.sessions="$sessions" --set memory_history.enabled=false --set prompt_length=128 --set decode_steps=32 \
    --set timing.warmup_steps=5 --set profiler.warmup=2 --set profiler.active=4 --set name="$name"
done
for pair in decode_vs_graph:decode batch_decode_vs_graph:batch_decode; do
  name="${pair%%:*}" workload="${pair#*:}"
  want "$name" || continue
  python3 -m analyzer capture "workloads/$workload.yaml" --out "$out" --set device=cuda --set timing.compare_fix=decode \
    --set timing.compare_fix_mode=cuda_graph --set timing.sessions="$sessions" --set memory_history.enabled=false \
    --set prompt_length=128 --set decode_steps=32 --set timing.warmup_steps=5 --set profiler.warmup=2 \
    --set profiler.active=4 --set name="$name"
done
# GPU-bound pairs: the step replayed as a CUDA graph at batch 8, so that the GPU is the bottleneck; the pathology is
# a per-step .item() plus host work (its twins: without the read-back, without the host work), or a per-step pageable
# upload (its twin: pinned, non_blocking).
# graph_sync_big_host: the same with 20,000 iterations of the helper (a saving well above the world's error);
# graph_hidden_host_work: the helper without the read-back, hidden under the next step's GPU work (a fix that buys
# nothing).
for pair in graph_sync_host_vs_no_item:decode_sync_host_work:decode_host_work \
    graph_sync_host_vs_no_host_work:decode_sync_host_work:decode_item_sync \
    graph_pageable_upload:decode_pageable_upload:decode_pinned_upload \
    graph_sync_big_host:decode_sync_big_host_work:decode_item_sync \
    graph_hidden_host_work:decode_host_work:decode; do
  IFS=: read -r name script twin <<< "$pair"
  want "$name" || continue
  python3 -m analyzer capture workloads/graph_decode.yaml --out "$out" --set script="$script" --set batch_size=8 \
    --set timing.compare_modes=false --set timing.compare_fix="$twin" --set timing.sessions="$sessions" \
    --set memory_history.enabled=false --set prompt_length=128 --set decode_steps=32 --set timing.warmup_steps=5 \
    --set profiler.warmup=2 --set profiler.active=4 --set name="$name"
done
if want compile_decode; then
  python3 -m analyzer capture workloads/compile_decode.yaml --out "$out" --set device=cuda \
    --set timing.compare_fix=compile_decode --set timing.compare_fix_compile_mode=reduce-overhead \
    --set timing.sessions="$sessions" --set memory_history.enabled=false --set prompt_length=128 --set decode_steps=32 \
    --set timing.warmup_steps=5 --set profiler.warmup=2 --set profiler.active=4 --set name=compile_decode
fi
if want hf_generate; then
  python3 -m analyzer capture workloads/hf_generate.yaml --out "$out" --set timing.compare_fix=hf_generate_static \
    --set timing.sessions="$sessions" --set memory_history.enabled=false --set hf.max_new_tokens=4 --set decode_steps=8 \
    --set timing.warmup_steps=3 --set profiler.warmup=1 --set profiler.active=2 --set profiler.with_stack=false \
    --set profiler.profile_memory=false --set name=hf_generate
fi
