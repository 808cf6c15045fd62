"""Callable grids run as native programs (fastkernel._grid_program, csrc/python/grid_program.cpp).

A grid function that is one side-effect-free int expression is evaluated natively instead of
called. The launched grid must be exactly what calling the function gives, every input (the
call's arguments, closure cells, globals, module attributes) read anew on each call, and
anything outside the fast case must reach the function itself, so that its value, its side
effects and its exceptions are Python's."""

from __future__ import annotations

import dis
import gc
import math
import pathlib
import shutil
import subprocess
import sys
import textwrap
import weakref

import kernels
import pytest
import torch
import triton

from fastkernel import _C, _grid_program, fastkernel

N = 256
NAMES = ("x_ptr", "y_ptr", "out_ptr", "n", "BLOCK")
SCALE = 3  # a global some grids read


def _args():
    return torch.randn(N), torch.randn(N), torch.empty(N)


def _expected(grid, n: int, block: int) -> tuple[int, int, int]:
    """The grid calling the function gives, as the launch reads it (1 for missing dims)."""
    dims = tuple(grid({"x_ptr": None, "y_ptr": None, "out_ptr": None, "n": n, "BLOCK": block}))
    return tuple(dims) + (1,) * (3 - len(dims))


def _launch(k, grid, n=N, block=64):
    x, y, out = _args()
    k[grid](x, y, out, n, BLOCK=block)


def _counts(k) -> tuple[int, int]:
    return tuple(k._grid_counts())


