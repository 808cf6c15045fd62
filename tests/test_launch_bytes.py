"""The exact bytes a launch sends, checked on CPU against the recording stand-in driver.

The stand-in reads each parameter's size and offset from the cubin (EIATTR_KPARAM_INFO), as the
real driver does, so these tests also check that the parameter count the launcher passes is the
one the binary expects. Expected bytes follow Triton's launcher (driver.c extractors)."""

from __future__ import annotations

import ctypes
import struct

import kernels
import pytest
import torch
import triton
import triton.language as tl
from conftest import TEST_STREAM
from triton_reference import TritonReference

from fastkernel import _C, fastkernel
from fastkernel import _triton_abi as abi

SCRATCH = [b"\0" * 8] * abi.num_scratch_params()


def ptr(t: torch.Tensor) -> bytes:
    return struct.pack("<Q", t.data_ptr())


def bf16(x: float) -> bytes:
    return struct.pack("<f", x)[2:]  # top 16 bits of the fp32 value (little-endian)


def test_add_kernel_launch(stand_in):
    k = fastkernel(kernels.add_kernel)
    x, y, out = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    k[(4,)](x, y, out, 4096, BLOCK=1024)
    (launch,) = stand_in.launches()
    assert launch.name == "add_kernel"
    assert launch.grid == (4, 1, 1)
    assert launch.block == (128, 1, 1)  # num_warps=4 by default
    assert launch.stream == TEST_STREAM
    assert launch.device == 0
    assert not launch.is_ex
    assert launch.params == [ptr(x), ptr(y), ptr(out), struct.pack("<i", 4096)] + SCRATCH


def test_every_scalar_kind_is_packed_like_triton(stand_in):
    k = fastkernel(kernels.scalars_kernel)
    out = torch.empty(16)
    k[(1,)](out, 5, 2**40, 2**63 + 5, 1.25, 0.3, -2.7, 3.14159, True, None, 1, BLOCK=16)
    (launch,) = stand_in.launches()
    # None and the int equal to 1 are specialized to constexprs and dropped.
    assert (
        launch.params
        == [
            ptr(out),
            struct.pack("<i", 5),
            struct.pack("<q", 2**40),
            struct.pack("<Q", 2**63 + 5),
            struct.pack("<f", 1.25),
            struct.pack("<e", 0.3),  # IEEE half, as CPython's PyFloat_Pack2 (driver.c extractFP16)
            bf16(-2.7),
            struct.pack("<d", 3.14159),
            # A bool is packed in a 4-byte u1 slot (driver.c extractU32); the cubin declares a
            # 1-byte parameter, so the driver reads its first byte.
            b"\x01",
        ]
        + SCRATCH
    )
    assert launch.param_layout[8][1] == 1


def test_int_one_none_and_pointers_change_the_parameter_list(stand_in):
    k = fastkernel(kernels.scalars_kernel)
    out, extra = torch.empty(16), torch.ones(16)
    args = (5, 7, 9, 0.0, 0.0, 0.0, 0.0, False)
    k[(1,)](out, *args, None, 1, BLOCK=16)
    k[(1,)](out, *args, extra, 3, BLOCK=16)
    first, second = stand_in.launches()
    assert len(second.params) == len(first.params) + 2
    assert second.params[-len(SCRATCH) - 2 : len(second.params) - len(SCRATCH)] == [
        ptr(extra),
        struct.pack("<i", 3),
    ]
    assert k.stats()["specializations"] == 2


@pytest.mark.parametrize("value,packed", [(0, b"\0"), (7, b"\x07"), (255, b"\xff")])
def test_annotated_integer_widths(stand_in, value, packed):
    k = fastkernel(kernels.typed_kernel)
    out = torch.empty(16)
    k[(1,)](out, 12, 2**33, value, BLOCK=16)
    (launch,) = stand_in.launches()
    assert launch.params[:4] == [ptr(out), struct.pack("<i", 12), struct.pack("<q", 2**33), packed]


def test_repeated_calls_are_native_hits(stand_in):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(1024)
    for _ in range(100):
        k[(1,)](x, x, x, 1024, BLOCK=1024)
    stats = k.stats()
    assert (stats["misses"], stats["hits"], stats["specializations"]) == (1, 99, 1)
    assert stand_in.launch_count() == 100
    assert stand_in.module_loads() == 1


