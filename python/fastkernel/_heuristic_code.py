"""What a ``@triton.heuristics`` function can read, found from its bytecode.

Triton's ``Heuristics.run`` (triton/runtime/autotuner.py) calls each function with a dict of
the call's arguments. The patched dispatch serves a heuristics call natively only when the
values it computes follow from the native key, so it must know, before trusting a record,
that a function reads nothing else: no global variable, closure variable, import or helper
whose value could change between calls without the key changing. :func:`analyze` reads the
function's code (nested functions and comprehensions included) with :mod:`dis`; anything it
does not recognise counts as an outside read, so an unknown construct keeps the heuristic on
Triton's path rather than risking a stale value. A plain Python function it calls (a helper
such as SGLang's replacement of ``triton.next_power_of_2``, which its runtime assigns on
import) is read the same way, with its own globals, and trusted when its code is.
"""

from __future__ import annotations

import builtins
import dis
import types
from dataclasses import dataclass
from typing import Any

from . import _host_helpers

#: Callables whose result depends only on their arguments: a heuristic may call them (found as
#: globals, built-ins or module attributes) and still be served natively. The functions of
#: :mod:`math` count as well (see :func:`_pure_callable`).
_PURE_CALLABLES: tuple[Any, ...] = (
    abs,
    all,
    any,
    bool,
    divmod,
    float,
    int,
    isinstance,
    len,
    max,
    min,
    pow,
    range,
    round,
    str,
    sum,
    tuple,
    _host_helpers.CDIV,
    _host_helpers.NEXT_POWER_OF_2,
)

#: Instructions that change state outside the call, or import.
_OUTSIDE_EFFECTS = frozenset(
    {
        "STORE_GLOBAL",
        "DELETE_GLOBAL",
        "STORE_NAME",
        "DELETE_NAME",
        "IMPORT_NAME",
        "IMPORT_FROM",
        "IMPORT_STAR",
    }
)

#: Loads of a name from the function's globals or the built-ins.
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})

#: Attribute loads (a method load on 3.10 and 3.11 is its own instruction).
_ATTRIBUTE_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})

#: Jumps taken on a value being (or not being) None, as CPython 3.11-3.13 compile `if x is None`.
_NONE_JUMPS = frozenset(
    {
        "POP_JUMP_IF_NONE",
        "POP_JUMP_IF_NOT_NONE",
        "POP_JUMP_FORWARD_IF_NONE",
        "POP_JUMP_FORWARD_IF_NOT_NONE",
        "POP_JUMP_BACKWARD_IF_NONE",
        "POP_JUMP_BACKWARD_IF_NOT_NONE",
    }
)


@dataclass(frozen=True)
class HeuristicReads:
    """What one heuristic function can read.

    ``spelled``: every string constant of its code, the names it could read from the
    argument mapping. ``identity_only``: the names whose every use is ``args[name]`` compared
    with None by identity (``args["h0"] is not None``), which depends only on whether the
    argument is None, a fact the native key holds for an argument of any kind. ``outside``:
    why it may read state the argument mapping does not hold (a global variable, a closure
    variable, an import, a helper function), as a phrase ("reads 'G', which the key does not
    hold"), or None when it provably reads none.
    """

    spelled: frozenset[str]
    identity_only: frozenset[str]
    outside: str | None


def _constant(value: Any) -> bool:
    """Whether ``value`` is an immutable constant: None, a bool, int, float or str, or a tuple
    of them."""
    if value is None or type(value) in (bool, int, float, str):
        return True
    return type(value) is tuple and all(_constant(item) for item in value)


def _pure_callable(obj: Any) -> bool:
    """Whether calling ``obj`` computes from its arguments alone (see ``_PURE_CALLABLES``)."""
    if isinstance(obj, types.BuiltinFunctionType) and getattr(obj, "__module__", None) == "math":
        return True
    return any(obj is f for f in _PURE_CALLABLES)


#: The most helper functions one heuristic's analysis reads (each read once); one that calls
#: more counts as reading outside its arguments.
_MAX_HELPERS = 16

_MISSING = object()


def _loaded_global(globals_: dict, instructions: list[dis.Instruction], i: int) -> tuple[str, Any]:
    """The name (``triton.cdiv``) and current value of the global loaded by ``instructions[i]``
    with the module attributes loaded right after it; ``_MISSING`` when there is none."""
    chain = instructions[i].argval
    obj = globals_.get(chain, _MISSING)
    if obj is _MISSING:
        obj = getattr(builtins, chain, _MISSING)
    for follow in instructions[i + 1 :]:
        if not isinstance(obj, types.ModuleType) or follow.opname not in _ATTRIBUTE_LOADS:
            break
        chain += "." + follow.argval
        obj = getattr(obj, follow.argval, _MISSING)
    return chain, obj


