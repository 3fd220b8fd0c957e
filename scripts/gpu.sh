#!/usr/bin/env bash
# mlx-trellis on an NVIDIA GPU: get MLX's CUDA build, build the binaries, run the tests, the
# benchmarks, the profiles and the tensor-parallel checks. Documented in docs/gpu.md.
#
#   scripts/gpu.sh setup DIR                  # MLX's CUDA build (pip) into DIR; writes DIR/env.sh
#   scripts/gpu.sh build                      # test and example binaries into the bundle
#   scripts/gpu.sh test [NAME...]             # the bundle's test binaries, ignored GPU tests included
#   scripts/gpu.sh exits [N]                  # N (50) failing runs must each exit 2, none abort
#   scripts/gpu.sh bench [mlp|down|encoder|all | ab BASE_BENCH_MLP [ROWS]]
#   scripts/gpu.sh profile [mlp [M] | chain [K] | axis1 [M] | down [M] | latency [contenders|sweep] | ab BASE_BENCH_DOWN ROWS...]
#   scripts/gpu.sh tp [one | multi N]         # tensor parallelism over NCCL
#
# Environment (defaults in brackets):
#   MLX_VERSION      the MLX release to set up [0.32.2, the one mlx-c 0.7.0 is written against]
#   PYTHON           the Python whose pip `setup` uses [python3]
#   NVIDIA_LIBS      setup: `system` (the CUDA 13 runtime of PYTHON's `nvidia` package), `install`
#                    (pip-install the runtime wheels MLX's CUDA build declares into DIR) or `auto`
#                    (system when PYTHON has an `nvidia` package, else install) [auto]
#   MLX_CUDA_DIR     a folder `setup` filled: its env.sh is sourced before every run step [unset:
#                    the environment as it is, LD_LIBRARY_PATH must already reach MLX's CUDA build]
#   BUNDLE           where `build` puts the binaries and the run steps find them [target/gpu-bundle]
#   OUT              where the run steps write logs, JSON and reports [$BUNDLE/out]
#   MLX_PTX_CACHE_DIR  MLX's disk cache of its own NVRTC-compiled kernels (never of custom ones)
#                    [$BUNDLE/ptx-cache]
#   MLX_MAX_OPS_PER_BUFFER  operations MLX records into a CUDA graph before launching it [24]
#   TEST_THREADS     test threads per test binary [8]
#   TEST_TIMEOUT     seconds each test binary may take [1200]
#   BENCH_TIMEOUT    seconds each benchmark may take [900]
#   NCU, NSYS        Nsight Compute and Nsight Systems [found on PATH or under /usr/local/cuda/bin]
#
# Every run step has a time limit (a hung GPU call must not hold the machine), writes its output
# to $OUT/NAME.txt, and ends with a summary of each step's status. Exit status: 0 when every
# step passed, 1 when one failed, 2 for a usage error.
set -uo pipefail
cd "$(dirname "$0")/.."

bundle="${BUNDLE:-target/gpu-bundle}"
mlx_version="${MLX_VERSION:-0.32.2}"
python="${PYTHON:-python3}"

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# ---------------------------------------------------------------------------------------------
# setup DIR: MLX's CUDA build with pip, and the environment that runs the binaries on it.

