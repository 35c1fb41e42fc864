#!/usr/bin/env bash
# Installs everything sparq needs to build, test and benchmark on Debian 12 (run as root or with
# sudo available): the Debian packages, then the Python tools in a virtual environment .venv/ of
# the repository (Debian's python3 refuses `pip install`, PEP 668). Idempotent: packages already
# present are not installed again.
#
# Writes only .venv/ and pip's cache ${SPARQ_CACHE:-~/.cache/sparq}/pip (besides apt's packages).
#   PYTHON=python3.X     the interpreter .venv is made from (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git unzip python3 python3-venv
  libhwy-dev libopenblas-dev liblapacke-dev zlib1g-dev
  # `sparq train --task fashion-mnist` (its IDX files in /usr/share/datasets/fashion-mnist)
  dataset-fashion-mnist
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  # peers for `sparq bench kernels` (optional at build time, used when present)
  libeigen3-dev libblis-dev libdnnl-dev
  # fuzzing (libFuzzer + sanitizers)
  clang libclang-rt-14-dev
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install_deps] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python tools of the tests and scripts, never of the library: the independent GGUF reader (the
# checked-in reference statistics were made with gguf 0.19.0), NumPy, matplotlib for the plots;
# nanobind and scikit-build-core build the Python module (pyproject.toml) and pytest tests it.
PY_PACKAGES=(gguf==0.19.0 "numpy>=1.24,<3" "matplotlib>=3.6,<4" "nanobind>=2.0,<4"
             "scikit-build-core>=0.10,<2" "pytest>=7,<10")
PY_IMPORTS="import gguf, numpy, matplotlib, nanobind, scikit_build_core, pytest"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-${SPARQ_CACHE:-$HOME/.cache/sparq}/pip}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV=.venv
if ! "$VENV/bin/python" -c "import sys" 2>/dev/null; then
  echo "[install_deps] ${PYTHON:-python3} -m venv $VENV"
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "$PY_IMPORTS" 2>/dev/null ||
   [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("gguf"))')" != 0.19.0 ]; then
  echo "[install_deps] $VENV/bin/pip install ${PY_PACKAGES[*]}"
  "$VENV/bin/python" -m pip install -q "${PY_PACKAGES[@]}"
fi
echo "[install_deps] ok (Python tools in $VENV/)"
