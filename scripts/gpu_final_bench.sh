#!/usr/bin/env bash
# The final GPU measurements on one H200. `down`: tensor parallelism with one NCCL rank,
# bench_down before/after (the A/B of the restructure) and the f32 17-32-row decode comparison;
# `mlp`: bench_mlp. Writes logs and JSON to $OUT.
set -u
b=target/b-bench
tp=target/b-bench
out="${OUT:-/tmp/out}"; mkdir -p "$out"
export MLX_PTX_CACHE_DIR=/tmp/ptx
export NCCL_NVLS_ENABLE=0
start=$SECONDS
case "${1:-down}" in
down)
  # Tensor parallelism on one GPU: the NCCL back-end is there, one NCCL rank runs the sharded
  # MLP end to end against one process, and the sharded path's overhead with one rank.
  timeout 60 $tp/qwen_mlp --probe > "$out/tp_probe.txt" 2>&1; echo "== tp probe rc $?: $(grep -E 'back-end|nccl' "$out/tp_probe.txt" | tr '\n' ' ')"
  timeout 120 $tp/qwen_mlp --tp 1 --backend nccl --layers 2 --rows 1 --timeout 110 > "$out/tp_nccl1.txt" 2>&1; echo "== tp one NCCL rank rc $? at $((SECONDS - start)) s"
  grep -E "Group\(|relErr|per layer|ok|FAIL" "$out/tp_nccl1.txt" | head -12
  timeout 150 $b/bench_mlp --tp 1 --backend nccl --rows 1,32 --evals 10 --timeout 140 > "$out/tp_overhead.txt" 2>&1; echo "== tp overhead rc $? at $((SECONDS - start)) s"
  grep -E "^\||^Qwen|TP" "$out/tp_overhead.txt" | head -12
  timeout 100 target/b-bench/bench_down_before_stripped --evals 10 > "$out/down_before.txt" 2>&1; echo "down before rc $? at $((SECONDS - start)) s"
  timeout 100 $b/bench_down --evals 10 --json "$out/down.json" > "$out/down_after.txt" 2>&1; echo "down after rc $? at $((SECONDS - start)) s"
  timeout 80 $b/bench_down --bits 3 --dtype f32 --sweep --rows 17,24,32 --calls 20 --evals 8 \
    --configs "nc2 mt3 ks4 w8 s13; nc2 mt4 ks4 w8 s13" > "$out/f32_sweep.txt" 2>&1; echo "f32 sweep rc $? at $((SECONDS - start)) s"
  grep -E "^\||^Qwen" "$out/down_before.txt" | head -20
  grep -E "^\||^Qwen" "$out/down_after.txt" | head -20
  grep -E "^\|" "$out/f32_sweep.txt"
  ;;
mlp)
  timeout 560 $b/bench_mlp --bits 3,2 --evals 10 --rounds 3 --json "$out/mlp.json" > "$out/mlp.txt" 2> "$out/mlp.err"; echo "mlp rc $? at $((SECONDS - start)) s"
  cat "$out/mlp.txt"; tail -3 "$out/mlp.err"
  ;;
esac
