"""Bad input gets a clear exception naming the argument; nothing crashes, nothing launches."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import kernels
import pytest
import torch
import triton
import triton.language as tl
from conftest import TEST_STREAM
from triton_reference import TritonReference, assert_same_launch

from fastkernel import CudaError, fastkernel

REPO_TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def add(stand_in):
    return fastkernel(kernels.add_kernel)


X = torch.randn(64)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (
            lambda k: k[(1,)](X, X, X, 64, 64, 5),
            TypeError,
            "add_kernel takes 5 arguments but 6 were given",
        ),
        (
            lambda k: k[(1,)](X, X, X, 64, BLOCK=64, bogus=1),
            TypeError,
            "unexpected keyword argument 'bogus'",
        ),
        (lambda k: k[(1,)](X, X, X, BLOCK=64), TypeError, "missing required argument 'n'"),
        (
            lambda k: k[(1,)](X, X, X, 64, BLOCK=64, n=3),
            TypeError,
            "multiple values for argument 'n'",
        ),
        (
            lambda k: k[(1,)](X, X, X, 64, BLOCK=64, stream=0),
            TypeError,
            "unexpected keyword argument 'stream'",
        ),
        (lambda k: k[(1,)](X, X, X, 2**64, BLOCK=64), OverflowError, "argument 'n'"),
        (lambda k: k[(-1,)](X, X, X, 64, BLOCK=64), ValueError, r"grid\[0\]"),
        (lambda k: k[(1, 70000)](X, X, X, 64, BLOCK=64), ValueError, r"grid\[1\]"),
        (lambda k: k[(1, 1, 1, 1)](X, X, X, 64, BLOCK=64), ValueError, "1 to 3 dimensions"),
        (lambda k: k[(1.5,)](X, X, X, 64, BLOCK=64), TypeError, r"grid\[0\] must be an int"),
        (lambda k: k["abc"](X, X, X, 64, BLOCK=64), TypeError, r"grid\[0\] must be an int"),
        (lambda k: k[5](X, X, X, 64, BLOCK=64), TypeError, "grid must be a tuple"),
        (lambda k: k[lambda meta: None](X, X, X, 64, BLOCK=64), TypeError, "grid must be a tuple"),
    ],
    ids=[
        "too_many",
        "unknown_keyword",
        "missing",
        "duplicate",
        "stream_keyword",
        "int_overflow",
        "negative_grid",
        "grid_y_limit",
        "grid_4d",
        "float_grid",
        "str_grid",
        "int_grid",
        "callable_grid_returns_none",
    ],
)
def test_bad_calls_raise_and_launch_nothing(add, stand_in, call, exc, match):
    with pytest.raises(exc, match=match):
        call(add)
    assert stand_in.launches() == []


def test_tensor_where_an_int_is_declared(stand_in):
    k = fastkernel(kernels.typed_kernel)
    out = torch.empty(16)
    with pytest.raises(TypeError, match="argument 'n': expected i32, got a tensor"):
        k[(1,)](out, out, 2, 3, BLOCK=16)
    assert stand_in.launches() == []


@triton.jit
def scale_kernel(out_ptr, s: tl.float32, n: tl.int32, BLOCK: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.zeros([BLOCK], tl.float32) + s * n)


def test_one_element_tensors_for_annotated_scalars_launch_as_triton_packs_them(stand_in):
    # Triton's launcher reads the value of a one-element tensor given for a scalar parameter
    # (float() / int() of it); the native packer has only its address, so such a call goes
    # through Triton, counted as a fallback, launching what Triton launches.
    out = torch.empty(16)
    calls = [(torch.tensor(2.5), 3), (2.5, torch.tensor(3))]
    k = fastkernel(scale_kernel)
    for s, n in calls:
        with TritonReference(stand_in, TEST_STREAM) as reference:
            theirs = reference.launch(scale_kernel, (1,), out, s, n, BLOCK=16)
            k[(1,)](out, s, n, BLOCK=16)
        assert_same_launch(stand_in.launches()[-1], theirs)
    reasons = k.stats()["fallback_reasons"]
    assert any("argument 's' is a one-element tensor for a fp32 parameter" in r for r in reasons)
    with pytest.raises(TypeError, match="argument 's': expected fp32, got a tensor"):
        k[(1,)](out, torch.ones(2), 3, BLOCK=16)  # a value Triton cannot read either


def test_int_where_a_tensor_was_passed_before(stand_in):
    k = fastkernel(kernels.add_kernel)
    k[(1,)](X, X, X, 64, BLOCK=64)
    with pytest.raises(TypeError, match="argument 'x_ptr' is int but earlier calls passed tensor"):
        k[(1,)](12345, X, X, 64, BLOCK=64)
    assert len(stand_in.launches()) == 1


@triton.jit
def bias_kernel(out_ptr, b_ptr, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK <= 64, "BLOCK too large")
    offs = tl.arange(0, BLOCK)
    v = tl.zeros([BLOCK], tl.float32)
    if b_ptr is not None:
        v += tl.load(b_ptr + offs)
    tl.store(out_ptr + offs, v)


def test_none_for_an_optional_pointer_leaves_the_compile_error_as_triton_raises_it(stand_in):
    # None where earlier calls passed a tensor is Triton's optional pointer, not a kind error:
    # the error of a compile failing for another reason (here a static_assert) is Triton's own.
    k = fastkernel(bias_kernel)
    out = torch.empty(128)
    k[(1,)](out, out, BLOCK=16)
    with pytest.raises(triton.CompilationError, match="BLOCK too large"):
        k[(1,)](out, None, BLOCK=128)
    assert len(stand_in.launches()) == 1


@pytest.mark.parametrize(
    "args,match",
    [
        ((2**40, 1, 1), "argument 'n': value 1099511627776 is out of range for i32"),
        ((1, 1, 300), "argument 'small': value 300 is out of range for u8"),
        ((1, 1, -1), "argument 'small': value -1 is out of range for u8"),
    ],
)
def test_int_out_of_range_for_declared_width(stand_in, args, match):
    k = fastkernel(kernels.typed_kernel)
    with pytest.raises(OverflowError, match=match):
        k[(1,)](torch.empty(16), *args, BLOCK=16)
    assert stand_in.launches() == []


def test_cpu_tensor_for_a_gpu_launch(stand_in):
    from fastkernel import _C

    _C._testing.set_host_testing(False)
    k = fastkernel(kernels.add_kernel)
    with pytest.raises(ValueError, match="argument 'x_ptr' is a tensor on 'cpu'"):
        k[(1,)](X, X, X, 64, BLOCK=64)
    assert stand_in.launches() == []


@pytest.mark.parametrize(
    "tensor,layout",
    [
        (lambda: torch.zeros(64).to_sparse(), "Sparse"),
        (lambda: torch.zeros(8, 8).to_sparse_csr(), "SparseCsr"),
    ],
    ids=["sparse_coo", "sparse_csr"],
)
def test_a_tensor_without_strided_storage_names_its_layout(add, stand_in, tensor, layout):
    """A tensor with no data pointer (a non-strided layout) gets the layout error for its
    argument, whether it comes first or after a tensor that was fine."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: sparse CSR support is in beta
        t = tensor()
    for args in ((t, X, X), (X, X, t)):
        name = "x_ptr" if args[0] is t else "out_ptr"
        with pytest.raises(
            ValueError, match=f"argument '{name}' is a tensor with a {layout} layout"
        ):
            add[(1,)](*args, 64, BLOCK=64)
    assert stand_in.launches() == []


