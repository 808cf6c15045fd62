"""Test configuration: CPU tests launch against the recording stand-in driver; GPU tests
(marked ``gpu``) use the real driver. One process can load only one driver library, so the
mode is chosen once: the stand-in when there is no CUDA device (or FASTKERNEL_TEST_STAND_IN=1),
else the real GPU. On a GPU machine run pytest twice to cover both."""

from __future__ import annotations

import gc
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# The benchmark harness (benchmarks/fkbench), whose host-side part some tests run.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
)

import torch  # noqa: E402
from stand_in_driver.recording import RecordingDriver, build_recording_driver  # noqa: E402

from fastkernel import _C  # noqa: E402

if not hasattr(_C, "_testing"):
    raise pytest.UsageError(
        "the tests need fastkernel built with its testing additions: build it with "
        "`pip install --no-build-isolation -C cmake.define.FASTKERNEL_TESTING=ON .` "
        "(scripts/dev.sh does)"
    )

STAND_IN = os.environ.get("FASTKERNEL_TEST_STAND_IN") == "1" or not torch.cuda.is_available()
STAND_IN_PATH = None
if STAND_IN:
    STAND_IN_PATH = build_recording_driver()
    os.environ["FASTKERNEL_CUDA_DRIVER"] = str(STAND_IN_PATH)
    os.environ.setdefault("FKSTUB_DEVICES", "2")

# A stream handle the stand-in records, distinct from the legacy default stream (0).
TEST_STREAM = 0x5EED5

#: A value for each launch fact of a binary (abi.LaunchMetadata's fields but its name, cubin and
#: descriptor metadata), the numbers no two alike and each within what a launch record accepts:
#: a writer and a reader that disagreed on which fact is which would show.
DISTINCT_LAUNCH_FACTS = {
    "block_x": 96,
    "shared_mem": 4096,
    "num_ctas": 2,
    "cooperative_grid": True,
    "pdl": True,
    "global_scratch_size": 384,
    "global_scratch_align": 64,
    "profile_scratch_size": 640,
    "profile_scratch_align": 32,
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and STAND_IN:
            item.add_marker(
                pytest.mark.skip(reason="needs a CUDA GPU (running against the stand-in driver)")
            )
        uses_stand_in = "stand_in" in item.fixturenames or item.get_closest_marker("stand_in")
        if uses_stand_in and not STAND_IN:
            item.add_marker(
                pytest.mark.skip(
                    reason="stand-in driver tests: rerun with FASTKERNEL_TEST_STAND_IN=1"
                )
            )


@pytest.fixture(scope="session", autouse=True)
def _private_kernel_cache_root(tmp_path_factory):
    """The tests never read or write the user's on-disk kernel cache (fastkernel/cache.py):
    session- and module-scoped fixtures (and their subprocesses) share one under the session's
    temporary directory..."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTKERNEL_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache-session")))
        yield


@pytest.fixture(autouse=True)
def _private_kernel_cache(_private_kernel_cache_root, tmp_path_factory, monkeypatch):
    """...and each test gets its own empty one, so no test sees entries another test wrote."""
    monkeypatch.setenv("FASTKERNEL_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))


@pytest.fixture
def stand_in():
    """The recording stand-in driver, reset, with CPU tensors standing in for device tensors on
    device 0 and launches going to TEST_STREAM."""
    from fastkernel import _C

    driver = RecordingDriver(STAND_IN_PATH)
    driver.reset()
    _C._testing.set_host_testing(True, 0, TEST_STREAM)
    yield driver
    _C._testing.set_host_testing(False)
    # Kernels Triton launched on the stand-in (tests/triton_reference.py) unload their modules
    # through Triton's active driver when collected, and JITFunctions sit in reference cycles:
    # collect the test's garbage now, with the stand-in active, rather than at some later
    # collection when no Triton driver is.
    from triton_reference import TritonReference

    # A kept handle's launcher lives as long as the handle, and Triton's kernel cache keeps
    # handles for the session: forget them, so each test's handle launches start with a miss.
    _C.forget_handle_launches()
    if TritonReference.entered:
        with TritonReference(driver, TEST_STREAM):
            # A collection can free what holds the last reference to more garbage in cycles
            # (a handle's launcher, once the handle's weak reference fires): until none is left.
            for _ in range(8):
                if gc.collect() == 0:
                    break
        TritonReference.entered = False
    driver.reset()
