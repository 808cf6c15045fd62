"""fastkernel.patch(): every Triton kernel's launches served natively, byte for byte what Triton's
own launcher sends (compared on the recording stand-in), and Triton exactly as it was after
unpatch()."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.jit import JITFunction, KernelInterface

import fastkernel
from fastkernel import _C, fastkernel as fk
from fastkernel.kernel import PATCH_ATTR

import corpus
import kernels
from conftest import TEST_STREAM
from test_corpus import triton_allocator_for_scratch  # noqa: F401 - a fixture used below
from triton_reference import TritonReference, assert_same_launch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
N = 4096


def _triton_attributes():
    """Every attribute the patch touches, by identity."""
    cf = getattr(triton.runtime.jit, "ConstexprFunction", None)
    return {
        "JITFunction": dict(JITFunction.__dict__),
        "KernelInterface.__getitem__": KernelInterface.__dict__["__getitem__"],
        "Autotuner": dict(Autotuner.__dict__),
        "Heuristics": dict(Heuristics.__dict__),
        "ConstexprFunction.__call__": cf.__dict__["__call__"] if cf else None,
    }


def _same_objects(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    return a is b


@pytest.fixture
def patch_on():
    assert not fastkernel.is_patched()
    assert fastkernel.patch()
    yield
    fastkernel.unpatch()


def _tensors():
    return torch.randn(N), torch.randn(N), torch.empty(N)


def _stats_of(jit_fn):
    return jit_fn.__dict__[PATCH_ATTR].stats()


def test_unpatch_leaves_every_triton_object_as_it_was(stand_in):
    before = _triton_attributes()
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM) as reference:
        # Triton fills a kernel's lazy attributes (its hash, the globals it read) on a launch.
        reference.launch(kernels.add_kernel, (4,), x, y, out, N, BLOCK=1024)
    kernel_dict = dict(kernels.add_kernel.__dict__)
    assert fastkernel.patch() and fastkernel.patch()  # idempotent
    assert _C.patch_slot_is_native(JITFunction)  # no Python frame between kernel[grid] and C
    kernels.add_kernel[(4,)](x, y, out, N, BLOCK=1024)
    assert PATCH_ATTR in kernels.add_kernel.__dict__
    fastkernel.unpatch()
    fastkernel.unpatch()  # idempotent
    after = _triton_attributes()
    for name in before:
        assert _same_objects(before[name], after[name]), name
    assert not _C.patch_slot_is_native(JITFunction)
    assert kernels.add_kernel.__dict__.keys() == kernel_dict.keys()
    assert all(kernels.add_kernel.__dict__[k] is v or kernels.add_kernel.__dict__[k] == v
               for k, v in kernel_dict.items())
    assert isinstance(kernels.add_kernel, JITFunction)


def test_kernels_made_before_and_after_the_patch_launch_natively(stand_in, patch_on):
    hits_before = fastkernel.stats().get("kernels.add_kernel", {"hits": 0})["hits"]
    made_after = JITFunction(kernels.add_kernel.fn)  # a new kernel, created under the patch
    table = {"add": kernels.add_kernel}  # a kernel held in a dict, as libraries do
    x, y, out = _tensors()
    for kernel in (kernels.add_kernel, made_after, table["add"]):
        for _ in range(3):
            kernel[(4,)](x, y, out, N, BLOCK=1024)
    assert _stats_of(kernels.add_kernel) == {**_stats_of(kernels.add_kernel), "misses": 1,
                                             "hits": 5, "fallbacks": 0}
    assert _stats_of(made_after)["hits"] == 2 and _stats_of(made_after)["fallbacks"] == 0
    assert len(stand_in.launches()) == 9
    names = fastkernel.stats()
    # Both objects, under module.qualname (other live kernels of that name are summed in too).
    assert names["kernels.add_kernel"]["hits"] - hits_before == 7


@pytest.mark.parametrize("style", ["tuple", "callable", "keywords", "num_warps", "run"])
def test_patched_launches_equal_triton_launches(style, stand_in):
    x, y, out = _tensors()
    grid = (4,) if style != "callable" else (lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),))
    extra = {"num_warps": 2} if style == "num_warps" else {}

    def call(kernel):
        if style == "keywords":
            return kernel[grid](x_ptr=x, y_ptr=y, out_ptr=out, n=N, BLOCK=1024)
        if style == "run":
            return kernel.run(x, y, out, N, BLOCK=1024, grid=grid, warmup=False)
        return kernel[grid](x, y, out, N, BLOCK=1024, **extra)

    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(kernels.add_kernel, (4,), x, y, out, N, BLOCK=1024, **extra)
    stand_in.reset()
    with fastkernel.patched():
        call(kernels.add_kernel)
        call(kernels.add_kernel)
        stats = _stats_of(kernels.add_kernel)
    ours = stand_in.launches()
    assert len(ours) == 2
    for launch in ours:
        assert_same_launch(launch, theirs)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 1, 0)


@pytest.mark.parametrize("name", list(corpus.CASES))
def test_every_corpus_case_launches_the_same_bytes_under_the_patch(name, stand_in,
                                                                   triton_allocator_for_scratch):
    case = corpus.CASES[name]
    calls: list = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append((self.kernel, grid, args, kwargs))
                reference.launch(self.kernel, grid, *args, **kwargs)
            return launch

    with TritonReference(stand_in, TEST_STREAM) as reference:
        case.run(corpus.wrap(case.kernel, Recorder), "cpu")
    theirs = stand_in.launches()
    stand_in.reset()
    with fastkernel.patched():
        for kernel, grid, args, kwargs in calls:  # the plain Triton kernels, as a library calls
            kernel[grid](*args, **kwargs)
        plain = case.kernel if isinstance(case.kernel, tuple) else (case.kernel,)
        stats = [_stats_of(k) for k in plain]
    ours = stand_in.launches()
    assert len(ours) == len(theirs) == len(calls)
    for mine, reference_launch in zip(ours, theirs):
        assert_same_launch(mine, reference_launch)
    for s in stats:
        assert s["fallbacks"] == 0 and s["misses"] >= 1, (name, s)


def test_triton_autotune_and_heuristics_launch_natively_underneath(stand_in, patch_on):
    tuned = triton.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4)],
                            key=["n"])(kernels.add_kernel)
    heuristic = triton.heuristics({"BLOCK": lambda args: 512})(kernels.add_kernel)
    x, y, out = _tensors()
    for _ in range(3):
        tuned[(4,)](x, y, out, N)
        heuristic[(8,)](x, y, out, N)
    stats = _stats_of(kernels.add_kernel)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 4, 0)
    launches = stand_in.launches()
    assert [launch.block for launch in launches] == [(128, 1, 1)] * 6
    assert [launch.grid for launch in launches] == [(4, 1, 1), (8, 1, 1)] * 3


def test_a_subclass_with_its_own_run_keeps_it(stand_in, patch_on):
    seen = []

    class Traced(JITFunction):
        def run(self, *args, grid, warmup, **kwargs):
            seen.append(grid)
            return super().run(*args, grid=grid, warmup=warmup, **kwargs)

    traced = Traced(kernels.add_kernel.fn)
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM):
        traced[(4,)](x, y, out, N, BLOCK=1024)
        traced.run(x, y, out, N, BLOCK=1024, grid=(4,), warmup=False)
    assert seen == [(4,), (4,)] and PATCH_ATTR not in traced.__dict__
    assert len(stand_in.launches()) == 2


def test_fastkernel_kernels_are_not_wrapped_twice(stand_in, patch_on):
    kernel = fk(kernels.add_kernel)
    x, y, out = _tensors()
    kernel[(4,)](x, y, out, N, BLOCK=1024)
    kernel[(4,)](x, y, out, N, BLOCK=1024)
    assert kernel.stats()["hits"] == 1 and PATCH_ATTR not in kernel.__dict__
    assert PATCH_ATTR not in kernels.add_kernel.__dict__  # its jit_function was not launched


def test_warmup_compiles_without_launching(stand_in, patch_on):
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.add_kernel.warmup(x, y, out, N, BLOCK=1024, grid=(4,))
    assert compiled is not None and hasattr(compiled, "metadata")
    assert stand_in.launches() == []


@pytest.mark.parametrize("variable", ["TRITON_INTERPRET", "FASTKERNEL_DISABLE"])
def test_patch_is_a_logged_no_op_when_disabled(variable, monkeypatch, caplog):
    before = _triton_attributes()
    monkeypatch.setenv(variable, "1")
    with caplog.at_level("INFO", logger="fastkernel"):
        assert fastkernel.patch() is False
    assert not fastkernel.is_patched() and variable in caplog.text
    after = _triton_attributes()
    assert all(_same_objects(before[k], after[k]) for k in before)


def test_an_unsupported_triton_is_refused_and_nothing_is_patched(monkeypatch):
    from fastkernel import _triton_abi
    before = _triton_attributes()
    monkeypatch.setattr(_triton_abi, "TRITON_VERSION", (3, 4))
    with pytest.raises(RuntimeError, match=r"Triton .* is not supported \(supported: 3\.5 to 3\.9\)"):
        fastkernel.patch()
    assert not fastkernel.is_patched()
    after = _triton_attributes()
    assert all(_same_objects(before[k], after[k]) for k in before)


def test_unpatch_while_other_threads_launch(stand_in):
    x, y, out = _tensors()
    stop = threading.Event()
    errors: list = []
    counts = [0] * 4

    def launcher(i):
        try:
            while not stop.is_set():
                kernels.add_kernel[(4,)](x, y, out, N, BLOCK=1024)
                counts[i] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with TritonReference(stand_in, TEST_STREAM):
        kernels.add_kernel[(4,)](x, y, out, N, BLOCK=1024)  # compiled by Triton beforehand
        threads = [threading.Thread(target=launcher, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for _ in range(50):
            fastkernel.patch()
            fastkernel.unpatch()
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert len(stand_in.launches()) == 1 + sum(counts)
    assert not fastkernel.is_patched() and PATCH_ATTR not in kernels.add_kernel.__dict__


def test_fallbacks_name_the_kernel_argument_type_and_reason(stand_in, patch_on, caplog):
    x, y, out = _tensors()

    class Opaque:
        pass

    with caplog.at_level("WARNING", logger="fastkernel"), TritonReference(stand_in, TEST_STREAM):
        kernels.constexpr_kernel[(1,)](out, SCALE=2.0, MODE=Opaque, BLOCK=64)
    reasons = fastkernel.stats()["kernels.constexpr_kernel"]["fallback_reasons"]
    (reason,) = reasons
    assert reason.startswith("argument 'MODE' of type type: a constexpr value")
    assert "constexpr_kernel" in caplog.text and "argument 'MODE'" in caplog.text


def _run_python(*args, env=None, cwd=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=600)


def test_fastkernel_patch_variable_patches_at_import():
    result = _run_python("-c", "import fastkernel; print(fastkernel.is_patched())",
                         env={"FASTKERNEL_PATCH": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_run_passes_argv_main_and_exit_status(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import sys, fastkernel\n"
        "print(__name__, sys.argv, fastkernel.is_patched())\n"
        "sys.exit(int(sys.argv[-1]))\n")
    result = _run_python("-m", "fastkernel", "run", str(script), "-h", "--x", "7")
    assert result.returncode == 7, result.stderr
    assert result.stdout.strip() == f"__main__ ['{script}', '-h', '--x', '7'] True"
    (tmp_path / "progmod.py").write_text(script.read_text())
    result = _run_python("-m", "fastkernel", "run", "-m", "progmod", "0", cwd=tmp_path,
                         env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("__main__ [") and result.stdout.strip().endswith("'0'] True")


def test_run_stats_lists_every_kernel_that_launched(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "import conftest, torch\n"
        "from fastkernel import _C\n"
        "_C._testing.set_host_testing(True, 0, conftest.TEST_STREAM)\n"
        "import kernels\n"
        "x = torch.randn(4096)\n"
        "for _ in range(3):\n"
        "    kernels.add_kernel[(4,)](x, x, x, 4096, BLOCK=1024)\n")
    result = _run_python("-m", "fastkernel", "run", "--stats", str(script))
    assert result.returncode == 0, result.stderr
    line = next(l for l in result.stderr.splitlines() if l.startswith("kernels.add_kernel"))
    assert line.split()[1:] == ["2", "1", "0"]  # hits, misses, fallbacks


# -- host helpers: triton.cdiv, triton.next_power_of_2 and other constexpr functions ------------


@triton.constexpr_function
def _scaled(x, scale=2):
    return x * scale


def _outcome(fn, *args, **kwargs):
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the outcome is compared, type and message
        return ("raised", type(exc), str(exc))


HELPER_CALLS = [
    (triton.cdiv, (4096, 1024), {}), (triton.cdiv, (4097, 1024), {}), (triton.cdiv, (-7, 2), {}),
    (triton.cdiv, (7, -2), {}), (triton.cdiv, (0, 5), {}), (triton.cdiv, (1, 0), {}),
    (triton.cdiv, (2**70, 3), {}), (triton.cdiv, (True, 1), {}), (triton.cdiv, (7.0, 2), {}),
    (triton.cdiv, (tl.constexpr(4096), 1024), {}), (triton.cdiv, (), {"x": 10, "y": 3}),
    (triton.cdiv, ("a", 2), {}), (triton.cdiv, (1,), {}), (triton.cdiv, (1, 2, 3), {}),
    (triton.next_power_of_2, (1000,), {}), (triton.next_power_of_2, (1,), {}),
    (triton.next_power_of_2, (0,), {}), (triton.next_power_of_2, (-5,), {}),
    (triton.next_power_of_2, (2**62,), {}), (triton.next_power_of_2, (2**62 + 1,), {}),
    (triton.next_power_of_2, (tl.constexpr(33),), {}), (triton.next_power_of_2, (3.5,), {}),
    (triton.next_power_of_2, (), {"n": 17}), (_scaled, (3,), {}), (_scaled, (3,), {"scale": 5}),
    (_scaled, (tl.constexpr(3),), {"scale": tl.constexpr(4)}),
]


def test_host_helpers_return_and_raise_what_triton_does():
    expected = [_outcome(fn, *a, **kw) for fn, a, kw in HELPER_CALLS]
    assert fastkernel.patch_host_helpers()
    try:
        got = [_outcome(fn, *a, **kw) for fn, a, kw in HELPER_CALLS]
        for v in range(-300, 300):
            for d in (1, 2, 3, 7, 16, 1024, -1, -5):
                assert triton.cdiv(v, d) == triton.cdiv.fn(v, d)
            if v > 0:
                assert triton.next_power_of_2(v) == triton.next_power_of_2.fn(v)
    finally:
        fastkernel.unpatch_host_helpers()
    for call, e, g in zip(HELPER_CALLS, expected, got):
        assert e == g and type(e[-1]) is type(g[-1]), call


def test_host_helpers_keep_the_code_generators_constexpr():
    cf = triton.runtime.jit.ConstexprFunction
    original = cf.__dict__["__call__"]
    with fastkernel.patched():
        assert cf.__dict__["__call__"] is not original
        # With _semantic (Triton's code generator), Triton's own __call__ runs: a constexpr.
        result = triton.cdiv(tl.constexpr(10), 4, _semantic=object())
        assert isinstance(result, tl.constexpr) and result.value == 3
    assert cf.__dict__["__call__"] is original


@pytest.mark.parametrize("version, ok", [("3.5.1", True), ("3.9.0", True), ("3.6.0+git1", True),
                                         ("3.4.0", False), ("3.10.0", False), ("4.0.0", False),
                                         ("nightly", False)])
def test_an_unsupported_triton_is_named_at_import(version, ok):
    if ok:
        fastkernel._check_triton_version(version)
    else:
        expected = ("cannot read Triton's version" if version == "nightly" else
                    rf"supports Triton 3\.5 to 3\.9, but Triton {re.escape(version)} is installed")
        with pytest.raises(ImportError, match=expected):
            fastkernel._check_triton_version(version)
