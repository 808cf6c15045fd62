"""Tests of the recording stand-in for the CUDA driver, driven through ctypes only.

The stand-in replaces libcuda.so.1 in CPU tests of the native launcher, so its
own behaviour is checked here against a real cubin: a Triton kernel compiled
for sm_90 on this machine (ptxas ships with Triton, no GPU needed).
"""

import ctypes
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import threading

import pytest

# tests/ is not a package we own; make tests/stand_in_driver importable from here.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from stand_in_driver.recording import RecordingDriver, build_recording_driver  # noqa: E402

try:
    import triton
    import triton.language as tl
except ImportError:  # the driver tests that need no cubin still run
    triton = None

pytestmark = pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_LAUNCH_FAILED = 719
CUDA_ERROR_NOT_SUPPORTED = 801

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4

if triton is not None:

    @triton.jit
    def scale_kernel(x_ptr, n, s, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * s, mask=mask)


# -- ctypes mirrors of the driver structs (layout of cuda.h 12/13) ------------


class CUlaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class CUlaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(CUlaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


def _declare_driver_api(lib):
    c_int, c_uint, vp = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p
    vpp = ctypes.POINTER(ctypes.c_void_p)
    ip = ctypes.POINTER(ctypes.c_int)
    sigs = {
        "cuInit": [c_uint],
        "cuDriverGetVersion": [ip],
        "cuDeviceGetCount": [ip],
        "cuDeviceGet": [ip, c_int],
        "cuDeviceGetAttribute": [ip, c_int, c_int],
        "cuDevicePrimaryCtxRetain": [vpp, c_int],
        "cuDevicePrimaryCtxRelease": [c_int],
        "cuDevicePrimaryCtxRelease_v2": [c_int],
        "cuCtxGetCurrent": [vpp],
        "cuCtxSetCurrent": [vp],
        "cuCtxPushCurrent": [vp],
        "cuCtxPushCurrent_v2": [vp],
        "cuCtxPopCurrent": [vpp],
        "cuCtxPopCurrent_v2": [vpp],
        "cuCtxGetDevice": [ip],
        "cuModuleLoadData": [vpp, ctypes.c_char_p],
        "cuModuleUnload": [vp],
        "cuModuleGetFunction": [vpp, vp, ctypes.c_char_p],
        "cuFuncGetAttribute": [ip, c_int, vp],
        "cuFuncSetAttribute": [vp, c_int, c_int],
        "cuFuncSetCacheConfig": [vp, c_int],
        "cuLaunchKernel": [
            vp,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            vp,
            vpp,
            vpp,
        ],
        "cuLaunchKernelEx": [ctypes.POINTER(CUlaunchConfig), vp, vpp, vpp],
        "cuGetErrorName": [c_int, ctypes.POINTER(ctypes.c_char_p)],
        "cuGetErrorString": [c_int, ctypes.POINTER(ctypes.c_char_p)],
        "cuPointerGetAttribute": [vp, c_int, ctypes.c_ulonglong],
        "cuStreamIsCapturing": [vp, ip],
    }
    for name, argtypes in sigs.items():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = argtypes


# -- fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def drv():
    d = RecordingDriver(build_recording_driver())
    _declare_driver_api(d.lib)
    assert d.lib.cuInit(0) == CUDA_SUCCESS
    return d


@pytest.fixture(autouse=True)
def clean_state(request, monkeypatch):
    monkeypatch.delenv("FKSTUB_DEVICES", raising=False)
    monkeypatch.delenv("FKSTUB_LAUNCH_RESULT", raising=False)
    if "drv" not in request.fixturenames:
        yield
        return
    d = request.getfixturevalue("drv")
    # The context stack is per thread and tests share the main thread: a launch in another
    # module's test leaves its context current there.
    _pop_all_contexts(d)
    d.reset()
    yield
    d.reset()
    _pop_all_contexts(d)


def _pop_all_contexts(d):
    """Empties the calling thread's context stack in the stand-in driver."""
    while _current(d) is not None:
        assert d.lib.cuCtxPopCurrent(None) == CUDA_SUCCESS


def _scale_kernel(block: int):
    """(cubin bytes, kernel name, threads per block) of scale_kernel with ``BLOCK=block``, built
    for sm_90."""
    if triton is None:
        pytest.skip("triton is not installed")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(
        scale_kernel,
        {"x_ptr": "*fp32", "n": "i32", "s": "fp32", "BLOCK": "constexpr"},
        {(3,): block},
    )
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    return k.asm["cubin"], k.name, k.metadata.num_warps * 32


@pytest.fixture(scope="module")
def kernel():
    """(cubin bytes, kernel name, threads per block) of scale_kernel built for sm_90."""
    return _scale_kernel(128)


# -- helpers ----------------------------------------------------------------------


def _current(d):
    ctx = ctypes.c_void_p()
    assert d.lib.cuCtxGetCurrent(ctypes.byref(ctx)) == CUDA_SUCCESS
    return ctx.value


def _primary_ctx(d, dev):
    ctx = ctypes.c_void_p()
    assert d.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == CUDA_SUCCESS
    return ctx


def _load_module(d, cubin, dev=0):
    """Makes device `dev`'s primary context current and loads `cubin` in it."""
    ctx = _primary_ctx(d, dev)
    assert d.lib.cuCtxSetCurrent(ctx) == CUDA_SUCCESS
    mod = ctypes.c_void_p()
    assert d.lib.cuModuleLoadData(ctypes.byref(mod), cubin) == CUDA_SUCCESS
    return ctx, mod


def _load(d, cubin, name, dev=0):
    """As _load_module, then looks up the kernel `name`."""
    ctx, mod = _load_module(d, cubin, dev)
    fn = ctypes.c_void_p()
    assert d.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()) == CUDA_SUCCESS
    return ctx, mod, fn


