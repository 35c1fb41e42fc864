#!/usr/bin/env bash
# The one device run of issue 30 (docs/cuda.md): on a machine with an NVIDIA GPU (sm_80 or later),
# from a clean checkout, in well under 8 minutes:
#   1. prints and records the GPU model, driver and CUDA versions (nvidia-smi, nvcc);
#   2. configures build/cuda with SPARQ_CUDA=ON and builds only the CUDA room's executables (the
#      host-side layout tests, the gpu-labelled kernel tests, the benchmark: core, quant, formats
#      and cuda; no command line, no model);
#   3. runs the host-side layout tests (ctest -R MmaSpPack) and every test labelled gpu;
#   4. runs the benchmark grid (sparq_cuda_bench: 2:4 decode and GEMM beside cuBLAS dense bf16;
#      the peers still missing, cuSPARSELt and cuSPARSE, are named in the JSON);
#   5. writes $OUT/gpu_check.json (and the logs and JUnit XML beside it).
# It downloads nothing. Exit status: 0 when every step that ran passed.
#
#   scripts/gpu_check.sh [--out DIR] [--no-gpu] [--skip-build]
#     --out DIR      where results go (default gpu_check_out/<UTC time>)
#     --no-gpu       stop before the steps that need a GPU (no nvidia-smi; the gpu tests run only
#                    to show they skip cleanly): what a CPU machine with the CUDA toolkit can check
#     --skip-build   use build/cuda as it is (e.g. built on a CPU machine and carried over)
#   JOBS (default: the number of cores), NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=""
NO_GPU=0
SKIP_BUILD=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --no-gpu) NO_GPU=1; shift ;;
    --skip-build) SKIP_BUILD=1; shift ;;
    *) echo "gpu_check.sh: unknown argument '$1' (--out DIR, --no-gpu, --skip-build)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-gpu_check_out/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=${JOBS:-$(nproc)}
BUILD=build/cuda
start=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - start ))s] $*"; }
status=0

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}

# ---- 1. versions ---------------------------------------------------------------------------------
gpu_name="none" driver="none" cuda_driver="none"
if [ "$NO_GPU" = 0 ]; then
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi | tee "$OUT/nvidia-smi.txt"
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)
    cuda_driver=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n1)
  else
    stamp "nvidia-smi not found: is this a GPU machine? (--no-gpu for a CPU machine)"
    status=1
  fi
fi
nvcc_version=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\),.*/\1/p' || true)
stamp "GPU: $gpu_name; driver $driver (CUDA $cuda_driver); nvcc ${nvcc_version:-missing}"

# ---- 2. build --------------------------------------------------------------------------------------
build_s=0
if [ "$SKIP_BUILD" = 0 ]; then
  stamp "configure + build ($BUILD, SPARQ_CUDA=ON, the CUDA room's tests only)"
  b0=$(date +%s)
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARQ_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$NVCC" -DSPARQ_BUILD_PYTHON=OFF -DSPARQ_BUILD_BENCH=OFF \
        "${launcher[@]}" >"$OUT/configure.log" 2>&1; then
    tail -n 30 "$OUT/configure.log"
    stamp "configure failed (log: $OUT/configure.log): a missing package above? This script" \
          "downloads nothing; build on a machine that has them and rerun with --skip-build"
    exit 1
  fi
  if ! cmake --build "$BUILD" -j "$JOBS" --target sparq_cuda_tests sparq_cuda_gputests sparq_cuda_bench \
        >"$OUT/build.log" 2>&1; then
    tail -n 40 "$OUT/build.log"
    stamp "build failed (log: $OUT/build.log)"
    exit 1
  fi
  build_s=$(( $(date +%s) - b0 ))
  stamp "built in ${build_s}s"
fi

