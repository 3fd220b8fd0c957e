#!/usr/bin/env bash
# Quantizes SmolLM2-135M-Instruct in every variant of the evaluation and evaluates them all in
# one eval_model run (KL against the model as shipped, perplexity, bits per weight; speed is bench_model's).
#
# Usage: scripts/eval_smollm2.sh BIN_DIR OUT_DIR [--backend auto|cpu|cuda] [--max-tokens N]
#                                [--layers N] [--only NAMES] [--reuse]
#
#   BIN_DIR       where the quantize_model and eval_model examples are built
#                 (cargo build --release --example quantize_model --example eval_model:
#                 target/release/examples)
#   OUT_DIR       one model directory per variant (OUT_DIR/<name>, or OUT_DIR/ldlq-set/<output>
#                 for those of the shared LDLQ run below), each with OUT_DIR/<name>.report.json,
#                 <name>.log and <name>.md; the calibration OUT_DIR/hessians.safetensors
#                 (collected once, by the first trellis variant, and read by the others); and
#                 OUT_DIR/eval.json, eval.svg, eval.md, eval.log
#   --backend     the encoder's block search (default auto: CUDA where MLX has it)
#   --max-tokens  evaluate only the first N tokens of the text (default 0: all)
#   --layers N    code only the first N blocks of every trellis variant (a quick smoke run)
#   --only NAMES  comma-separated variant names to quantize and evaluate (default: all; the
#                 calibration is collected by the first trellis variant listed)
#   --reuse       keep variants whose model directory's config.json and report already exist
#                 (the shared LDLQ run: where all of its selected variants' do), and the
#                 calibration file if present
#
# Environment: EVAL_TEXT (default /usr/share/common-licenses/GPL-3), CALIB_TEXTS (space-separated
# files, default GPL-2 LGPL-2.1 Apache-2.0 GFDL-1.3 from /usr/share/common-licenses),
# CALIB_TOKENS (default 16384), MODEL (a GGUF file; default: the cached SmolLM2 download).
#
# Variants (names): shipped; affine-{4,3,2}-g{64,32} (MLX affine MLPs); plain-k{4,3,2} (trellis
# MLPs, unrotated); rot-k{4,3,2} (rotated); rot-all-k4 (rotated, every linear layer);
# ldlq-k{4,3,2} (rotated + LDLQ, each also coded unweighted to report the proxy-error ratio);
# budget-{2.5,3.0,3.5} (rotated + LDLQ, k per projection from the budget).
#
# The shared LDLQ run: a budget codes every projection at k 2, 3 and 4 with LDLQ, which are the
# codes of ldlq-k{2,3,4} too (the encoder is deterministic). So when at least two of budget-*
# and ldlq-k* are selected, a budget among them, one quantize_model run writes them all, at the
# place of the first selected: --budget with the selected budgets, --ldlq, and where an ldlq-k*
# is selected --also-uniform and --baseline (the unweighted codes for the proxy-error ratio,
# which quantize_model also takes beside a budget), into OUT_DIR/ldlq-set/{budget-B,kK}; each
# variant's report, log (the shared lines and its output's) and table are then split out to
# OUT_DIR/<name>.report.json, .log and .md. Otherwise each variant has its own run.
# Progress goes to stderr; every step's exit status is checked.
set -euo pipefail

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
BIN=$1 OUT=$2
shift 2
BACKEND=auto MAX_TOKENS=0 LAYERS="" ONLY="" REUSE=0
while [ $# -gt 0 ]; do
    case $1 in
        --backend) BACKEND=${2:?--backend needs a value}; shift 2 ;;
        --max-tokens) MAX_TOKENS=${2:?--max-tokens needs a value}; shift 2 ;;
        --layers) LAYERS=${2:?--layers needs a value}; shift 2 ;;
        --only) ONLY=${2:?--only needs a value}; shift 2 ;;
        --reuse) REUSE=1; shift ;;
        *) echo "eval_smollm2: unknown option $1" >&2; usage ;;
    esac
done
case $BACKEND in auto|cpu|cuda) ;; *) echo "eval_smollm2: --backend must be auto, cpu or cuda" >&2; exit 2 ;; esac

EVAL_TEXT=${EVAL_TEXT:-/usr/share/common-licenses/GPL-3}
CALIB_TEXTS=${CALIB_TEXTS:-/usr/share/common-licenses/GPL-2 /usr/share/common-licenses/LGPL-2.1 /usr/share/common-licenses/Apache-2.0 /usr/share/common-licenses/GFDL-1.3}
CALIB_TOKENS=${CALIB_TOKENS:-16384}
MODEL=${MODEL:-}

for exe in quantize_model eval_model; do
    [ -x "$BIN/$exe" ] || { echo "eval_smollm2: $BIN/$exe is missing (cargo build --release --example $exe)" >&2; exit 2; }
done
for f in "$EVAL_TEXT" $CALIB_TEXTS; do
    [ -r "$f" ] || { echo "eval_smollm2: cannot read the text $f" >&2; exit 2; }