def test_unaligned_pointer_gets_its_own_binary(stand_in):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(1025)
    k[(1,)](x, x, x, 1024, BLOCK=1024)
    k[(1,)](x[1:], x, x, 1024, BLOCK=1024)
    k[(1,)](x, x, x, 1024, BLOCK=1024)
    assert k.stats()["specializations"] == 2
    aligned, unaligned = k._compiled
    # Triton marks 16-byte-aligned pointers divisible; the unaligned binary must not assume it.
    assert aligned.src.attrs[(0,)] == [["tt.divisibility", 16]]
    assert unaligned.src.attrs[(0,)] == []
    launches = stand_in.launches()
    assert launches[1].params[0] == ptr(x[1:])
    assert launches[0].raw != launches[1].raw


def test_num_warps_and_callable_grid(stand_in):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(5000)
    seen = {}

    def grid(meta):
        seen.update(meta)
        return (triton.cdiv(meta["n"], meta["BLOCK"]),)

    k[grid](x, x, x, 5000, BLOCK=512, num_warps=8)
    (launch,) = stand_in.launches()
    assert launch.grid == (10, 1, 1)
    assert launch.block == (256, 1, 1)
    assert set(seen) == {"x_ptr", "y_ptr", "out_ptr", "n", "BLOCK"} and seen["BLOCK"] == 512


def test_call_site_options_follow_their_values(stand_in):
    """One call site (the same keyword tuple every call) passing num_warps from a variable: the
    option's key words kept from the last call serve only a call passing the same value object,
    so every launch has its own value's binary, and returning to a value is a hit again."""
    k = fastkernel(kernels.add_kernel)
    x = torch.zeros(64)
    warps = (4, 4, 8, 8, 4, 2, 4)
    for w in warps:
        k[(1,)](x, x, x, 64, BLOCK=64, num_warps=w, num_stages=2)
    assert [launch.block for launch in stand_in.launches()] == [(32 * w, 1, 1) for w in warps]
    stats = k.stats()
    assert (stats["misses"], stats["hits"]) == (3, 4)
    # The same options by other keywords, in another order, reach the same binaries.
    k[(1,)](x, x, x, num_stages=2, num_warps=8, n=64, BLOCK=64)
    assert stand_in.launches()[-1].block == (256, 1, 1) and k.stats()["hits"] == 5


@pytest.mark.parametrize("outer_warps", [2, 8], ids=["kept_options", "new_options"])
def test_a_call_reentered_while_its_key_is_built_keeps_its_own_options(stand_in, outer_warps):
    """A constexpr whose value is read by Python code that calls the same kernel through other
    keywords (rebinding them). The outer call's option words were taken before any value was
    read (kept ones) or are made from the call's own values (new ones), so it launches the
    binary of its own options natively, and the calls after it launch theirs."""
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    armed = []

    class Block(tl.constexpr):
        @property
        def value(self):
            if armed:
                armed.clear()
                k[(1,)](x, x, x, 64, BLOCK=64, num_stages=2)  # other keywords
            return self._value

        @value.setter
        def value(self, value):
            self._value = value

    calls = [(64, 2), (64, 2), (Block(64), outer_warps), (64, outer_warps), (64, 2)]
    with TritonReference(stand_in, TEST_STREAM):
        for block, warps in calls:
            if isinstance(block, Block):
                armed.append(True)
            k[(1,)](x, x, x, 64, BLOCK=block, num_warps=warps)
    assert k.stats()["fallbacks"] == 0
    threads = [32 * w for _, w in calls]
    assert [launch.block for launch in stand_in.launches()] == [
        (threads[0], 1, 1),
        (threads[1], 1, 1),
        (128, 1, 1),  # the re-entrant call: Triton's default num_warps=4
        (threads[2], 1, 1),
        (threads[3], 1, 1),
        (threads[4], 1, 1),
    ]


def test_three_dimensional_grid_and_empty_grid(stand_in):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    k[(2, 3, 4)](x, x, x, 64, BLOCK=64)
    k[(0, 3)](x, x, x, 64, BLOCK=64)  # launches nothing, as Triton
    launches = stand_in.launches()
    assert len(launches) == 1 and launches[0].grid == (2, 3, 4)


def test_constexpr_and_defaults(stand_in):
    k = fastkernel(kernels.constexpr_kernel)
    out = torch.empty(16)
    k[(1,)](out, SCALE=2.0, MODE="double", BLOCK=16)
    k[(1,)](out, SCALE=2.0, MODE="single", BLOCK=16)
    k[(1,)](out, SCALE=2.0, MODE="double", BLOCK=16)
    assert k.stats()["specializations"] == 2 and k.stats()["hits"] == 1
    assert all(launch.params == [ptr(out)] + SCRATCH for launch in stand_in.launches())