def test_a_strided_tensor_without_storage_keeps_torchs_error(add, stand_in):
    """Inside torch.func.vmap the argument is a batched tensor: strided, with no storage, so
    data_ptr() refuses it. The call raises torch's own error (with the kernel's name), as
    Triton's launcher would on its data_ptr() call, and launches nothing."""

    def call(t):
        add[(1,)](t, X, X, 64, BLOCK=64)
        return t

    with pytest.raises(RuntimeError, match="add_kernel: Cannot access data pointer of Tensor"):
        torch.func.vmap(call)(torch.zeros(2, 64))
    assert stand_in.launches() == []


@pytest.mark.parametrize("name", ["num_warps", "BLOCK"])
def test_a_keyword_repeated_in_a_hand_built_kwnames_takes_tritons_path(add, stand_in, name):
    """Only a C caller can pass one keyword twice (CPython's call syntax never does): 70 times
    here, past the native buffer of set options. The call is not bound natively; Triton's path
    takes it, where **kwargs keeps the last value, and it is counted with its reason."""
    _testcapi = pytest.importorskip("_testcapi")
    values = {"num_warps": (1,) * 69 + (2,), "BLOCK": (16,) * 69 + (64,)}[name]
    kwnames = (name,) * 70 + (("BLOCK",) if name == "num_warps" else ())
    args = (X, X, X, 64, *values) + ((64,) if name == "num_warps" else ())
    with TritonReference(stand_in, TEST_STREAM):
        _testcapi.pyobject_vectorcall(add[(1,)], args, kwnames)
    (launch,) = stand_in.launches()
    assert launch.block == ((64, 1, 1) if name == "num_warps" else (128, 1, 1))
    stats = add.stats()
    assert stats["fallbacks"] == 1
    assert stats["fallback_reasons"] == {"a keyword given twice in one call's kwnames": 1}


