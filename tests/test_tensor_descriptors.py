"""Host tensor descriptors (triton.tools.tensor_descriptor.TensorDescriptor) on the native path,
on CPU: every launch is compared byte for byte with Triton's own launcher run against the same
recording stand-in (tests/triton_reference.py), on an sm_90 device (TMA lowering: a CUtensorMap
per descriptor, which the stand-in encodes readably) and an sm_80 one (the decomposed form)."""

from __future__ import annotations

import struct

import kernels
import pytest
import torch
from conftest import TEST_STREAM
from triton.tools.tensor_descriptor import TensorDescriptor
from triton_reference import TritonReference, assert_same_launch

from fastkernel import CudaError, fastkernel
from fastkernel import _triton_abi as abi

HAS_TF32_FIELD = "round_f32_to_tf32" in TensorDescriptor.__dataclass_fields__


@pytest.fixture(params=[90, 80], ids=["sm90-tma", "sm80-decomposed"])
def capability(request, monkeypatch):
    monkeypatch.setenv("FKSTUB_CAPABILITY", str(request.param))
    return request.param


@pytest.fixture
def reference(stand_in):
    with TritonReference(stand_in, TEST_STREAM) as ref:
        yield ref


def decode_tensor_map(raw: bytes) -> dict:
    """The fields the stand-in's cuTensorMapEncodeTiled wrote (recording_driver.c layout)."""
    assert len(raw) == 128 and raw[:4] == b"FKTM", raw[:16].hex()
    rank = raw[5]
    return {
        "data_type": raw[4],
        "rank": rank,
        "interleave": raw[6],
        "swizzle": raw[7],
        "l2_promotion": raw[8],
        "oob_fill": raw[9],
        "address": struct.unpack_from("<Q", raw, 16)[0],
        "dims": list(struct.unpack_from(f"<{rank}Q", raw, 24)),
        "byte_strides": list(struct.unpack_from(f"<{rank - 1}Q", raw, 64)) if rank > 1 else [],
        "box": list(struct.unpack_from(f"<{rank}I", raw, 96)),
        "element_strides": list(raw[116 : 116 + rank]),
    }


def _copy_args(src, dst, block=(16, 32), **kw):
    return (
        TensorDescriptor.from_tensor(src, list(block), **kw),
        TensorDescriptor.from_tensor(dst, list(block)),
        2.0,
    )


def _both(reference, stand_in, kernel_fn, grid, *args, fk=None, **kwargs):
    """Launch through Triton, then through fastkernel (``fk`` reused when given); both launches."""
    theirs = reference.launch(kernel_fn, grid, *args, **kwargs)
    fk = fk or fastkernel(kernel_fn)
    fk[grid](*args, **kwargs)
    return theirs, stand_in.launches()[-1], fk


def test_descriptors_launch_the_bytes_triton_launches(stand_in, reference, capability):
    src, dst = torch.randn(64, 96), torch.empty(64, 96)
    args = _copy_args(src, dst)
    theirs, ours, k = _both(
        reference, stand_in, kernels.descriptor_copy_kernel, (4, 3), *args, BLOCK_M=16, BLOCK_N=32
    )
    assert_same_launch(ours, theirs)
    assert k.stats()["fallbacks"] == 0
    if capability >= 90:
        assert len(ours.params[0]) == 128  # a CUtensorMap
        fields = decode_tensor_map(ours.params[0])
        assert fields["address"] == src.data_ptr()
        assert fields["dims"] == [96, 64]  # innermost first
        assert fields["byte_strides"] == [96 * 4]
        assert fields["box"] == [32, 16]
        assert fields["element_strides"] == [1, 1]
        assert fields["data_type"] == 7  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
        assert (fields["l2_promotion"], fields["oob_fill"]) == (2, 0)
    else:
        assert ours.params[0] == struct.pack("<Q", src.data_ptr())  # the base pointer


