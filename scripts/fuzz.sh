#!/usr/bin/env bash
# The fuzzers of every parser of untrusted input, with AddressSanitizer and UBSan:
#   native (libFuzzer, clang): the bundle manifest and entry loader, the cubin ELF check, the
#     tensor-map encoder's argument checks, the registration checks of launch facts
#     (tests/fuzz/*.cpp, built with -DFASTKERNEL_FUZZ=ON);
#   Python (atheris): the disk cache's entry decoder and the warm index record decoder.
# Seeds come from real artifacts (tests/fuzz/make_seeds.py). Each target runs RUNS executions;
# a finding (crash, sanitizer report, unexpected exception) stops that target, leaves its input
# in build/fuzz/findings and makes the script exit 1. Exit 2: a toolchain is missing (no clang
# with libFuzzer, or no atheris for the Python targets) and what needs it did not run.
#
#   scripts/fuzz.sh [RUNS]      default 10000000 per target; CI runs a short campaign
#
# Needs the environment scripts/dev.sh sets up (.venv), and clang with libFuzzer: when no clang
# is found and apt-get can run, the script installs Debian's clang and libclang-rt-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10000000}
py=${PYTHON:-.venv/bin/python}
out=build/fuzz
findings=$out/findings

find_clang() {
  local c
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
    if command -v "$c" >/dev/null 2>&1; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

cxx=$(find_clang) || true
if [ -z "$cxx" ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "fuzz: installing clang and libFuzzer (Debian: clang, libclang-rt-dev)"
  apt-get install -y -q clang libclang-rt-dev >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q clang libclang-rt-dev >/dev/null; }
  cxx=$(find_clang)
fi
if [ -z "$cxx" ]; then
  echo "fuzz: no clang with libFuzzer found (install clang and libclang-rt-dev)" >&2
  exit 2
fi
cc=${cxx/clang++/clang}

PATH="$(dirname "$py"):$PATH" cmake -S . -B "$out/native" -G Ninja -DFASTKERNEL_FUZZ=ON \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=None >/dev/null
PATH="$(dirname "$py"):$PATH" cmake --build "$out/native" >/dev/null
bin=$out/native/tests/fuzz

rm -rf "$out/seeds" "$findings"
mkdir -p "$findings"
"$py" tests/fuzz/make_seeds.py "$out/seeds" 2>/dev/null

status=0
run() {  # name, seed directory ("" for none), then the target's command
  local name=$1 seeds=$2
  shift 2
  local corpus=$out/corpus/$name start end log=$out/$name.log
  mkdir -p "$corpus"
  start=$(date +%s)
  # The first directory is the working corpus (new inputs go there); seeds are read from the second.
  if "$@" -runs="$runs" -print_final_stats=1 -artifact_prefix="$findings/$name-" \
      "$corpus" ${seeds:+"$seeds"} >"$log" 2>&1; then
    end=$(date +%s)
    printf '  %-14s %12s executions, 0 findings, %5d s\n' "$name" \
      "$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")" $((end - start))
  else
    echo "  $name: FINDING (input in $findings, log $log):"
    grep -E "ERROR|runtime error|Traceback|Error" "$log" | head -5 | sed 's/^/    /'
    status=1
  fi
}

echo "fuzz: $runs executions per target (clang: $cxx)"
FASTKERNEL_FUZZ_CUBINS="$out/seeds/cubins" run manifest "$out/seeds/manifest" "$bin/fuzz_manifest"
run cubin "$out/seeds/cubin" "$bin/fuzz_cubin"
run tensor_map "" "$bin/fuzz_tensor_map"
run registration "" "$bin/fuzz_registration"
if "$py" -c "import atheris" 2>/dev/null; then
  run cache_entry "$out/seeds/cache_entry" "$py" tests/fuzz/fuzz_cache_entry.py
  run index_record "$out/seeds/index_record" "$py" tests/fuzz/fuzz_index_record.py
else
  echo "  cache_entry, index_record: NOT RUN: atheris does not import in $py" >&2
  if [ "$status" = 0 ]; then status=2; fi
fi
exit $status