setup() {
  local dir="${1:-}"
  [ -n "$dir" ] || usage
  set -e
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  echo "== MLX $mlx_version, CUDA 13 build (mlx-cuda-13), into $dir"
  "$python" -m pip install --quiet --upgrade --no-deps --target "$dir" "mlx-cuda-13==$mlx_version"
  [ -f "$dir/mlx/lib/libmlx.so" ] || { echo "no $dir/mlx/lib/libmlx.so after pip install" >&2; exit 1; }

  # The CUDA 13 runtime libraries MLX's CUDA build needs (cuBLAS, cuDNN, NVRTC, NCCL, ...): the
  # ones a Python environment already has (a PyTorch install, say), or the wheels it declares.
  local mode="${NVIDIA_LIBS:-auto}" nvidia_roots
  if [ "$mode" = auto ]; then
    if "$python" -c 'import nvidia' 2>/dev/null; then mode=system; else mode=install; fi
  fi
  case "$mode" in
  system)
    nvidia_roots=$("$python" -c 'import nvidia; print("\n".join(nvidia.__path__))')
    ;;
  install)
    local reqs
    reqs=$("$python" - "$dir" <<'EOF'
import glob, sys
from email.parser import Parser
for meta in glob.glob(sys.argv[1] + "/mlx_cuda_13-*.dist-info/METADATA"):
    for req in Parser().parse(open(meta, encoding="utf-8")).get_all("Requires-Dist") or []:
        if req.startswith("nvidia-") and "extra ==" not in req:
            print(req.split(";")[0].replace(" ", ""))
EOF
)
    [ -n "$reqs" ] || { echo "found no nvidia-* requirements in mlx-cuda-13's metadata" >&2; exit 1; }
    echo "== the CUDA runtime wheels it declares, into $dir:" $reqs
    # shellcheck disable=SC2086
    "$python" -m pip install --quiet --upgrade --target "$dir" $reqs
    nvidia_roots="$dir/nvidia"
    ;;
  *)
    echo "NVIDIA_LIBS=$mode: expected auto, system or install" >&2
    exit 2
    ;;
  esac
  local libs="$dir/mlx/lib"
  [ -d "$dir/mlx_cuda_13.libs" ] && libs="$libs:$dir/mlx_cuda_13.libs"
  local root sub
  while read -r root; do
    for sub in "$root"/*/lib; do [ -d "$sub" ] && libs="$libs:$sub"; done
  done <<<"$nvidia_roots"
  cat >"$dir/env.sh" <<EOF
# MLX $mlx_version's CUDA build for mlx-trellis binaries (written by scripts/gpu.sh setup).
# The binaries' run path (DT_RUNPATH) names the MLX they were built against; LD_LIBRARY_PATH
# overrides it, so the same binaries load this libmlx.so and run on the GPU.
export LD_LIBRARY_PATH="$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export MLX_CUDA_DIR="$dir"
EOF
  set +e
  echo
  echo "Wrote $dir/env.sh:"
  cat "$dir/env.sh"
  echo
  echo "Use it one of two ways:"
  echo "  source $dir/env.sh                  # then run any binary built as usual, or"
  echo "  MLX_CUDA_DIR=$dir scripts/gpu.sh test     # the run steps of this script source it"
  echo "or build against it directly (the binaries then link the CUDA libmlx.so; the linker and"
  echo "the binaries find the CUDA runtime libraries through env.sh):"
  echo "  source $dir/env.sh && MLX_DIR=$dir/mlx cargo build --release --features tuning --examples"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  else
    echo "(nvidia-smi is not on PATH: no driver here?)"
  fi
}

# ---------------------------------------------------------------------------------------------
# build: every test binary and example into the bundle, under stable names.

# collect_tests CARGO_ARGS...: builds the test binaries `cargo test --no-run CARGO_ARGS` names
# and copies each to $bundle/test_NAME (the library's unit tests as test_lib).
collect_tests() {
  cargo test --release --no-run --message-format=json "$@" |
    "$python" -c 'import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        kind = m["target"]["kind"]
        print("lib" if kind == ["lib"] else m["target"]["name"], m["executable"])' |
    while read -r name exe; do cp "$exe" "$bundle/test_$name"; done
}

build() {
  set -e
  mkdir -p "$bundle"
  cargo build --release --features tuning --examples
  collect_tests --features tuning --lib --tests
  local e
  for e in bench_down bench_mlp qwen_down qwen_mlp quantize_layer quantize_mlp; do
    cp "target/release/examples/$e" "$bundle/"
  done
  # Smaller to carry to another machine; the run path to MLX stays.
  strip "$bundle"/* 2>/dev/null || true
  ls -l "$bundle"
}

# ---------------------------------------------------------------------------------------------
# The run steps.

out="${OUT:-$bundle/out}"
summary=()
failed=0

# prepare: the environment every run step needs, and the bundle's presence.
prepare() {
  if [ -n "${MLX_CUDA_DIR:-}" ]; then
    [ -f "$MLX_CUDA_DIR/env.sh" ] || { echo "MLX_CUDA_DIR=$MLX_CUDA_DIR has no env.sh (scripts/gpu.sh setup DIR)" >&2; exit 2; }
    # shellcheck disable=SC1091
    source "$MLX_CUDA_DIR/env.sh"
  fi
  [ -d "$bundle" ] || { echo "no bundle at $bundle: run 'scripts/gpu.sh build' (or set BUNDLE)" >&2; exit 2; }
  mkdir -p "$out"
  export MLX_PTX_CACHE_DIR="${MLX_PTX_CACHE_DIR:-$bundle/ptx-cache}"
  # CUDA graphs of 24 operations: MLX's default (100) keeps the GPU idle while the host records
  # about 20 coded MLP layers (mlx_trellis::trellis::cuda::MAX_OPS_PER_GRAPH).
  export MLX_MAX_OPS_PER_BUFFER="${MLX_MAX_OPS_PER_BUFFER:-24}"
  # NVLink SHARP (multicast) is left off: some virtualised GPUs reject it (NCCL then fails).
  export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
  export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
}

# step NAME SECONDS COMMAND...: COMMAND under a time limit, its output in $out/NAME.txt (and on
# the terminal), its status in the summary. Returns the command's exit status.
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit} s): $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]} took=$((SECONDS - t0))
  if [ "$rc" = 0 ]; then
    summary+=("ok      $name (${took} s)")
  elif [ "$rc" = 134 ] && grep -q '^test result: ok\.' "$out/$name.txt" && grep -q 'driver shutting down' "$out/$name.txt"; then
    # A test binary ends through libtest's own exit, not mlx_trellis::exit_process, so MLX's CUDA
    # static destructors can still abort it after its results are printed (docs/gpu.md).
    summary+=("ok      $name (${took} s; every test passed, then the harness aborted at exit: driver shutting down)")
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    summary+=("TIMEOUT $name (over ${limit} s)")
    failed=1
  else
    summary+=("FAILED  $name (exit $rc, ${took} s)")
    failed=1
  fi
  return "$rc"
}

note() { # a line of the summary that is not a step's status
  summary+=("$1")
}

finish() {
  echo
  echo "== summary (logs in $out)"
  printf '  %s\n' "${summary[@]}"
  exit "$failed"
}

# ---------------------------------------------------------------------------------------------
# test [NAME...]: the bundle's test binaries (all, or test_NAME for each NAME).

# Binaries whose f32 gates assume MLX multiplies f32 matrices in f32: run with MLX_ENABLE_TF32=0.
f32_only=" tensor_parallel shard "
# Binaries run a second time with MLX_ENABLE_TF32=0 (the generic path's f32 gate is then 1e-4
# instead of TF32's).
f32_again=" foundation trellis_core "
# Binaries that start processes of their own: one test at a time.
serial=" tensor_parallel "
# Binaries whose tests are compile-bound (NVRTC, a kernel per planned shape): one process per
# test, all at once. MLX compiles a process's kernels one at a time (its JIT cache holds a
# process-wide lock while it compiles) and never keeps custom kernels on disk, so only separate
# processes compile in parallel. Each gets its own MLX_PTX_CACHE_DIR (MLX's own kernels are cached
# there; no two processes write one file). In one process tests/cuda_mlp.rs did not finish in
# 400 s on an H200 (8 threads) and tests/cuda_down.rs ran 8 of its 27 tests in 540 s (16
# threads); split, cuda_mlp finished in 260 s (docs/gpu.md).
split=" cuda_mlp cuda_down "

# split_tests NAME EXE: every test of EXE (ignored ones too) in its own process, at once, each
# under TEST_TIMEOUT with its output in $out/NAME/TEST.txt; one summary line per test.
split_tests() {
  local name=$1 exe=$2 t pids=() tests=() i rc
  mkdir -p "$out/$name"
  mapfile -t tests < <("$exe" --list 2>/dev/null | sed -n 's/: test$//p'; "$exe" --list --ignored 2>/dev/null | sed -n 's/: test$//p')
  mapfile -t tests < <(printf '%s\n' "${tests[@]}" | sort -u)
  echo "== $name: ${#tests[@]} tests, one process each (limit ${TEST_TIMEOUT:-1200} s)"
  for t in "${tests[@]}"; do
    mkdir -p "$MLX_PTX_CACHE_DIR/$name/$t"
    MLX_PTX_CACHE_DIR="$MLX_PTX_CACHE_DIR/$name/$t" timeout --kill-after=10 "${TEST_TIMEOUT:-1200}" \
      "$exe" --include-ignored --exact "$t" --nocapture --test-threads 1 > "$out/$name/$t.txt" 2>&1 &
    pids+=($!)
  done
  for i in "${!tests[@]}"; do
    wait "${pids[$i]}" && rc=0 || rc=$?
    case "$rc" in
      0) summary+=("ok      $name::${tests[$i]}") ;;
      124 | 137) summary+=("TIMEOUT $name::${tests[$i]} (over ${TEST_TIMEOUT:-1200} s)"); failed=1 ;;
      *) summary+=("FAILED  $name::${tests[$i]} (exit $rc; $out/$name/${tests[$i]}.txt)"); failed=1 ;;
    esac
  done
}

run_tests() {
  local names=("$@") t exe threads
  if [ "${#names[@]}" = 0 ]; then
    for exe in "$bundle"/test_*; do names+=("${exe##*/test_}"); done
  fi
  for t in "${names[@]}"; do
    exe="$bundle/test_$t"
    [ -x "$exe" ] || { note "FAILED  test_$t: no $exe"; failed=1; continue; }
    if [[ "$split" == *" $t "* ]]; then
      split_tests "test_$t" "$exe"
      continue
    fi
    threads="${TEST_THREADS:-8}"
    [[ "$serial" == *" $t "* ]] && threads=1
    # The encoder's quality table is a measurement (minutes on the CPU), not a check.
    if [[ "$f32_only" == *" $t "* ]]; then
      step "test_${t}_f32" "${TEST_TIMEOUT:-1200}" env MLX_ENABLE_TF32=0 "$exe" --include-ignored \
        --skip quality_table --test-threads "$threads"
      continue
    fi
    step "test_$t" "${TEST_TIMEOUT:-1200}" "$exe" --include-ignored --skip quality_table --test-threads "$threads"
    if [[ "$f32_again" == *" $t "* ]]; then
      step "test_${t}_f32" "${TEST_TIMEOUT:-1200}" env MLX_ENABLE_TF32=0 "$exe" --include-ignored \
        --skip quality_table --test-threads "$threads"
    fi
  done
  [ "${#@}" = 0 ] && exits
}