# ---- 3. tests --------------------------------------------------------------------------------------
# ctest's summary: "N% tests passed, F tests failed out of T"; skipped tests are listed "(Skipped)".
run_ctest() {  # name, ctest args...
  local name=$1
  shift
  local log="$OUT/ctest-$name.log" rc=0
  ctest --test-dir "$BUILD" --output-on-failure --timeout 120 --output-junit "$OUT/ctest-$name.xml" \
    "$@" >"$log" 2>&1 || rc=$?
  local line total=0 failed=0 skipped=0
  line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$log" | tail -n1 || true)
  if [[ $line =~ ([0-9]+)\ tests\ failed\ out\ of\ ([0-9]+) ]]; then
    failed=${BASH_REMATCH[1]}
    total=${BASH_REMATCH[2]}
    skipped=$(grep -c '(Skipped)$' "$log" || true)
  else
    failed=1
  fi
  local passed=$((total - failed - skipped))
  stamp "$name: $passed passed, $failed failed, $skipped skipped (log: $log)"
  [ "$rc" = 0 ] && [ "$failed" = 0 ] || { tail -n 40 "$log"; status=1; }
  last_skipped=$skipped
  last_json="\"$name\": {\"passed\": $passed, \"failed\": $failed, \"skipped\": $skipped}"
}
run_ctest host -R '^MmaSpPack\.'
host_json=$last_json
gpu_json='"gpu": null'
if [ "$NO_GPU" = 0 ]; then
  run_ctest gpu -L '^gpu$'
  gpu_json=$last_json
  # A GPU machine must run them: a skip there means the device was not found.
  if [ "$last_skipped" != 0 ]; then
    stamp "gpu tests skipped on a GPU machine: the CUDA runtime found no device"
    status=1
  fi
else
  # No GPU: the gpu tests must still build, start, and skip cleanly (or pass what needs no device).
  run_ctest gpu_without_device -L '^gpu$'
  gpu_json=$last_json
fi

# ---- 4. benchmark grid -----------------------------------------------------------------------------
# sparq_cuda_bench: decode 8192x8192 and 28672x8192 (1, 8, 16 tokens; weights rotating past L2) and
# the 8192^3 GEMM, each beside cuBLAS dense bf16; one JSON object a line.
missing='"cusparselt: the nvidia-cusparselt-cu13 wheel does not travel with the checkout yet", "cusparse csr/bsr: no sparq CSR/BSR CUDA kernel yet"'
if [ "$NO_GPU" = 0 ]; then
  stamp "benchmark grid (sparq_cuda_bench, at most 300 s)"
  bench_rc=0
  timeout 300 "$BUILD/sparq_cuda_bench" >"$OUT/bench.jsonl" 2>"$OUT/bench.err" || bench_rc=$?
  cat "$OUT/bench.jsonl"
  rows=$(paste -sd, "$OUT/bench.jsonl")
  bench_json="\"bench\": {\"ran\": true, \"rc\": $bench_rc, \"peers_missing\": [$missing], \"rows\": [$rows]}"
  [ "$bench_rc" = 0 ] || { stamp "benchmark grid failed (rc $bench_rc; $OUT/bench.err)"; status=1; }
else
  # No GPU: the benchmark must be built and must say plainly that it found no device.
  bench_rc=0
  "$BUILD/sparq_cuda_bench" --quick >"$OUT/bench.jsonl" 2>&1 || bench_rc=$?
  if [ "$bench_rc" = 1 ] && grep -q '"error": "no CUDA device' "$OUT/bench.jsonl"; then
    stamp "benchmark grid: built; not run (no GPU): $(cat "$OUT/bench.jsonl")"
  else
    stamp "benchmark grid: expected a 'no CUDA device' error, got rc $bench_rc: $(cat "$OUT/bench.jsonl")"
    status=1
  fi
  bench_json="\"bench\": {\"ran\": false, \"why\": \"no GPU (--no-gpu)\", \"peers_missing\": [$missing]}"
fi

# ---- 5. JSON ---------------------------------------------------------------------------------------
total_s=$(( $(date +%s) - start ))
cat >"$OUT/gpu_check.json" <<EOF
{
  "date_utc": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "commit": "$(git rev-parse HEAD 2>/dev/null || echo unknown)",
  "gpu": "$gpu_name", "driver": "$driver", "cuda_driver": "$cuda_driver",
  "nvcc": "${nvcc_version:-missing}", "no_gpu_mode": $([ "$NO_GPU" = 1 ] && echo true || echo false),
  "build_seconds": $build_s, "total_seconds": $total_s,
  "tests": {$host_json, $gpu_json},
  $bench_json,
  "ok": $([ "$status" = 0 ] && echo true || echo false)
}
EOF
stamp "wrote $OUT/gpu_check.json (${total_s}s in all)"
exit "$status"
