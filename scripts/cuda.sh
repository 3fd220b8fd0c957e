#!/usr/bin/env bash
# Build here, run on a CUDA machine: the CUDA tests, the down-projection benchmark and the
# encoder on the Qwen down shape.
#
#   scripts/cuda.sh build   # on the build machine: release binaries into target/cuda-bundle/
#                           # (also what scripts/gpu_final_tests.sh and gpu_final_bench.sh run)
#   scripts/cuda.sh run     # on the CUDA machine, in a copy of the checkout that holds
#                           # target/cuda-bundle/, with MLX's CUDA build on LD_LIBRARY_PATH
#   scripts/cuda.sh tests   # only the tests of `run`
#   scripts/cuda.sh bench   # only the encoder and the benchmark of `run`
#   scripts/cuda.sh profile [M]  # Nsight Compute on one fused down kernel at M rows (default 1)
#   scripts/cuda.sh ab BASE ROWS...  # the planned fused kernel alone at each row count: this
#                                # bundle's bench_down against BASE (another build's bench_down),
#                                # alternating, two runs each (Nsight Compute; $out/ab.txt)
#   scripts/cuda.sh latency [contenders|sweep]  # every kernel's own duration (Nsight Compute,
#                                # one at a time): the benchmark's contenders and the fused
#                                # kernel's configurations (both unless one is named; SWEEP_ROWS
#                                # lists the sweep's row counts, SWEEP_TIMEOUT the seconds each
#                                # may take, 280 by default, SWEEP_ARGS more arguments of
#                                # bench_down, e.g. `--bits 2`)
#
# The binaries link MLX's CPU wheel at build time; MLX's CUDA build of the same version
# (`mlx-cuda-13==0.32.2`) exports the same API, so putting its lib/ first on LD_LIBRARY_PATH
# (the binaries' run path is DT_RUNPATH, which LD_LIBRARY_PATH overrides) runs them on the GPU.
# MLX compiles custom kernels with NVRTC at first use and caches them under MLX_PTX_CACHE_DIR.
# On an H200 `run` takes about 15 minutes, most of it the CUDA down tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=target/cuda-bundle

