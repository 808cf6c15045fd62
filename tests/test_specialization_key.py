"""The native specialization key against Triton's own specializer.

The plain-Python ``reference_specialize`` below is the readable spec of Triton's rules
(triton/python/src/specialize.cc and jit.py ``create_function_from_signature``); it is checked
against Triton's ``native_specialize_impl``, and the native key builder is checked against both
over a grid of dtypes, alignments, int values and flags, on CPU tensors.
"""

from __future__ import annotations

import itertools
import struct

import kernels
import pytest
import torch
import triton
import triton.language as tl

from fastkernel import _C, fastkernel
from fastkernel import _triton_abi as abi

BACKEND = abi.backend_for(abi.cuda_target(9, 0))

try:
    from triton._C.libtriton import native_specialize_impl
except ImportError:  # Triton < 3.6: the specializer is Python (triton/runtime/jit.py)
    from triton.runtime.jit import create_specialize_impl

    def native_specialize_impl(backend, value, is_const, specialize, align):
        return create_specialize_impl(backend.get_arg_specialization)(
            value, is_const, specialize, align
        )

# ---- the readable spec --------------------------------------------------------------------------


def reference_specialize(value, specialize: bool = True, align: bool = True):
    """Triton's (type, key) for one non-constexpr argument."""
    if isinstance(value, bool):
        return ("u1", None)
    if isinstance(value, int):
        if specialize and value == 1:
            return ("constexpr", 1)
        if -(2**31) <= value < 2**31:
            ty = "i32"
        elif -(2**63) <= value < 2**63:
            ty = "i64"
        elif value < 2**64:
            ty = "u64"
        else:
            raise OverflowError("integer too large")
        if not specialize:
            return (ty, None)
        return (ty, "D" if align and value % 16 == 0 else "")
    if isinstance(value, float):
        return ("fp32", None)
    if value is None:
        return ("constexpr", None)
    if isinstance(value, torch.Tensor):
        ty = "*" + triton._utils.canonicalize_dtype(value.dtype)
        if not specialize:
            return (ty, None)
        return (ty, "D" if align and value.data_ptr() % 16 == 0 else "")
    raise TypeError(type(value))


# ---- decoding native key words ------------------------------------------------------------------

KIND_TENSOR, KIND_INT, KIND_FLOAT, KIND_BOOL, KIND_NONE = 1, 2, 3, 4, 5
WIDTHS = {0: "i32", 1: "i64", 2: "u64"}
CLASSES = {0: None, 1: "D", 2: ""}


def key_words(key: bytes):
    return list(struct.unpack(f"<{len(key) // 8}Q", key))


def native_class(word: int, value):
    """Map the native key word of one argument to Triton's (type, key) form."""
    kind = word & 0xFF
    if kind == KIND_TENSOR:
        assert (word >> 8) & 0xFF == int(_scalar_type(value.dtype))
        return ("*" + triton._utils.canonicalize_dtype(value.dtype), CLASSES[(word >> 24) & 0xFF])
    if kind == KIND_INT:
        cls = (word >> 16) & 0xFF
        if cls == 3:
            return ("constexpr", 1)
        return (WIDTHS[(word >> 8) & 0xFF], CLASSES[cls])
    if kind == KIND_FLOAT:
        return ("fp32", None)
    if kind == KIND_BOOL:
        return ("u1", None)
    if kind == KIND_NONE:
        return ("constexpr", None)
    raise AssertionError(f"unexpected word {word:#x}")


def _scalar_type(dtype):
    # c10::ScalarType numbering, as torch exposes it through the dtype's index in this list.
    order = [
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        None,
        None,
        None,
        torch.bool,
        None,
        None,
        None,
        torch.bfloat16,
    ]
    return order.index(dtype)


# ---- the value grid -----------------------------------------------------------------------------

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]
_BASES = {dtype: torch.zeros(64, dtype=dtype) for dtype in DTYPES}


def _tensor(dtype, element_offset):
    t = _BASES[dtype][element_offset:]
    return t


TENSORS = [_tensor(d, off) for d in DTYPES for off in (0, 1, 16)]
INTS = [
    0,
    1,
    2,
    15,
    16,
    17,
    32,
    -1,
    -16,
    -17,
    2**30 - 1,  # the largest magnitude CPython stores in one digit (read without a call)
    2**30,
    -(2**30) + 1,
    -(2**30),
    2**30 + 16,
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**32,
    2**32 + 1,
    2**63 - 1,
    2**63 - 16,
    2**63,
    2**63 + 16,
    2**64 - 1,
    2**64 - 16,
]
OTHERS = [True, False, 0.0, 1.0, -2.5, None]
VALUES = TENSORS + INTS + OTHERS
FLAGS = [(True, True), (False, True), (True, False)]


def _id(v):
    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype)[6:]}@{v.data_ptr() % 64}"
    return repr(v)


@triton.jit
def probe(x):
    pass


@triton.jit(do_not_specialize=["x"])
def probe_no_specialize(x):
    pass


@triton.jit(do_not_specialize_on_alignment=["x"])
def probe_no_align(x):
    pass