# exits [N]: how runs that fail end. N (50) failing invocations of mixed kinds (a forced path
# that does not serve the layer or MLP, a broken artifact, activations of the wrong width or
# dtype) must each end in exit status 2 and never in an abort ("terminate called ...
# Destroy(handle_) failed: driver shutting down", status 134); so must an NCCL rank 1 started
# without its rank 0 (3 runs); the main example's success path must end in 0. Every run's output
# is in $out/exits/.
exits() {
  local n="${1:-50}" dir="$out/exits"
  [ -x "$bundle/qwen_down" ] && [ -x "$bundle/quantize_mlp" ] && [ -x "$bundle/qwen_mlp" ] || {
    note "FAILED  exits: qwen_down, quantize_mlp and qwen_mlp must be in the bundle"
    failed=1
    return
  }
  rm -rf "$dir" && mkdir -p "$dir"
  # A valid MLP artifact (hidden 512), a copy whose safetensors is cut short, and activations
  # files of the wrong width and of an integer dtype.
  step exits_artifact 600 "$bundle/quantize_mlp" --out "$dir/good" >/dev/null || return
  mkdir -p "$dir/truncated"
  cp "$dir/good/config.json" "$dir/truncated/"
  head -c 4096 "$dir/good/model.safetensors" >"$dir/truncated/model.safetensors"
  "$python" - "$dir" <<'EOF' || { note "FAILED  exits: could not write the activations files"; failed=1; return; }
import json, struct, sys
def write(path, dtype, shape, data):
    header = json.dumps({"x": {"dtype": dtype, "shape": shape, "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)
d = sys.argv[1]
write(f"{d}/x_wide.safetensors", "F32", [2, 100], struct.pack("<200f", *([0.5] * 200)))
write(f"{d}/x_int.safetensors", "I32", [2, 512], struct.pack("<1024i", *([1] * 1024)))
EOF
  local mlp=(--weights "$dir/good" --mlp model.layers.0.mlp)
  local i rc log codes="" aborts=0 bad=0 kind cmd=()
  for i in $(seq "$n"); do
    log="$dir/run_$i.txt"
    case $((i % 5)) in
    0) kind="forced Metal path, synthetic layer"; cmd=("$bundle/qwen_down" --path metal --rows 1 --bits 2) ;;
    1) kind="forced Metal path, MLP artifact"; cmd=("$bundle/qwen_down" "${mlp[@]}" --path metal) ;;
    2) kind="truncated artifact"; cmd=("$bundle/qwen_down" --weights "$dir/truncated" --mlp model.layers.0.mlp --path cuda) ;;
    3) kind="activations of the wrong width"; cmd=("$bundle/qwen_down" "${mlp[@]}" --x "$dir/x_wide.safetensors" --path cuda) ;;
    4) kind="integer activations"; cmd=("$bundle/qwen_down" "${mlp[@]}" --x "$dir/x_int.safetensors" --path auto) ;;
    esac
    echo "# $kind: ${cmd[*]}" >"$log"
    timeout 120 "${cmd[@]}" >>"$log" 2>&1
    rc=$?
    codes="$codes $rc"
    grep -q "terminate called" "$log" && aborts=$((aborts + 1))
    [ "$rc" = 2 ] && ! grep -q "terminate called" "$log" || bad=$((bad + 1))
  done
  if [ "$bad" = 0 ]; then
    note "ok      exits: $n failing runs, every one exit 2, $aborts aborts"
  else
    note "FAILED  exits: $n failing runs, $bad not ending in exit 2, $aborts aborts (exit codes$codes; see $dir/run_*.txt)"
    failed=1
  fi
  # An NCCL rank 1 whose rank 0 never starts: its set-up fails within MLX_NCCL_TIMEOUT.
  local port
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  codes="" bad=0
  for i in 1 2 3; do
    log="$dir/nccl_rank1_$i.txt"
    timeout 120 env MLX_TRELLIS_TP_ROLE=nccl MLX_TRELLIS_TP_OUT="$dir" MLX_RANK=1 MLX_WORLD_SIZE=2 \
      NCCL_HOST_IP=127.0.0.1 NCCL_PORT="$port" MLX_NCCL_TIMEOUT=3000 "$bundle/qwen_mlp" >"$log" 2>&1
    rc=$?
    codes="$codes $rc"
    [ "$rc" = 2 ] && ! grep -q "terminate called" "$log" || bad=1
  done
  if [ "$bad" = 0 ]; then note "ok      exits: NCCL rank 1 without rank 0, 3 runs, exit 2 each"; else
    note "FAILED  exits: NCCL rank 1 without rank 0 (exit codes$codes; see $dir/nccl_rank1_*.txt)"
    failed=1
  fi
  step qwen_down_ok 300 "$bundle/qwen_down" --rows 1 --bits 2 >/dev/null
}

