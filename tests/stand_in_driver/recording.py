"""Builds the recording stand-in for the CUDA driver and reads what it recorded, through ctypes.

The native launcher dlopens the same .so path that `build_recording_driver()`
returns. dlopen of an already loaded path returns the same handle, so the
launcher and `RecordingDriver` share one copy of the library's state: launches
the launcher makes are visible here.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import pathlib
import shlex
import shutil
import subprocess
import sysconfig
import tempfile

__all__ = ["Launch", "RecordingDriver", "build_recording_driver", "SOURCE", "BUILD_DIR"]

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "recording_driver.c"
# Ignored by tests/stand_in_driver/.gitignore.
BUILD_DIR = HERE / "build"

_ATTR_BYTES = 64  # size of the CUlaunchAttributeValue union


def _compiler() -> list[str]:
    """The C compiler Python was configured with, if it exists here, else `cc`."""
    configured = shlex.split(sysconfig.get_config_var("CC") or "")
    if configured and shutil.which(configured[0]):
        return configured
    return ["cc"]


def _build_command(output: str) -> list[str]:
    # The soname makes the library answer to "libcuda.so.1": Triton's launcher module links
    # against libcuda and dlopens "libcuda.so.1", and both resolve to this library once it is
    # loaded (see tests/triton_reference.py).
    return [
        *_compiler(),
        "-std=c11",
        "-shared",
        "-fPIC",
        "-O1",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wl,-soname,libcuda.so.1",
        "-o",
        output,
        str(SOURCE),
        "-lpthread",
    ]


@functools.cache
def build_recording_driver() -> pathlib.Path:
    """Compiles recording_driver.c once per process and returns the .so path.

    The library is ``BUILD_DIR/<hash>/libcuda.so.1`` (with a ``libcuda.so`` link beside it, for
    linkers), where the hash covers the source and the build command: an unchanged source
    reuses the library built by an earlier session, and a library that some process has loaded
    is never overwritten in place.
    """
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + shlex.join(_build_command("-")).encode()).hexdigest()[:16]
    directory = BUILD_DIR / digest
    target = directory / "libcuda.so.1"
    if target.exists() and (directory / "libcuda.so").exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    # Build to a temporary name and rename: concurrent builders (pytest-xdist
    # workers) then never see a half-written library.
    fd, tmp = tempfile.mkstemp(prefix=".libcuda-", suffix=".so", dir=directory)
    os.close(fd)
    cmd = _build_command(tmp)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"building the recording driver failed ({shlex.join(cmd)}):\n{proc.stdout}{proc.stderr}"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    link = directory / "libcuda.so"
    if not link.exists():
        fd, tmp_link = tempfile.mkstemp(prefix=".libcuda-link-", dir=directory)
        os.close(fd)
        os.unlink(tmp_link)
        os.symlink("libcuda.so.1", tmp_link)
        os.replace(tmp_link, link)
    return target


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch recorded by the stand-in driver."""

    name: str
    device: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    stream: int
    is_ex: bool
    attrs: list[
        tuple[int, bytes]
    ]  # (CUlaunchAttributeID, 64 raw value bytes), cuLaunchKernelEx only
    params: list[bytes]  # one entry per kernel parameter, in ordinal order
    param_layout: list[tuple[int, int]]  # (offset, size) of each parameter in `raw`
    raw: bytes  # the parameter bank (EIATTR_CBANK_PARAM_SIZE bytes) as the kernel would see it
    image: int = 0  # a digest (FNV-1a) of the module image the launched function is in


