#!/usr/bin/env bash
# The final GPU check on one H200: the CUDA tests (ignored elsewhere) and the clean-exit
# regression. Run from the checkout's root: it runs the binaries of target/cuda-bundle/
# (`scripts/cuda.sh build`; BUNDLE=DIR for another) with MLX's CUDA build staged (source
# /tmp/mlxcu/env.sh first). Writes logs to $OUT (default /tmp/out). Exit status 0 when every
# step passed, 1 otherwise.
set -u
b="${BUNDLE:-target/cuda-bundle}"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
export MLX_PTX_CACHE_DIR=/tmp/ptx
status=0
run() { # name seconds cmd...: returns the command's exit status
  local name=$1 t=$2; shift 2
  local start=$SECONDS
  timeout "$t" "$@" > "$out/$name.txt" 2>&1; local rc=$?
  echo "== $name: rc $rc in $((SECONDS - start)) s: $(grep -E '^test result' "$out/$name.txt" | tr '\n' ' ')"
  grep -E "panicked|FAILED" -A4 "$out/$name.txt" | head -20
  return $rc
}
run cuda_mlp 330 $b/test_cuda_mlp --include-ignored --test-threads 16 & mlp_pid=$!
run cuda_down 330 $b/test_cuda_down --include-ignored --test-threads 16 concurrent planned_kernel activations_at_the_edges unsupported dense_path & down_pid=$!
wait $mlp_pid || status=1
wait $down_pid || status=1
run kernels 60 $b/test_kernels --include-ignored || status=1
run mlp 60 $b/test_mlp --include-ignored --test-threads 8 || status=1
run foundation 60 $b/test_foundation --include-ignored --test-threads 8 || status=1
# Clean exit: a call that fails after GPU work (the Metal path forced on CUDA), 20 times, each
# must end in exit status 2 (an error), and the main example's success path twice (status 0).
# An abort shows as rc 134 and "terminate called".
aborts=0; codes=""
for i in $(seq 20); do
  timeout 60 $b/qwen_down --path metal --rows 1 --bits 2 > "$out/exit_$i.txt" 2>&1; rc=$?
  codes="$codes $rc"; [ "$rc" = 2 ] || status=1
  grep -q "terminate called" "$out/exit_$i.txt" && aborts=$((aborts + 1))
done
[ "$aborts" = 0 ] || status=1
echo "== clean exit after an error, 20 runs: exit codes$codes; aborts $aborts"
tail -2 "$out/exit_1.txt"
for i in 1 2; do
  timeout 120 $b/qwen_down --rows 1 --bits 2 > "$out/ok_$i.txt" 2>&1; rc=$?
  echo -n "ok run $i rc $rc "; [ "$rc" = 0 ] || status=1
done; echo
grep -E "^\|" "$out/ok_1.txt" | head -4
echo "== status $status"
exit $status
