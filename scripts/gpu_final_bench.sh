#!/usr/bin/env bash
# The final GPU measurements on one H200. `down [BEFORE]`: tensor parallelism with one NCCL
# rank, bench_down (against BEFORE, another build's bench_down, when given: the A/B of the
# restructure) and the f32 17-32-row decode comparison; `mlp`: bench_mlp. Run from the
# checkout's root: it runs the binaries of target/cuda-bundle/ (`scripts/cuda.sh build`;
# BUNDLE=DIR for another) with MLX's CUDA build staged (source /tmp/mlxcu/env.sh first). Writes
# logs and JSON to $OUT (default /tmp/out).
# Exit status 0 when every step of this build passed (BEFORE's run is information: it may stop
# at its time limit), 1 otherwise, 2 for a wrong argument.
#
#   scripts/gpu_final_bench.sh down [BEFORE_BENCH_DOWN]
#   scripts/gpu_final_bench.sh mlp
set -u
b="${BUNDLE:-target/cuda-bundle}"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
export MLX_PTX_CACHE_DIR=/tmp/ptx
export NCCL_NVLS_ENABLE=0
start=$SECONDS
status=0
# step NAME SECONDS CMD...: CMD with a time limit, output into $out/NAME.txt; a failure sets
# status. Returns the command's exit status.
step() {
  local name=$1 t=$2; shift 2
  timeout "$t" "$@" > "$out/$name.txt" 2>&1; local rc=$?
  echo "== $name rc $rc at $((SECONDS - start)) s"
  [ "$rc" = 0 ] || status=1
  return $rc
}
case "${1:-down}" in
down)
  before="${2:-}"
  # Tensor parallelism on one GPU: the NCCL back-end is there, one NCCL rank runs the sharded
  # MLP end to end against one process, and the sharded path's overhead with one rank.
  step tp_probe 60 $b/qwen_mlp --probe
  grep -E 'back-end|nccl' "$out/tp_probe.txt"
  step tp_nccl1 120 $b/qwen_mlp --tp 1 --backend nccl --layers 2 --rows 1 --timeout 110
  grep -E "Group\(|relErr|per layer|ok|FAIL" "$out/tp_nccl1.txt" | head -12
  step tp_overhead 150 $b/bench_mlp --tp 1 --backend nccl --rows 1,32 --evals 10 --timeout 140
  grep -E "^\||^Qwen|TP" "$out/tp_overhead.txt" | head -12
  if [ -n "$before" ]; then
    timeout 100 "$before" --evals 10 > "$out/down_before.txt" 2>&1
    echo "== down_before rc $? at $((SECONDS - start)) s (information)"
  else
    echo "== down_before: skipped (no BEFORE bench_down given)"
  fi
  step down_after 100 $b/bench_down --evals 10 --json "$out/down.json"
  step f32_sweep 80 $b/bench_down --bits 3 --dtype f32 --sweep --rows 17,24,32 --calls 20 --evals 8 \
    --configs "nc2 mt3 ks4 w8 s13; nc2 mt4 ks4 w8 s13"
  [ -n "$before" ] && grep -E "^\||^Qwen" "$out/down_before.txt" | head -20
  grep -E "^\||^Qwen" "$out/down_after.txt" | head -20
  grep -E "^\|" "$out/f32_sweep.txt"
  ;;
mlp)
  timeout 560 $b/bench_mlp --bits 3,2 --evals 10 --rounds 3 --json "$out/mlp.json" > "$out/mlp.txt" 2> "$out/mlp.err"
  rc=$?; echo "== mlp rc $rc at $((SECONDS - start)) s"; [ "$rc" = 0 ] || status=1
  cat "$out/mlp.txt"; tail -3 "$out/mlp.err"
  ;;
*)
  echo "usage: scripts/gpu_final_bench.sh down [BEFORE_BENCH_DOWN] | mlp" >&2
  exit 2
  ;;
esac
echo "== status $status"
exit $status