def test_do_not_specialize_shares_one_binary(stand_in):
    k = fastkernel(kernels.no_spec_kernel)
    x = torch.randn(64)
    for n, base in [(16, x), (1, x), (17, x[1:])]:
        k[(1,)](base, x, n, BLOCK=64)
    assert k.stats()["specializations"] == 1
    assert [launch.params[2] for launch in stand_in.launches()] == [
        struct.pack("<i", n) for n in (16, 1, 17)
    ]


def _make_current(stand_in, device: int) -> None:
    """What torch.cuda.set_device does to the driver: make the device's primary context current."""
    ctx = ctypes.c_void_p()
    assert stand_in.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device) == 0
    assert stand_in.lib.cuCtxSetCurrent(ctx) == 0


def test_device_index_selects_the_module(stand_in):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    _make_current(stand_in, 0)
    k[(1,)](x, x, x, 64, BLOCK=64)
    _C._testing.set_host_testing(True, 1, TEST_STREAM + 1)
    _make_current(stand_in, 1)
    k[(1,)](x, x, x, 64, BLOCK=64)
    _C._testing.set_host_testing(True, 0, TEST_STREAM)
    _make_current(stand_in, 0)
    k[(1,)](x, x, x, 64, BLOCK=64)
    first, second, third = stand_in.launches()
    assert (first.device, second.device, third.device) == (0, 1, 0)
    assert second.stream == TEST_STREAM + 1
    assert k.stats()["specializations"] == 2 and stand_in.module_loads() == 2


def test_a_module_is_never_launched_on_another_device(stand_in):
    """The device index is in the key; if the thread's context disagrees with torch's current
    device the driver rejects the launch and fastkernel raises instead of retrying elsewhere."""
    from fastkernel import _C, CudaError

    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    _C._testing.set_host_testing(True, 1, TEST_STREAM)
    _make_current(stand_in, 1)
    k[(1,)](x, x, x, 64, BLOCK=64)
    _make_current(stand_in, 0)
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_HANDLE.*|add_kernel"):
        k[(1,)](x, x, x, 64, BLOCK=64)
    assert [launch.device for launch in stand_in.launches()] == [1]


@pytest.mark.parametrize("spare_words", [0, 1, 2])
def test_a_key_at_the_buffer_limit_keeps_its_device_word(stand_in, spare_words):
    """The launch device and the knob state end every key. A call whose arguments fill the key
    buffer up to them keeps both words, or falls back: it never launches the record another
    device registered under the same leading words."""
    k = fastkernel(kernels.constexpr_kernel)
    out = torch.empty(16)
    mode = _mode_filling_the_key(spare_words)
    _make_current(stand_in, 0)
    with TritonReference(stand_in, TEST_STREAM, device=0):  # a fallback launches through Triton
        k[(1,)](out, SCALE=2.0, MODE=mode, BLOCK=16)
    _C._testing.set_host_testing(True, 1, TEST_STREAM)
    _make_current(stand_in, 1)
    try:
        with TritonReference(stand_in, TEST_STREAM, device=1):
            k[(1,)](out, SCALE=2.0, MODE=mode, BLOCK=16)
    finally:
        _C._testing.set_host_testing(True, 0, TEST_STREAM)
        _make_current(stand_in, 0)
    assert [launch.device for launch in stand_in.launches()] == [0, 1]
    stats = k.stats()
    assert stats["specializations"] + stats["fallbacks"] == 2 and stats["hits"] == 0


@pytest.mark.parametrize("spare_words", [0, 1, 2])
def test_a_key_at_the_buffer_limit_keeps_its_knob_word(stand_in, spare_words):
    """As above for the word of the binary-changing knobs: Triton's debug knob set between two
    otherwise equal calls selects a debug binary, never the one compiled without it."""
    from triton import knobs

    k = fastkernel(kernels.constexpr_kernel)
    out = torch.empty(16)
    mode = _mode_filling_the_key(spare_words)
    with TritonReference(stand_in, TEST_STREAM):  # a fallback launches through Triton
        k[(1,)](out, SCALE=2.0, MODE=mode, BLOCK=16)
        knobs.runtime.debug = True
        try:
            k[(1,)](out, SCALE=2.0, MODE=mode, BLOCK=16)
        finally:
            knobs.runtime.debug = False
    assert len(stand_in.launches()) == 2
    stats = k.stats()
    assert stats["specializations"] + stats["fallbacks"] == 2 and stats["hits"] == 0


