#!/usr/bin/env bash
# The GPU checks, for a session that is lent a GPU machine (its python3 has torch, triton,
# pybind11, scikit-build-core, cmake, ninja, pytest, hypothesis, filelock and tqdm, and reaches
# no package registry). Each step fits one 10-minute device call; logs and results go to $OUT
# (default build/gpu-out), benchmark results also to benchmarks/results/.
#   scripts/gpu_session.sh test      build, then the GPU tests and the whole suite on the GPU
#   scripts/gpu_session.sh gpu       build, then the GPU tests alone (the libraries' too, if carried)
#   scripts/gpu_session.sh bench     build, then the dispatch benchmark (--quick)
#   scripts/gpu_session.sh sanitize [TOOL] [pytest args]
#                                    build, then GPU tests under compute-sanitizer TOOL (memcheck,
#                                    racecheck, synccheck or initcheck; default memcheck) over
#                                    the pytest args (default tests/test_gpu.py)
#   scripts/gpu_session.sh example   build, then the C++ torch op example (examples/torch_op)
#   scripts/gpu_session.sh all       build, then in one device call, most valuable first, each
#                                    under its own time limit so that what finished comes back:
#                                    the GPU tests but the libraries', the benchmark (--quick),
#                                    memcheck over the GPU tests, the corpus and the patch tests,
#                                    racecheck over the corpus, the libraries' GPU tests (if
#                                    carried; their autotuned kernels compile every config);
#                                    $OUT/summary.txt has each part's exit status and seconds
#                                    (124: it ran past its limit)
#   scripts/gpu_session.sh wheels    (here, not there) download the test libraries' wheels
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:-test}
shift || true
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

# The kernel libraries the tests call (Liger-Kernel, fla-core and its einops,
# conch-triton-kernels, FlagGems and its PyYAML and SQLAlchemy, SGLang and what its package
# imports that the GPU machines' image lacks) are not on the GPU machines and nothing can be
# fetched there: download their wheels here first with
#   scripts/gpu_session.sh wheels      (into .whl/, which .gitignore keeps out of commits)
# and name .whl in the device call's carry; they are installed beside the image's packages.
if [ "$step" = wheels ]; then
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 -d .whl \
    liger-kernel==0.8.5 fla-core==0.6.0 einops==0.8.2 conch-triton-kernels==1.3 \
    flag-gems==5.0.2 pyyaml==6.0.4 sqlalchemy==2.0.58
  # SGLang's wheel asks for glibc 2.34 (the GPU machines have 2.39).
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 -d .whl \
    sglang==0.5.23 orjson==3.13.0 pybase64==1.5.1 starlette==1.10.0 msgspec==0.23.0 \
    pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 pyzmq==27.3.0 \
    ipython==9.19.1 traitlets==5.16.1
  du -sh .whl
  ls .whl
  exit 0