def test_a_repeated_descriptor_is_a_hit_and_is_not_encoded_again(stand_in, reference):
    from fastkernel import _C

    _C._testing.clear_tensor_map_cache()
    src, dst = torch.randn(64, 96), torch.empty(64, 96)
    args = _copy_args(src, dst)
    k = fastkernel(kernels.descriptor_copy_kernel)
    k[(4, 3)](*args, BLOCK_M=16, BLOCK_N=32)
    encodes = stand_in.tensor_map_encodes()
    assert encodes == 2
    for _ in range(5):
        k[(4, 3)](*args, BLOCK_M=16, BLOCK_N=32)
    assert stand_in.tensor_map_encodes() == encodes
    # New descriptors over other tensors of the same dtype and block: the same binary (a hit),
    # new tensor maps; the first pair again is still cached.
    other = _copy_args(torch.randn(32, 64), torch.empty(32, 64))
    theirs = reference.launch(
        kernels.descriptor_copy_kernel, (2, 2), *other, BLOCK_M=16, BLOCK_N=32
    )
    before = stand_in.tensor_map_encodes()
    k[(2, 2)](*other, BLOCK_M=16, BLOCK_N=32)
    assert_same_launch(stand_in.launches()[-1], theirs)
    assert stand_in.tensor_map_encodes() == before + 2
    k[(4, 3)](*args, BLOCK_M=16, BLOCK_N=32)
    assert stand_in.tensor_map_encodes() == before + 2
    stats = k.stats()
    assert (stats["misses"], stats["hits"], stats["specializations"]) == (1, 7, 1)


def test_block_shape_and_dtype_select_the_binary(stand_in, reference):
    k = fastkernel(kernels.descriptor_copy_kernel)
    src, dst = torch.randn(64, 64), torch.empty(64, 64)
    k[(4, 2)](*_copy_args(src, dst, (16, 32)), BLOCK_M=16, BLOCK_N=32)
    k[(2, 2)](*_copy_args(src, dst, (32, 32)), BLOCK_M=32, BLOCK_N=32)
    half = _copy_args(src.half(), dst.half(), (16, 32))
    theirs, ours, _ = _both(
        reference,
        stand_in,
        kernels.descriptor_copy_kernel,
        (4, 2),
        *half,
        fk=k,
        BLOCK_M=16,
        BLOCK_N=32,
    )
    assert_same_launch(ours, theirs)
    assert k.stats()["specializations"] == 3


def test_nan_padding_is_a_runtime_value(stand_in, reference, capability):
    src, dst = torch.randn(64, 64), torch.empty(64, 64)
    k = fastkernel(kernels.descriptor_copy_kernel)
    for padding in ("zero", "nan", "zero"):
        args = _copy_args(src, dst, padding=padding)
        theirs, ours, _ = _both(
            reference,
            stand_in,
            kernels.descriptor_copy_kernel,
            (4, 2),
            *args,
            fk=k,
            BLOCK_M=16,
            BLOCK_N=32,
        )
        assert_same_launch(ours, theirs)
        if capability >= 90:
            assert decode_tensor_map(ours.params[0])["oob_fill"] == (padding == "nan")
    assert k.stats()["specializations"] == 1


@pytest.mark.skipif(
    not HAS_TF32_FIELD, reason="this Triton's TensorDescriptor has no round_f32_to_tf32"
)
def test_tf32_rounding_matches_triton(stand_in, reference, capability):
    src, dst = torch.randn(64, 64), torch.empty(64, 64)
    k = fastkernel(kernels.descriptor_copy_kernel)
    for rounding in (True, False):
        args = _copy_args(src, dst, round_f32_to_tf32=rounding)
        theirs, ours, _ = _both(
            reference,
            stand_in,
            kernels.descriptor_copy_kernel,
            (4, 2),
            *args,
            fk=k,
            BLOCK_M=16,
            BLOCK_N=32,
        )
        assert_same_launch(ours, theirs)
        if capability >= 90:
            assert decode_tensor_map(ours.params[0])["data_type"] == (11 if rounding else 7)


@pytest.mark.skipif(
    abi.TRITON_VERSION <= (3, 7), reason="Triton <= 3.7 expands top-level descriptors only"
)
def test_a_descriptor_inside_a_tuple(stand_in, reference, capability):
    src, out = torch.randn(64, 16), torch.empty(16, 16)
    pair = (TensorDescriptor.from_tensor(src, [16, 16]), 32)
    theirs, ours, k = _both(
        reference, stand_in, kernels.descriptor_tuple_kernel, (1,), pair, out, BLOCK=16
    )
    assert_same_launch(ours, theirs)
    assert k.stats()["fallbacks"] == 0


