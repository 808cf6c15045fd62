"""What a callable grid receives: every declared parameter mapped to its argument, as Triton's
JITFunction.run passes its bound_args dict; fastkernel passes a read-only mapping read in
place (``_C.GridMeta``). Every way a grid function reads the dict must work the same, and a
grid function that keeps the mapping must never see a later call's arguments."""

from __future__ import annotations

import collections.abc
import copy
import operator

import kernels
import pytest
import torch
import triton

from fastkernel import _C, fastkernel

N = 256


def _args():
    x, y, out = torch.randn(N), torch.randn(N), torch.empty(N)
    return x, y, out


def test_the_grid_sees_every_parameter_as_tritons_dict(stand_in):
    x, y, out = _args()
    seen = []

    def grid(meta):
        seen.append(
            {
                "getitem": meta["BLOCK"],
                "get": (meta.get("n"), meta.get("missing"), meta.get("missing", 7)),
                "len": len(meta),
                "iter": list(meta),
                "in": ("out_ptr" in meta, "nope" in meta, 3 in meta),
                "keys": list(meta.keys()),
                "items": [
                    (k, v if not isinstance(v, torch.Tensor) else v.data_ptr())
                    for k, v in meta.items()
                ],
                "values_len": len(list(meta.values())),
                "double_star": sorted(dict(**meta)),
                "copy_is_dict": type(meta.copy()) is dict,
                "mapping": isinstance(meta, collections.abc.Mapping),
                "eq": meta == {**meta},
                "repr": repr(meta).startswith("{'x_ptr':"),
            }
        )
        return (triton.cdiv(meta["n"], meta["BLOCK"]),)

    k = fastkernel(kernels.add_kernel)
    for _ in range(2):  # the miss (Python path) and the hit (native mapping)
        k[grid](x, y, out, N, BLOCK=64)
    names = ["x_ptr", "y_ptr", "out_ptr", "n", "BLOCK"]
    expected = {
        "getitem": 64,
        "get": (N, None, 7),
        "len": 5,
        "iter": names,
        "in": (True, False, False),
        "keys": names,
        "items": [
            ("x_ptr", x.data_ptr()),
            ("y_ptr", y.data_ptr()),
            ("out_ptr", out.data_ptr()),
            ("n", N),
            ("BLOCK", 64),
        ],
        "values_len": 5,
        "double_star": sorted(names),
        "copy_is_dict": True,
        "mapping": True,
        "eq": True,
        "repr": True,
    }
    assert seen[-1] == expected
    assert k.stats()["hits"] == 1
    assert [l.grid for l in stand_in.launches()] == [(4, 1, 1), (4, 1, 1)]


def test_the_mapping_answers_the_rest_of_dicts_reads_as_the_dict_does(stand_in):
    x, y, out = _args()
    k = fastkernel(kernels.add_kernel)
    seen = []

    def grid(meta):
        d = dict(meta)
        outcomes = []
        for read in (
            lambda m: m | {"extra": 1},
            lambda m: {"extra": 1} | m,
            lambda m: list(reversed(m)),
            lambda m: copy.copy(m),
            lambda m: m.get([1], 2),  # an unhashable key: TypeError, as from a dict
            lambda m: [1] in m,
            lambda m: m[[1]],
        ):
            try:
                outcomes.append(read(meta) == read(d))
            except TypeError as exc:
                try:
                    read(d)
                    outcomes.append(f"only the mapping raised {exc}")
                except TypeError:
                    outcomes.append("TypeError")
        seen.append(outcomes)
        return (tuple([1]),)[0]  # called in Python: outside the grid programs' forms

    for _ in range(2):
        k[grid](x, y, out, N, BLOCK=64)
    assert seen[-1] == [True, True, True, True, "TypeError", "TypeError", "TypeError"]
    assert k._grid_counts() == (0, 2)


@pytest.mark.parametrize(
    "grid,expected",
    [
        ({0: 5}, (5, 1, 1)),  # Triton reads len(grid), grid[0], ...: a dict by its keys 0..2
        ({0: 3, 1: 2}, (3, 2, 1)),
        ([4, 2], (4, 2, 1)),
        ({4}, TypeError),  # no grid[0]
        (frozenset({4}), TypeError),
        ((i for i in (2, 3)), TypeError),  # no len()
    ],
)
def test_a_grid_other_than_a_tuple_is_read_as_triton_reads_it(stand_in, grid, expected):
    x, y, out = _args()
    k = fastkernel(kernels.add_kernel)
    for given in (grid, lambda meta, g=grid: g):
        if isinstance(expected, tuple):
            k[given](x, y, out, N, BLOCK=64)
            assert stand_in.launches()[-1].grid == expected
        else:
            before = len(stand_in.launches())
            with pytest.raises(expected):
                k[given](x, y, out, N, BLOCK=64)
            assert len(stand_in.launches()) == before


def test_a_missing_key_raises_keyerror_and_the_mapping_is_read_only(stand_in):
    x, y, out = _args()
    k = fastkernel(kernels.add_kernel)
    k[(1,)](x, y, out, N, BLOCK=64)
    errors = []

    def grid(meta):
        for attempt in (lambda: meta["nope"], lambda: operator.setitem(meta, "n", 3)):
            try:
                attempt()
            except (KeyError, TypeError) as exc:
                errors.append(type(exc).__name__)
        return (1,)

    k[grid](x, y, out, N, BLOCK=64)
    assert errors == ["KeyError", "TypeError"]
    assert k.stats()["hits"] == 1  # the tuple-grid call registered it


def test_a_kept_mapping_holds_its_own_call_not_a_later_one(stand_in):
    x, y, out = _args()
    k = fastkernel(kernels.add_kernel)
    k[(1,)](x, y, out, N, BLOCK=64)
    kept = []

    def grid(meta):
        kept.append(meta)
        return (1,)

    for n in (N, N - 16, N - 32):
        k[grid](x, y, out, n, BLOCK=64)
    assert [m["n"] for m in kept] == [N, N - 16, N - 32]
    assert [dict(m)["n"] for m in kept] == [N, N - 16, N - 32]
    assert all(type(m).__name__ == "GridMeta" for m in kept)


def test_a_grid_that_launches_the_kernel_again_gets_its_own_mapping(stand_in):
    x, y, out = _args()
    k = fastkernel(kernels.add_kernel)
    k[(1,)](x, y, out, N, BLOCK=64)
    k[(1,)](x, y, out, N - 16, BLOCK=64)
    seen = []

    def inner(meta):
        seen.append(("inner", meta["n"]))
        return (1,)

    def outer(meta):
        seen.append(("outer before", meta["n"]))
        k[inner](x, y, out, N - 16, BLOCK=64)
        seen.append(("outer after", meta["n"]))
        return (2,)

    k[outer](x, y, out, N, BLOCK=64)
    assert seen == [("outer before", N), ("inner", N - 16), ("outer after", N)]
    assert [l.grid[0] for l in stand_in.launches()[-2:]] == [1, 2]


def test_the_mapping_type_is_not_constructible_from_python():
    with pytest.raises(TypeError):
        _C.GridMeta()
