#!/usr/bin/env bash
# Installs everything sparq needs to build, test and benchmark on Debian 12 (run as root or with
# sudo available). Idempotent: packages already present are skipped by apt/pip themselves.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git unzip python3 python3-pip
  libhwy-dev libopenblas-dev liblapacke-dev
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

# Python tools used by tests and scripts only (never by the library): the independent GGUF reader.
PY=${PYTHON:-python3}
if ! $PY -c "import gguf, numpy" 2>/dev/null; then
  echo "[install_deps] pip install gguf numpy"
  $PY -m pip install -q gguf numpy
fi
echo "[install_deps] ok"