class Args:
    """Launch arguments of scale_kernel as Triton 3.9 passes them: the kernel's
    own arguments, then the global_scratch and profile_scratch pointers."""

    def __init__(self, x_ptr=0x1000, n=7, s=1.5, global_scratch=0x2000, profile_scratch=0x3000):
        self.values = [
            ctypes.c_uint64(x_ptr),
            ctypes.c_int32(n),
            ctypes.c_float(s),
            ctypes.c_uint64(global_scratch),
            ctypes.c_uint64(profile_scratch),
        ]
        self.array = (ctypes.c_void_p * len(self.values))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in self.values]
        )

    def expected(self):
        return [bytes(v) for v in self.values]


def _launch(d, fn, args=None, grid=(3, 1, 1), block=(128, 1, 1), smem=0, stream=None, extra=None):
    params = args.array if args is not None else None
    return d.lib.cuLaunchKernel(fn, *grid, *block, smem, stream, params, extra)


def _cuobjdump():
    if triton is not None:
        bundled = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.exists():
            return str(bundled)
    return shutil.which("cuobjdump")


def _section(cubin, wanted):
    """(offset, size) of the ELF64 section called `wanted`."""
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)

    def header(i):
        name, _type, _flags, _addr, off, size = struct.unpack_from(
            "<IIQQQQ", cubin, shoff + i * shentsize
        )
        return name, off, size

    str_off = header(shstrndx)[1]
    for i in range(shnum):
        name, off, size = header(i)
        if cubin[str_off + name :].split(b"\0", 1)[0] == wanted.encode():
            return off, size
    raise KeyError(wanted)


# -- device, context and error queries --------------------------------------------


def test_device_queries(drv, monkeypatch):
    lib, out = drv.lib, ctypes.c_int()
    assert lib.cuInit(1) == CUDA_ERROR_INVALID_VALUE
    assert lib.cuDriverGetVersion(ctypes.byref(out)) == CUDA_SUCCESS and out.value == 12080
    assert lib.cuDeviceGetCount(ctypes.byref(out)) == CUDA_SUCCESS and out.value == 2
    monkeypatch.setenv("FKSTUB_DEVICES", "3")
    assert lib.cuDeviceGetCount(ctypes.byref(out)) == CUDA_SUCCESS and out.value == 3
    assert lib.cuDeviceGet(ctypes.byref(out), 2) == CUDA_SUCCESS and out.value == 2
    assert lib.cuDeviceGet(ctypes.byref(out), 3) == CUDA_ERROR_INVALID_DEVICE
    assert lib.cuDeviceGet(ctypes.byref(out), -1) == CUDA_ERROR_INVALID_DEVICE
    expected = {75: 9, 76: 0, 97: 232448, 81: 233472, 16: 132, 8: 49152, 10: 32, 1: 0}
    for attr, value in expected.items():
        assert lib.cuDeviceGetAttribute(ctypes.byref(out), attr, 0) == CUDA_SUCCESS
        assert out.value == value, attr
    assert lib.cuDeviceGetAttribute(ctypes.byref(out), 75, 5) == CUDA_ERROR_INVALID_DEVICE