def _closure_grids():
    H, B, big = 4, 3, 2**40

    def tutorial(meta):
        return (triton.cdiv(meta["n"], meta["BLOCK"]),)

    return {
        "tutorial": tutorial,
        "lambda": lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
        "fla": lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]), H, B * H),
        "constant": lambda meta: (7,),
        "constant3": lambda meta: (2, 3, 4),
        "list": lambda meta: [meta["n"] // meta["BLOCK"] + 1, meta["n"] % 5 + 1],
        "global": lambda meta: (SCALE * meta["BLOCK"] // 16,),
        "npo2": lambda meta: (triton.next_power_of_2(meta["n"]) // 8 + 1,),
        "maxmin": lambda meta: (max(1, meta["n"] // 1000), min(meta["BLOCK"], 8, 9)),
        "negative_floor": lambda meta: ((meta["n"] - 1000) // 7 + 200, (meta["n"] - 1000) % 7 + 1),
        "negative_divisor": lambda meta: (meta["n"] // -7 + 1000, meta["n"] % -7 + 10),
        "big_closure": lambda meta: (big // 2**30 - 1000,),
        "nested_cdiv": lambda meta: (triton.cdiv(triton.cdiv(meta["n"], 2), meta["BLOCK"] - 60),),
    }


def test_translations_are_kept_while_the_code_lives_and_not_after():
    """A code object is translated once per kernel signature, and the translation cache holds
    no reference to it: a grid function made by exec'd or generated code is freed with it."""
    grid = eval("lambda meta: (meta['n'] // 48611 + 1,)")  # a constant no other test uses
    first = _grid_program.compile_grid(grid.__code__, NAMES)
    assert first is not None
    assert _grid_program.compile_grid(grid.__code__, NAMES) is first
    other_names = ("a", "b", "c", "n", "BLOCK")
    assert _grid_program.compile_grid(grid.__code__, other_names) == (("ARG", 3),) + first[1:]
    code = weakref.ref(grid.__code__)
    del grid
    gc.collect()
    assert code() is None


@pytest.mark.parametrize("name", sorted(_closure_grids()))
def test_a_native_grid_launches_what_the_function_returns(stand_in, name):
    grid = _closure_grids()[name]
    assert _grid_program.compile_grid(grid.__code__, NAMES) is not None
    k = fastkernel(kernels.add_kernel)
    for n in (N, 512, 4096):  # one specialization: the first call misses, two hit
        _launch(k, grid, n=n)
        assert stand_in.last_launch().grid == _expected(grid, n, 64)
    native, called = _counts(k)
    assert k.stats()["hits"] == 2
    assert native == 3 and called == 0  # the miss's launch, too


def test_the_tutorial_grid_is_native_with_and_without_the_host_helpers(stand_in):
    from fastkernel import _host_helpers

    grid = _closure_grids()["tutorial"]
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    installed = _host_helpers.installed()
    try:
        for install in (_host_helpers.install, _host_helpers.uninstall):
            install()
            _launch(k, grid)
            assert stand_in.last_launch().grid == (4, 1, 1)
    finally:
        (_host_helpers.install if installed else _host_helpers.uninstall)()
    assert _counts(k) == (2, 0)


def test_every_input_is_read_anew_on_each_call(stand_in):
    global SCALE
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    grid = _closure_grids()["global"]
    saved = SCALE
    try:
        for scale in (3, 5, 8):
            SCALE = scale
            _launch(k, grid)
            assert stand_in.last_launch().grid == (scale * 64 // 16, 1, 1)
    finally:
        SCALE = saved

    blocks = 2

    def grid_of_cell(meta):
        return (blocks * meta["BLOCK"] // 64,)

    for blocks in (2, 6):  # the closure cell is rebound
        _launch(k, grid_of_cell)
        assert stand_in.last_launch().grid == (blocks, 1, 1)

    # A library wrapper makes a new function per call over its own locals: one program.
    for n in (64, 128, 640):
        _launch(k, (lambda size: lambda meta: (triton.cdiv(size, meta["BLOCK"]),))(n))
        assert stand_in.last_launch().grid == (math.ceil(n / 64), 1, 1)

    def grid_of_default(meta, g=(3,)):
        return g

    for g in ((3,), (4, 2), (5, 6, 7)):  # the default is replaced
        grid_of_default.__defaults__ = (g,)
        _launch(k, grid_of_default)
        assert stand_in.last_launch().grid == g + (1,) * (3 - len(g))
    assert _counts(k) == (3 + 2 + 3 + 3, 0)


def test_a_module_call_on_plain_operands_reads_callee_and_operands_anew(stand_in, monkeypatch):
    """`triton.cdiv(a, b)` whose operands are arguments, constants or closure cells runs as one
    native step: the callee is looked up and each operand read on every call, a rebound cell
    and a replaced module attribute are seen, and an operand that is not a 64-bit int (a bool,
    an int past 64 bits) leaves the call to Python, whose result is launched."""
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    size = 1000

    def by_cell(meta):
        return (triton.cdiv(size, meta["BLOCK"]) % 1000 + 1, triton.cdiv(meta["n"], 100), 2)

    for size in (1000, 64, 2**40, True, 2**70, 3000):  # rebound in the same function
        _launch(k, by_cell)
        assert stand_in.last_launch().grid == _expected(by_cell, N, 64), size
    assert _counts(k) == (4, 2)  # the bool and the 2**70 call the function

    npo2 = lambda meta: (triton.next_power_of_2(meta["n"]),)  # noqa: E731
    _launch(k, npo2, n=300)
    assert stand_in.last_launch().grid == (512, 1, 1)
    calls: list = []
    monkeypatch.setattr(triton, "next_power_of_2", lambda n: calls.append(n) or 7)
    _launch(k, npo2, n=300)
    assert stand_in.last_launch().grid == (7, 1, 1) and calls == [300]
    monkeypatch.undo()
    _launch(k, npo2, n=300)
    assert stand_in.last_launch().grid == (512, 1, 1) and calls == [300]
    assert _counts(k) == (4 + 2, 2 + 1)


def test_a_cached_lookup_is_dropped_when_its_dict_changes(stand_in, monkeypatch):
    """Global and module-attribute lookups are cached by the dict's version: a global that
    shadows a builtin, a module attribute replaced, and the same code with other globals must
    all be seen on the next call."""
    import types

    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    calls: list = []
    uses_max = lambda meta: (max(meta["BLOCK"] // 16, 2),)  # noqa: E731
    for _ in range(2):
        _launch(k, uses_max)
        assert stand_in.last_launch().grid == (4, 1, 1)

    def shadow(a, b):
        calls.append("max")
        return 9

    monkeypatch.setitem(globals(), "max", shadow)  # the module's global now shadows max
    _launch(k, uses_max)
    assert stand_in.last_launch().grid == (9, 1, 1) and calls == ["max"]
    monkeypatch.delitem(globals(), "max")
    _launch(k, uses_max)
    assert stand_in.last_launch().grid == (4, 1, 1) and calls == ["max"]

    tutorial = _closure_grids()["lambda"]
    _launch(k, tutorial)

    def other_cdiv(a, b):
        calls.append("cdiv")
        return 11

    monkeypatch.setattr(triton, "cdiv", other_cdiv)
    _launch(k, tutorial)
    assert stand_in.last_launch().grid == (11, 1, 1) and calls[-1] == "cdiv"
    monkeypatch.undo()
    _launch(k, tutorial)
    assert stand_in.last_launch().grid == (4, 1, 1) and len(calls) == 2

    # The same code object with other globals: its own lookups.
    with_globals = types.FunctionType(
        _closure_grids()["global"].__code__, {**globals(), "SCALE": 7}
    )
    _launch(k, with_globals)
    assert stand_in.last_launch().grid == (7 * 64 // 16, 1, 1)
    _launch(k, _closure_grids()["global"])
    assert stand_in.last_launch().grid == (SCALE * 64 // 16, 1, 1)
    assert _counts(k) == (2 + 1 + 2 + 2, 2)


def test_python_run_by_a_lookup_cannot_free_the_running_program(stand_in):
    """A globals dict with a key whose __eq__ runs Python: looking a name up calls it, and here
    it launches the kernel with ten other grid functions, replacing every cached program, the
    running one included, in the middle of its run. The run must finish on its own copy (the
    sanitizer build of CI checks that no freed memory is read)."""
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    evicting = [eval(f"lambda meta: ({i + 1},)") for i in range(10)]  # ten code objects

    class Collider:
        armed = False

        def __hash__(self):
            return hash("SCALE_X")

        def __eq__(self, other):
            if Collider.armed:  # not while the dict is filled
                Collider.armed = False
                for grid in evicting:
                    _launch(k, grid)
            return False

    namespace = {Collider(): 0}
    namespace["SCALE_X"] = 3
    grid = eval("lambda meta: (SCALE_X * 2,)", namespace)
    Collider.armed = True
    _launch(k, grid)
    assert not Collider.armed  # the lookup ran it
    assert stand_in.last_launch().grid == (6, 1, 1)
    assert [launch.grid[0] for launch in stand_in.launches()[-11:-1]] == list(range(1, 11))
    native, called = _counts(k)
    assert native == 11 and called == 0


def test_a_parameter_without_a_default_raises_as_the_call_does(stand_in):
    """Triton passes only the mapping: a grid function with another required parameter raises
    TypeError when called, even when its body never reads that parameter."""
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))

    def reads_a_default(meta, x, y=1):
        return (y, meta["n"] // 64)

    for grid in (lambda meta, x: (1, 2), reads_a_default):
        assert _grid_program.compile_grid(grid.__code__, NAMES) is not None
        with pytest.raises(TypeError, match="missing 1 required positional argument"):
            _launch(k, grid)
    assert _counts(k) == (0, 2)


def test_globals_that_are_an_instance_dict_are_read_on_every_call(stand_in):
    """An instance __dict__ as a function's globals: on CPython 3.13 an attribute assignment
    can change it without a new dict version, so its lookups are never cached."""
    import types

    class Namespace:
        pass

    ns = Namespace()
    ns.BLOCKS = 3
    grid = types.FunctionType((lambda meta: (BLOCKS,)).__code__, vars(ns))  # noqa: F821
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    for blocks in (3, 10**12 + 1, 5):  # the middle one is a Python int object, then freed
        ns.BLOCKS = blocks
        if blocks > 2**31:
            with pytest.raises(ValueError):
                _launch(k, grid)
        else:
            _launch(k, grid)
            assert stand_in.last_launch().grid == (blocks, 1, 1)


def test_a_module_whose_class_changed_is_read_through_its_class(stand_in, monkeypatch):
    """`module.__class__ = Sub` changes no dict, but a property of Sub now answers the
    attribute: the cached module attribute must not be used."""
    import sys
    import types

    module = types.ModuleType("fk_test_grid_config")
    module.BLOCKS = 2
    monkeypatch.setitem(sys.modules, "fk_test_grid_config", module)
    namespace = {"cfg": module}
    grid = eval("lambda meta: (cfg.BLOCKS,)", namespace)
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    _launch(k, grid)
    assert stand_in.last_launch().grid == (2, 1, 1)

    class WithProperty(types.ModuleType):
        BLOCKS = property(lambda self: 8)

    module.__class__ = WithProperty
    _launch(k, grid)
    assert stand_in.last_launch().grid == (8, 1, 1)
    assert _counts(k) == (1, 1)


def test_evicting_a_program_whose_code_dies_may_launch_again(stand_in):
    """The slot a new program takes held the only reference to an old code object, whose weakref
    callback launches the kernel again while the old program is destroyed."""
    import weakref

    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    relaunched = []

    def relaunch(_):
        relaunched.append(1)
        _launch(k, eval("lambda meta: (7,)"))

    dying = eval("lambda meta: (1,)")
    _launch(k, dying)
    watcher = weakref.ref(dying.__code__, relaunch)
    del dying
    for i in range(8):  # eight new programs: the slot ring comes round to the dying one
        _launch(k, eval(f"lambda meta: ({i + 2},)"))
    assert watcher() is None and relaunched == [1]
    _launch(k, eval("lambda meta: (9,)"))
    assert stand_in.last_launch().grid == (9, 1, 1)


class _NotAModule:
    def __init__(self, log):
        self.log = log

    def cdiv(self, a, b):
        self.log.append((a, b))
        return (a + b - 1) // b


def test_anything_outside_the_fast_case_calls_the_function(stand_in, monkeypatch):
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    log: list = []

    def side_effect(meta):
        log.append(meta["n"])
        return (1,)

    # A call of an unknown function: every call runs it (its side effects are seen).
    _launch(k, lambda meta: (side_effect(meta)[0],))
    _launch(k, lambda meta: (side_effect(meta)[0],))
    assert log == [N, N]
    # `triton` rebound to an object whose cdiv is not Triton's: called, with its own result.
    monkeypatch.setitem(globals(), "triton", _NotAModule(log))
    tutorial = _closure_grids()["lambda"]
    _launch(k, tutorial)
    assert log[-1] == (N, 64) and stand_in.last_launch().grid == (4, 1, 1)
    monkeypatch.undo()
    _launch(k, tutorial)
    assert len(log) == 3  # Triton's cdiv again: native
    # A value that is not an exact int (a bool here): Python's arithmetic decides.
    flag = True
    _launch(k, lambda meta: (meta["BLOCK"] // 64 + flag,))
    assert stand_in.last_launch().grid == (2, 1, 1)
    native, called = _counts(k)
    assert called == 4 and native == 1


@pytest.mark.parametrize(
    "grid, error",
    [
        (lambda meta: (meta["n"] // (meta["BLOCK"] - 64),), ZeroDivisionError),
        (lambda meta: (meta["n"] % (meta["BLOCK"] - 64),), ZeroDivisionError),
        (lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"] - 64),), ZeroDivisionError),
        (lambda meta: (meta["missing"],), KeyError),
        (lambda meta: (triton.no_such_helper(meta["n"]),), AttributeError),
        (lambda meta: (meta["n"] - 1000,), ValueError),  # negative: outside [0, 2**31 - 1]
        (lambda meta: (1, 70000), ValueError),  # grid[1] > 65535
        (lambda meta: (meta["n"] * 2**62,), ValueError),  # past 64 bits: Python's int
        (lambda meta: (2**62 * 2**62 // meta["n"],), ValueError),
    ],
)
def test_errors_are_the_functions_own(stand_in, grid, error):
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    with pytest.raises(error) as native:
        _launch(k, grid)
    with pytest.raises(error) as python:
        _launch(k, lambda meta: tuple(grid(dict(meta))))  # never native: a call of `grid`
    assert str(native.value).split(":")[-1] == str(python.value).split(":")[-1]


def test_a_bad_program_from_the_translator_is_never_run(stand_in, monkeypatch):
    """The native side checks every program's stack effects, operand kinds and step names; a
    malformed one (or a translator that raises) leaves the grid function to be called."""
    bad_programs = [
        (("ADD", 0), ("RETURN", 1)),  # stack underflow
        (("CONST", 1), ("RETURN", 2)),  # returns more than it holds
        (("CONST", 1),),  # no return
        (("CONST", 1), ("RETURN", 1), ("CONST", 2)),  # steps after the return
        (("ARG", 10**6), ("RETURN", 1)),  # no such parameter slot
        (("ARG", -1), ("RETURN", 1)),
        (("ARG", 2**32), ("RETURN", 1)),  # an index that would wrap to 0 in an int
        (("CELL", -1), ("RETURN", 1)),
        (("CONST", 1), ("ATTR", 5), ("RETURN", 1)),  # ATTR's operand is a name
        (("GLOBAL", 3), ("RETURN", 1)),
        (("CONST", 1.5), ("RETURN", 1)),
        (("JUMP", 0), ("RETURN", 1)),  # not a step
        (("CONST", 1),) * 17 + (("RETURN", 1),),  # deeper than the evaluator's stack
        (("CONST", 2**70), ("RETURN", 1)),
        (("CONST", 1), ("CALL", 1), ("RETURN", 1)),  # a call without a callee below
        (("CONST", 1), ("CONST", 2), ("RETURN_TUPLE", 0)),  # two values left
        (("DEFAULT", -1), ("RETURN_TUPLE", 0)),
        "not a program",
        (("CONST",),),
    ]
    calls: list = []

    def grid(meta):
        calls.append(1)
        return (5,)

    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    for program in bad_programs + [RuntimeError("translator failed")]:

        def translator(code, names, program=program):
            if isinstance(program, Exception):
                raise program
            return program

        _C.set_grid_program_support(translator, triton.cdiv, triton.next_power_of_2, max, min)
        try:
            fresh = fastkernel(kernels.add_kernel)
            _launch(fresh, (1,))
            _launch(fresh, grid)
            assert stand_in.last_launch().grid == (5, 1, 1)
            assert _counts(fresh) == (0, 1), program
        finally:
            _C.set_grid_program_support(
                _grid_program.compile_grid, triton.cdiv, triton.next_power_of_2, max, min
            )
    assert len(calls) == len(bad_programs) + 1


def test_a_refused_program_keeps_no_reference_to_its_names(stand_in):
    """A program whose attribute step has nothing to read is refused before any name in it is
    kept: refusing it again and again holds nothing."""
    name = "".join(["fk_probe_", "attribute"])  # a str of this test's own, its references counted

    def translator(code, names):
        return (("ATTR", name), ("CONST", 1), ("RETURN", 1))

    k = fastkernel(kernels.add_kernel)
    grids = [eval(f"lambda meta: ({i} + 1,)") for i in range(12)]  # more than the program slots
    _C.set_grid_program_support(translator, triton.cdiv, triton.next_power_of_2, max, min)
    try:
        before = sys.getrefcount(name)
        for grid in grids * 3:  # each call translates its grid's code anew
            _launch(k, grid)
        assert sys.getrefcount(name) == before
    finally:
        _C.set_grid_program_support(
            _grid_program.compile_grid, triton.cdiv, triton.next_power_of_2, max, min
        )
    assert stand_in.last_launch().grid == (12, 1, 1)  # called in Python: the program was refused


# ---- the translator, on every supported CPython's bytecode ------------------------------------


def test_the_translator_emits_only_steps_the_native_side_knows():
    emitted = set()
    for grid in _closure_grids().values():
        program = _grid_program.compile_grid(grid.__code__, NAMES)
        assert program is not None and program[-1][0] == "RETURN"
        emitted |= {op for op, _ in program}
    assert emitted <= set(_C.GRID_PROGRAM_STEPS)
    assert {"ARG", "CONST", "CELL", "GLOBAL", "ATTR", "CALL", "RETURN"} <= emitted


def test_the_translator_gives_the_expected_program_for_the_tutorial_grid():
    program = _grid_program.compile_grid(_closure_grids()["lambda"].__code__, NAMES)
    assert program == (
        ("GLOBAL", "triton"),
        ("ATTR", "cdiv"),
        ("ARG", 3),
        ("ARG", 4),
        ("CALL", 2),
        ("RETURN", 1),
    )


def _untranslatable():
    x = 5

    def uses_builtin_abs(meta):
        return (abs(meta["n"]),)

    def uses_builtin_len(meta):
        return (len(meta),)

    def stores(meta):
        y = meta["n"]
        return (y,)

    def branches(meta):
        return (1 if meta["n"] else 2,)

    def keyword_call(meta):
        return (triton.cdiv(meta["n"], y=meta["BLOCK"]),)

    def own_cell(meta):
        z = meta["n"]
        return ((lambda: z)(),)

    return {
        "abs": uses_builtin_abs,  # translated; an unknown callee at run time (see below)
        "len": uses_builtin_len,  # the mapping itself as a value
        "stores": stores,
        "branches": branches,
        "keyword": keyword_call,
        "own_cell": own_cell,
        "get": lambda meta: (meta.get("n"),),
        "unknown_key": lambda meta: (meta["nope"],),
        "not_a_tuple": lambda meta: meta["n"],
        "four_dims": lambda meta: (1, 2, 3, 4),
        "two_params": lambda meta, extra: (extra,),  # translated: no default, called
        "varargs": lambda *meta: (1,),
        "generator": (lambda meta: ((yield 1),)),
        "string": lambda meta: ("a",),
        "float": lambda meta: (1.5,),
        "true_div": lambda meta: (meta["n"] / 2,),
        "dunder": lambda meta: (triton.__name__,),
        "unary": lambda meta: (-meta["n"],),
        "closure": lambda meta: (x,),  # translatable: x is a free variable
        "default": lambda meta, extra=1: (extra,),
        "returned_tuple": lambda meta, g=(1,): g,
        "local_default": lambda meta, extra=1, *, kw=2: (kw,),
    }


@pytest.mark.parametrize("name", sorted(_untranslatable()))
def test_the_translator_declines_what_it_does_not_translate(name):
    fn = _untranslatable()[name]
    program = _grid_program.compile_grid(fn.__code__, NAMES)
    if name in ("abs", "closure", "two_params", "default", "returned_tuple"):
        assert program is not None
    else:
        assert program is None, dis.Bytecode(fn).dis()


def test_a_returned_tuple_or_default_outside_the_fast_case_calls_the_function(stand_in):
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    as_list = [2, 3]
    _launch(k, lambda meta, g=as_list: g)  # a list: Python's grid parsing
    assert stand_in.last_launch().grid == (2, 3, 1)
    with pytest.raises(TypeError):  # a parameter without a default: the call's TypeError
        _launch(k, _untranslatable()["two_params"])
    four = (1, 1, 1, 1)
    with pytest.raises(ValueError, match="1 to 3 dimensions"):
        _launch(k, lambda meta: four)
    assert _counts(k) == (0, 3)


def test_a_call_of_abs_is_translated_but_always_calls_the_function(stand_in):
    k = fastkernel(kernels.add_kernel)
    _launch(k, (1,))
    for _ in range(2):
        _launch(k, _untranslatable()["abs"])
        assert stand_in.last_launch().grid == (N, 1, 1)
    assert _counts(k) == (0, 2)


REPLACED_FIRST = """
    import os, sys, triton
    OFFSET = 3

    def next_power_of_2(n):  # a library's own, assigned before fastkernel's import
        return n + OFFSET

    triton.next_power_of_2 = next_power_of_2
    import torch
    from fastkernel import _C, _heuristic_code, fastkernel
    from stand_in_driver.recording import RecordingDriver
    import kernels

    driver = RecordingDriver(os.environ["FASTKERNEL_CUDA_DRIVER"])
    _C._testing.set_host_testing(True, 0, 0x5EED5)
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    grid = lambda meta: (triton.next_power_of_2(meta["n"]),)
    for _ in range(3):
        k[grid](x, x, x, 9, BLOCK=64)
    reads = _heuristic_code.analyze(lambda args: triton.next_power_of_2(args["n"]))
    print([tuple(l.grid) for l in driver.launches()], tuple(k._grid_counts()), reads.outside)
"""


def test_a_function_assigned_over_tritons_before_the_import_is_called():
    """A library that replaces ``triton.next_power_of_2`` before fastkernel is imported (SGLang
    does on import) has its own function called by the grid, never Triton's body computed in
    its place, and a heuristic calling it is read as calling that function."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(REPLACED_FIRST)],
        capture_output=True,
        text=True,
        cwd=pathlib.Path(__file__).parent,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith("[(12, 1, 1), (12, 1, 1), (12, 1, 1)]"), line
    assert "'OFFSET'" in line, line  # the heuristic reads a global through the function


def _interpreters() -> dict[str, str]:
    """CPython 3.10-3.13 interpreters on this machine (pyenv's, else python3.X on PATH), the
    running one included."""
    found = {f"{sys.version_info[0]}.{sys.version_info[1]}": sys.executable}
    try:
        root = subprocess.run(
            ["pyenv", "root"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        root = ""
    for minor in ("3.10", "3.11", "3.12", "3.13"):
        if minor in found:
            continue
        candidates = (
            sorted(pathlib.Path(root).glob(f"versions/{minor}.*/bin/python3")) if root else []
        )
        path = str(candidates[0]) if candidates else shutil.which(f"python{minor}")
        if path:
            found[minor] = path
    return found


def test_the_translator_agrees_with_calling_the_function_on_every_installed_cpython():
    """The bytecode of the same grid functions differs between CPython versions; the check
    script (no torch, no Triton) runs the translated programs under each interpreter found."""
    script = pathlib.Path(__file__).with_name("grid_program_versions.py")
    for minor, python in sorted(_interpreters().items()):
        proc = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and " 0 problems" in proc.stdout, (
            minor,
            proc.stdout,
            proc.stderr,
        )


def test_the_python_version_is_one_the_translator_knows():
    # The bytecode forms it reads are those of CPython 3.10 to 3.13; a newer CPython must be
    # checked (the tests above) before it is listed in pyproject.toml.
    assert (3, 10) <= sys.version_info[:2] <= (3, 13)
