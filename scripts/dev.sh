#!/usr/bin/env bash
# One entry point for a fresh machine: set up .venv, build and install the wheel, then run
#   scripts/dev.sh demo   the main job: example kernels through fastkernel, checked against torch
#   scripts/dev.sh test   the test suite (what .ci/run runs)
#   scripts/dev.sh bench  the dispatch benchmark
#   scripts/dev.sh sanitize  the test suite against a copy of the native module built with
#                         AddressSanitizer and UndefinedBehaviorSanitizer
#   scripts/dev.sh cuda-build  configure and compile the native module against a CUDA build of
#                         torch without a CUDA toolkit (build only; downloads about 1.2 GB once)
#   scripts/dev.sh fuzz [RUNS]  the fuzzers of every parser of untrusted input (scripts/fuzz.sh;
#                         installs clang with apt-get when it is missing and may)
#   scripts/dev.sh lint   ruff (lint, format check), clang-format check, mypy (seconds)
#   scripts/dev.sh ci     lint, test, cuda-build, sanitize, then a short fuzzing campaign (what
#                         .ci/run runs)
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
# Test dependencies: Triton kernel libraries the patch-mode tests call through their own host
# functions (tests/test_libraries.py). Pinned, and installed without their dependencies (torch,
# triton, numpy, einops: all installed above or here): resolving them would re-resolve torch's
# own triton pin and replace the Triton this environment was asked for. FlagGems imports PyYAML
# and SQLAlchemy (its tuning database).
"${pip[@]}" install --no-deps liger-kernel==0.8.5 fla-core==0.6.0 einops==0.8.2 conch-triton-kernels==1.3 \
  flag-gems==5.0.2 pyyaml==6.0.4 sqlalchemy==2.0.58
# SGLang (Python 3.11 and newer): its package imports its runtime's utilities on any import, so
# its kernels need what those import, pinned here (its own torch, flashinfer and CUDA pins are
# left out: only its Triton kernels are called).
sglang_only="; python_version >= '3.11'"
"${pip[@]}" install --no-deps "sglang==0.5.23$sglang_only" "orjson==3.13.0$sglang_only" \
  "psutil==7.2.2$sglang_only" "pybase64==1.5.1$sglang_only" "requests==2.34.2$sglang_only" \
  "urllib3==2.8.0$sglang_only" "idna==3.21$sglang_only" "certifi==2026.10.19.post1$sglang_only" \
  "pillow==13.0.0$sglang_only" "starlette==1.10.0$sglang_only" "anyio==4.16.0$sglang_only" \
  "msgspec==0.23.0$sglang_only" "pydantic==2.14.4$sglang_only" "pydantic-core==2.50.5$sglang_only" \
  "typing-inspection==0.4.5$sglang_only" "pyzmq==27.3.0$sglang_only" "ipython==9.19.1$sglang_only" \
  "traitlets==5.16.1$sglang_only" "aiohttp==3.14.5$sglang_only" "multidict==7.2.1$sglang_only" \
  "attrs==26.1.0$sglang_only" "yarl==1.25.1$sglang_only" "propcache==0.5.4$sglang_only" \
  "aiohappyeyeballs==2.7.1$sglang_only" "aiosignal==1.4.0$sglang_only" "frozenlist==1.8.0$sglang_only"
# vLLM (Python 3.11 and newer): its kernel modules import its configuration, which imports
# transformers and Hugging Face Hub, its structured-output backends (xgrammar, llguidance) and its
# engine's utilities; pinned here, beside what SGLang's pins above already give it (its torch,
# flashinfer and CUDA pins are left out: only its Triton kernels are called).
vllm_only="; python_version >= '3.11'"
"${pip[@]}" install --no-deps "vllm==0.34.0$vllm_only" "transformers==5.22.2$vllm_only" \
  "huggingface-hub==2.4.0$vllm_only" "tokenizers==0.23.3$vllm_only" "safetensors==0.8.0$vllm_only" \
  "regex==2026.12.2$vllm_only" "httpx2==2.17.0$vllm_only" "httpcore2==2.17.0$vllm_only" \
  "h11==0.16.0$vllm_only" "truststore==0.10.5$vllm_only" "xgrammar==0.2.8$vllm_only" \
  "apache-tvm-ffi==0.1.11$vllm_only" "llguidance==1.7.6$vllm_only" "cachetools==8.0.3$vllm_only" \
  "cbor2==6.3.0$vllm_only" "cloudpickle==3.1.3$vllm_only" "prometheus-client==0.26.0$vllm_only" \
  "py-cpuinfo==9.0.0$vllm_only" "uvloop==0.23.0$vllm_only" "annotated-types==0.8.0$vllm_only"
# The hygiene tools `lint` runs, pinned so that their verdicts do not drift.
"${pip[@]}" install ruff==0.17.6 mypy==2.4.1 clang-format==18.1.8
# The Python fuzzers' engine (scripts/fuzz.sh); a Python it has no wheel for skips it here and
# fuzz.sh then says so.
"${pip[@]}" install atheris==3.0.0 ||
  echo "dev.sh: atheris is not installable for this Python; scripts/fuzz.sh needs it" >&2