def test_contexts_are_per_device_and_thread_local(drv):
    lib = drv.lib
    assert _current(drv) is None
    ctx0, ctx1 = _primary_ctx(drv, 0), _primary_ctx(drv, 1)
    assert ctx0.value and ctx1.value and ctx0.value != ctx1.value
    assert _primary_ctx(drv, 0).value == ctx0.value
    assert (
        lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctypes.c_void_p()), 2)
        == CUDA_ERROR_INVALID_DEVICE
    )

    dev = ctypes.c_int()
    assert lib.cuCtxGetDevice(ctypes.byref(dev)) == CUDA_ERROR_INVALID_CONTEXT
    assert lib.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS
    assert _current(drv) == ctx1.value
    assert lib.cuCtxGetDevice(ctypes.byref(dev)) == CUDA_SUCCESS and dev.value == 1

    seen = []
    t = threading.Thread(target=lambda: seen.append(_current(drv)))
    t.start()
    t.join()
    assert seen == [None]

    # Push/pop nest on top of the current context; _v2 names behave the same.
    assert lib.cuCtxPushCurrent_v2(ctx0) == CUDA_SUCCESS
    assert _current(drv) == ctx0.value
    popped = ctypes.c_void_p()
    assert lib.cuCtxPopCurrent(ctypes.byref(popped)) == CUDA_SUCCESS and popped.value == ctx0.value
    assert _current(drv) == ctx1.value
    assert (
        lib.cuCtxPopCurrent_v2(ctypes.byref(popped)) == CUDA_SUCCESS and popped.value == ctx1.value
    )
    assert _current(drv) is None
    assert lib.cuCtxPopCurrent(ctypes.byref(popped)) == CUDA_ERROR_INVALID_CONTEXT
    assert lib.cuCtxSetCurrent(ctypes.c_void_p(0x1234)) == CUDA_ERROR_INVALID_CONTEXT
    assert lib.cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS
    assert lib.cuDevicePrimaryCtxRelease_v2(1) == CUDA_SUCCESS
    assert lib.cuDevicePrimaryCtxRelease(9) == CUDA_ERROR_INVALID_DEVICE


def test_error_names_and_strings(drv):
    lib, s = drv.lib, ctypes.c_char_p()
    names = {
        0: b"CUDA_SUCCESS",
        1: b"CUDA_ERROR_INVALID_VALUE",
        2: b"CUDA_ERROR_OUT_OF_MEMORY",
        100: b"CUDA_ERROR_NO_DEVICE",
        101: b"CUDA_ERROR_INVALID_DEVICE",
        200: b"CUDA_ERROR_INVALID_IMAGE",
        201: b"CUDA_ERROR_INVALID_CONTEXT",
        400: b"CUDA_ERROR_INVALID_HANDLE",
        500: b"CUDA_ERROR_NOT_FOUND",
        700: b"CUDA_ERROR_ILLEGAL_ADDRESS",
        719: b"CUDA_ERROR_LAUNCH_FAILED",
        801: b"CUDA_ERROR_NOT_SUPPORTED",
        999: b"CUDA_ERROR_UNKNOWN",
    }
    for code, name in names.items():
        assert lib.cuGetErrorName(code, ctypes.byref(s)) == CUDA_SUCCESS and s.value == name
        assert lib.cuGetErrorString(code, ctypes.byref(s)) == CUDA_SUCCESS and s.value
    s.value = b"stale"
    assert (
        lib.cuGetErrorName(12345, ctypes.byref(s)) == CUDA_ERROR_INVALID_VALUE and s.value is None
    )
    s.value = b"stale"
    assert (
        lib.cuGetErrorString(12345, ctypes.byref(s)) == CUDA_ERROR_INVALID_VALUE and s.value is None
    )


