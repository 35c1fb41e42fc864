#!/usr/bin/env bash
# The one device run of issue 30 (docs/cuda.md). On a machine with an NVIDIA GPU (sm_80 or later),
# in well under 8 minutes, it:
#   1. prints and records the GPU model, driver and CUDA versions (nvidia-smi, nvcc);
#   2. configures build/cuda with SPARQ_CUDA=ON and builds only the CUDA room's executables (the
#      host-side layout tests, the gpu-labelled kernel tests, the benchmark: rooms core, quant,
#      formats and cuda; no command line, no model) -- or takes them ready-built (--prebuilt);
#   3. runs the room's host-side tests (sparq_cuda_tests: the mma.sp layout, the decode kernel's
#      step emulated on the CPU) and every gpu-labelled test (ctest -L gpu;
#      with --prebuilt, the sparq_*_gputests executables, which hold exactly those tests);
#   4. runs the benchmark grid (sparq_cuda_bench: 2:4 decode and GEMM beside cuBLAS dense bf16;
#      the peers still missing, cuSPARSELt and cuSPARSE, are named in the JSON);
#   5. writes $OUT/gpu_check.json, with the logs and test XML beside it.
# It downloads nothing. Exit status: 0 when every step that ran passed.
#
#   scripts/gpu_check.sh [--out DIR] [--no-gpu] [--pack DIR | --prebuilt DIR]
#     --out DIR       where results go (default gpu_check_out/<UTC time>)
#     --no-gpu        leave out what needs a GPU (nvidia-smi, the benchmark's run; the gpu tests
#                     run only to show that they skip cleanly): a CPU machine with nvcc checks the rest
#     --pack DIR      (CPU machine; implies --no-gpu) after the checks, copy the executables and the
#                     shared libraries they need beyond glibc and CUDA into DIR, to carry to a GPU
#                     machine that lacks sparq's build dependencies (Highway, GoogleTest, ...)
#     --prebuilt DIR  (GPU machine) run the executables in DIR (from --pack); no configure, no build
#   JOBS (default: the number of cores), NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=""
NO_GPU=0
PACK=""
PREBUILT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --no-gpu) NO_GPU=1; shift ;;
    --pack) PACK=$2; NO_GPU=1; shift 2 ;;
    --prebuilt) PREBUILT=$2; shift 2 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (--out DIR, --no-gpu, --pack DIR, --prebuilt DIR)" >&2
       exit 2 ;;
  esac
done
if [ -n "$PACK" ] && [ -n "$PREBUILT" ]; then
  echo "gpu_check.sh: --pack builds, --prebuilt does not: give one" >&2
  exit 2
fi
OUT=${OUT:-gpu_check_out/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=${JOBS:-$(nproc)}
BUILD=build/cuda
EXES=(sparq_cuda_tests sparq_cuda_gputests sparq_cuda_bench)
start=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - start ))s] $*"; }
status=0
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}

# ---- 1. versions -----------------------------------------------------------------------------------
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

