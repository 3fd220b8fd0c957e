#!/usr/bin/env bash
# Build here, run on a CUDA machine: the CUDA tests, the down-projection benchmark and the
# encoder on the Qwen down shape.
#
#   scripts/cuda.sh build   # on the build machine: release binaries into target/cuda-bundle/
#   scripts/cuda.sh run     # on the CUDA machine, in a copy of the checkout that holds
#                           # target/cuda-bundle/, with MLX's CUDA build on LD_LIBRARY_PATH
#
# The binaries link MLX's CPU wheel at build time; MLX's CUDA build of the same version
# (`mlx-cuda-13==0.32.2`) exports the same API, so putting its lib/ first on LD_LIBRARY_PATH
# (the binaries' run path is DT_RUNPATH, which LD_LIBRARY_PATH overrides) runs them on the GPU.
# MLX compiles custom kernels with NVRTC at first use and caches them under MLX_PTX_CACHE_DIR.
# On an H200 `run` takes about 10 minutes, most of it the CUDA down tests (about 4.5 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=target/cuda-bundle

case "${1:-}" in
build)
  cargo build --release --example bench_down --example qwen_down --example quantize_layer
  mkdir -p "$bundle"
  # Test binaries carry a hash in their names: copy them under stable ones.
  cargo test --release --no-run --test cuda_down --test kernels --test trellis_core --test foundation \
    --test encoder --test encoder_cuda --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do cp "$exe" "$bundle/test_$name"; done
  cp target/release/examples/{bench_down,qwen_down,quantize_layer} "$bundle/"
  ls -l "$bundle"
  ;;
run)
  out="${OUT:-$bundle/out}"
  mkdir -p "$out"
  export MLX_PTX_CACHE_DIR="${MLX_PTX_CACHE_DIR:-/tmp/mlx-trellis-ptx}"
  status=0
  # Every step has a time limit: a hung GPU call must not eat the machine.
  for t in foundation kernels cuda_down trellis_core encoder encoder_cuda; do
    echo "== test_$t"
    timeout 600 "$bundle/test_$t" --test-threads 1 2>&1 | tee "$out/test_$t.txt" | grep -E "^test |test result" || status=1
  done
  # The same with MLX's f32 matmul in f32 (MLX_ENABLE_TF32=0): the generic path's f32 gate is
  # then 1e-5 instead of TF32's.
  for t in foundation trellis_core; do
    echo "== test_$t, MLX_ENABLE_TF32=0"
    MLX_ENABLE_TF32=0 timeout 600 "$bundle/test_$t" --test-threads 1 2>&1 | tee "$out/test_${t}_f32.txt" |
      grep -E "^test |test result" || status=1
  done
  echo "== quantize_layer (Qwen down, k 3, L 12, CUDA search; first 512 rows again on the CPU)"
  timeout 600 "$bundle/quantize_layer" --backend cuda --compare-cpu 512 2>&1 | tee "$out/quantize.txt" |
    grep -E "^\||coded in" || status=1
  echo "== bench_down"
  timeout 900 "$bundle/bench_down" --json "$out/bench.json" 2>&1 | tee "$out/bench.txt" | grep -E "^\||^Qwen" || status=1
  exit $status
  ;;
*)
  echo "usage: scripts/cuda.sh build | run" >&2
  exit 2
  ;;
esac