def test_pointer_and_capture_queries(drv):
    lib, status = drv.lib, ctypes.c_int(-1)
    assert (
        lib.cuPointerGetAttribute(ctypes.byref(ctypes.c_int()), 1, 0x1000)
        == CUDA_ERROR_NOT_SUPPORTED
    )
    assert lib.cuStreamIsCapturing(None, ctypes.byref(status)) == CUDA_SUCCESS and status.value == 0


def test_bad_image_is_rejected(drv):
    lib, mod = drv.lib, ctypes.c_void_p()
    image = b"not an ELF image" + bytes(64)
    assert (
        lib.cuModuleLoadData(ctypes.byref(mod), image) == CUDA_ERROR_INVALID_CONTEXT
    )  # nothing current
    assert lib.cuCtxSetCurrent(_primary_ctx(drv, 0)) == CUDA_SUCCESS
    assert lib.cuModuleLoadData(ctypes.byref(mod), image) == CUDA_ERROR_INVALID_IMAGE
    elf32 = b"\x7fELF\x01\x01\x01" + bytes(57)
    assert lib.cuModuleLoadData(ctypes.byref(mod), elf32) == CUDA_ERROR_INVALID_IMAGE
    assert drv.module_loads() == 0


# -- loading and launching a real Triton cubin -------------------------------------


def test_launch_records_parameter_bank(drv, kernel):
    cubin, name, threads = kernel
    ctx, mod, fn = _load(drv, cubin, name, dev=0)
    assert drv.module_loads() == 1

    again = ctypes.c_void_p()
    assert drv.lib.cuModuleGetFunction(ctypes.byref(again), mod, name.encode()) == CUDA_SUCCESS
    assert again.value == fn.value
    assert (
        drv.lib.cuModuleGetFunction(ctypes.byref(again), mod, b"no_such_kernel")
        == CUDA_ERROR_NOT_FOUND
    )

    args = Args()
    stream = ctypes.c_void_p(0xABC0)
    assert (
        _launch(drv, fn, args, grid=(3, 2, 1), block=(threads, 1, 1), smem=1024, stream=stream)
        == CUDA_SUCCESS
    )
    assert drv.launch_count() == 1
    (rec,) = drv.launches()
    assert rec.name == name == "scale_kernel"
    assert rec.device == 0
    assert rec.grid == (3, 2, 1) and rec.block == (threads, 1, 1)
    assert rec.shared_mem == 1024 and rec.stream == 0xABC0
    assert not rec.is_ex and rec.attrs == []
    # Pointer, i32, f32, then Triton's two scratch pointers, packed by the
    # offsets ptxas chose (EIATTR_KPARAM_INFO).
    assert rec.param_layout == [(0, 8), (8, 4), (12, 4), (16, 8), (24, 8)]
    assert rec.params == args.expected()
    assert rec.params[1] == struct.pack("<i", 7) and rec.params[2] == struct.pack("<f", 1.5)
    assert rec.raw == struct.pack("<QifQQ", 0x1000, 7, 1.5, 0x2000, 0x3000)
    assert len(rec.raw) == 32  # EIATTR_CBANK_PARAM_SIZE

    # The image is copied at load: clobbering the caller's copy changes nothing.
    assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS
    buf = ctypes.create_string_buffer(cubin, len(cubin))
    mod2, fn2 = ctypes.c_void_p(), ctypes.c_void_p()
    assert drv.lib.cuModuleLoadData(ctypes.byref(mod2), buf) == CUDA_SUCCESS
    ctypes.memset(buf, 0, len(cubin))
    assert drv.lib.cuModuleGetFunction(ctypes.byref(fn2), mod2, name.encode()) == CUDA_SUCCESS
    assert _launch(drv, fn2, Args(n=9)) == CUDA_SUCCESS
    assert drv.launches()[1].params[1] == struct.pack("<i", 9)
    assert drv.module_loads() == 2

    drv.reset()
    assert drv.launches() == [] and drv.launch_count() == 0 and drv.module_loads() == 0
    assert _launch(drv, fn2, Args()) == CUDA_SUCCESS  # modules survive a reset
    assert drv.lib.cuModuleUnload(mod2) == CUDA_SUCCESS


