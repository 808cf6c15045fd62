"""Triton's own launcher, run on CPU against the recording stand-in driver: the reference for
what a fastkernel launch must send.

Triton's ``CudaUtils`` compiles its ``driver.c`` against ``libcuda`` from
``TRITON_LIBCUDA_PATH`` and dlopens ``libcuda.so.1`` for ``cuLaunchKernelEx`` and
``cuTensorMapEncodeTiled``. The stand-in is built as ``<dir>/libcuda.so.1`` with that soname and
is already loaded in the test process, so both resolve to it: ``JITFunction.run`` then
specializes, compiles, packs and launches exactly as it does on a GPU, and the stand-in records
the bytes. A test runs the same call through fastkernel and compares the two recordings.

Only the facts a CPU-only torch cannot give are supplied here: the current device, its
capability (from the stand-in) and the current stream.
"""

from __future__ import annotations

import functools
import os
import pathlib

import triton
from stand_in_driver.recording import Launch, RecordingDriver


@functools.cache
def _cuda_driver(stand_in_path: pathlib.Path):
    os.environ["TRITON_LIBCUDA_PATH"] = str(stand_in_path.parent)
    from triton.backends.nvidia import driver as nvidia

    for cached in ("libcuda_dirs", "library_dirs"):
        getattr(getattr(nvidia, cached, None), "cache_clear", lambda: None)()
    return nvidia.CudaDriver()  # builds Triton's launcher module, linked to the stand-in


def _cached_arch(jit_fn, device: int) -> int | None:
    """The arch of the compile target ``jit_fn`` fixed for ``device`` on its first launch there
    (the GPUTarget in its ``device_caches`` entry, whose layout varies with Triton's version),
    or None before any."""
    from triton.backends.compiler import GPUTarget

    entry = jit_fn.device_caches.get(device)  # a defaultdict: get() creates nothing
    for item in entry or ():
        if isinstance(item, GPUTarget):
            return item.arch
    return None


def _other_libcuda(stand_in: pathlib.Path):
    """A libcuda.so.1 other than the stand-in already mapped into this process, or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcuda.so" in line}
    except OSError:
        return None
    others = sorted(p for p in paths if os.path.realpath(p) != os.path.realpath(stand_in))
    return others[0] if others else None


class TritonReference:
    """Runs calls through ``JITFunction.run`` on the stand-in and returns what it recorded."""

    #: Set by every use; the stand_in fixture collects a test's garbage when it is (conftest.py).
    entered = False

    def __init__(self, recording: RecordingDriver, stream: int, device: int = 0):
        self.recording = recording
        other = _other_libcuda(recording.path)
        if other is not None:  # FASTKERNEL_TEST_STAND_IN=1 on a machine whose torch loaded CUDA
            import pytest

            pytest.skip(
                f"the real driver {other} is loaded in this process: Triton's launcher "
                f"would bind to it rather than to the stand-in"
            )
        self.driver = _cuda_driver(recording.path)
        self.stream = stream
        self.device = device

    def __enter__(self) -> TritonReference:
        from fastkernel import _C

        d = self.driver
        d.get_current_device = lambda: self.device
        d.get_current_stream = lambda device=None: self.stream
        d.get_device_capability = lambda device=None: _C.device_capability(
            self.device if device is None else device
        )
        d.set_current_device = lambda device: None
        # Restored as it was on exit (reset_active would probe for a real driver and fail).
        self._saved = triton.runtime.driver._active
        triton.runtime.driver.set_active(d)
        TritonReference.entered = True
        return self

    def __exit__(self, *exc) -> None:
        triton.runtime.driver._active = self._saved

    def launch(self, jit_fn, grid, *args, **kwargs) -> Launch:
        """Launch ``jit_fn[grid](*args, **kwargs)`` through Triton; its one recorded launch."""
        from fastkernel import _C

        jit_fn = getattr(jit_fn, "jit_function", jit_fn)
        # A JITFunction fixes its compile target per device on first use (device_caches), by
        # whichever path launched it first; the stand-in's capability can change between tests
        # (FKSTUB_CAPABILITY), a real device's never does.
        inner = jit_fn
        while not hasattr(inner, "device_caches"):
            inner = inner.fn  # an autotuner's or heuristics' JITFunction
        major, minor = _C.device_capability(self.device)
        cached = _cached_arch(inner, self.device)
        if cached is not None and cached != major * 10 + minor:
            inner.device_caches.clear()
        before = self.recording.launch_count()
        jit_fn[grid](*args, **kwargs)
        launches = self.recording.launches()
        assert self.recording.launch_count() == before + 1, "Triton did not launch exactly once"
        return launches[-1]


def assert_same_launch(ours: Launch, triton_launch: Launch) -> None:
    """The launch fastkernel made is the one Triton made: the binary (the module image's
    digest) and its entry point, grid, block, dynamic shared memory, stream, device, launch
    attributes and every parameter's bytes. (Triton always calls cuLaunchKernelEx; fastkernel
    calls cuLaunchKernel when no attribute is needed, which the driver treats the same.)"""
    assert ours.name == triton_launch.name
    assert ours.image == triton_launch.image, "fastkernel launched another binary than Triton"
    assert (ours.grid, ours.block) == (triton_launch.grid, triton_launch.block)
    assert ours.shared_mem == triton_launch.shared_mem
    assert (ours.stream, ours.device) == (triton_launch.stream, triton_launch.device)
    assert sorted(ours.attrs) == sorted(triton_launch.attrs)
    assert ours.param_layout == triton_launch.param_layout
    for k, (mine, theirs) in enumerate(zip(ours.params, triton_launch.params)):
        assert mine == theirs, f"parameter {k}: fastkernel sent {mine.hex()}, Triton {theirs.hex()}"
    assert ours.raw == triton_launch.raw