def test_persistent_matmul_over_descriptors(stand_in, reference, capability):
    m, n, kdim = 256, 192, 128
    a = torch.randn(m, kdim).half()
    b = torch.randn(n, kdim).half()
    c = torch.empty(m, n).half()
    descs = (
        TensorDescriptor.from_tensor(a, [64, 32]),
        TensorDescriptor.from_tensor(b, [64, 32]),
        TensorDescriptor.from_tensor(c, [64, 64]),
    )
    theirs, ours, k = _both(
        reference,
        stand_in,
        kernels.matmul_descriptor_persistent_kernel,
        (4,),
        *descs,
        m,
        n,
        kdim,
        BLOCK_M=64,
        BLOCK_N=64,
        BLOCK_K=32,
        NUM_PROGRAMS=4,
    )
    assert_same_launch(ours, theirs)
    assert k.stats()["fallbacks"] == 0


def test_a_descriptor_subclass_goes_through_triton(stand_in, reference):
    class Described(TensorDescriptor):
        pass

    src, dst = torch.randn(64, 64), torch.empty(64, 64)
    args = (
        Described(src, src.shape, src.stride(), [16, 32]),
        Described(dst, dst.shape, dst.stride(), [16, 32]),
        2.0,
    )
    k = fastkernel(kernels.descriptor_copy_kernel)
    k[(4, 2)](*args, BLOCK_M=16, BLOCK_N=32)
    stats = k.stats()
    assert stats["fallbacks"] == 1 and stats["specializations"] == 0
    assert len(stand_in.launches()) == 1  # launched once, by Triton's own launcher


def _assert_refused(stand_in, make_bad, exc, match):
    """A registered copy kernel called with ``make_bad(src)`` as its input descriptor raises
    ``exc`` matching ``match`` and launches nothing."""
    src, dst = torch.randn(64, 64), torch.empty(64, 64)
    k = fastkernel(kernels.descriptor_copy_kernel)
    args = _copy_args(src, dst)
    k[(4, 2)](*args, BLOCK_M=16, BLOCK_N=32)
    bad = make_bad(src)
    launches = len(stand_in.launches())
    with pytest.raises(exc, match=match):
        k[(4, 2)](bad, args[1], 2.0, BLOCK_M=16, BLOCK_N=32)
    assert len(stand_in.launches()) == launches


def test_a_non_contiguous_last_dimension_is_refused(stand_in):
    def make_bad(src):
        bad = TensorDescriptor.from_tensor(src, [16, 32])
        bad.strides = [64, 2]  # TensorDescriptor checks this at construction only
        return bad

    _assert_refused(stand_in, make_bad, TypeError, "argument 'in_desc'.*innermost stride must be 1")


def test_a_descriptor_the_driver_refuses_raises_and_launches_nothing(stand_in):
    def make_bad(src):
        bad = TensorDescriptor.from_tensor(src, [16, 32])
        bad.base = src.view(-1)[1:].view(63, 65)[:, :64]  # 4 bytes past a 16-byte boundary
        return bad

    _assert_refused(stand_in, make_bad, CudaError, "tensor map")


def test_expanded_plans_match_tritons_signature_expansion():
    """The parameter types fastkernel expands a descriptor into are the installed Triton's
    (expand_signature), with and without TMA metadata."""
    signature = {"a": "tensordesc<fp16[64, 32]>", "n": "i32", "t": ("i32", "tensordesc<fp32[8]>")}
    if abi.TRITON_VERSION <= (3, 7):  # descriptors inside tuples: Triton >= 3.8
        signature.pop("t")
    plan = abi.launch_plan(signature)
    meta = {
        "swizzle": 3,
        "elem_size": 2,
        "elem_type": 6,
        "block_size": [64, 32],
        "fp4_padded": False,
        "is_im2col": False,
    }
    metas = [meta, dict(meta, block_size=[8], elem_type=7, elem_size=4, swizzle=0)][
        : len(signature) - 1
    ]
    for tensordesc_meta in ([], metas):
        expanded, maps = abi.expand_descriptors(plan, tensordesc_meta)
        assert [ty for _, ty in expanded] == _tritons_expansion(signature, tensordesc_meta)
        assert len(maps) == (len(metas) if tensordesc_meta else 0)


def _tritons_expansion(signature, tensordesc_meta):
    try:  # Triton >= 3.8
        from triton.backends.driver import expand_signature

        expanded = expand_signature(signature.values(), tensordesc_meta, "nvTmaDesc")
    except ImportError:
        from triton.backends.nvidia import driver as nvidia

        if hasattr(nvidia, "expand_signature"):  # 3.7
            expanded = nvidia.expand_signature(signature.values(), tensordesc_meta)
        else:  # 3.5, 3.6: make_launcher's inner expansion is not importable; rebuild it
            pytest.skip("this Triton builds its expansion inside make_launcher")

    def flat(items):
        for item in items:
            if isinstance(item, tuple):
                yield from flat(item)
            else:
                yield item

    return list(flat(expanded))