def _mode_filling_the_key(spare_words: int) -> str:
    """A MODE string for constexpr_kernel whose call leaves `spare_words` of the native key
    buffer (``_C.MAX_KEY_WORDS`` words) free before the device and knob words: out_ptr, SCALE and
    BLOCK take 1 + 2 + 2 words, the string a header word and one word per 8 bytes."""
    return "m" * 8 * (_C.MAX_KEY_WORDS - 5 - 1 - spare_words)


def test_fallback_path_counts_and_warns_once(stand_in, caplog):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    # A tensor subclass is not covered by the native key: Triton's own launcher takes it (here
    # on the stand-in), and the call is counted as a fallback, with one warning.
    sub = x.as_subclass(_TensorSubclass)
    with TritonReference(stand_in, TEST_STREAM):
        k[(1,)](x, x, sub, 64, BLOCK=64)
        k[(1,)](x, x, sub, 64, BLOCK=64)
    assert k.stats()["fallbacks"] == 2 and len(stand_in.launches()) == 2
    assert caplog.text.count("goes through Triton's own launcher") == 1
    assert "argument 'out_ptr' of type test_launch_bytes._TensorSubclass" in caplog.text


class _TensorSubclass(torch.Tensor):
    pass


def test_a_call_triton_rejects_raises_tritons_error_and_is_no_fallback(stand_in):
    """The error is Triton's own, word for word (its text differs between Triton versions)."""
    k = fastkernel(kernels.add_kernel)
    x, bad = torch.randn(64), object()
    with TritonReference(stand_in, TEST_STREAM):
        with pytest.raises(TypeError) as theirs:
            kernels.add_kernel[(1,)](x, x, x, bad, BLOCK=64)
        with pytest.raises(TypeError) as ours:
            k[(1,)](x, x, x, bad, BLOCK=64)
    assert str(ours.value) == str(theirs.value)
    assert k.stats()["fallbacks"] == 0 and stand_in.launches() == []


def test_dtype_and_jit_function_constexprs_stay_native(stand_in):
    import triton.language as tl

    k = fastkernel(kernels.cast_kernel)
    src, out16, out32 = torch.randn(64), torch.empty(64, dtype=torch.float16), torch.empty(64)
    for _ in range(3):
        k[(1,)](out16, src, 64, OUT_DTYPE=tl.float16, FN=kernels.times_two, BLOCK=64)
        k[(1,)](out32, src, 64, OUT_DTYPE=tl.float32, FN=kernels.times_two, BLOCK=64)
        k[(1,)](out32, src, 64, OUT_DTYPE=tl.float32, FN=kernels.times_three, BLOCK=64)
        k[(1,)](
            out32, src, 64, OUT_DTYPE=tl.constexpr(tl.float32), FN=kernels.times_three, BLOCK=64
        )
    stats = k.stats()
    assert stats["fallbacks"] == 0
    assert stats["specializations"] == 4 and stats["hits"] == 8
    assert all(
        launch.params == [ptr(launch_out), ptr(src), struct.pack("<i", 64)] + SCRATCH
        for launch, launch_out in zip(stand_in.launches(), [out16, out32, out32, out32] * 3)
    )


def test_constexpr_objects_in_unannotated_parameters(stand_in):
    import triton.language as tl

    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    k[(1,)](x, x, x, tl.constexpr(64), BLOCK=64)
    k[(1,)](x, x, x, tl.constexpr(64), BLOCK=64)
    assert k.stats()["fallbacks"] == 0 and k.stats()["hits"] == 1
    # n became a constexpr: only the three pointers (and scratch) are passed.
    assert stand_in.launches()[0].params == [ptr(x)] * 3 + SCRATCH


def test_keywords_built_at_run_time_match_by_value(stand_in):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    block, warps, n = "".join(["BLO", "CK"]), "_".join(["num", "warps"]), "".join(["n"])
    k[(1,)](x, x, x, **{n: 64, block: 64, warps: 2})
    k[(1,)](x, x, x, n=64, BLOCK=64, num_warps=2)
    first, second = stand_in.launches()
    assert first.block == second.block == (64, 1, 1)
    assert k.stats()["specializations"] == 1 and k.stats()["hits"] == 1