# ---------------------------------------------------------------------------------------------
# bench [mlp|down|encoder|all]

bench() {
  local what="${1:-all}" limit="${BENCH_TIMEOUT:-900}"
  case "$what" in mlp | down | encoder | all) ;; ab) shift; bench_ab "$@"; return ;; *) usage ;; esac
  if [ "$what" = mlp ] || [ "$what" = all ]; then
    # The headline table (docs/benchmarks.md) and its plot.
    step bench_mlp "$limit" "$bundle/bench_mlp" --bits 3,2 --evals 10 --rounds 3 --pipelined --json "$out/bench_mlp.json" &&
      step bench_mlp_plot 60 "$bundle/bench_mlp" --plot "$out/bench_mlp.json" "$out/bench_mlp.svg"
  fi
  if [ "$what" = down ] || [ "$what" = all ]; then
    step bench_down "$limit" "$bundle/bench_down" --evals 10 --json "$out/bench_down.json"
  fi
  if [ "$what" = encoder ] || [ "$what" = all ]; then
    # The Qwen down shape coded on the GPU, its first 512 rows again on the CPU: the same bytes.
    step quantize_layer "$limit" "$bundle/quantize_layer" --backend cuda --compare-cpu 512
  fi
}

# bench ab BASE [ROWS]: the MLP chain of this bundle's bench_mlp against BASE (another build's),
# k 3, in the order base, this, this, base, so that drift over the minutes cancels. A plan's
# change must be judged in the chain: the alone sweeps queue independent calls whose partial last
# waves overlap (docs/cuda-mlp.md). One untimed run of each first compiles its kernels into the
# PTX cache, so that no timed run pays for NVRTC.
bench_ab() {
  local base="${1:-}" rows="${2:-16,32,64,128}" limit="${BENCH_TIMEOUT:-900}" i=0 which bin
  [ -n "$base" ] && [ -x "$base" ] || usage
  for which in base this; do
    bin="$bundle/bench_mlp"
    [ "$which" = base ] && bin="$base"
    step "bench_ab_warm_$which" "$limit" "$bin" --bits 3 --rows "$rows" --evals 1 --rounds 1 --no-alone >/dev/null
  done
  for which in base this this base; do
    i=$((i + 1))
    bin="$bundle/bench_mlp"
    [ "$which" = base ] && bin="$base"
    step "bench_ab_${i}_$which" "$limit" "$bin" --bits 3 --rows "$rows" --evals 8 --rounds 3 --no-alone \
      --json "$out/bench_ab_${i}_$which.json"
  done
  # Each run's table, named by its build.
  for f in "$out"/bench_ab_[1-4]_*.txt; do
    echo "## $(basename "$f" .txt)"
    grep -E '^\| (M|[0-9]+) \|' "$f" | head -"$(( $(tr -cd , <<<"$rows" | wc -c) + 2 ))"
  done | tee "$out/bench_ab.summary.txt"
}

