#!/usr/bin/env bash
# sparq's main job on its built-in default, from a fresh machine: install dependencies, fetch the
# default model (SmolLM2-135M-Instruct) into the cache, build the release preset, run `sparq demo`
# (which reads data/text/ of this checkout). Arguments go to `sparq demo` (e.g. --quick).
# Writes only build/, .venv/ and ${SPARQ_CACHE:-~/.cache/sparq} (the model, pip's cache, the
# demo's checkpoints in demo/ or demo-quick/).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
bash scripts/install_deps.sh
if [ -f scripts/fetch_model.sh ]; then bash scripts/fetch_model.sh; fi
cmake --preset release >/dev/null
cmake --build --preset release -j "$JOBS" --target sparq_cli
./build/release/sparq demo "$@"