@pytest.fixture
def triton_allocator():
    """Restore Triton's allocator (a ContextVar) after a test sets one."""
    from triton.runtime import _allocation

    token = _allocation._allocator.set(_allocation._allocator.get())
    yield
    _allocation._allocator.reset(token)


def test_global_scratch_comes_from_tritons_allocator(stand_in, triton_allocator):
    k = fastkernel(kernels.device_descriptor_kernel)
    src, dst = torch.randn(64, 32), torch.empty(64, 32)
    calls = []

    def allocator(size, alignment, stream):
        buffer = torch.empty(size + alignment, dtype=torch.int8)
        calls.append((size, alignment, stream, buffer))
        return buffer

    # Without an allocator Triton's NullAllocator refuses, and nothing launches.
    with pytest.raises(RuntimeError, match="triton.set_allocator"):
        k[(4,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)
    assert stand_in.launches() == []
    triton.set_allocator(allocator)
    k[(4,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)
    compiled = k._compiled[-1]
    per_cta = compiled.metadata.global_scratch_size
    assert per_cta > 0
    ((size, alignment, stream, buffer),) = calls
    # Triton's sizing: grid CTAs x num_ctas x per-CTA bytes, on the launch stream.
    assert size == 4 * 1 * per_cta
    assert alignment == compiled.metadata.global_scratch_align
    assert stream == TEST_STREAM
    (launch,) = stand_in.launches()
    assert launch.params[-2] == ptr(buffer)  # global_scratch
    assert launch.params[-1] == b"\0" * 8  # profile_scratch: size 0, NULL


def test_a_scratch_size_past_64_bits_reaches_the_allocator_exactly(stand_in, triton_allocator):
    """Triton sizes scratch with Python ints; so does the native launch past 64 bits (no wrap
    to a small buffer the kernel would overrun)."""
    k = fastkernel(kernels.device_descriptor_kernel)
    src, dst = torch.randn(64, 32), torch.empty(64, 32)
    sizes = []

    def allocator(size, alignment, stream):
        sizes.append(size)
        if size > 2**40:
            raise MemoryError(f"no {size} bytes here")
        return torch.empty(size + alignment, dtype=torch.int8)

    triton.set_allocator(allocator)
    k[(1,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)
    per_cta = k._compiled[-1].metadata.global_scratch_size
    stand_in.reset()
    grid = (2**31 - 1, 65535, 65535)
    with pytest.raises(MemoryError):
        k[grid](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)
    assert sizes[-1] == (2**31 - 1) * 65535 * 65535 * per_cta > 2**64
    assert stand_in.launches() == []


# cuda.h: CU_LAUNCH_ATTRIBUTE_{COOPERATIVE=2, CLUSTER_DIMENSION=4,
# CLUSTER_SCHEDULING_POLICY_PREFERENCE=5, PROGRAMMATIC_STREAM_SERIALIZATION=6};
# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8.
COOPERATIVE, CLUSTER_DIMENSION, CLUSTER_SCHEDULING, PDL = 2, 4, 5, 6


def _attrs(launch):
    return {attr_id: value for attr_id, value in launch.attrs}


def test_clusters_launch_with_cluster_attributes_and_scaled_grid(stand_in):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(4096)
    k[(3, 2)](x, x, x, 4096, BLOCK=1024, num_ctas=2)
    (launch,) = stand_in.launches()
    assert launch.is_ex
    assert launch.grid == (6, 2, 1)  # grid.x times num_ctas, as Triton's driver.c
    attrs = _attrs(launch)
    assert set(attrs) == {CLUSTER_DIMENSION, CLUSTER_SCHEDULING}
    assert struct.unpack("<III", attrs[CLUSTER_DIMENSION][:12]) == (2, 1, 1)
    assert struct.unpack("<i", attrs[CLUSTER_SCHEDULING][:4]) == (1,)  # SPREAD
    assert launch.params == [ptr(x)] * 3 + [struct.pack("<i", 4096)] + SCRATCH


@pytest.mark.parametrize(
    "option,attr_id", [("launch_cooperative_grid", COOPERATIVE), ("launch_pdl", PDL)]
)
def test_cooperative_grid_and_pdl_are_launch_attributes(stand_in, option, attr_id):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(4096)
    k[(4,)](x, x, x, 4096, BLOCK=1024, **{option: True})
    k[(4,)](x, x, x, 4096, BLOCK=1024)
    with_attr, plain = stand_in.launches()
    assert with_attr.is_ex and set(_attrs(with_attr)) == {attr_id}
    assert struct.unpack("<i", _attrs(with_attr)[attr_id][:4]) == (1,)
    assert with_attr.grid == (4, 1, 1)
    assert not plain.is_ex  # no attribute needed: plain cuLaunchKernel


def test_more_than_48kb_of_shared_memory_opts_in_at_registration(stand_in):
    k = fastkernel(kernels.big_shared_kernel)
    src, dst = torch.randn(128 * 128), torch.empty(128 * 128)
    k[(1,)](src, dst, ROWS=128, COLS=128, num_warps=8)
    k[(1,)](src, dst, ROWS=128, COLS=128, num_warps=8)
    shared = k._compiled[0].metadata.shared
    assert shared > 49152
    launches = stand_in.launches()
    assert [launch.shared_mem for launch in launches] == [shared, shared]
    # Set once when the module was loaded, to the device's opt-in limit less static shared
    # memory (the stand-in reports 232448 and 0), as Triton's loadBinary does.
    assert stand_in.func_attribute("big_shared_kernel", 8) == 232448
    assert stand_in.module_loads() == 1


def test_scratch_of_a_captured_launch_outlives_the_capture(stand_in, triton_allocator, monkeypatch):
    import gc
    import weakref

    from fastkernel import _triton_abi as abi

    k = fastkernel(kernels.device_descriptor_kernel)
    src, dst = torch.randn(64, 32), torch.empty(64, 32)
    buffers = []

    def allocator(size, alignment, stream):
        buffers.append(weakref.ref(buffer := torch.empty(size, dtype=torch.int8)))
        return buffer

    triton.set_allocator(allocator)
    k[(4,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)  # not capturing: freed after
    monkeypatch.setattr(abi, "_stream_is_capturing", lambda: True)
    k[(4,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)  # "captured": kept alive
    gc.collect()
    assert buffers[0]() is None and buffers[1]() is not None
    assert abi.CAPTURED_SCRATCH[-1] is buffers[1]()
    abi.CAPTURED_SCRATCH.pop()


def test_tuple_arguments_are_flattened_like_tritons_launcher(stand_in):
    k = fastkernel(kernels.tuple_kernel)
    x, y, out = torch.randn(64), torch.randn(64), torch.empty(64)
    k[(1,)](out, (x, 3), 64, (7, (2.5, y)), BLOCK=64)
    (launch,) = stand_in.launches()
    # Leaves in order; every element specialized (an int == 1 would drop out).
    assert (
        launch.params
        == [
            ptr(out),
            ptr(x),
            struct.pack("<i", 3),
            struct.pack("<i", 64),
            struct.pack("<i", 7),
            struct.pack("<f", 2.5),
            ptr(y),
        ]
        + SCRATCH
    )
    k[(1,)](out, (x[1:], 1), 63, (7, (2.5, y)), BLOCK=64)  # unaligned, and k == 1: constexpr
    second = stand_in.launches()[1]
    assert (
        second.params
        == [
            ptr(out),
            ptr(x[1:]),
            struct.pack("<i", 63),
            struct.pack("<i", 7),
            struct.pack("<f", 2.5),
            ptr(y),
        ]
        + SCRATCH
    )
    k[(1,)](out, (x, 5), 64, (9, (0.5, y)), BLOCK=64)  # the first specialization again: a hit
    s = k.stats()
    assert (s["hits"], s["misses"], s["fallbacks"], s["specializations"]) == (1, 2, 0, 2)
    assert stand_in.launches()[2].params[2] == struct.pack("<i", 5)
    with pytest.raises(OverflowError, match="tuple_kernel: argument 'pair'"):
        k[(1,)](out, (x, 2**70), 64, (7, (2.5, y)), BLOCK=64)


def test_a_tensor_the_scratch_allocator_gives_new_storage_launches_its_current_storage(
    stand_in, triton_allocator
):
    """The allocator is Python run after the arguments were read: a tensor it gives new storage
    is launched with it, as Triton's launcher reads data_ptr() after allocating."""
    k = fastkernel(kernels.device_descriptor_kernel)  # needs global scratch: calls the allocator
    src, dst = torch.randn(64, 32), torch.empty(64, 32)
    moves = []

    def allocator(size, alignment, stream):
        if moves:
            dst.set_(torch.empty(64, 32))
        return torch.empty(size, dtype=torch.int8)

    triton.set_allocator(allocator)
    k[(4,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)
    moves.append(True)
    k[(4,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)
    assert struct.unpack("<Q", stand_in.last_launch().params[1])[0] == dst.data_ptr()