# ---------------------------------------------------------------------------------------------
# profile: Nsight Systems and Nsight Compute, where they are installed.

find_tool() { # find_tool NAME: the tool on PATH or under /usr/local/cuda/bin, else nothing
  command -v "$1" 2>/dev/null || { [ -x "/usr/local/cuda/bin/$1" ] && echo "/usr/local/cuda/bin/$1"; } || true
}

# durations NAME SECONDS [NCU_ARGS...] -- COMMAND...: each kernel launch's own duration (launches
# serialised, clocks as the GPU sets them) into $out/NAME.csv, for scripts/ncu_durations.py.
durations() {
  local name=$1 limit=$2
  shift 2
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  step "$name" "$limit" "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --print-units base --csv --page raw --log-file "$out/$name.log" "${args[@]}" "$@" >/dev/null
  # The CSV is what ncu printed on standard output: keep it, not the tee'd copy with the log.
  grep -E '^"' "$out/$name.txt" >"$out/$name.csv" || true
}

# stalls NAME: the SASS of the report $out/NAME.ncu-rep with its warp stall samples (CSV), and
# scripts/ncu_stalls.py's summary of it: the instructions the warps wait at, and each opcode's share.
stalls() {
  local name=$1 roles=()
  # The warp-specialized kernels' samples by role too (producers, the consumer's steps, its tiles).
  case "$name" in *_ws_*) roles=(--roles) ;; esac
  step "ncu_${name}_sass" 120 "$ncu" --import "$out/$name.ncu-rep" --page source --csv --print-source sass >/dev/null &&
    "$python" scripts/ncu_stalls.py "$out/ncu_${name}_sass.txt" ${roles[@]+"${roles[@]}"} | tee "$out/${name}_stalls.txt"
}

