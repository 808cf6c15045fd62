#!/usr/bin/env bash
# The version matrix: each cell is a fresh virtual environment (Python, torch, Triton), the wheel
# built and installed there by scripts/dev.sh, and the whole CPU suite run against the stand-in
# driver. Not part of CI: the CUDA-build cells download several GB of torch and its CUDA
# libraries from the registry (pip's cache keeps them for the next run).
#
#   scripts/matrix.sh               every cell below
#   scripts/matrix.sh gpu dev       the named cells only
#
# Each cell's summary line goes to build/matrix/results.tsv (cell, python, torch, triton,
# result, date) and its log to build/matrix/<cell>.log; the table at the end is the README's.
#
# The torch214 and torch215 cells are the newest torch releases, each with the Triton it pins. A
# pip configuration that caps torch below a cell's version (a pip constraints file) stops that
# cell at install; PIP_CONSTRAINT=/dev/null lifts the cap for the run.
#
# The gpu cell is the GPU machines' own combination (Python 3.12, torch 2.11.0 CUDA build,
# Triton 3.6.0). It builds with no CUDA toolkit visible: CUDA_HOME and CUDA_PATH unset, no nvcc
# on PATH, and, where `unshare` may make a mount namespace (root), the toolkit directories
# (/usr/local/cuda*) and any nvcc hidden behind empty mounts for the whole cell.
set -euo pipefail
cd "$(dirname "$0")/.."

# cell  python  torch-spec  triton-spec
CELLS="
dev     3.11  torch==2.13.0  triton==3.9.0
gpu     3.12  torch==2.11.0  triton==3.6.0
oldest  3.10  torch==2.11.0  triton==3.5.1
newest  3.13  torch==2.11.0  triton==3.8.0
t37     3.11  torch==2.13.0  triton==3.7.1
torch214 3.12 torch==2.14.1  triton==3.8.0
torch215 3.12 torch==2.15.0  triton==3.9.0
"

want=("$@")
out=build/matrix
mkdir -p "$out"
results="$out/results.tsv"
touch "$results"

python_for() {  # the pyenv interpreter of a minor version, else python3.X on PATH
  local minor=$1 root
  root=$(pyenv root 2>/dev/null || true)
  if [ -n "$root" ]; then
    for d in "$root"/versions/"$minor".*; do
      [ -x "$d/bin/python3" ] && { echo "$d/bin/python3"; return; }
    done
  fi
  command -v "python$minor"
}

# Runs "$@" with no CUDA toolkit visible (see the header).
without_toolkit() {
  if [ "$(id -u)" = 0 ] && unshare --mount true 2>/dev/null; then
    # shellcheck disable=SC2016
    env -u CUDA_HOME -u CUDA_PATH unshare --mount bash -c '
      for d in /usr/local/cuda /usr/local/cuda-*; do
        [ -d "$d" ] && mount -t tmpfs none "$d"
      done
      : >/tmp/fastkernel-no-nvcc  # an empty file that is not executable
      IFS=: read -ra dirs <<<"$PATH"
      for d in "${dirs[@]}"; do
        [ -f "$d/nvcc" ] && mount --bind /tmp/fastkernel-no-nvcc "$d/nvcc"
      done
      if nvcc --version >/dev/null 2>&1 ||
         [ -n "$(find /usr/local/cuda*/ -mindepth 1 2>/dev/null)" ]; then
        echo "matrix: a CUDA toolkit is still visible" >&2; exit 1
      fi
      echo "matrix: no CUDA toolkit visible (CUDA_HOME unset, no nvcc, /usr/local/cuda* empty)"
      exec "$@"' bash "$@"
  else
    local path_no_nvcc
    path_no_nvcc=$(tr ':' '\n' <<<"$PATH" | while read -r d; do
      [ -x "$d/nvcc" ] || printf '%s:' "$d"; done)
    echo "matrix: CUDA_HOME unset and no nvcc on PATH (cannot hide /usr/local/cuda: not root)"
    env -u CUDA_HOME -u CUDA_PATH PATH="${path_no_nvcc%:}" "$@"
  fi
}

run_cell() {
  local cell=$1 minor=$2 torch_spec=$3 triton_spec=$4 py venv log status summary
  py=$(python_for "$minor") || { echo "matrix: no Python $minor" >&2; return 1; }
  venv="$out/venv-$cell"
  log="$out/$cell.log"
  rm -rf "$venv"
  echo "== $cell: Python $minor, $torch_spec, $triton_spec"
  local runner=(env)
  [ "$cell" = gpu ] && runner=(without_toolkit)
  set +e
  PYTHON="$py" FASTKERNEL_VENV="$venv" FASTKERNEL_TORCH_SPEC="$torch_spec" \
    FASTKERNEL_TRITON_SPEC="$triton_spec" \
    "${runner[@]}" bash scripts/dev.sh test -q -p no:cacheprovider >"$log" 2>&1
  status=$?
  set -e
  summary=$(grep -E '^=* ?[0-9]+ (passed|failed|error).* in ' "$log" | tail -n 1 | tr -d '=' |
            sed 's/^ *//; s/ *$//')
  [ -n "$summary" ] || summary="no test summary (exit $status; see $log)"
  local versions
  versions=$("$venv/bin/python" -c 'import sys, torch, triton; print("%d.%d.%d" % sys.version_info[:3], torch.__version__, triton.__version__, sep="\t")' 2>/dev/null ||
             printf '%s\t%s\t%s' "$minor" "$torch_spec" "$triton_spec")
  grep -v "^$cell	" "$results" >"$results.new" || true
  printf '%s\t%s\t%s\t%s\n' "$cell" "$versions" "$summary" "$(date -u +%Y-%m-%d)" >>"$results.new"
  mv "$results.new" "$results"
  echo "   $summary"
  return $status
}

failed=0
while read -r cell minor torch_spec triton_spec; do
  [ -n "$cell" ] || continue
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $cell "* ]]; then
    continue
  fi
  run_cell "$cell" "$minor" "$torch_spec" "$triton_spec" || failed=1
done <<<"$CELLS"

echo
echo "| cell | Python | torch | Triton | CPU suite | date |"
echo "|---|---|---|---|---|---|"
while IFS=$'\t' read -r cell py torch triton summary date; do
  echo "| $cell | $py | $torch | $triton | $summary | $date |"
done <"$results"
exit $failed