class RecordingDriver:
    """ctypes view of the stand-in driver at `path`.

    `lib` exposes the driver entry points (cuInit, cuLaunchKernel, ...) for
    tests that drive the library directly.
    """

    def __init__(self, path: os.PathLike | str | None = None):
        self.path = pathlib.Path(path) if path is not None else build_recording_driver()
        self.lib = ctypes.CDLL(str(self.path))
        self._declare()

    def _declare(self) -> None:
        L = self.lib
        c_int, c_uint, c_char_p, c_void_p = (
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_char_p,
            ctypes.c_void_p,
        )
        u32p = ctypes.POINTER(c_uint)
        sigs = {
            "fkstub_reset": (None, []),
            "fkstub_launch_count": (c_int, []),
            "fkstub_recorded_count": (c_int, []),
            "fkstub_module_load_count": (c_int, []),
            "fkstub_module_unload_count": (c_int, []),
            "fkstub_retained_bytes": (ctypes.c_ulonglong, []),
            "fkstub_set_launch_result": (None, [c_int]),
            "fkstub_set_function_defaults": (None, [c_int, c_int, c_int]),
            "fkstub_func_attribute": (c_int, [c_char_p, c_int]),
            "fkstub_launch_name": (c_int, [c_int, c_char_p, c_int]),
            "fkstub_launch_device": (c_int, [c_int]),
            "fkstub_launch_dims": (c_int, [c_int, u32p, u32p]),
            "fkstub_launch_shared_mem": (c_int, [c_int, u32p]),
            "fkstub_launch_stream": (c_int, [c_int, ctypes.POINTER(ctypes.c_ulonglong)]),
            "fkstub_launch_is_ex": (c_int, [c_int]),
            "fkstub_launch_image": (c_int, [c_int, ctypes.POINTER(ctypes.c_ulonglong)]),
            "fkstub_launch_num_attrs": (c_int, [c_int]),
            "fkstub_launch_attr": (c_int, [c_int, c_int, u32p, c_void_p]),
            "fkstub_launch_num_params": (c_int, [c_int]),
            "fkstub_launch_param": (c_int, [c_int, c_int, u32p, u32p]),
            "fkstub_launch_raw": (c_int, [c_int, c_void_p, c_int]),
            "fkstub_tensor_map_encode_count": (c_int, []),
            "fkstub_set_param_count_api": (None, [c_int]),
            "fkstub_param_info_failure_count": (c_int, []),
        }
        for name, (restype, argtypes) in sigs.items():
            fn = getattr(L, name)
            fn.restype = restype
            fn.argtypes = argtypes

    # -- controls -----------------------------------------------------------

    def reset(self) -> None:
        """Forget recorded launches, counters and any injected launch result (modules stay loaded)."""
        self.lib.fkstub_reset()

    def set_launch_result(self, code: int) -> None:
        """Make every following launch return `code` without recording it; 0 restores normal launches."""
        self.lib.fkstub_set_launch_result(code)

    def set_function_defaults(self, max_threads: int, num_regs: int, local_bytes: int) -> None:
        """What every function reports for CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, NUM_REGS and
        LOCAL_SIZE_BYTES until the next reset (1024, 32 and 0 before); a launch of a larger
        block than ``max_threads`` fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (701)."""
        self.lib.fkstub_set_function_defaults(max_threads, num_regs, local_bytes)

    def set_param_count_api(self, enabled: bool) -> None:
        """Makes ``cuFuncGetParamCount`` answer (True) or return CUDA_ERROR_NOT_SUPPORTED, as a
        driver without it would be handled (False), until the next :meth:`reset`."""
        self.lib.fkstub_set_param_count_api(int(enabled))

    # -- queries ------------------------------------------------------------

    def param_info_failures(self) -> int:
        """``cuFuncGetParamInfo`` calls that returned an error since the last reset."""
        return self.lib.fkstub_param_info_failure_count()

    def module_loads(self) -> int:
        """Successful cuModuleLoadData calls since the last reset."""
        return self.lib.fkstub_module_load_count()

    def module_unloads(self) -> int:
        """Successful cuModuleUnload calls since the last reset."""
        return self.lib.fkstub_module_unload_count()

    def retained_bytes(self) -> int:
        """Bytes the stand-in keeps for unloaded modules (never freed, by design)."""
        return self.lib.fkstub_retained_bytes()

    def launch_count(self) -> int:
        """Successful launches since the last reset, including any past the 4096 recorded."""
        return self.lib.fkstub_launch_count()

    def tensor_map_encodes(self) -> int:
        """Successful cuTensorMapEncodeTiled calls since the last reset."""
        return self.lib.fkstub_tensor_map_encode_count()

    def func_attribute(self, name: str, attr: int) -> int:
        """Last value set with cuFuncSetAttribute(attr) on any function called `name`, or -1."""
        return self.lib.fkstub_func_attribute(name.encode(), attr)

    def last_launch(self) -> Launch:
        """The most recent recorded launch (without decoding the others)."""
        count = self.launch_count()
        if count == 0:
            raise IndexError("no launch was recorded")
        return self._launch(count - 1)

    def launches(self) -> list[Launch]:
        """The recorded launches, oldest first."""
        return [self._launch(i) for i in range(self.lib.fkstub_recorded_count())]

    def _launch(self, i: int) -> Launch:
        L = self.lib
        name_len = L.fkstub_launch_name(i, None, 0)
        if name_len < 0:
            raise IndexError(i)
        name_buf = ctypes.create_string_buffer(name_len + 1)
        L.fkstub_launch_name(i, name_buf, len(name_buf))

        grid, block = (ctypes.c_uint * 3)(), (ctypes.c_uint * 3)()
        L.fkstub_launch_dims(i, grid, block)
        smem = ctypes.c_uint()
        L.fkstub_launch_shared_mem(i, ctypes.byref(smem))
        stream = ctypes.c_ulonglong()
        L.fkstub_launch_stream(i, ctypes.byref(stream))
        image = ctypes.c_ulonglong()
        L.fkstub_launch_image(i, ctypes.byref(image))

        attrs = []
        for j in range(L.fkstub_launch_num_attrs(i)):
            attr_id, value = ctypes.c_uint(), ctypes.create_string_buffer(_ATTR_BYTES)
            L.fkstub_launch_attr(i, j, ctypes.byref(attr_id), value)
            attrs.append((attr_id.value, value.raw))

        raw_size = L.fkstub_launch_raw(i, None, 0)
        raw_buf = ctypes.create_string_buffer(max(raw_size, 1))
        L.fkstub_launch_raw(i, raw_buf, raw_size)
        raw = raw_buf.raw[:raw_size]

        layout = []
        for k in range(L.fkstub_launch_num_params(i)):
            offset, size = ctypes.c_uint(), ctypes.c_uint()
            L.fkstub_launch_param(i, k, ctypes.byref(offset), ctypes.byref(size))
            layout.append((offset.value, size.value))

        return Launch(
            name=name_buf.value.decode(),
            device=L.fkstub_launch_device(i),
            grid=tuple(grid),
            block=tuple(block),
            shared_mem=smem.value,
            stream=stream.value,
            is_ex=bool(L.fkstub_launch_is_ex(i)),
            attrs=attrs,
            params=[raw[off : off + size] for off, size in layout],
            param_layout=layout,
            raw=raw,
            image=image.value,
        )