@pytest.fixture(autouse=True)
def host_tensors():
    """CPU tensors stand in for device tensors while keys are built (no launch happens)."""
    _C._testing.set_host_testing(True, 0, 0)
    yield
    _C._testing.set_host_testing(False)


PROBES = {
    (True, True): fastkernel(probe),
    (False, True): fastkernel(probe_no_specialize),
    (True, False): fastkernel(probe_no_align),
}


def native_key(kernel, args, kwargs=None, device=0):
    key, reason = _C._testing.build_key(kernel, tuple(args), dict(kwargs or {}), device)
    assert key is not None, reason
    return key


@pytest.mark.parametrize("flags", FLAGS, ids=["specialize", "no_specialize", "no_align"])
@pytest.mark.parametrize("value", VALUES, ids=_id)
def test_reference_matches_triton(value, flags):
    specialize, align = flags
    assert reference_specialize(value, specialize, align) == tuple(
        native_specialize_impl(BACKEND, value, False, specialize, align)
    )


@pytest.mark.parametrize("flags", FLAGS, ids=["specialize", "no_specialize", "no_align"])
@pytest.mark.parametrize("value", VALUES, ids=_id)
def test_native_key_matches_triton(value, flags):
    words = key_words(native_key(PROBES[flags], [value]))
    assert len(words) == 3  # the argument's word, the device word, the knob-state word
    assert native_class(words[0], value) == reference_specialize(value, *flags)
    assert words[1] == _C.ARG_KINDS["device"]  # device 0 in bits 8..39
    assert words[2] == abi.knob_state()[0]


@pytest.mark.parametrize("flags", FLAGS, ids=["specialize", "no_specialize", "no_align"])
def test_same_native_key_iff_same_triton_specialization(flags):
    """Never one binary for two of Triton's specializations, never two for one (on this grid)."""
    kernel = PROBES[flags]
    native = [native_key(kernel, [v]) for v in VALUES]
    triton_spec = [(type(v) is bool, reference_specialize(v, *flags)) for v in VALUES]
    for (i, a), (j, b) in itertools.combinations(enumerate(VALUES), 2):
        assert (native[i] == native[j]) == (triton_spec[i] == triton_spec[j]), (_id(a), _id(b))


def test_constexpr_values_are_keyed_by_type_and_value():
    k = fastkernel(kernels.constexpr_kernel)
    out = torch.zeros(16)
    keys = [
        native_key(k, [out], {"SCALE": s, "MODE": m, "BLOCK": 16})
        for s in (1, 1.0, True, 2, 2.5, None)
        for m in ("single", "double")
    ]
    assert len(set(keys)) == len(keys)
    assert native_key(k, [out], {"SCALE": 2, "MODE": "single", "BLOCK": 16}) == native_key(
        k, [out], {"SCALE": 2, "MODE": "single", "BLOCK": 16}
    )


def test_dtype_jit_function_and_wrapped_constexprs():
    k = fastkernel(kernels.constexpr_kernel)
    out = torch.zeros(16)

    def key(scale, mode="m"):
        return native_key(k, [out], {"SCALE": scale, "MODE": mode, "BLOCK": 16})

    assert key(tl.float16) == key(tl.float16)
    assert key(tl.float16) != key(tl.float32)
    assert key(kernels.times_two) != key(kernels.times_three)
    assert key(tl.constexpr(3)) == key(tl.constexpr(3))
    assert key(tl.constexpr(3)) != key(tl.constexpr(4))
    assert key(tl.constexpr("a")) != key(tl.constexpr("b"))
    # A tl.constexpr around an object that is not keyed by value falls back.
    fallback, reason = _C._testing.build_key(
        k, (out,), {"SCALE": tl.constexpr([1]), "MODE": "m", "BLOCK": 16}, 0
    )
    assert fallback is None and "constexpr" in reason


def test_keyword_order_does_not_change_the_key():
    k = fastkernel(kernels.constexpr_kernel)
    out = torch.zeros(16)
    a = native_key(
        k, [out], {"SCALE": 2, "MODE": "x", "BLOCK": 16, "num_warps": 2, "num_stages": 1}
    )
    b = native_key(
        k,
        [],
        {"num_stages": 1, "BLOCK": 16, "out_ptr": out, "num_warps": 2, "MODE": "x", "SCALE": 2},
    )
    assert a == b


def test_compile_options_and_device_are_in_the_key():
    k = fastkernel(kernels.add_kernel)
    x = torch.zeros(64)
    base = native_key(k, [x, x, x, 64], {"BLOCK": 64})
    assert native_key(k, [x, x, x, 64], {"BLOCK": 64, "num_warps": 8}) != base
    assert native_key(k, [x, x, x, 64], {"BLOCK": 64, "num_warps": 8}) != native_key(
        k, [x, x, x, 64], {"BLOCK": 64, "num_warps": 2}
    )
    assert native_key(k, [x, x, x, 64], {"BLOCK": 64, "num_stages": 2}) != base
    assert native_key(k, [x, x, x, 64], {"BLOCK": 64}, device=1) != base
    assert native_key(k, [x, x, x, 64], {"BLOCK": 128}) != base