profile() {
  local what="${1:-mlp}"
  [ $# -gt 0 ] && shift
  ncu="${NCU:-$(find_tool ncu)}"
  local nsys="${NSYS:-$(find_tool nsys)}" m
  case "$what" in
  mlp)
    # The MLP benchmark at M rows (default 1): a timeline, every kernel's own duration, and a
    # full report of one launch of each trellis kernel.
    m="${1:-1}"
    local run=("$bundle/bench_mlp" --rows "$m" --bits 3 --evals 3 --rounds 1 --no-alone)
    if [ -n "$nsys" ]; then
      step "nsys_mlp_m$m" 600 "$nsys" profile --force-overwrite true -o "$out/mlp_m$m" "${run[@]}"
    else
      note "skipped nsys: not installed (NSYS=PATH)"
    fi
    if [ -n "$ncu" ]; then
      durations "durations_mlp_m$m" 600 -- "${run[@]}" &&
        "$python" scripts/ncu_durations.py "$out/durations_mlp_m$m.csv" | tee "$out/durations_mlp_m$m.summary.txt"
      step "ncu_mlp_m$m" 600 "$ncu" --kernel-name 'regex:gate_up|down_mma' --launch-skip 6 --launch-count 2 \
        --set full -o "$out/mlp_m$m" -f "${run[@]}"
    else
      note "skipped ncu: not installed (NCU=PATH)"
    fi
    ;;
  chain)
    # Every trellis kernel of the MLP chain at every row count of bench_mlp (one width, default 3),
    # launches serialised: per row count each kernel's median and the sum a layer, to set beside
    # the chain's own time (scripts/ncu_chain.py; docs/cuda-mlp.md).
    local bits="${1:-3}" rows="${ROWS:-1,2,4,8,16,32,64,128}"
    [ -n "$ncu" ] || { note "skipped: ncu is not installed (NCU=PATH)"; return; }
    durations "chain_k$bits" 600 -- "$bundle/bench_mlp" --bits "$bits" --rows "$rows" --evals 2 --rounds 1 --no-alone &&
      "$python" scripts/ncu_chain.py "$out/chain_k$bits.csv" --rows "$rows" | tee "$out/chain_k$bits.summary.txt"
    ;;
  axis1)
    # The axis-1 kernels, fused, at M rows (default 1) on Qwen3-14B's gate and up (bench_mlp's
    # alone rows): up to 2 rows the fragment kernel the plan takes and the int8 one, from 3 rows
    # the planned GEMM (and the int8 one up to 8), at 49-128 rows the warp-specialized GEMM
    # (sm_90); a full report of one launch each with the
    # warps' stall reasons, for what bounds them (docs/cuda-mlp.md).
    m="${1:-1}"
    [ -n "$ncu" ] || { note "skipped: ncu is not installed (NCU=PATH)"; return; }
    local kind kinds="fragment:gate_up_fused int8:gate_up_int8_fused"
    [ "$m" -ge 3 ] && kinds="gemm:gate_up_gemm_fused int8:gate_up_int8_fused"
    [ "$m" -ge 9 ] && kinds="gemm:gate_up_gemm_fused"
    [ "$m" -ge 49 ] && [ "$m" -le 128 ] && kinds="ws:gate_up_ws_fused"
    local name
    for kind in $kinds; do
      name="axis1_${kind%%:*}_m$m"
      step "ncu_$name" 600 "$ncu" --kernel-name "regex:${kind#*:}" --launch-skip 8 --launch-count 1 \
        --set full --import-source yes --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' \
        -o "$out/$name" -f "$bundle/bench_mlp" --rows "$m" --bits 3 --evals 1 --rounds 1 &&
        step "ncu_${name}_details" 120 "$ncu" --import "$out/$name.ncu-rep" --page details >/dev/null &&
        stalls "$name"
    done
    ;;
  down)
    # The planned down kernel at M rows: a full report with per-instruction stalls and SASS.
    m="${1:-1}"
    [ -n "$ncu" ] || { note "skipped: ncu is not installed (NCU=PATH)"; return; }
    step "ncu_down_m$m" 300 "$ncu" --kernel-name regex:down_mma --launch-skip 3 --launch-count 1 --set full \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' \
      -o "$out/down_m$m" -f "$bundle/bench_down" --paths --rows "$m" --bits 3 --calls 4 --evals 3 &&
      step "ncu_down_m${m}_details" 120 "$ncu" --import "$out/down_m$m.ncu-rep" --page details >/dev/null &&
      stalls "down_m$m"
    ;;
  latency)
    # Every kernel's own duration (launches serialised): the down benchmark's contenders and the
    # down kernel's configurations. SWEEP_ROWS, SWEEP_TIMEOUT [280] and SWEEP_ARGS (more
    # bench_down arguments, e.g. `--bits 2`) shape the sweep.
    local part="${1:-both}"
    [ -n "$ncu" ] || { note "skipped: ncu is not installed (NCU=PATH)"; return; }
    if [ "$part" != sweep ]; then
      for m in 1 8 16 32 64 128; do
        durations "latency_m$m" 100 -- "$bundle/bench_down" --rows "$m" --bits 3 --calls 1 --evals 3
      done
    fi
    if [ "$part" != contenders ]; then
      for m in ${SWEEP_ROWS:-1 8 16 32 64 128}; do
        # shellcheck disable=SC2086
        durations "latency_sweep_m$m" "${SWEEP_TIMEOUT:-280}" --kernel-name regex:down_mma -- \
          "$bundle/bench_down" --sweep --rows "$m" --bits 3 --calls 1 --evals 1 ${SWEEP_ARGS:-}
      done
    fi
    "$python" scripts/ncu_durations.py "$out"/latency_*.csv | tee "$out/latency.summary.txt"
    ;;
  ab)
    # The planned down kernel alone, this bundle's bench_down against BASE (another build's),
    # alternating, two runs each: builds compared in the same minutes, since run-to-run drift of
    # a few per cent would hide the change.
    local base="${1:-}"
    [ -n "$base" ] && [ $# -ge 2 ] || usage
    shift
    [ -n "$ncu" ] || { note "skipped: ncu is not installed (NCU=PATH)"; return; }
    local run which bin
    for m in "$@"; do for run in 1 2; do for which in base this; do
      bin="$bundle/bench_down"
      [ "$which" = base ] && bin="$base"
      durations "ab_m${m}_${which}_$run" 100 --kernel-name regex:down_mma -- \
        "$bin" --paths --rows "$m" --bits 3 --calls 1 --evals 3
    done; done; done
    "$python" scripts/ncu_durations.py "$out"/ab_m*.csv | tee "$out/ab.summary.txt"
    ;;
  *) usage ;;
  esac
}