# ---- 2. build (or the executables carried in) ------------------------------------------------------
build_s=0
if [ -n "$PREBUILT" ]; then
  BIN=$(cd "$PREBUILT" && pwd)
  for e in "${EXES[@]}"; do
    [ -x "$BIN/$e" ] || { stamp "--prebuilt $PREBUILT: no executable $e (make it with --pack)"; exit 1; }
  done
  # The carried libraries (Highway), then the machine's CUDA runtime and cuBLAS; the carried C++
  # runtime only where the machine's own is too old to start the executables (it would shadow a
  # newer one that CUDA's libraries may need).
  ld_rest=${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64$ld_rest"
  if ! "$BIN/sparq_cuda_tests" --gtest_list_tests >/dev/null 2>&1; then
    export LD_LIBRARY_PATH="$BIN/lib:$BIN/lib/cxx:/usr/local/cuda/lib64$ld_rest"
    stamp "the machine's C++ runtime cannot start the executables: using the carried one"
  fi
  stamp "prebuilt executables from $BIN ($(cat "$BIN/commit.txt" 2>/dev/null || echo 'commit unknown'))"
else
  BIN=$BUILD
  stamp "configure + build ($BUILD, SPARQ_CUDA=ON, the CUDA room's executables only)"
  b0=$(date +%s)
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  # No precompiled headers: the tests' shared one is owned by another room's target, which would
  # pull that room (the CPU kernels) into this build.
  if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARQ_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$NVCC" -DSPARQ_BUILD_PYTHON=OFF -DSPARQ_BUILD_BENCH=OFF -DSPARQ_PCH=OFF \
        "${launcher[@]}" >"$OUT/configure.log" 2>&1; then
    tail -n 30 "$OUT/configure.log"
    stamp "configure failed (log: $OUT/configure.log): a missing package above? This script" \
          "downloads nothing: run it with --pack DIR where sparq builds, carry DIR, --prebuilt DIR here"
    exit 1
  fi
  if ! cmake --build "$BUILD" -j "$JOBS" --target "${EXES[@]}" >"$OUT/build.log" 2>&1; then
    tail -n 40 "$OUT/build.log"
    stamp "build failed (log: $OUT/build.log)"
    exit 1
  fi
  build_s=$(( $(date +%s) - b0 ))
  stamp "built in ${build_s}s"
fi

# ---- 3. tests --------------------------------------------------------------------------------------
# Each run sets last_json and last_skipped. ctest's summary: "N% tests passed, F tests failed out
# of T", skipped tests listed "(Skipped)"; gtest's: "[  PASSED  ] N tests", "[  SKIPPED ] N",
# "[  FAILED  ] N".
record() {  # name passed failed skipped log rc
  stamp "$1: $2 passed, $3 failed, $4 skipped (log: $5)"
  if [ "$6" != 0 ] || [ "$3" != 0 ] || [ $(( $2 + $3 + $4 )) = 0 ]; then
    tail -n 40 "$5"
    status=1
  fi
  last_skipped=$4
  last_json="\"$1\": {\"passed\": $2, \"failed\": $3, \"skipped\": $4}"
}
run_ctest() {  # name, ctest args...
  local name=$1 log="$OUT/ctest-$1.log" rc=0 line total=0 failed=1 skipped=0
  shift
  ctest --test-dir "$BUILD" --output-on-failure --timeout 120 --output-junit "$OUT/ctest-$name.xml" \
    "$@" >"$log" 2>&1 || rc=$?
  line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$log" | tail -n1 || true)
  if [[ $line =~ ([0-9]+)\ tests\ failed\ out\ of\ ([0-9]+) ]]; then
    failed=${BASH_REMATCH[1]}
    total=${BASH_REMATCH[2]}
    skipped=$(grep -c '(Skipped)$' "$log" || true)
  fi
  record "$name" $((total - failed - skipped)) "$failed" "$skipped" "$log" "$rc"
}
run_gtest() {  # name, executable, gtest args...
  local name=$1 exe=$2 log="$OUT/gtest-$1.log" rc=0 passed failed skipped
  shift 2
  timeout 300 "$exe" --gtest_output="xml:$OUT/gtest-$name.xml" "$@" >"$log" 2>&1 || rc=$?
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -n1)
  failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n1)
  record "$name" "${passed:-0}" "${failed:-0}" "${skipped:-0}" "$log" "$rc"
}
# The room's host tests (the mma.sp layout, the decode step emulated on the CPU): one executable.
run_gtest host "$BIN/sparq_cuda_tests"
host_json=$last_json
gpu_name_tests=gpu
[ "$NO_GPU" = 0 ] || gpu_name_tests=gpu_without_device
if [ -n "$PREBUILT" ]; then
  run_gtest "$gpu_name_tests" "$BIN/sparq_cuda_gputests"
else
  run_ctest "$gpu_name_tests" -L '^gpu$'
fi
gpu_json=$last_json
# On a GPU machine they must run: a skip there means the CUDA runtime found no device. Without
# one they must start, and skip (or pass what needs no device).
if [ "$NO_GPU" = 0 ] && [ "$last_skipped" != 0 ]; then
  stamp "gpu tests skipped on a GPU machine: the CUDA runtime found no device"
  status=1
fi