done
for f in $CALIB_TEXTS; do
    if [ "$(readlink -f "$f")" = "$(readlink -f "$EVAL_TEXT")" ]; then
        echo "eval_smollm2: the calibration text $f is the evaluation text" >&2
        exit 2
    fi
done
mkdir -p "$OUT"
HESSIANS=$OUT/hessians.safetensors

log() { echo "[eval_smollm2 $(date +%H:%M:%S)] $*" >&2; }

wanted() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }

# Every variant: name, then quantize_model's arguments ("-" for those eval_model makes itself),
# then its eval_model variant spec.
VARIANTS=(
    "shipped|-|shipped|label=as shipped|family=as shipped"
    "affine-4-g64|-|affine:4:64|label=MLX affine 4-bit g64|family=MLX affine g64"
    "affine-3-g64|-|affine:3:64|label=MLX affine 3-bit g64|family=MLX affine g64"
    "affine-2-g64|-|affine:2:64|label=MLX affine 2-bit g64|family=MLX affine g64"
    "affine-4-g32|-|affine:4:32|label=MLX affine 4-bit g32|family=MLX affine g32"
    "affine-3-g32|-|affine:3:32|label=MLX affine 3-bit g32|family=MLX affine g32"
    "affine-2-g32|-|affine:2:32|label=MLX affine 2-bit g32|family=MLX affine g32"
    "rot-k4|--bits 4|label=trellis rotated k4|family=trellis rotated"
    "rot-k3|--bits 3|label=trellis rotated k3|family=trellis rotated"
    "rot-k2|--bits 2|label=trellis rotated k2|family=trellis rotated"
    "plain-k4|--bits 4 --no-rotation|label=trellis unrotated k4|family=trellis unrotated"
    "plain-k3|--bits 3 --no-rotation|label=trellis unrotated k3|family=trellis unrotated"
    "plain-k2|--bits 2 --no-rotation|label=trellis unrotated k2|family=trellis unrotated"
    "rot-all-k4|--bits 4 --attention|label=trellis rotated k4, all linear layers|family=trellis rotated, all layers"
    "ldlq-k4|--bits 4 --ldlq --baseline|label=trellis rotated+LDLQ k4|family=trellis rotated + LDLQ"
    "ldlq-k3|--bits 3 --ldlq --baseline|label=trellis rotated+LDLQ k3|family=trellis rotated + LDLQ"
    "ldlq-k2|--bits 2 --ldlq --baseline|label=trellis rotated+LDLQ k2|family=trellis rotated + LDLQ"
    "budget-2.5|--budget 2.5 --ldlq|label=budget 2.5 (rotated+LDLQ)|family=trellis rotated + LDLQ, budget"
    "budget-3.0|--budget 3.0 --ldlq|label=budget 3.0 (rotated+LDLQ)|family=trellis rotated + LDLQ, budget"
    "budget-3.5|--budget 3.5 --ldlq|label=budget 3.5 (rotated+LDLQ)|family=trellis rotated + LDLQ, budget"
)

# The output of the shared LDLQ run that would hold variant $1; fails for the others.
set_sub() {
    case $1 in
        budget-*) echo "$1" ;;
        ldlq-k[234]) echo "k${1#ldlq-k}" ;;
        *) return 1 ;;
    esac
}

# The selected variants of the shared LDLQ run, in order (SET) and to their outputs (SUB), when
# it is worth one.
declare -A SUB=()
SET=()
SET_BUDGETS="" SET_UNIFORM=0
for v in "${VARIANTS[@]}"; do
    name=${v%%|*}
    if wanted "$name" && sub=$(set_sub "$name"); then
        SUB[$name]=$sub
        SET+=("$name")
        case $name in
            budget-*) SET_BUDGETS+=${SET_BUDGETS:+,}${name#budget-} ;;
            *) SET_UNIFORM=1 ;;
        esac
    fi
done
if [ "${#SET[@]}" -lt 2 ] || [ -z "$SET_BUDGETS" ]; then
    SUB=()
    SET=()
fi
SET_DIR=$OUT/ldlq-set
SET_ARGS=(--budget "$SET_BUDGETS" --ldlq)
[ "$SET_UNIFORM" = 1 ] && SET_ARGS+=(--also-uniform --baseline)

COMMON=(--backend "$BACKEND" --calib-tokens "$CALIB_TOKENS")
for f in $CALIB_TEXTS; do COMMON+=(--calib-text "$f"); done
[ -n "$MODEL" ] && COMMON+=(--model "$MODEL")
[ -n "$LAYERS" ] && COMMON+=(--layers "$LAYERS")
[ "$REUSE" = 1 ] || rm -f "$HESSIANS"

EVAL_ARGS=()
TOTAL=0
for v in "${VARIANTS[@]}"; do wanted "${v%%|*}" && TOTAL=$((TOTAL + 1)); done
[ "$TOTAL" -gt 0 ] || { echo "eval_smollm2: --only $ONLY names no variant" >&2; exit 2; }
START=$(date +%s)

# The model directory of variant $1.
variant_dir() {
    if [ -n "${SUB[$1]+x}" ]; then echo "$SET_DIR/${SUB[$1]}"; else echo "$OUT/$1"; fi
}