# ---------------------------------------------------------------------------------------------
# tp [one | multi N]: tensor parallelism over NCCL.

tp() {
  local mode="${1:-one}"
  # The NCCL back-end must be there, or nothing else can run.
  step tp_probe 60 "$bundle/qwen_mlp" --probe || return
  if ! grep -q "MLX back-end cuda" "$out/tp_probe.txt"; then
    note "FAILED  MLX's back-end is not CUDA (MLX_CUDA_DIR, or LD_LIBRARY_PATH?)"
    failed=1
    return
  fi
  if ! grep -q "nccl yes" "$out/tp_probe.txt"; then
    note "FAILED  this MLX CUDA build has no NCCL back-end (is libnccl.so.2 on LD_LIBRARY_PATH?)"
    failed=1
    return
  fi
  case "$mode" in
  one)
    # One GPU: a one-rank NCCL group runs the sharded MLP end to end against one process, and the
    # sharded path's cost against the unsharded MLP (target: within 3 %).
    step tp_nccl_one_rank_bf16 150 "$bundle/qwen_mlp" --tp 1 --backend nccl --layers 2 --rows 1 --timeout 130 &&
      real_group tp_nccl_one_rank_bf16 1
    step tp_nccl_one_rank_f32 120 "$bundle/qwen_mlp" --tp 1 --backend nccl --layers 2 --rows 4 --dtype f32 --timeout 100 &&
      real_group tp_nccl_one_rank_f32 1
    step tp_overhead 240 "$bundle/bench_mlp" --tp 1 --backend nccl --rows 1,8,32,128 --evals 30 --timeout 220 &&
      overhead tp_overhead 1.03
    ;;
  multi)
    local n="${2:-}"
    [ -n "$n" ] || usage
    local gpus
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    if [ "$gpus" -lt "$n" ]; then
      note "FAILED  $n ranks need $n GPUs; nvidia-smi lists $gpus"
      failed=1
      return
    fi
    step "tp_nccl_${n}_ranks_m1" 200 "$bundle/qwen_mlp" --tp "$n" --backend nccl --layers 2 --rows 1 --timeout 180 &&
      real_group "tp_nccl_${n}_ranks_m1" "$n"
    step "tp_nccl_${n}_ranks_m8_f32" 200 "$bundle/qwen_mlp" --tp "$n" --backend nccl --layers 2 --rows 8 --dtype f32 --timeout 180 &&
      real_group "tp_nccl_${n}_ranks_m8_f32" "$n"
    step "tp_bench_$n" 180 "$bundle/bench_mlp" --tp "$n" --backend nccl --rows 1,8,32,128 --evals 20 --timeout 160
    ;;
  *) usage ;;
  esac
}