def test_compile_option_values_are_keyed_by_type_and_value():
    """Small-int option values share one key word with the option; every other value (big
    ints, bools, floats, strings) is keyed as a constexpr. No two distinct values share a key."""
    k = fastkernel(kernels.add_kernel)
    x = torch.zeros(64)
    values = [4, 8, 0, -4, 2**30 - 1, 2**30, -(2**30), 2**40, True, False, 4.0, "4", None]
    keys = [native_key(k, [x, x, x, 64], {"BLOCK": 64, "num_stages": v}) for v in values]
    assert len(set(keys)) == len(values), values
    for v, key in zip(values, keys):
        assert native_key(k, [x, x, x, 64], {"BLOCK": 64, "num_stages": v}) == key


def test_option_pairs_are_keyed_by_both_values():
    """Two small non-negative int options share one key word, greedily in option order; values
    on both sides of the pairing bound, and a third option, still give every distinct set of
    options its own key, whatever the keyword order."""
    k = fastkernel(kernels.add_kernel)
    x = torch.zeros(64)
    values = [0, 3, 4, 2**20 - 1, 2**20, -1, 2**30, True, "4"]
    keys = {}
    for warps in values:
        for stages in values:
            for ctas in (None, 1, 2**21):
                options = {"num_warps": warps, "num_stages": stages}
                if ctas is not None:
                    options["num_ctas"] = ctas
                key = native_key(k, [x, x, x, 64], {"BLOCK": 64, **options})
                reordered = dict(reversed(list(options.items())))
                assert native_key(k, [x, x, x, 64], {**reordered, "BLOCK": 64}) == key
                keys.setdefault(key, []).append(options)
    assert all(len(same) == 1 for same in keys.values()), [s for s in keys.values() if len(s) > 1]


def test_defaults_fill_missing_arguments():
    @triton.jit
    def with_default(x_ptr, n=16, BLOCK: tl.constexpr = 32):
        pass

    k = fastkernel(with_default)
    x = torch.zeros(4)
    assert native_key(k, [x]) == native_key(k, [x, 16], {"BLOCK": 32})
    assert native_key(k, [x]) != native_key(k, [x, 17])


@pytest.mark.parametrize(
    "value",
    [
        __import__("collections").namedtuple("P", "a b")(1, 2),
        object(),
        torch.nn.Parameter(torch.zeros(2)),
    ],
    ids=["namedtuple", "plain_object", "tensor_subclass_parameter"],
)
def test_uncovered_kinds_take_the_fallback(value):
    result = _C._testing.build_key(PROBES[(True, True)], (value,), {}, 0)
    if isinstance(value, torch.nn.Parameter):
        # Parameter is a plain tensor to C++ (THPVariable_CheckExact accepts it).
        assert result[0] is not None
    else:
        assert result[0] is None and "does not cover" in result[1]


def _tuple_values():
    base = torch.zeros(64)
    leaves = [base, base[1:], 1, 16, 17, 2**40, 1.5, None, True]
    values = [(a, b) for a in leaves for b in leaves]
    values += [
        (base, (16, None)),
        (base, (17, None)),
        (base[1:], (16, None)),
        ((1, 2.0),),
        ((base,),),
        (base, 16, 17),
        (),
    ]
    return values


@pytest.mark.parametrize("flags", FLAGS, ids=["specialize", "no_specialize", "no_align"])
def test_tuples_key_like_tritons_specialization_of_each_element(flags):
    """Tuples are flattened by Triton; the native key holds each element's class, so two tuple
    arguments share a binary exactly when Triton specializes them alike."""
    kernel = PROBES[flags]
    values = _tuple_values()
    native = [native_key(kernel, [v]) for v in values]
    specs = [
        repr(native_specialize_impl(BACKEND, v, False, *flags))
        + repr(tuple(type(x) is bool for x in v))
        for v in values
    ]
    for (i, a), (j, b) in itertools.combinations(enumerate(values), 2):
        assert (native[i] == native[j]) == (specs[i] == specs[j]), (a, b)


def test_fake_tensors_take_the_fallback():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(8)
    key, reason = _C._testing.build_key(PROBES[(True, True)], (fake,), {}, 0)
    assert key is None and "does not cover" in reason


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 2**100])
def test_ints_beyond_64_bits_raise_overflow_naming_the_argument(value):
    with pytest.raises(OverflowError, match="argument 'x'"):
        _C._testing.build_key(PROBES[(True, True)], (value,), {}, 0)


def test_tuple_constexprs_are_keyed_by_value():
    k = fastkernel(kernels.constexpr_kernel)
    out = torch.empty(4)

    def key(scale):
        return native_key(k, [out], {"SCALE": scale, "MODE": "x", "BLOCK": 4})

    assert key((1, 2)) == key((1, 2))
    assert (
        len({key((1, 2)), key((2, 1)), key((1, 2, 3)), key(((1, 2),)), key((1.0, 2)), key(())}) == 6
    )
