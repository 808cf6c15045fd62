#!/usr/bin/env bash
# One entry point for a fresh machine: set up .venv, build and install the wheel, then run
#   scripts/dev.sh demo   the main job: example kernels through fastkernel, checked against torch
#   scripts/dev.sh test   the test suite (what .ci/run runs)
#   scripts/dev.sh bench  the dispatch benchmark
#   scripts/dev.sh sanitize  the test suite against a copy of the native module built with
#                         AddressSanitizer and UndefinedBehaviorSanitizer
#   scripts/dev.sh ci     test, then sanitize (what .ci/run runs)
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
"${pip[@]}" install "$TRITON_SPEC" filelock tqdm numpy hypothesis "pybind11>=2.12" "scikit-build-core>=0.10" cmake ninja "pytest>=7"

# A torch extension builds against the installed torch, so no build isolation; build the wheel
# and install it, as a user would.
# The wheel goes inside the environment it is built for, so that environments built side by
# side (scripts/matrix.sh) never share one.
wheels="$VENV/wheels"
rm -rf "$wheels"
"${pip[@]}" wheel --no-build-isolation --no-deps -w "$wheels" .
"${pip[@]}" install --force-reinstall --no-deps "$wheels"/fastkernel-*.whl

# The sanitized module: the same sources built with -fsanitize=address,undefined into
# build/sanitize, staged beside a copy of the Python package so that it shadows the installed
# wheel, and the sanitizer runtimes preloaded into the (uninstrumented) interpreter.
sanitize() {
  local build=build/sanitize stage=build/sanitize-pkg flags
  flags="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
  PATH="$(dirname "$py"):$PATH" cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF -DPython_EXECUTABLE="$py" \
    -Dpybind11_DIR="$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())')" >/dev/null
  PATH="$(dirname "$py"):$PATH" cmake --build "$build" --target _C >/dev/null
  rm -rf "$stage" && mkdir -p "$stage"
  cp -r python/fastkernel "$stage/"
  cp "$build"/_C*.so "$build/_build_info.py" "$stage/fastkernel/"
  # The C++ caller's files (headers, core library, CMake package) come from the installed wheel:
  # a sanitized static library could not link into the uninstrumented C++ test program.
  local installed
  installed="$("$py" -c 'import os, fastkernel; print(os.path.dirname(fastkernel.__file__))')"
  cp -r "$installed/include" "$installed/lib" "$installed/share" "$stage/fastkernel/"
  # Leak checking is off: CPython and torch keep allocations alive until exit by design.
  LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
    ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    PYTHONPATH="$stage" "$py" -m pytest tests "$@"
}

case "$command" in
  demo) exec "$py" -m fastkernel demo "$@" ;;
  bench) exec "$py" -m fastkernel bench "$@" ;;
  test) exec "$py" -m pytest tests "$@" ;;
  sanitize) sanitize "$@" ;;
  ci)
    "$py" -m pytest tests "$@"
    echo "--- the same suite against the AddressSanitizer/UBSan build of the native module ---"
    sanitize "$@"
    ;;
  *) echo "usage: scripts/dev.sh demo|test|bench|sanitize|ci [args...]" >&2; exit 2 ;;
esac