def test_failed_launch_names_the_cuda_error_and_kernel(add, stand_in):
    add[(1,)](X, X, X, 64, BLOCK=64)
    stand_in.set_launch_result(700)
    try:
        with pytest.raises(
            CudaError, match=r"'add_kernel'.*CUDA_ERROR_ILLEGAL_ADDRESS \(700\)"
        ) as info:
            add[(1,)](X, X, X, 64, BLOCK=64)
    finally:
        stand_in.set_launch_result(0)
    assert info.value.code == 700
    assert isinstance(info.value, RuntimeError)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO_TESTS,
        timeout=300,
    )


def test_no_driver_imports_and_fails_at_first_launch():
    result = _run(
        """
        import torch, fastkernel, kernels
        from fastkernel import _C
        k = fastkernel.fastkernel(kernels.add_kernel)
        assert not _C.driver_loaded()
        _C._testing.set_host_testing(True, 0, 0)
        x = torch.zeros(16)
        try:
            k[(1,)](x, x, x, 16, BLOCK=16)
        except fastkernel.DriverUnavailableError as e:
            assert isinstance(e, RuntimeError)
            print("RAISED:", e)
    """,
        FASTKERNEL_CUDA_DRIVER="/nonexistent/libcuda.so.1",
    )
    assert result.returncode == 0, result.stderr
    assert (
        "RAISED: fastkernel: cannot open the CUDA driver library '/nonexistent/libcuda.so.1'"
        in result.stdout
    )


def test_import_under_another_torch_raises_clearly():
    result = _run("""
        import torch
        torch.__version__ = "0.0.1"
        try:
            import fastkernel
        except ImportError as e:
            print("RAISED:", e)
    """)
    assert result.returncode == 0, result.stderr
    assert "RAISED: fastkernel was built against torch" in result.stdout
    assert "torch 0.0.1 is installed" in result.stdout


def test_decorator_rejects_non_functions():
    with pytest.raises(TypeError, match="decorates functions"):
        fastkernel(42)


def test_jit_options_with_a_decorated_kernel_are_refused_not_dropped():
    k = fastkernel(kernels.add_kernel)
    assert fastkernel(k) is k
    with pytest.raises(TypeError, match="jit options can only be given with a plain function"):
        fastkernel(k, do_not_specialize=["n"])
    with pytest.raises(TypeError, match="jit options can only be given with a plain function"):
        fastkernel(kernels.add_kernel, do_not_specialize=["n"])


# -- error order: arity and keywords, then kinds, then values ---------------------------------------


def _entry_points():
    """Each Python entry point over add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK): @fastkernel,
    the patch over a plain Triton kernel, fastkernel.autotune, fastkernel.heuristics, and
    Triton's own autotune and heuristics under the patch."""
    import triton

    from fastkernel import autotune, heuristics

    configs = [triton.Config({"BLOCK": 64})]
    return {
        "fastkernel": lambda: fastkernel(kernels.add_kernel),
        "patched": lambda: triton.jit(kernels.add_kernel.fn),
        "fastkernel.autotune": lambda: autotune(configs, key=["n"])(
            fastkernel(triton.jit(kernels.add_kernel.fn))
        ),
        "fastkernel.heuristics": lambda: heuristics({"BLOCK": lambda args: 64})(
            fastkernel(triton.jit(kernels.add_kernel.fn))
        ),
        "triton.autotune patched": lambda: triton.autotune(configs, key=["n"])(
            triton.jit(kernels.add_kernel.fn)
        ),
        "triton.heuristics patched": lambda: triton.heuristics({"BLOCK": lambda args: 64})(
            triton.jit(kernels.add_kernel.fn)
        ),
    }


@pytest.mark.parametrize("entry", list(_entry_points()))
def test_a_missing_argument_is_reported_before_a_cpu_tensor(stand_in, entry):
    """Python binds all arguments before it checks any value: a call missing ``n`` with CPU
    tensors is a TypeError for ``n``, not a ValueError for the first tensor."""
    import fastkernel as fk
    from fastkernel import _C

    _C._testing.set_host_testing(False)
    with fk.patched():
        kernel = _entry_points()[entry]()
        block = {} if "autotune" in entry or "heuristics" in entry else {"BLOCK": 64}
        with pytest.raises(TypeError, match="missing .*argument.*'(n|out_ptr)'"):
            kernel[(1,)](X, X, **block)
        with pytest.raises(TypeError, match="missing .*argument.*'n'"):
            kernel[(1,)](X, X, X, **block)
        with pytest.raises(ValueError, match="argument 'x_ptr' is a tensor on 'cpu'"):
            kernel[(1,)](X, X, X, 64, **block)  # complete: now the value error
    assert stand_in.launches() == []