case "${1:-}" in
build)
  cargo build --release --features tuning --example bench_down --example bench_mlp --example qwen_down \
    --example qwen_mlp --example quantize_layer
  mkdir -p "$bundle"
  # Test binaries carry a hash in their names: copy them under stable ones.
  cargo test --release --features tuning --no-run --test cuda_down --test cuda_mlp --test mlp --test kernels \
    --test trellis_core --test foundation --test encoder --test encoder_cuda --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do cp "$exe" "$bundle/test_$name"; done
  cp target/release/examples/{bench_down,bench_mlp,qwen_down,qwen_mlp,quantize_layer} "$bundle/"
  strip "$bundle"/*  # smaller to carry to the GPU machine
  ls -l "$bundle"
  ;;
run | tests | bench | profile | latency | ab)
  out="${OUT:-$bundle/out}"
  mkdir -p "$out"
  export MLX_PTX_CACHE_DIR="${MLX_PTX_CACHE_DIR:-/tmp/mlx-trellis-ptx}"
  status=0
  step="$1"
  ncu="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}" # Nsight Compute: profile, latency, ab
  # durations SECONDS CSV [NCU_ARGS...] BENCH_DOWN [ARGS...]: each kernel launch's own duration
  # (one at a time, clocks as the GPU sets them) into CSV, for scripts/ncu_durations.py.
  durations() {
    local limit=$1 csv=$2
    shift 2
    timeout "$limit" "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
      --print-units base --csv --page raw "$@" >"$csv" 2>/dev/null
  }
  if [ "$step" = profile ]; then
    # Every launch of the fused kernel after three warm-up ones is the planned configuration at
    # M rows (bench_down --paths times it first); the report and a text summary go to $out.
    m="${2:-1}"
    timeout 300 "$ncu" --kernel-name regex:down_mma --launch-skip 3 --launch-count 1 --set full \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' \
      -o "$out/down_m$m" -f "$bundle/bench_down" --paths --rows "$m" --bits 3 --calls 4 --evals 3 >"$out/profile_m$m.log" 2>&1 ||
      status=1
    timeout 120 "$ncu" --import "$out/down_m$m.ncu-rep" --page details >"$out/profile_m$m.txt" 2>&1 || status=1
    timeout 120 "$ncu" --import "$out/down_m$m.ncu-rep" --page raw --csv >"$out/profile_m${m}_raw.csv" 2>&1 || status=1
    timeout 120 "$ncu" --import "$out/down_m$m.ncu-rep" --page source --csv --print-source sass \
      >"$out/profile_m${m}_sass.csv" 2>&1 || status=1
    exit $status
  fi
  if [ "$step" = ab ]; then
    # Builds compared on the same machine in the same minutes: run-to-run drift of a few per
    # cent would otherwise hide the change.
    base="${2:?usage: scripts/cuda.sh ab BASE_BENCH_DOWN ROWS...}"
    shift 2
    for m in "$@"; do for run in 1 2; do for build in base this; do
      bin="$bundle/bench_down"; [ "$build" = base ] && bin="$base"
      durations 100 "$out/ab_m${m}_${build}_$run.csv" --kernel-name regex:down_mma \
        "$bin" --paths --rows "$m" --bits 3 --calls 1 --evals 3 || status=1
    done; done; done
    python3 scripts/ncu_durations.py "$out"/ab_m*.csv | tee "$out/ab.txt"
    exit $status
  fi
  if [ "$step" = latency ]; then
    # Queued calls may overlap on the GPU (MLX runs independent kernels concurrently), so the
    # benchmark's per-call figures are throughput; a model's dependent layers wait for each
    # kernel in full. Nsight Compute serialises launches and reports each one's duration.
    part="${2:-both}"
    [ "$part" = sweep ] || for m in 1 8 16 32 64 128; do
      durations 100 "$out/latency_m$m.csv" "$bundle/bench_down" --rows "$m" --bits 3 --calls 1 --evals 3 || status=1
    done
    [ "$part" = contenders ] || for m in ${SWEEP_ROWS:-1 8 16 32 64 128}; do
      durations "${SWEEP_TIMEOUT:-280}" "$out/latency_sweep_m$m.csv" --kernel-name regex:down_mma \
        "$bundle/bench_down" --sweep --rows "$m" --bits 3 --calls 1 --evals 1 ${SWEEP_ARGS:-} || status=1
    done
    python3 scripts/ncu_durations.py "$out"/latency_*.csv | tee "$out/latency.txt"
    exit $status
  fi
  # Every step has a time limit: a hung GPU call must not eat the machine.
  # The CUDA down tests compile a few hundred kernels (NVRTC, at first use): their tests run
  # side by side (TEST_THREADS, 8 by default; over 9 minutes on an H200 with 16).
  [ "$step" = bench ] || for t in foundation kernels cuda_down cuda_mlp mlp trellis_core encoder encoder_cuda; do
    echo "== test_$t"
    timeout 1200 "$bundle/test_$t" --include-ignored --skip quality_table --test-threads "${TEST_THREADS:-8}" 2>&1 | tee "$out/test_$t.txt" |
      grep -E "^test |test result" || status=1
  done
  # The same with MLX's f32 matmul in f32 (MLX_ENABLE_TF32=0): the generic path's f32 gate is
  # then 1e-5 instead of TF32's.
  [ "$step" = bench ] || for t in foundation trellis_core; do
    echo "== test_$t, MLX_ENABLE_TF32=0"
    MLX_ENABLE_TF32=0 timeout 600 "$bundle/test_$t" --include-ignored --test-threads "${TEST_THREADS:-8}" 2>&1 | tee "$out/test_${t}_f32.txt" |
      grep -E "^test |test result" || status=1
  done
  [ "$step" = tests ] && exit $status
  echo "== quantize_layer (Qwen down, k 3, L 12, CUDA search; first 512 rows again on the CPU)"
  timeout 600 "$bundle/quantize_layer" --backend cuda --compare-cpu 512 2>&1 | tee "$out/quantize.txt" |
    grep -E "^\||coded in" || status=1
  echo "== bench_down"
  timeout 900 "$bundle/bench_down" --json "$out/bench.json" 2>&1 | tee "$out/bench.txt" | grep -E "^\||^Qwen" || status=1
  exit $status
  ;;
*)
  echo "usage: scripts/cuda.sh build | run | tests | bench | profile [M] | latency | ab BASE ROWS..." >&2
  exit 2
  ;;
esac