# A torch extension builds against the installed torch, so no build isolation; build the wheel
# and install it, as a user would.
# The wheel goes inside the environment it is built for, so that environments built side by
# side (scripts/matrix.sh) never share one.
wheels="$VENV/wheels"
rm -rf "$wheels"
# FASTKERNEL_TESTING adds the host-testing switch, _C._testing and the benchmark loops, which
# the tests and the benchmark use; a user's `pip install fastkernel` leaves them out.
"${pip[@]}" wheel --no-build-isolation --no-deps -C cmake.define.FASTKERNEL_TESTING=ON -w "$wheels" .
"${pip[@]}" install --force-reinstall --no-deps "$wheels"/fastkernel-*.whl

# The sanitized module: the same sources built with -fsanitize=address,undefined into
# build/sanitize, staged beside a copy of the Python package so that it shadows the installed
# wheel, and the sanitizer runtimes preloaded into the (uninstrumented) interpreter.
# Configuration: pyproject.toml ([tool.ruff], [tool.mypy]) and .clang-format.
lint() {
  local bin
  bin="$(dirname "$py")"
  "$py" -m ruff check python benchmarks tests scripts
  "$py" -m ruff format --check python benchmarks tests scripts
  git ls-files -z '*.c' '*.cpp' '*.h' | xargs -0 "$bin/clang-format" --dry-run --Werror
  "$py" -m mypy
  echo "lint: ruff, clang-format and mypy found nothing"
}

sanitize() {
  local build=build/sanitize stage=build/sanitize-pkg flags
  flags="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
  PATH="$(dirname "$py"):$PATH" cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DFASTKERNEL_TESTING=ON \
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

# The native module configured and compiled against a CUDA build of torch from the registry, with
# no CUDA toolkit (CUDA_HOME unset; the build looks for none). The wheel is installed without its
# CUDA libraries (1.2 GB instead of about 4.6 GB with them), so it cannot be imported: its paths
# are given to CMake instead of read from torch.utils.cpp_extension (CMakeLists.txt).
cuda_torch_build() {
  local spec=${FASTKERNEL_CUDA_TORCH_SPEC:-torch==2.11.0} dir=build/ci-cuda-torch site torch_dir
  local version abi
  site="$dir/site"
  if ! [ -f "$site/torch/version.py" ]; then
    rm -rf "$site"
    "${pip[@]}" install --no-deps --target "$site" "$spec"
  fi
  torch_dir="$site/torch"
  version=$(sed -n "s/^__version__ = '\(.*\)'$/\1/p" "$torch_dir/version.py")
  # libc10 exports std::__cxx11 names exactly when torch was built with _GLIBCXX_USE_CXX11_ABI=1.
  abi=0
  if nm -D --defined-only "$torch_dir/lib/libc10.so" | grep -q __cxx11; then abi=1; fi
  echo "--- configure and compile against torch $version (CXX11 ABI $abi), no CUDA toolkit ---"
  env -u CUDA_HOME -u CUDA_PATH PATH="$(dirname "$py"):$PATH" cmake -S . -B "$dir/build" -G Ninja \
    -DPython_EXECUTABLE="$py" \
    -Dpybind11_DIR="$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
    -DFASTKERNEL_TORCH_VERSION="$version" -DFASTKERNEL_TORCH_CXX11_ABI="$abi" \
    -DFASTKERNEL_TORCH_LIBRARY_DIR="$torch_dir/lib" \
    -DFASTKERNEL_TORCH_INCLUDE_DIRS="$torch_dir/include;$torch_dir/include/torch/csrc/api/include" \
    >/dev/null
  env -u CUDA_HOME -u CUDA_PATH PATH="$(dirname "$py"):$PATH" cmake --build "$dir/build" --target _C
  # It links torch's CPU libraries only: no CUDA library may be a direct dependency.
  if readelf -d "$dir"/build/_C*.so | grep NEEDED | grep -Ei 'cuda|cudnn|nvrtc|cublas'; then
    echo "error: _C links a CUDA library" >&2
    return 1
  fi
  echo "built $(ls "$dir"/build/_C*.so) against torch $version"
}

case "$command" in
  demo) exec "$py" -m fastkernel demo "$@" ;;
  bench) exec "$py" benchmarks/dispatch.py "$@" ;;
  lint) lint ;;
  test) exec "$py" -m pytest tests "$@" ;;
  sanitize) sanitize "$@" ;;
  cuda-build) cuda_torch_build ;;
  fuzz) PYTHON="$py" exec bash scripts/fuzz.sh "$@" ;;
  ci)
    echo "--- lint: ruff, clang-format, mypy ---"
    lint
    "$py" -m pytest tests "$@"
    cuda_torch_build
    echo "--- the same suite against the AddressSanitizer/UBSan build of the native module ---"
    sanitize "$@"
    echo "--- a short run of every fuzzer (scripts/fuzz.sh 50000) ---"
    # A finding fails CI; a fuzzing toolchain this machine cannot install is reported, not failed.
    fuzz_status=0
    PYTHON="$py" bash scripts/fuzz.sh 50000 || fuzz_status=$?
    if [ "$fuzz_status" = 2 ]; then
      echo "*** FUZZERS NOT RUN (or not all): their toolchain is missing; see above ***"
    elif [ "$fuzz_status" != 0 ]; then
      exit "$fuzz_status"
    fi
    ;;
  *) echo "usage: scripts/dev.sh demo|test|bench|lint|sanitize|cuda-build|fuzz|ci [args...]" >&2
     exit 2 ;;
esac
