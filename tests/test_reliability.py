"""Short runs of the reliability scripts (scripts/reliability/), which run at scale outside CI:
differential call-surface fuzzing against Triton's own launcher, and writers killed with SIGKILL
mid-write. Both on the recording stand-in driver."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts" / "reliability"

pytestmark = pytest.mark.stand_in


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_calls_launch_tritons_bytes_or_raise_typed_errors():
    """1,500 generated calls over six kernels: each launches what Triton's launcher launches,
    byte for byte, or raises a typed error naming the argument (or Triton's own error)."""
    result = _load("fuzz_calls").run(1500, seed=7, pool=8)
    assert result["failures"] == [], result["failures"][:5]
    outcomes = result["outcomes"]
    # The run exercised both sides of the contract, natively.
    assert outcomes.get("launched, the same bytes as Triton", 0) > 500, outcomes
    assert sum(v for k, v in outcomes.items() if k.startswith("raised")) > 100, outcomes
    assert sum(s["hits"] for s in result["stats"].values()) > 500


def test_generated_calls_of_new_wrappers_are_served_by_the_warm_index():
    """Past WARM_EVERY calls the kernels are wrapped anew: the new wrappers' misses are served
    from the run's cache through its warm index (records that fit their calls), as a new
    process's would be."""
    fuzz_calls = _load("fuzz_calls")
    result = fuzz_calls.run(fuzz_calls.WARM_EVERY + 300, seed=11, pool=4)
    assert result["failures"] == [], result["failures"][:5]
    assert result["cache"]["compiled"] > 0 and result["cache"]["warm"] > 0, result["cache"]


def test_writers_killed_mid_write_leave_nothing_that_loads_wrong(tmp_path):
    """25 writers of cache entries, index and tuning records and bundle exports killed with
    SIGKILL at random points: every entry loads intact, the bundle always loads whole."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "crash_writers.py"), "--kills", "25", "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^  failures +0$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^  entry loaded intact +25$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^  bundle loaded whole +25$", proc.stdout, re.M), proc.stdout
