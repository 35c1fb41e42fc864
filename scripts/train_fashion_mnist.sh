#!/usr/bin/env bash
# Dense against 2:4 (SR-STE) training of `sparq train --task fashion-mnist`: the runs interleaved
# (dense, 2:4, dense, 2:4 ...: a slow phase of a shared machine hits both), one JSON per run in
# OUT, then the mean +- spread (half the range) of the test accuracy and the median of the runs'
# median step times per pattern. Usage:
#   scripts/train_fashion_mnist.sh [EPOCHS=3] [SEEDS="1 2 3"] [THREADS=2] [OUT=/tmp/sparq-fmnist]
set -euo pipefail
EPOCHS=${1:-3}
SEEDS=${2:-"1 2 3"}
THREADS=${3:-2}
OUT=${4:-/tmp/sparq-fmnist}
S=${SPARQ:-build/release/sparq}
mkdir -p "$OUT"
for seed in $SEEDS; do
  for pattern in dense 2:4; do
    tag=${pattern/:/of}
    echo "$S train --task fashion-mnist --pattern $pattern --epochs $EPOCHS --batch 256" \
         "--seed $seed --threads $THREADS --json $OUT/$tag-$seed.json"
    "$S" train --task fashion-mnist --pattern "$pattern" --epochs "$EPOCHS" --batch 256 \
         --seed "$seed" --threads "$THREADS" --json "$OUT/$tag-$seed.json" 2>/dev/null
  done
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(out + "/*.json")):
    j = json.load(open(f))
    rows.setdefault(j["pattern"], []).append(j)
base = None
for p in ("dense", "2:4"):
    rs = rows.get(p, [])
    if not rs:
        continue
    acc = [100 * r["test_accuracy"] for r in rs]
    ms = statistics.median(r["median_step_ms"] for r in rs)
    mean = statistics.mean(acc)
    spread = (max(acc) - min(acc)) / 2
    if p == "dense":
        base = (mean, ms)
    ratio = f"  step time dense / this {base[1] / ms:.2f}x, accuracy {mean - base[0]:+.2f} points" \
        if base and p != "dense" else ""
    print(f"{p:6s} seeds {len(rs)}  test accuracy {mean:.2f} +- {spread:.2f} % "
          f"({', '.join(f'{a:.2f}' for a in acc)})  median step {ms:.1f} ms{ratio}")
PY
