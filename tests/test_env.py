"""fastkernel's environment variables are read one way (``fastkernel._env``)."""

from __future__ import annotations

import pytest
from test_cache import run_python

from fastkernel import _env


@pytest.mark.parametrize(
    "raw, expected",
    [
        (None, "default"),
        ("", "default"),
        ("  ", "default"),
        ("0", False),
        ("false", False),
        (" OFF ", False),
        ("No", False),
        ("1", True),
        ("true", True),
        ("on", True),
        ("yes", True),
        ("2", True),
    ],
)
@pytest.mark.parametrize("default", [False, True])
def test_a_flag_is_off_for_0_false_off_no_and_on_for_anything_else(
    monkeypatch, raw, expected, default
):
    if raw is None:
        monkeypatch.delenv("FASTKERNEL_TEST_FLAG", raising=False)
    else:
        monkeypatch.setenv("FASTKERNEL_TEST_FLAG", raw)
    assert _env.flag("FASTKERNEL_TEST_FLAG", default) is (
        default if expected == "default" else expected
    )


def test_a_count_is_an_int_at_least_0_and_a_bad_one_names_the_variable(monkeypatch):
    monkeypatch.delenv("FASTKERNEL_TEST_COUNT", raising=False)
    assert _env.count("FASTKERNEL_TEST_COUNT", 7) == 7
    monkeypatch.setenv("FASTKERNEL_TEST_COUNT", " 12 ")
    assert _env.count("FASTKERNEL_TEST_COUNT", 7) == 12
    for bad in ("-1", "many", "1.5"):
        monkeypatch.setenv("FASTKERNEL_TEST_COUNT", bad)
        with pytest.raises(
            ValueError, match=f"FASTKERNEL_TEST_COUNT must be an int >= 0, got '{bad}'"
        ):
            _env.count("FASTKERNEL_TEST_COUNT", 7)


def test_triton_interpret_is_what_tritons_knob_says(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _env.triton_interpret()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not _env.triton_interpret()


_INTERPRETED_CHILD = r"""
import sys
import torch, triton, triton.language as tl
from fastkernel import fastkernel

@fastkernel
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)

assert type(add_kernel).__name__ == "_InterpretedKernel", type(add_kernel)
x, y = torch.arange(100.0), torch.full((100,), 0.5)
out = torch.empty(100)
add_kernel[(2,)](x, y, out, 100, BLOCK=64)
assert torch.equal(out, x + y)
# Both decorators go above it as on the native path, giving Triton's own over Triton's kernel.
import fastkernel as fk
from triton.runtime.autotuner import Autotuner, Heuristics

for tuned in (
    fk.heuristics(values={"BLOCK": lambda a: 64})(add_kernel),
    fk.heuristics(values={"BLOCK": lambda a: 64}, key=["n"])(add_kernel),
    fk.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n"])(
        add_kernel
    ),
):
    assert isinstance(tuned, (Autotuner, Heuristics)), type(tuned)
    out.zero_()
    tuned[(4,)](x, y, out, 100)
    assert torch.equal(out, x + y), type(tuned)
try:
    fastkernel(add_kernel.fn, num_warps=4)
except TypeError as e:
    assert "jit options" in str(e), e
else:
    raise AssertionError("jit options on an interpreted function were accepted")
print("ok")
"""


def test_import_leaves_triton_s_interpreter_unimported():
    """Triton's interpreter module costs about a third of ``import fastkernel``; Triton itself
    imports it only under ``TRITON_INTERPRET=1``, and so does fastkernel."""
    done = run_python(
        "import sys, torch, triton, fastkernel\n"
        "assert 'triton.runtime.interpreter' not in sys.modules\n"
        "print('ok')",
        TRITON_INTERPRET="0",
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_under_triton_interpret_a_kernel_runs_in_triton_s_interpreter():
    """A kernel that ``triton.jit`` made an ``InterpretedFunction`` under ``TRITON_INTERPRET=1``
    is recognized without fastkernel importing the interpreter itself, and runs in the
    interpreter on CPU tensors; jit options with it are refused."""
    done = run_python(_INTERPRETED_CHILD, TRITON_INTERPRET="1")
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
