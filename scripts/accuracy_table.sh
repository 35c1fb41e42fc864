#!/usr/bin/env bash
# The accuracy table of docs/model.md: dense, then magnitude / Wanda / SparseGPT at 50%
# unstructured, 2:4 and 4:8, plus SparseGPT 2:4 with channel permutation, each pruned with
# calibration from the Sherlock Holmes text and evaluated on WikiText-2 (ctx 512).
#
#   bash scripts/accuracy_table.sh [OUT_DIR]      (after the release build; see README)
#   EVAL_TOKENS=0 for the whole test text (about 300k tokens: hours on 2 cores), default 16384.
#   CALIB_SAMPLES / CALIB_LEN (default 16 x 512), THREADS (default 2), METHODS, PATTERNS.
# Prints one markdown table (perplexity and its ratio to dense, prune seconds) and keeps the
# pruned checkpoints and JSON in OUT_DIR (default build/accuracy).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/accuracy}
SPARQ=${SPARQ:-build/release/sparq}
MODEL=${MODEL:-${SPARQ_CACHE:-$HOME/.cache/sparq}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
SHARED=${SHARED:-../shared/data/text}
EVAL_TOKENS=${EVAL_TOKENS:-16384}
CALIB_SAMPLES=${CALIB_SAMPLES:-16}
CALIB_LEN=${CALIB_LEN:-512}
THREADS=${THREADS:-2}
METHODS=${METHODS:-"magnitude wanda sparsegpt"}
PATTERNS=${PATTERNS:-"unstructured:0.5 2:4 4:8"}
mkdir -p "$OUT"
max=()
[ "$EVAL_TOKENS" != 0 ] && max=(--max-tokens "$EVAL_TOKENS")

eval_ppl() {  # model -> "perplexity tokens"
  "$SPARQ" eval "$1" --text "$SHARED/wikitext-2-raw-test.txt" --ctx 512 "${max[@]}" \
    --threads "$THREADS" --json | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["perplexity"], j["tokens"])'
}

read -r dense tokens < <(eval_ppl "$MODEL")
rows=("| dense | - | $(printf '%.2f' "$dense") | 1.00x | - |")
run() {  # method pattern [extra flags...]
  local method=$1 pattern=$2; shift 2
  local tag="${method}_${pattern//:/-}${1:+_perm}"
  local t0=$SECONDS
  "$SPARQ" prune "$MODEL" --method "$method" --pattern "$pattern" \
    --calib "$SHARED/sherlock-holmes-pg1661.txt" --calib-samples "$CALIB_SAMPLES" \
    --calib-len "$CALIB_LEN" --threads "$THREADS" "$@" --report "$OUT/$tag.json" \
    -o "$OUT/$tag.sparq" >"$OUT/$tag.log" 2>&1
  local secs=$((SECONDS - t0))
  read -r ppl _ < <(eval_ppl "$OUT/$tag.sparq")
  rows+=("| $method | $pattern${1:+ + permute} | $(printf '%.2f' "$ppl") | $(python3 -c "print(f'{$ppl/$dense:.2f}x')") | $secs |")
  echo "${rows[-1]}" >&2
}
for p in $PATTERNS; do
  for m in $METHODS; do run "$m" "$p"; done
done
case " $METHODS " in *" sparsegpt "*) run sparsegpt 2:4 --permute ;; esac

echo "WikiText-2 test, first $tokens predicted tokens (ctx 512); calibration $CALIB_SAMPLES x $CALIB_LEN tokens of Sherlock Holmes; $THREADS threads"
echo
echo "| method | pattern | perplexity | vs dense | prune s |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