def _signature_problem(fn: types.FunctionType, first: str | None) -> str | None:
    """Why ``fn`` may read state outside its arguments through its closure or its defaults: a
    free variable (the enclosing scope can rebind it) or a default other than an immutable
    constant (other than ``first``'s), or None."""
    code = fn.__code__
    if code.co_freevars:
        return f"reads closure variable {sorted(code.co_freevars)[0]!r}"
    defaults = dict(fn.__kwdefaults__ or {})
    positional = code.co_varnames[: code.co_argcount]
    defaults.update(
        zip(positional[len(positional) - len(fn.__defaults__ or ()) :], fn.__defaults__ or ())
    )
    for name, value in defaults.items():
        if name != first and not _constant(value):
            return f"reads its default argument {name!r}"
    return None


def _strings_in(value: Any) -> list[str]:
    """The strings of an instruction's constant operand (tuples and frozensets searched)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (tuple, frozenset)):
        return [s for item in value for s in _strings_in(item)]
    return []


def _identity_tested(instructions: list[dis.Instruction], i: int) -> bool:
    """Whether the subscript at ``instructions[i]`` is only compared with None by identity."""
    following = instructions[i + 1 : i + 3]
    if following and following[0].opname in _NONE_JUMPS:
        return True
    return (
        len(following) == 2
        and following[0].opname == "LOAD_CONST"
        and following[0].argval is None
        and following[1].opname == "IS_OP"
    )


def analyze(fn: types.FunctionType) -> HeuristicReads:
    """What heuristic function ``fn`` can read (:class:`HeuristicReads`), from its code.

    A free variable (a closure) is an outside read: the enclosing scope can rebind it. So is a
    parameter after the first whose default is not an immutable constant, and every global or
    built-in other than the pure callables of ``_PURE_CALLABLES`` and the functions of
    :mod:`math`, reached directly or through module attributes (``triton.cdiv``), and plain
    Python functions whose own code reads nothing else by the same rules (any default of theirs
    counts, and at most ``_MAX_HELPERS`` of them). A helper's string constants count as spelled:
    it may be given the argument mapping.
    """
    outer = fn.__code__
    # Triton calls a heuristic with one argument: the others take their defaults, objects that
    # can be changed (or rebound through __defaults__) unless they are immutable constants.
    positional = outer.co_varnames[: outer.co_argcount]
    outside = _signature_problem(fn, positional[0] if positional else None)
    spelled: set[str] = set()  # every string constant, nested code and tuple constants included
    identity_uses: set[str] = set()
    other_uses: set[str] = set()
    # (code, its function's globals, the helper it belongs to: None for fn's own code)
    pending: list[tuple[types.CodeType, dict, str | None]] = [(outer, fn.__globals__, None)]
    helpers: set[int] = set()
    while pending:
        code, globals_, helper = pending.pop()
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                pending.append((const, globals_, helper))
            else:
                spelled.update(_strings_in(const))
        args_name = code.co_varnames[0] if code is outer and code.co_argcount else None
        instructions = list(dis.get_instructions(code))
        for i, ins in enumerate(instructions):
            op = ins.opname
            if outside is None:
                problem, where = None, helper
                if op in _OUTSIDE_EFFECTS:
                    problem = f"imports or writes a global ({op})"
                elif op in _GLOBAL_LOADS:
                    chain, obj = _loaded_global(globals_, instructions, i)
                    if obj is not _MISSING and _pure_callable(obj):
                        pass
                    elif type(obj) is types.FunctionType and len(helpers) < _MAX_HELPERS:
                        if id(obj) not in helpers:
                            helpers.add(id(obj))
                            where = helper or chain  # a problem of its signature names it
                            problem = _signature_problem(obj, None)
                            pending.append((obj.__code__, obj.__globals__, where))
                    else:
                        problem = f"reads {chain!r}, which the key does not hold"
                if problem is not None:
                    outside = problem if where is None else f"calls {where!r}, which {problem}"
            names = _strings_in(ins.argval) if op not in _GLOBAL_LOADS else []
            if (
                names
                and op == "LOAD_CONST"
                and args_name is not None
                and 0 < i < len(instructions) - 1
                and instructions[i - 1].opname.startswith("LOAD_FAST")
                and instructions[i - 1].argval == args_name
                and instructions[i + 1].opname == "BINARY_SUBSCR"
                and _identity_tested(instructions, i + 1)
            ):
                identity_uses.update(names)
            else:
                other_uses.update(names)
    return HeuristicReads(
        spelled=frozenset(spelled),
        identity_only=frozenset(identity_uses - other_uses),
        outside=outside,
    )