# ---- 4. benchmark grid -----------------------------------------------------------------------------
# sparq_cuda_bench: decode 8192x8192 and 28672x8192 (1, 8, 16 tokens; weights rotating past L2) and
# the 8192^3 GEMM, each beside cuBLAS dense bf16; one JSON object a line.
missing='"cusparselt: no sparq binding yet (the GPU image has the nvidia-cusparselt-cu13 wheel)", "cusparse csr/bsr: no sparq CSR/BSR CUDA kernel yet"'
bench_rc=0
if [ "$NO_GPU" = 0 ]; then
  stamp "benchmark grid (sparq_cuda_bench, at most 300 s)"
  timeout 300 "$BIN/sparq_cuda_bench" >"$OUT/bench.jsonl" 2>"$OUT/bench.err" || bench_rc=$?
  cat "$OUT/bench.jsonl"
  rows=$(paste -sd, "$OUT/bench.jsonl")
  bench_json="\"bench\": {\"ran\": true, \"rc\": $bench_rc, \"peers_missing\": [$missing], \"rows\": [$rows]}"
  [ "$bench_rc" = 0 ] || { stamp "benchmark grid failed (rc $bench_rc; $OUT/bench.err)"; status=1; }
else
  # No GPU: the benchmark must start and say plainly that it found no device.
  "$BIN/sparq_cuda_bench" --quick >"$OUT/bench.jsonl" 2>&1 || bench_rc=$?
  if [ "$bench_rc" = 1 ] && grep -q '"error": "no CUDA device' "$OUT/bench.jsonl"; then
    stamp "benchmark grid: not run (no GPU); the benchmark says: $(cat "$OUT/bench.jsonl")"
  else
    stamp "benchmark grid: expected a 'no CUDA device' error, got rc $bench_rc: $(cat "$OUT/bench.jsonl")"
    status=1
  fi
  bench_json="\"bench\": {\"ran\": false, \"why\": \"no GPU (--no-gpu)\", \"peers_missing\": [$missing]}"
fi

# ---- 5. JSON (and the pack) ------------------------------------------------------------------------
total_s=$(( $(date +%s) - start ))
cat >"$OUT/gpu_check.json" <<EOF
{
  "date_utc": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "commit": "$(git rev-parse HEAD 2>/dev/null || cat "$BIN/commit.txt" 2>/dev/null || echo unknown)",
  "gpu": "$gpu_name", "driver": "$driver", "cuda_driver": "$cuda_driver",
  "nvcc": "${nvcc_version:-missing}", "no_gpu_mode": $([ "$NO_GPU" = 1 ] && echo true || echo false),
  "prebuilt": $([ -n "$PREBUILT" ] && echo true || echo false),
  "build_seconds": $build_s, "total_seconds": $total_s,
  "tests": {$host_json, $gpu_json},
  $bench_json,
  "ok": $([ "$status" = 0 ] && echo true || echo false)
}
EOF
stamp "wrote $OUT/gpu_check.json (${total_s}s in all)"

if [ -n "$PACK" ] && [ "$status" = 0 ]; then
  rm -rf "$PACK"
  mkdir -p "$PACK/lib/cxx"
  for e in "${EXES[@]}"; do cp "$BUILD/$e" "$PACK/"; done
  # Every shared library the executables load except glibc's own and CUDA's (the GPU machine has
  # its driver's runtime): Highway in lib/, the C++ runtime this compiler built against in lib/cxx/
  # (used there only if the machine's own cannot start the executables).
  ldd "${EXES[@]/#/$BUILD/}" | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|/libcu(da|dart|blas|blasLt)[.]' |
    while read -r lib; do
      case "$(basename "$lib")" in
        libstdc++*|libgcc_s*) cp -L "$lib" "$PACK/lib/cxx/" ;;
        *) cp -L "$lib" "$PACK/lib/" ;;
      esac
    done
  git rev-parse HEAD >"$PACK/commit.txt" 2>/dev/null || true
  stamp "packed into $PACK: $(cd "$PACK" && find . -type f | sort | tr '\n' ' ')($(du -sh "$PACK" | cut -f1))"
fi
exit "$status"
