#!/usr/bin/env bash
# The accuracy table of docs/model.md: dense, then magnitude / Wanda / SparseGPT at 50%
# unstructured, 2:4 and 4:8, plus SparseGPT 2:4 with channel permutation, each pruned with
# calibration from the Sherlock Holmes text and evaluated on WikiText-2 (ctx 512).
#
#   bash scripts/accuracy_table.sh [OUT_DIR]      (after the release build; see README)
#   EVAL_TOKENS=0 for the whole test text (about 300k tokens, about 11 min per model with 2 threads),
#   default 16384. CALIB_SAMPLES / CALIB_LEN (default 16 x 512), THREADS per run (default 2),
#   JOBS runs at a time (default 1; JOBS=2 THREADS=1 keeps both cores busy through the
#   single-threaded permutation search), METHODS, PATTERNS, TEXTS (default data/text).
# Prints one markdown table (perplexity and its ratio to dense, prune seconds) and keeps the
# pruned checkpoints, JSON and one result line per row ($OUT_DIR/*.row) in OUT_DIR (default
# build/accuracy). Each row is also printed to stderr when it is done.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/accuracy}
SPARQ=${SPARQ:-build/release/sparq}
MODEL=${MODEL:-${SPARQ_CACHE:-$HOME/.cache/sparq}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
TEXTS=${TEXTS:-data/text}
PY=${SPARQ_PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
EVAL_TOKENS=${EVAL_TOKENS:-16384}
CALIB_SAMPLES=${CALIB_SAMPLES:-16}
CALIB_LEN=${CALIB_LEN:-512}
THREADS=${THREADS:-2}
JOBS=${JOBS:-1}
METHODS=${METHODS:-"magnitude wanda sparsegpt"}
PATTERNS=${PATTERNS:-"unstructured:0.5 2:4 4:8"}
mkdir -p "$OUT"
max=()
[ "$EVAL_TOKENS" != 0 ] && max=(--max-tokens "$EVAL_TOKENS")

eval_ppl() {  # model -> "perplexity tokens"
  "$SPARQ" eval "$1" --text "$TEXTS/wikitext-2-raw-test.txt" --ctx 512 "${max[@]}" \
    --threads "$THREADS" --json | "$PY" -c 'import json,sys; j=json.load(sys.stdin); print(j["perplexity"], j["tokens"])'
}

# One row -> $OUT/$tag.row: "perplexity tokens prune_seconds". A failed prune or eval leaves no
# .row file, and the table stops with the name of the row.
run() {  # tag method pattern [extra flags...]
  local tag=$1 method=$2 pattern=$3; shift 3
  local t0=$SECONDS ppl tokens
  rm -f "$OUT/$tag.row"
  "$SPARQ" prune "$MODEL" --method "$method" --pattern "$pattern" \
    --calib "$TEXTS/sherlock-holmes-pg1661.txt" --calib-samples "$CALIB_SAMPLES" \
    --calib-len "$CALIB_LEN" --threads "$THREADS" "$@" --report "$OUT/$tag.json" \
    -o "$OUT/$tag.sparq" >"$OUT/$tag.log" 2>&1
  local secs=$((SECONDS - t0))
  read -r ppl tokens < <(eval_ppl "$OUT/$tag.sparq")
  echo "$ppl $tokens $secs" >"$OUT/$tag.row"
  echo "done: $method $pattern${1:+ $*}: perplexity $ppl, prune $secs s" >&2
}
dense_row() {
  local ppl tokens
  rm -f "$OUT/dense.row"
  read -r ppl tokens < <(eval_ppl "$MODEL")
  echo "$ppl $tokens -" >"$OUT/dense.row"
  echo "done: dense: perplexity $ppl" >&2
}

# The rows in table order: "tag method pattern [flags]".
rows=("dense dense -")
for p in $PATTERNS; do
  for m in $METHODS; do rows+=("${m}_${p//:/-} $m $p"); done
done
case " $METHODS " in *" sparsegpt "*) rows+=("sparsegpt_2-4_perm sparsegpt 2:4 --permute") ;; esac

for r in "${rows[@]}"; do
  read -r -a f <<<"$r"
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  if [ "${f[0]}" = dense ]; then dense_row & else run "${f[@]}" & fi
done
wait

[ -f "$OUT/dense.row" ] || { echo "accuracy_table: the dense evaluation failed" >&2; exit 1; }
read -r dense tokens _ <"$OUT/dense.row"
echo "WikiText-2 test, first $tokens predicted tokens (ctx 512); calibration $CALIB_SAMPLES x $CALIB_LEN tokens of Sherlock Holmes; $THREADS threads per run, $JOBS at a time"
echo
echo "| method | pattern | perplexity | vs dense | prune s |"
echo "|---|---|---|---|---|"
status=0
for r in "${rows[@]}"; do
  read -r -a f <<<"$r"
  if [ ! -f "$OUT/${f[0]}.row" ]; then
    echo "accuracy_table: row ${f[0]} failed (see $OUT/${f[0]}.log)" >&2
    status=1
    continue
  fi
  read -r ppl _ secs <"$OUT/${f[0]}.row"
  pattern=${f[2]}
  [ "${f[3]:-}" = --permute ] && pattern="$pattern + permute"
  echo "| ${f[1]} | $pattern | $(printf '%.2f' "$ppl") | $("$PY" -c "print(f'{$ppl/$dense:.2f}x')") | $secs |"
done
exit $status
