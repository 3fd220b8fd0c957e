#!/usr/bin/env bash
# The final GPU measurements on one H200: bench_down before/after (the A/B of the restructure),
# the f32 17-32-row decode comparison, and bench_mlp. Writes logs and JSON to $OUT.
set -u
b=target/cuda-bundle
out="${OUT:-/tmp/out}"; mkdir -p "$out"
export MLX_PTX_CACHE_DIR=/tmp/ptx
start=$SECONDS
timeout 150 target-base/bench_down_before_stripped --evals 15 > "$out/down_before.txt" 2>&1; echo "down before rc $? at $((SECONDS - start)) s"
timeout 150 $b/bench_down --evals 15 --json "$out/down.json" > "$out/down_after.txt" 2>&1; echo "down after rc $? at $((SECONDS - start)) s"
timeout 100 $b/bench_down --bits 3 --dtype f32 --sweep --rows 17,24,32 --calls 20 --evals 10 \
  --configs "nc2 mt3 ks4 w8 s13; nc2 mt4 ks4 w8 s13" > "$out/f32_sweep.txt" 2>&1; echo "f32 sweep rc $? at $((SECONDS - start)) s"
timeout 320 $b/bench_mlp --bits 3,2 --evals 12 --rounds 3 --json "$out/mlp.json" > "$out/mlp.txt" 2> "$out/mlp.err"; echo "mlp rc $? at $((SECONDS - start)) s"
grep -E "^\||^Qwen" "$out/down_before.txt" | head -20
grep -E "^\||^Qwen" "$out/down_after.txt" | head -20
grep -E "^\|" "$out/f32_sweep.txt"
cat "$out/mlp.txt"; tail -3 "$out/mlp.err"