# real_group NAME RANKS: the log shows that the ranks formed an NCCL group of RANKS.
real_group() {
  if grep -q "Group(nccl, rank 0 of $2)" "$out/$1.txt"; then
    note "ok      $1: the ranks formed an NCCL group of $2"
  else
    note "FAILED  $1: no NCCL group of $2 in the log"
    failed=1
  fi
}

# overhead NAME LIMIT: the largest 'TP / unsharded' ratio of the benchmark's table.
overhead() {
  local worst
  worst=$(awk -F'|' '/^\| [0-9]+ \|/ { r = $5 + 0; if (r > w) w = r } END { printf "%.3f", w }' "$out/$1.txt")
  if awk -v w="$worst" -v l="$2" 'BEGIN { exit !(w > 0 && w <= l) }'; then
    note "ok      $1: sharded/unsharded at most $worst per layer (target $2)"
  else
    note "OVER    $1: sharded/unsharded up to $worst per layer (target $2; a few per cent is run-to-run noise: rerun to confirm)"
    failed=1
  fi
}

# ---------------------------------------------------------------------------------------------

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
setup) setup "$@" ;;
build) build ;;
test) prepare; run_tests "$@"; finish ;;
exits) prepare; exits "$@"; finish ;;
bench) prepare; bench "$@"; finish ;;
profile) prepare; profile "$@"; finish ;;
tp) prepare; tp "$@"; finish ;;
*) usage ;;
esac