# Whether --reuse keeps variant $1: its directory and report exist.
reusable() { [ "$REUSE" = 1 ] && [ -f "$(variant_dir "$1")/config.json" ] && [ -f "$OUT/$1.report.json" ]; }

# Runs quantize_model with the arguments "$@" (then --out and --report), its stdout to $OUT/$1.md
# and stderr to $OUT/$1.log; the calibration is saved by the first run and read by the others.
quantize() {
    local name=$1
    local -a calib
    shift
    if [ -f "$HESSIANS" ]; then
        calib=(--hessians "$HESSIANS")
    else
        calib=(--save-hessians "$HESSIANS")
    fi
    log "$name: quantize_model $* ${calib[*]}"
    if ! "$BIN/quantize_model" "$@" "${COMMON[@]}" "${calib[@]}" >"$OUT/$name.md" 2>"$OUT/$name.log"; then
        log "$name: quantize_model failed; the end of $OUT/$name.log:"
        tail -n 20 "$OUT/$name.log" >&2
        exit 1
    fi
}

# Logs variant $1's calibration and proxy figures from its log, and the time since $2.
summarize() {
    local summary
    summary=$(grep -E 'calibration:|median relative proxy|LDLQ / unweighted' "$OUT/$1.log" | sed 's/^\[quantize_model\] //' | paste -sd ';' - || true)
    log "$1: done in $(( $(date +%s) - $2 )) s; ${summary:-no proxy figures}"
}

# The shared LDLQ run, then each selected variant's report, log and table split out of it.
quantize_set() {
    local t0 name sub
    t0=$(date +%s)
    quantize ldlq-set "${SET_ARGS[@]}" --out "$SET_DIR" --report "$OUT/ldlq-set.report.json"
    for name in "${SET[@]}"; do
        sub=${SUB[$name]}
        mv -f "$OUT/ldlq-set.report.$sub.json" "$OUT/$name.report.json"
        # Every output's own lines start with its name; keep the common ones and this output's.
        awk -v own="[quantize_model] $sub: " '
            /^\[quantize_model\] (budget-[0-9.]+|k[234]): / && index($0, own) != 1 { next }
            { print }' "$OUT/ldlq-set.log" >"$OUT/$name.log"
        awk -v row="| $sub |" 'NR <= 2 || index($0, row) == 1' "$OUT/ldlq-set.md" >"$OUT/$name.md"
        summarize "$name" "$t0"
    done
}

I=0
for v in "${VARIANTS[@]}"; do
    IFS='|' read -r name qargs rest <<<"$v"
    wanted "$name" || continue
    I=$((I + 1))
    if [ "$qargs" = "-" ]; then
        EVAL_ARGS+=(--variant "$rest")
        log "($I/$TOTAL) $name: built by eval_model"
        continue
    fi
    dir=$(variant_dir "$name")
    EVAL_ARGS+=(--variant "dir:$dir|$rest")
    if [ -n "${SUB[$name]+x}" ]; then
        if [ "$name" != "${SET[0]}" ]; then
            log "($I/$TOTAL) $name: from the shared LDLQ run, $dir"
            continue
        fi
        all=1
        for m in "${SET[@]}"; do reusable "$m" || all=0; done
        if [ "$all" = 1 ]; then
            log "($I/$TOTAL) $name: reusing the shared LDLQ run, $SET_DIR"
        else
            log "($I/$TOTAL) $name: the shared LDLQ run of ${SET[*]}"
            quantize_set
        fi
        continue
    fi
    if reusable "$name"; then
        log "($I/$TOTAL) $name: reusing $dir"
        continue
    fi
    log "($I/$TOTAL) $name"
    t0=$(date +%s)
    # shellcheck disable=SC2086 # qargs is a list of flags
    quantize "$name" $qargs --out "$dir" --report "$OUT/$name.report.json"
    summarize "$name" "$t0"
done

log "eval_model over $TOTAL variants (text $EVAL_TEXT, max tokens $MAX_TOKENS)"
EVAL=("$BIN/eval_model" --text "$EVAL_TEXT" --max-tokens "$MAX_TOKENS" --json "$OUT/eval.json"
    --plot "$OUT/eval.svg" --markdown "$OUT/eval.md")
[ -n "$MODEL" ] && EVAL+=(--model "$MODEL")
if ! "${EVAL[@]}" "${EVAL_ARGS[@]}" 2> >(tee "$OUT/eval.log" >&2); then
    log "eval_model failed (see $OUT/eval.log)"
    exit 1
fi
log "proxy error LDLQ / rotation only (median over projections):"
for name in ldlq-k4 ldlq-k3 ldlq-k2; do
    if [ -f "$OUT/$name.log" ]; then
        line=$(grep 'LDLQ / unweighted' "$OUT/$name.log" | sed 's/^\[quantize_model\] //' || true)
        log "  $name: ${line:-none}"
    fi
done
log "all done in $(( $(date +%s) - START )) s: $OUT/eval.md, eval.json, eval.svg"