fi
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/fastkernel-site .whl/*.whl
  export PYTHONPATH=/tmp/fastkernel-site${PYTHONPATH:+:$PYTHONPATH}
fi

{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  "$py" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} | tee "$OUT/versions-$step.txt"
"$py" -m pip install -q --no-build-isolation --no-deps -C cmake.define.FASTKERNEL_TESTING=ON . 2>&1 | tee "$OUT/build-$step.log"

# sanitize TOOL LOG PYTEST-ARGS...: the GPU tests in PYTEST-ARGS under compute-sanitizer TOOL, its
# report in LOG; fails if pytest failed or the sanitizer reported an error. The errors counted
# leave out one kind, expected: on drivers without cuFuncGetParamCount (CUDA 13.1 and older) the
# parameter-count check asks cuFuncGetParamInfo for the index one past a kernel's last
# parameter, which the driver answers with CUDA_ERROR_INVALID_VALUE, reported as an API error.
sanitize() {
  local tool=$1 log=$2 rc=0
  shift 2
  compute-sanitizer --tool "$tool" "$py" -m pytest -q -m gpu -p no:cacheprovider "$@" \
    >"$log" 2>&1 || rc=$?
  "$py" - "$log" <<'PY' || rc=1
import re, sys
text = open(sys.argv[1], errors="replace").read()
totals = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", text)]
totals += [int(n) for n in re.findall(r"RACECHECK SUMMARY: .*?\((\d+) error", text)]
probe = len(re.findall(r"CUDA_ERROR_INVALID_VALUE .* on CUDA API call to cuFuncGetParamInfo", text))
errors = sum(totals) - probe
print(f"compute-sanitizer: {errors} errors ({probe} expected cuFuncGetParamInfo probe errors "
      f"left out)" if totals else "compute-sanitizer: no summary (it did not finish)")
sys.exit(0 if totals and errors == 0 else 1)
PY
  tail -n 1 "$log"
  return "$rc"
}

case "$step" in
  test)
    # Both runs always, so one device call gives both logs; the step fails if either did.
    set -o pipefail
    status=0
    "$py" -m pytest -q -m gpu tests -p no:cacheprovider -rs "$@" 2>&1 | tee "$OUT/pytest-gpu.log" ||
      status=$?
    "$py" -m pytest -q tests -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest-all.log" || status=$?
    exit "$status"
    ;;
  gpu)
    set -o pipefail
    "$py" -m pytest -q -m gpu tests -p no:cacheprovider -rs "$@" 2>&1 | tee "$OUT/pytest-gpu.log"
    ;;
  bench)
    "$py" benchmarks/dispatch.py --quick --out benchmarks/results "$@" 2>&1 | tee "$OUT/bench.log"
    cp benchmarks/results/*.json "$OUT/" 2>/dev/null || true
    ;;
  sanitize)
    set -o pipefail
    tool=memcheck
    case "${1:-}" in memcheck|racecheck|synccheck|initcheck) tool=$1; shift ;; esac
    [ $# -gt 0 ] || set -- tests/test_gpu.py
    sanitize "$tool" "$OUT/$tool.log" "$@"
    ;;
  example)
    build=build/torch_op
    cmake -S examples/torch_op -B "$build" -G Ninja \
      -DTorch_DIR="$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')/Torch" \
      -Dfastkernel_DIR="$("$py" -c 'import fastkernel; print(fastkernel.get_cmake_dir())')" \
      > "$OUT/example-cmake.log" 2>&1
    cmake --build "$build" >> "$OUT/example-cmake.log" 2>&1
    "$py" examples/torch_op/add_kernel.py "$build" 2>&1 | tee "$OUT/example.log"
    ;;
  all)
    # A drawn task gets about 15 minutes of device time, machine start included: one call of at
    # most 10 minutes. The limits (seconds; FASTKERNEL_GPU_LIMITS="tests bench memcheck
    # racecheck libraries"; 0 skips a part) add up to 9 minutes after the build (about 25 s).
    # Measured on an H200 (2026-11-27): the GPU tests 120 s, the --quick benchmark 57 s,
    # memcheck 107 s, racecheck over the corpus 10 s (over test_gpu.py it took more than 40 s
    # for its first test), Liger-Kernel's and conch's ops 65 s, flash-linear-attention's 9-21 s
    # per op (autotuning), about 300 s for its 19.
    read -r t_tests t_bench t_memcheck t_racecheck t_libraries \
      <<<"${FASTKERNEL_GPU_LIMITS:-140 80 130 60 130}"
    : >"$OUT/summary.txt"
    status=0
    export py
    export -f sanitize  # run by `timeout` through bash -c below
    part() {  # part NAME LIMIT COMMAND...: the command's output in $OUT/NAME.log
      local name=$1 limit=$2 start rc=0
      shift 2
      if [ "$limit" = 0 ]; then
        echo "$name skipped (limit 0)" | tee -a "$OUT/summary.txt"
        return 0
      fi
      start=$SECONDS
      timeout --signal=INT --kill-after=15 "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
      echo "$name exit=$rc seconds=$((SECONDS - start)) limit=$limit" | tee -a "$OUT/summary.txt"
      [ "$rc" = 0 ] || status=1
    }
    part pytest-gpu "$t_tests" "$py" -m pytest -q -m gpu tests -p no:cacheprovider -rs \
      --ignore=tests/test_gpu_libraries.py
    stamp=$(mktemp)
    part bench "$t_bench" "$py" benchmarks/dispatch.py --quick --out benchmarks/results
    find benchmarks/results -type f -newer "$stamp" -exec cp {} "$OUT/" \;  # this run's only
    rm -f "$stamp"
    part memcheck "$t_memcheck" bash -c 'sanitize "$@"' sanitize memcheck \
      "$OUT/memcheck-report.log" tests/test_gpu.py tests/test_corpus.py tests/test_gpu_patch.py
    part racecheck "$t_racecheck" bash -c 'sanitize "$@"' sanitize racecheck \
      "$OUT/racecheck-report.log" tests/test_corpus.py -k bit_for_bit
    part libraries "$t_libraries" "$py" -m pytest -q -m gpu -p no:cacheprovider -rs \
      tests/test_gpu_libraries.py
    exit "$status"
    ;;
  *) echo "usage: scripts/gpu_session.sh test|gpu|bench|sanitize|example|all|wheels [args]" >&2; exit 2 ;;
esac