def test_a_shape_beyond_int32_raises_naming_the_descriptor(stand_in, capability):
    # The kernel takes the shape as i32 (after the tensor map, or the i64 decomposed copy).
    _assert_refused(
        stand_in,
        lambda src: TensorDescriptor(src, [2**31, 64], [64, 1], [16, 32]),
        OverflowError,
        "argument 'in_desc'.*out of range for i32",
    )


def test_an_enter_hook_changing_a_descriptor_launches_what_triton_launches(
    stand_in, reference, capability
):
    """Triton expands host descriptors into launch parameters before its launcher calls the
    enter hooks, and reads only plain tensors' pointers after them: a hook that changes a
    descriptor's shape or base does not change this launch, here as there."""
    from triton import knobs

    src, dst, other = torch.randn(64, 96), torch.empty(64, 96), torch.randn(64, 96)
    k = fastkernel(kernels.descriptor_copy_kernel)
    for change in ("shape", "base", "float shape"):
        launches = []
        for system in ("triton", "fastkernel"):
            args = _copy_args(src, dst)

            def hook(metadata, descriptor=args[0], change=change):
                if change == "shape":
                    descriptor.shape = [32, 96]
                elif change == "base":
                    descriptor.base = other
                else:
                    descriptor.shape = [64.0, 96.0]

            knobs.runtime.launch_enter_hook.add(hook)
            try:
                if system == "triton":
                    launches.append(
                        reference.launch(
                            kernels.descriptor_copy_kernel, (4, 3), *args, BLOCK_M=16, BLOCK_N=32
                        )
                    )
                else:
                    k[(4, 3)](*args, BLOCK_M=16, BLOCK_N=32)
                    launches.append(stand_in.launches()[-1])
            finally:
                knobs.runtime.launch_enter_hook.remove(hook)
        assert_same_launch(launches[1], launches[0])


def _block_shape_hook(nargs):
    """Sets both descriptors' block shape from the config's (Liger-Kernel's TMA SwiGLU and
    FlagGems' Hopper matmul do this in a config pre_hook)."""
    for name in ("in_desc", "out_desc"):
        nargs[name].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_N"]]


def test_a_config_pre_hook_setting_block_shapes_launches_what_triton_launches(stand_in, capability):
    """Descriptors made with a placeholder block shape ([1, 1]), which the tuned config's
    ``pre_hook`` sets before the launch: under the patch each tuned call is one native hit of
    the autotuner, and launches the binary and the descriptor bytes Triton's run launches."""
    import triton

    from fastkernel import patched
    from fastkernel.patch import PATCH_ATTR

    timings = iter([2.0, 1.0])

    def do_bench(kernel_call, quantiles=None, **_):
        kernel_call()
        t = next(timings)
        return [t] * len(quantiles) if quantiles else t

    configs = [
        triton.Config({"BLOCK_M": m, "BLOCK_N": 32}, num_warps=4, pre_hook=_block_shape_hook)
        for m in (16, 32)
    ]
    src, dst = torch.randn(64, 96), torch.empty(64, 96)
    grid = lambda meta: (64 // meta["BLOCK_M"], 96 // meta["BLOCK_N"])  # noqa: E731

    def descriptors():
        return (
            TensorDescriptor.from_tensor(src, [1, 1]),
            TensorDescriptor.from_tensor(dst, [1, 1]),
            2.0,
        )

    tuned = triton.autotune(configs=configs, key=[], do_bench=do_bench)(
        kernels.descriptor_copy_kernel
    )
    with patched(), TritonReference(stand_in, TEST_STREAM):
        for _ in range(3):
            tuned[grid](*descriptors())
        stats = vars(tuned)[PATCH_ATTR].stats()
        ours = stand_in.launches()
    with TritonReference(stand_in, TEST_STREAM) as reference:  # unpatched: Triton's launcher
        theirs = reference.launch(
            kernels.descriptor_copy_kernel,
            grid,
            *_copy_args(src, dst, (32, 32)),
            **configs[1].kwargs,
        )
    assert tuned.best_config is configs[1]
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0)
    assert len(ours) == 2 + 3  # one launch per config timed, then the three calls
    for launch in ours[2:]:
        assert_same_launch(launch, theirs)
    if capability >= 90:
        assert decode_tensor_map(ours[-1].params[0])["box"] == [32, 32]
