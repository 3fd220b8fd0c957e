#!/usr/bin/env bash
# Tensor parallelism (issue 29) on a CUDA machine: build here, run there.
#
#   scripts/tp_gpu.sh build     # here: release binaries into target/tp-bundle/ (carry that folder)
#   scripts/tp_gpu.sh run       # there, one GPU: (1) MLX's CUDA build has the NCCL back-end,
#                               # (2) a one-rank NCCL group runs the sharded MLP end to end and
#                               # matches the one-process output (bf16 and f32), (3) the sharded
#                               # path with one rank against the unsharded MLP (target: within 3 %)
#   scripts/tp_gpu.sh multi N   # there, N GPUs: N NCCL ranks end to end, and the TP benchmark
#   scripts/tp_gpu.sh tests     # there: the tensor-parallel and shard tests (ring over loopback,
#                               # on the CUDA build, MLX_ENABLE_TF32=0)
#
# The binaries link MLX's CPU wheel here; there they run against MLX's CUDA build of the same
# version (mlx-cuda-13==0.32.2) through LD_LIBRARY_PATH: `source /tmp/mlxcu/env.sh` (see
# shared/device/README.md), which this script does itself when the file exists. Every step has a
# time limit and its output goes to $OUT (default target/tp-bundle/out); the summary at the end
# says which steps passed. NCCL_NVLS_ENABLE=0 is exported for every process (the launcher also
# sets it in each rank's environment).
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=target/tp-bundle

case "${1:-}" in
build)
  set -e
  cargo build --release --features tuning --example qwen_mlp --example bench_mlp
  mkdir -p "$bundle"
  cargo test --release --features tuning --no-run --test tensor_parallel --test shard --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do cp "$exe" "$bundle/test_$name"; done
  cp target/release/examples/{qwen_mlp,bench_mlp} "$bundle/"
  strip "$bundle"/qwen_mlp "$bundle"/bench_mlp "$bundle"/test_*
  ls -l "$bundle"
  exit 0
  ;;
run | multi | tests) ;;
*)
  echo "usage: scripts/tp_gpu.sh build | run | multi N | tests" >&2
  exit 2
  ;;
esac

mode="$1"
out="${OUT:-$bundle/out}"
mkdir -p "$out"
for b in qwen_mlp bench_mlp; do
  [ -x "$bundle/$b" ] || { echo "no $bundle/$b: run 'scripts/tp_gpu.sh build' on the build machine and carry $bundle" >&2; exit 2; }
done
if [ -f /tmp/mlxcu/env.sh ] && [[ "${LD_LIBRARY_PATH:-}" != */tmp/mlxcu/mlx/lib* ]]; then
  # shellcheck disable=SC1091
  source /tmp/mlxcu/env.sh
fi
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export MLX_PTX_CACHE_DIR="${MLX_PTX_CACHE_DIR:-/tmp/mlx-trellis-ptx}"

summary=()
failed=0
# step NAME SECONDS COMMAND...: runs COMMAND under a time limit, output to $out/NAME.txt.
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit} s): $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0))
  if [ "$rc" = 0 ]; then
    summary+=("ok      $name (${took} s)")
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    summary+=("TIMEOUT $name (over ${limit} s)")
    failed=1
  else
    summary+=("FAILED  $name (exit $rc, ${took} s)")
    failed=1
  fi
  return "$rc"
}

finish() {
  echo
  echo "== summary ($mode)"
  printf '  %s\n' "${summary[@]}"
  exit "$failed"
}

# The NCCL back-end must be there, or nothing else can run.
if ! step probe 60 "$bundle/qwen_mlp" --probe; then finish; fi
if ! grep -q "MLX back-end cuda" "$out/probe.txt"; then
  summary+=("FAILED  probe: MLX's back-end is not CUDA here (source /tmp/mlxcu/env.sh? see shared/device/README.md)")
  failed=1
  finish
fi
if ! grep -q "nccl yes" "$out/probe.txt"; then
  summary+=("FAILED  probe: this MLX CUDA build has no NCCL back-end (is_available(\"nccl\") is false; is libnccl.so.2 on LD_LIBRARY_PATH?)")
  failed=1
  finish
fi
summary+=("ok      probe: MLX on CUDA with the NCCL back-end")

# real_group NAME RANKS: the log shows that the ranks formed an NCCL group of RANKS.
real_group() {
  if grep -q "Group(nccl, rank 0 of $2)" "$out/$1.txt"; then
    summary+=("ok      $1: the ranks formed an NCCL group of $2")
  else
    summary+=("FAILED  $1: no NCCL group of $2 in the log")
    failed=1
  fi
}

# overhead NAME LIMIT: the largest 'TP / unsharded' ratio of the benchmark's table.
overhead() {
  local worst
  worst=$(awk -F'|' '/^\| [0-9]+ \|/ { r = $5 + 0; if (r > w) w = r } END { printf "%.3f", w }' "$out/$1.txt")
  if awk -v w="$worst" -v l="$2" 'BEGIN { exit !(w > 0 && w <= l) }'; then
    summary+=("ok      $1: sharded/unsharded at most $worst per layer (target $2)")
  else
    summary+=("OVER    $1: sharded/unsharded up to $worst per layer (target $2; ratios within a few % are noise, rerun to confirm)")
    failed=1
  fi
}

case "$mode" in
run)
  step nccl_one_rank_bf16 150 "$bundle/qwen_mlp" --tp 1 --backend nccl --layers 2 --rows 1 --timeout 130 &&
    real_group nccl_one_rank_bf16 1
  step nccl_one_rank_f32 120 "$bundle/qwen_mlp" --tp 1 --backend nccl --layers 2 --rows 4 --dtype f32 --timeout 100 &&
    real_group nccl_one_rank_f32 1
  step overhead_tp1 240 "$bundle/bench_mlp" --tp 1 --backend nccl --rows 1,8,32,128 --evals 30 --timeout 220 &&
    overhead overhead_tp1 1.03
  ;;
multi)
  n="${2:?usage: scripts/tp_gpu.sh multi N}"
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "$gpus" -lt "$n" ]; then
    summary+=("FAILED  $n ranks need $n GPUs; nvidia-smi lists $gpus")
    failed=1
    finish
  fi
  step "nccl_${n}_ranks_m1" 200 "$bundle/qwen_mlp" --tp "$n" --backend nccl --layers 2 --rows 1 --timeout 180 &&
    real_group "nccl_${n}_ranks_m1" "$n"
  step "nccl_${n}_ranks_m8_f32" 200 "$bundle/qwen_mlp" --tp "$n" --backend nccl --layers 2 --rows 8 --dtype f32 --timeout 180 &&
    real_group "nccl_${n}_ranks_m8_f32" "$n"
  step "bench_tp$n" 180 "$bundle/bench_mlp" --tp "$n" --backend nccl --rows 1,8,32,128 --evals 20 --timeout 160
  ;;
tests)
  for t in tensor_parallel shard; do
    [ -x "$bundle/test_$t" ] || { summary+=("FAILED  no $bundle/test_$t"); failed=1; continue; }
    step "test_$t" 200 env MLX_ENABLE_TF32=0 "$bundle/test_$t" --test-threads 1
  done
  ;;
esac
finish