def test_an_fp16_scalar_past_the_largest_half_raises_as_tritons_launcher_does(stand_in):
    """Triton packs an fp16 scalar with CPython's PyFloat_Pack2, which refuses a finite value
    that rounds past 65504 (OverflowError); infinities and NaN pass. Found by
    scripts/reliability/fuzz_calls.py: fastkernel sent inf."""
    k = fastkernel(kernels.scalars_kernel)
    out = torch.empty(16)
    args = [out, 5, 2**40, 2**63 + 5, 1.25, None, -2.7, 3.14159, True, None, 1]
    for h, ok in [
        (65504.0, True),
        (65519.0, True),
        (float("inf"), True),
        (65520.0, False),
        (1e40, False),
        (-1e40, False),
    ]:
        args[5] = h
        if ok:
            k[(1,)](*args, BLOCK=16)
        else:
            with pytest.raises(OverflowError, match="argument 'h'.*out of range for fp16"):
                k[(1,)](*args, BLOCK=16)
    assert len(stand_in.launches()) == 3


def test_an_empty_grid_still_checks_the_arguments(stand_in):
    """Triton's launcher converts every argument before it skips an empty grid, so a float for
    an int64 parameter raises even then. Found by scripts/reliability/fuzz_calls.py."""
    k = fastkernel(kernels.typed_kernel)
    out = torch.empty(16)
    k[(0,)](out, 3, 4, 5, BLOCK=16)  # launches nothing
    with pytest.raises(TypeError, match="argument 'big': expected i64, got a float"):
        k[(0,)](out, 3, 1.5, 5, BLOCK=16)
    assert stand_in.launches() == []


def _launched_pointers(launch) -> list[int]:
    return [int.from_bytes(p, "little") for p in launch.params[:3]]


def test_a_keyword_binding_is_reused_only_for_its_positional_count(add, stand_in):
    """CPython passes every call site of one function with the same literal keywords the same
    kwnames tuple; the binding the native entry keeps for that tuple holds only for the
    positional count it was checked with."""
    a, b, c = torch.randn(64), torch.randn(64), torch.randn(64)

    def call(positional_n: bool):
        if positional_n:
            return add[(1,)](a, b, c, 64, n=64, BLOCK=64)
        return add[(1,)](a, b, c, n=64, BLOCK=64)

    assert call.__code__.co_consts.count(("n", "BLOCK")) == 1  # one tuple for both sites
    call(False)
    with pytest.raises(TypeError, match="multiple values for argument 'n'"):
        call(True)
    call(False)
    assert len(stand_in.launches()) == 2


def test_keyword_call_sites_bind_each_their_own_way(add, stand_in):
    """Alternating call sites with different keywords (and a rejected one between them) each
    launch their own arguments in their parameters' places."""
    a, b, c = torch.randn(64), torch.randn(64), torch.randn(64)
    expected = [a.data_ptr(), b.data_ptr(), c.data_ptr()]
    for _ in range(3):
        add[(1,)](a, b, c, n=64, BLOCK=64)
        add[(1,)](out_ptr=c, y_ptr=b, x_ptr=a, BLOCK=64, n=64)
        with pytest.raises(TypeError, match="unexpected keyword argument 'z_ptr'"):
            add[(1,)](a, b, z_ptr=c, n=64, BLOCK=64)
        add[(1,)](a, b, c, 64, BLOCK=64, num_warps=4)
    launches = stand_in.launches()
    assert len(launches) == 9
    assert all(_launched_pointers(launch) == expected for launch in launches)
    assert add.stats()["fallbacks"] == 0


def test_what_a_grid_items_index_or_len_raises_propagates(add, stand_in):
    """A grid dimension that is not an int gets the error naming it, but an exception its own
    ``__index__`` or ``__len__`` raises (a KeyboardInterrupt among them) propagates as it is."""

    class Interrupting:
        def __index__(self):
            raise KeyboardInterrupt

    class LengthFails:
        def __len__(self):
            raise ValueError("no length here")

    x = torch.randn(64)
    with pytest.raises(KeyboardInterrupt):
        add[(Interrupting(),)](x, x, x, 64, BLOCK=64)
    with pytest.raises(ValueError, match="no length here"):
        add[LengthFails()](x, x, x, 64, BLOCK=64)
    with pytest.raises(TypeError, match=r"grid\[0\] must be an int, got str"):
        add[("4",)](x, x, x, 64, BLOCK=64)
    with pytest.raises(TypeError, match="grid must be a tuple"):
        add[3.5](x, x, x, 64, BLOCK=64)
    assert stand_in.launches() == []
