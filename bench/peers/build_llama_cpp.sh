#!/usr/bin/env bash
# Rebuild only llama.cpp's CPU backend (libggml-cpu) without -march=native, for the llama.cpp peer
# (bench/peers/llama_cpp_*.py). A `pip install llama-cpp-python` built with GGML_NATIVE=ON dies
# with SIGILL on this VM; the rest of its libraries (libllama, libggml, libggml-base) hold no
# CPU-specific code and are reused as they are.
#
#   bench/peers/build_llama_cpp.sh [PY_LIB_DIR]
#
# PY_LIB_DIR: the folder holding the installed package's libllama.so, libggml*.so (default: the
# `lib/` folder of the llama_cpp package installed in the repository's .venv, or $LLCPP_LIB).
# Without either, the script first installs llama-cpp-python $VER into that Python (from its
# sdist, GGML_NATIVE off; about 10 min on 2 cores) and the modules the peer scripts import, where
# they are missing. Afterwards `sparq bench model MODEL --llama-cpp` finds the peer by itself.
# Work folders: $LLSRC, $LLBUILD; result: $LLLIB (a copy of PY_LIB_DIR with the new
# libggml-cpu.so*). All three default to ${SPARQ_CACHE:-~/.cache/sparq}/llama_cpp/, pip's cache
# to ${SPARQ_CACHE:-~/.cache/sparq}/pip.
# Builds nice'd with 2 jobs.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
PY=${SPARQ_PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=python3
CACHE=${SPARQ_CACHE:-$HOME/.cache/sparq}
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$CACHE/pip}"
VER=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}   # must equal the installed llama-cpp-python version (ABI)
LLSRC=${LLSRC:-$CACHE/llama_cpp/src} LLBUILD=${LLBUILD:-$CACHE/llama_cpp/build}
LLLIB=${LLLIB:-$CACHE/llama_cpp/lib}

# 0. The package, where the Python has none (found without importing it: its import loads the
# libraries). Its own build is portable (GGML_NATIVE off); step 2 replaces its CPU backend.
has_mod() { "$PY" -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('$1') else 1)"; }
if [ -z "${1:-}${LLCPP_LIB:-}" ]; then
  if ! has_mod llama_cpp; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL=2 nice -n 10 "$PY" -m pip install "llama-cpp-python==$VER"
  fi
  have=$("$PY" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))')
  [ "$have" = "$VER" ] || {
    echo "llama-cpp-python $have is installed, this script builds $VER's backend: set" \
         "LLAMA_CPP_PYTHON_VERSION=$have or install $VER" >&2
    exit 1
  }
  # A `pip install --no-deps` leaves these out; the peer scripts import them.
  for m in numpy typing_extensions diskcache jinja2; do
    has_mod "$m" || "$PY" -m pip install "${m//_/-}"
  done
fi
PY_LIB_DIR=${1:-${LLCPP_LIB:-$("$PY" -c 'import importlib.util as u, os; \
print(os.path.join(os.path.dirname(u.find_spec("llama_cpp").origin), "lib"))')}}
[ -f "$PY_LIB_DIR/libllama.so" ] || { echo "no libllama.so in $PY_LIB_DIR: pass the folder" >&2; exit 1; }

# 1. The sdist carries llama.cpp in vendor/llama.cpp.
mkdir -p "$LLSRC"
[ -f "$LLSRC/llama_cpp_python-$VER.tar.gz" ] ||
  "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$LLSRC"
[ -d "$LLSRC/llama_cpp_python-$VER" ] || tar xzf "$LLSRC/llama_cpp_python-$VER.tar.gz" -C "$LLSRC"

# 2. Explicit x86 features: AVX2/FMA/F16C/BMI2 + AVX-512 F/CD/VL/DQ/BW, and AVX-512 VNNI / VBMI /
#    BF16 and AVX-VNNI where /proc/cpuinfo lists them (llama.cpp's integer dot products use
#    VNNI: leaving it off would handicap the peer); AMX always off (AMX tile code in the native
#    build is the likely SIGILL). AVX512 (default: whether the CPU has avx512f) = OFF builds AVX2 only;
#    with AVX_VNNI=OFF too it is what an AVX2-only CPU (Zen 3) runs, e.g. to compare with
#    `sparq --max-isa AVX2` on an AVX-512 host (LLBUILD / LLLIB elsewhere, then LLAMA_CPP_LIB_PATH).
has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
AVX512=${AVX512:-$(has avx512f)}
AVX_VNNI=${AVX_VNNI:-$(has avx_vnni)}
has512() { if [ "$AVX512" = ON ]; then has "$1"; else echo OFF; fi; }
nice -n 10 cmake -S "$LLSRC/llama_cpp_python-$VER/vendor/llama.cpp" -B "$LLBUILD" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF \
  -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512="$AVX512" -DGGML_AVX_VNNI="$AVX_VNNI" \
  -DGGML_AVX512_VBMI="$(has512 avx512vbmi)" -DGGML_AVX512_VNNI="$(has512 avx512_vnni)" \
  -DGGML_AVX512_BF16="$(has512 avx512_bf16)" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF

# 3. Only the CPU backend (ggml-base is built as its dependency). ~10 min on 2 shared cores.
nice -n 10 cmake --build "$LLBUILD" --target ggml-cpu -j 2

# 4. The installed libraries, with libggml-cpu swapped (same ggml version, so ABI-compatible).
rm -rf "$LLLIB" && mkdir -p "$(dirname "$LLLIB")" && cp -a "$PY_LIB_DIR" "$LLLIB"
rm -f "$LLLIB"/libggml-cpu.so*
cp -a "$LLBUILD"/bin/libggml-cpu.so* "$LLLIB"/

# The folder that holds the llama_cpp package (PY_LIB_DIR is its lib/ folder), e.g. the
# --target of a `pip install --target DIR llama-cpp-python`, which the venv alone does not find.
PY_PKG_PARENT=$(cd "$PY_LIB_DIR/../.." && pwd)
echo "export PYTHONPATH=$PY_PKG_PARENT"
echo "export LLAMA_CPP_LIB_PATH=$LLLIB"