def test_a_launch_names_the_binary_it_ran(drv, kernel):
    """Each launch records a digest of its function's module image: two loads of one cubin
    give the same, another specialization of the same kernel (same name, same parameters)
    another."""
    cubin, name, threads = kernel
    other, other_name, _ = _scale_kernel(256)
    assert other_name == name and other != cubin
    for image in (cubin, cubin, other):
        _, mod, fn = _load(drv, image, name)
        assert _launch(drv, fn, Args(), block=(threads, 1, 1)) == CUDA_SUCCESS
        assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS
    first, again, another = (launch.image for launch in drv.launches())
    assert first == again != another and first != 0
    assert [launch.params for launch in drv.launches()] == [Args().expected()] * 3


def test_param_layout_matches_cuobjdump(drv, kernel, tmp_path):
    cubin, name, _ = kernel
    _, mod, fn = _load(drv, cubin, name)
    assert _launch(drv, fn, Args()) == CUDA_SUCCESS
    (rec,) = drv.launches()
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not available")
    path = tmp_path / "kernel.cubin"
    path.write_bytes(cubin)
    listing = subprocess.run(
        [tool, "-elf", str(path)], capture_output=True, text=True, check=True
    ).stdout
    # The dump of the section starts on its own line (the section table
    # mentions the name too, indented), and ends at a blank-line gap.
    section = listing.split(f"\n.nv.info.{name}\n", 1)[1].split("\n\n\n", 1)[0]
    entries = re.findall(
        r"Ordinal\s*:\s*0x([0-9a-f]+)\s+Offset\s*:\s*0x([0-9a-f]+)\s+Size\s*:\s*0x([0-9a-f]+)",
        section,
    )
    by_ordinal = sorted((int(o, 16), int(off, 16), int(sz, 16)) for o, off, sz in entries)
    assert [o for o, _, _ in by_ordinal] == list(range(len(by_ordinal)))
    assert rec.param_layout == [(off, sz) for _, off, sz in by_ordinal]
    cbank = re.search(
        r"EIATTR_CBANK_PARAM_SIZE\s+Format:\s+EIFMT_HVAL\s+Value:\s+0x([0-9a-f]+)", section
    )
    assert cbank and len(rec.raw) == int(cbank.group(1), 16)
    assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS


def test_short_attribute_formats_take_four_bytes(drv, kernel):
    """NVAL, BVAL and HVAL entries all span 4 bytes; SVAL spans 4 + its length.

    ptxas emits no NVAL entries, so rewrite every HVAL entry except
    CBANK_PARAM_SIZE as NVAL and BVAL: the parameter layout must not change.
    """
    cubin, name, _ = kernel
    image = bytearray(cubin)
    off, size = _section(cubin, f".nv.info.{name}")
    pos, rewritten, formats = off, 0, [0x01, 0x02]
    while pos < off + size:
        fmt, attr = image[pos], image[pos + 1]
        if fmt == 0x04:
            pos += 4 + struct.unpack_from("<H", image, pos + 2)[0]
            continue
        if fmt == 0x03 and attr != 0x19:
            image[pos] = formats[rewritten % 2]
            rewritten += 1
        pos += 4
    assert rewritten >= 2
    _, mod, fn = _load(drv, bytes(image), name)
    assert _launch(drv, fn, Args()) == CUDA_SUCCESS
    assert drv.launches()[0].param_layout == [(0, 8), (8, 4), (12, 4), (16, 8), (24, 8)]
    assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS

    # An unknown format byte makes the kernel's info unreadable.
    image[off] = 0x07
    _, mod = _load_module(drv, bytes(image))
    fn = ctypes.c_void_p()
    assert (
        drv.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode())
        == CUDA_ERROR_INVALID_IMAGE
    )
    assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS


def test_launch_rejects_function_of_another_context(drv, kernel):
    cubin, name, _ = kernel
    _, mod, fn = _load(drv, cubin, name, dev=0)
    assert drv.lib.cuCtxSetCurrent(_primary_ctx(drv, 1)) == CUDA_SUCCESS
    assert _launch(drv, fn, Args()) == CUDA_ERROR_INVALID_HANDLE
    assert drv.lib.cuCtxSetCurrent(None) == CUDA_SUCCESS
    assert _launch(drv, fn, Args()) == CUDA_ERROR_INVALID_CONTEXT
    assert drv.launches() == []

    # Loaded on device 1, it launches there and is recorded as device 1.
    _, mod1, fn1 = _load(drv, cubin, name, dev=1)
    assert _launch(drv, fn1, Args()) == CUDA_SUCCESS
    assert [r.device for r in drv.launches()] == [1]
    assert drv.lib.cuModuleUnload(mod1) == CUDA_SUCCESS
    assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS


def test_launch_validates_arguments(drv, kernel):
    cubin, name, _ = kernel
    _, mod, fn = _load(drv, cubin, name)
    assert _launch(drv, fn, None) == CUDA_ERROR_INVALID_VALUE  # kernel has parameters
    assert _launch(drv, fn, Args(), grid=(0, 1, 1)) == CUDA_ERROR_INVALID_VALUE
    assert _launch(drv, fn, Args(), block=(2048, 1, 1)) == CUDA_ERROR_INVALID_VALUE
    assert _launch(drv, ctypes.c_void_p(0x1234), Args()) == CUDA_ERROR_INVALID_HANDLE

    # Parameters packed by the caller through `extra`.
    packed = struct.pack("<QifQQ", 0x5000, 3, 2.0, 0, 0)
    buf = ctypes.create_string_buffer(packed, len(packed))
    size = ctypes.c_size_t(len(packed))
    extra = (ctypes.c_void_p * 5)(
        1,
        ctypes.cast(buf, ctypes.c_void_p),
        2,
        ctypes.cast(ctypes.pointer(size), ctypes.c_void_p),
        0,
    )
    assert _launch(drv, fn, Args(), extra=extra) == CUDA_ERROR_INVALID_VALUE  # both given
    assert _launch(drv, fn, None, extra=extra) == CUDA_SUCCESS
    (rec,) = drv.launches()
    assert rec.raw == packed and rec.params[0] == struct.pack("<Q", 0x5000)
    assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS
    assert _launch(drv, fn, Args()) == CUDA_ERROR_INVALID_HANDLE  # unloaded
    assert drv.lib.cuModuleUnload(mod) == CUDA_ERROR_INVALID_HANDLE


def test_launch_ex_records_attributes(drv, kernel):
    assert ctypes.sizeof(CUlaunchAttribute) == 72 and ctypes.sizeof(CUlaunchConfig) == 56
    cubin, name, threads = kernel
    _, mod, fn = _load(drv, cubin, name)
    attrs = (CUlaunchAttribute * 2)()
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    struct.pack_into("<III", attrs[0].value, 0, 2, 1, 1)
    attrs[1].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    struct.pack_into("<i", attrs[1].value, 0, 1)
    cfg = CUlaunchConfig(4, 1, 1, threads, 1, 1, 512, ctypes.c_void_p(0x77), attrs, 2)
    args = Args()
    assert drv.lib.cuLaunchKernelEx(ctypes.byref(cfg), fn, args.array, None) == CUDA_SUCCESS
    (rec,) = drv.launches()
    assert rec.is_ex and rec.grid == (4, 1, 1) and rec.block == (threads, 1, 1)
    assert rec.shared_mem == 512 and rec.stream == 0x77
    assert [a for a, _ in rec.attrs] == [
        CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
    ]
    assert rec.attrs[0][1] == struct.pack("<III", 2, 1, 1) + bytes(52)
    assert rec.attrs[1][1] == struct.pack("<i", 1) + bytes(60)
    assert rec.params == args.expected()

    cfg.numAttrs, cfg.attrs = 1, None
    assert (
        drv.lib.cuLaunchKernelEx(ctypes.byref(cfg), fn, args.array, None)
        == CUDA_ERROR_INVALID_VALUE
    )
    assert drv.lib.cuLaunchKernelEx(None, fn, args.array, None) == CUDA_ERROR_INVALID_VALUE
    assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS


def test_injected_launch_failure(drv, kernel, monkeypatch):
    cubin, name, _ = kernel
    _, mod, fn = _load(drv, cubin, name)
    drv.set_launch_result(CUDA_ERROR_LAUNCH_FAILED)
    assert _launch(drv, fn, Args()) == CUDA_ERROR_LAUNCH_FAILED
    cfg = CUlaunchConfig(1, 1, 1, 128, 1, 1, 0, None, None, 0)
    assert (
        drv.lib.cuLaunchKernelEx(ctypes.byref(cfg), fn, Args().array, None)
        == CUDA_ERROR_LAUNCH_FAILED
    )
    assert drv.launches() == [] and drv.launch_count() == 0
    drv.set_launch_result(0)
    assert _launch(drv, fn, Args()) == CUDA_SUCCESS

    # Without an override, FKSTUB_LAUNCH_RESULT is honoured; an override wins.
    drv.reset()
    monkeypatch.setenv("FKSTUB_LAUNCH_RESULT", "700")
    assert _launch(drv, fn, Args()) == 700
    drv.set_launch_result(0)
    assert _launch(drv, fn, Args()) == CUDA_SUCCESS
    assert drv.launch_count() == 1
    assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS


def test_function_attributes(drv, kernel):
    cubin, name, _ = kernel
    _, mod, fn = _load(drv, cubin, name)
    lib, out = drv.lib, ctypes.c_int()
    for attr, value in {0: 1024, 1: 0, 3: 0, 4: 32}.items():
        assert (
            lib.cuFuncGetAttribute(ctypes.byref(out), attr, fn) == CUDA_SUCCESS
            and out.value == value
        )
    assert drv.func_attribute(name, 9) == -1
    assert lib.cuFuncSetCacheConfig(fn, 1) == CUDA_SUCCESS

    # More than 48 KiB of dynamic shared memory needs the opt-in, as on a GPU.
    assert _launch(drv, fn, Args(), smem=100_000) == CUDA_ERROR_INVALID_VALUE
    assert (
        lib.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 300_000)
        == CUDA_ERROR_INVALID_VALUE
    )
    assert (
        lib.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100_000)
        == CUDA_SUCCESS
    )
    assert (
        lib.cuFuncGetAttribute(
            ctypes.byref(out), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn
        )
        == 0
    )
    assert out.value == 100_000
    assert drv.func_attribute(name, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) == 100_000
    assert _launch(drv, fn, Args(), smem=100_000) == CUDA_SUCCESS
    assert drv.launches()[0].shared_mem == 100_000
    assert lib.cuFuncSetAttribute(ctypes.c_void_p(0x10), 8, 1) == CUDA_ERROR_INVALID_HANDLE
    assert lib.cuModuleUnload(mod) == CUDA_SUCCESS


def test_recording_stops_at_capacity_but_counting_goes_on(drv, kernel):
    cubin, name, _ = kernel
    _, mod, fn = _load(drv, cubin, name)
    args = Args()
    for _ in range(4100):
        assert _launch(drv, fn, args) == CUDA_SUCCESS
    assert drv.launch_count() == 4100
    assert drv.lib.fkstub_recorded_count() == len(drv.launches()) == 4096
    assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS


def test_concurrent_launches_are_all_recorded(drv, kernel):
    cubin, name, _ = kernel
    _, mod, fn = _load(drv, cubin, name)
    ctx = _primary_ctx(drv, 0)
    errors = []

    def worker(tid):
        if drv.lib.cuCtxSetCurrent(ctx) != CUDA_SUCCESS:
            errors.append("set ctx")
        for i in range(100):
            rc = _launch(drv, fn, Args(n=tid * 1000 + i))
            if rc != CUDA_SUCCESS:
                errors.append(rc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    recs = drv.launches()
    assert drv.launch_count() == len(recs) == 800
    seen = sorted(struct.unpack("<i", r.params[1])[0] for r in recs)
    assert seen == sorted(t * 1000 + i for t in range(8) for i in range(100))
    assert drv.lib.cuModuleUnload(mod) == CUDA_SUCCESS
