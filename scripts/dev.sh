#!/usr/bin/env bash
# One entry point for a fresh machine: set up .venv, build and install the wheel, then run
#   scripts/dev.sh demo   the main job: example kernels through fastkernel, checked against torch
#   scripts/dev.sh test   the test suite (what .ci/run runs)
#   scripts/dev.sh bench  the dispatch benchmark
# Extra arguments go to the command (pytest, the demo or the benchmark).
set -euo pipefail
cd "$(dirname "$0")/.."

command=${1:-test}
shift || true

PYTHON=${PYTHON:-python3}
VENV=${FASTKERNEL_VENV:-.venv}
# torch 2.13.0 is the CPU build on this project's machines (a local file); on a GPU machine an
# already-installed CUDA torch is kept. triton is pinned so the tested ABI is the one installed.
TORCH_SPEC=${FASTKERNEL_TORCH_SPEC:-torch==2.13.0}
TRITON_SPEC=${FASTKERNEL_TRITON_SPEC:-triton==3.9.0}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
py="$VENV/bin/python"
pip=("$py" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >/dev/null
if ! "$py" -c "import torch" 2>/dev/null; then
  "${pip[@]}" install "$TORCH_SPEC"
fi
"${pip[@]}" install "$TRITON_SPEC" numpy hypothesis "pybind11>=2.12" "scikit-build-core>=0.10" cmake ninja "pytest>=7"

# A torch extension builds against the installed torch, so no build isolation; build the wheel
# and install it, as a user would.
rm -rf dist
"${pip[@]}" wheel --no-build-isolation --no-deps -w dist .
"${pip[@]}" install --force-reinstall --no-deps dist/fastkernel-*.whl

case "$command" in
  demo) exec "$py" -m fastkernel demo "$@" ;;
  bench) exec "$py" -m fastkernel bench "$@" ;;
  test) exec "$py" -m pytest tests "$@" ;;
  *) echo "usage: scripts/dev.sh demo|test|bench [args...]" >&2; exit 2 ;;
esac
