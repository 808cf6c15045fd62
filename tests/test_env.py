"""fastkernel's environment variables are read one way (``fastkernel._env``)."""

from __future__ import annotations

import pytest

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
