"""Grid functions as native programs: the callable grids that libraries write, evaluated without
calling Python.

Triton's tutorials, flash-linear-attention and FlagGems pass grids such as
``lambda meta: (triton.cdiv(n, meta["BLOCK"]), H * B)``. Calling one from the launch path costs
a Python frame, a mapping of the call's arguments and, for ``triton.cdiv``, a
``ConstexprFunction`` call: more than the rest of a native hit. Most such functions are a
single expression over ints with no side effects, so :func:`compile_grid` translates the code
object's bytecode (read with :mod:`dis`, whose instruction names differ between CPython 3.10,
3.11, 3.12 and 3.13) into a short postfix program that the native layer
(``csrc/python/grid_program.cpp``) runs on each call with the same values the function would
read: the call's arguments for ``meta[name]``, the function's closure cells and globals, read
anew on every call.

Only what has no side effects and whose result on exact ints is fixed is translated: integer
constants, ``meta["<parameter>"]``, closure variables, globals, attributes of modules,
parameters' defaults, ``+ - * // %``, and calls of ``triton.cdiv``, ``triton.next_power_of_2``,
``max`` and ``min`` (the callee is checked by identity on every call), returning a tuple or list
of 1 to 3 items, or one such value that is a tuple at run time (``lambda meta: grid``).
Anything else (another call, a branch, a keyword, a store) is not translated, and the function
is called as Triton calls it. At run time the native program gives up, and the function is
called instead, whenever a value is not an exact int fitting 64 bits, a name is missing, a
callee is not one of those four, a division is by zero or the arithmetic overflows 64 bits:
then Python computes the result, or raises what it raises.
"""

from __future__ import annotations

import dis
import sys
import types
import weakref
from typing import Any

#: A program step: (operation, operand). Operations, run on a stack of values:
#: ("ARG", i) pushes the call's argument for parameter i; ("CONST", int) an int constant;
#: ("CELL", i) the contents of closure cell i; ("GLOBAL", name) the function's global;
#: ("ATTR", name) replaces a module on top by its attribute; ("CALL", n) calls the callee below
#: n arguments; ("ADD" | "SUB" | "MUL" | "FLOORDIV" | "MOD", 0) the binary operators;
#: ("DEFAULT", i) the default value of the function's parameter i (Triton passes only the
#: first); ("RETURN", n) ends with the top n values as the grid; ("RETURN_TUPLE", 0) with the
#: top value, which must be a tuple of 1 to 3 ints.
Step = tuple[str, int | str]

#: The most steps and the deepest stack a program may have (the native evaluator's buffers).
MAX_STEPS = 64
MAX_DEPTH = 16

_BINARY = {"+": "ADD", "-": "SUB", "*": "MUL", "//": "FLOORDIV", "%": "MOD"}
# CPython 3.10's binary opcodes (3.11+ has BINARY_OP with the operator as its argrepr).
_BINARY_310 = {
    "BINARY_ADD": "ADD",
    "BINARY_SUBTRACT": "SUB",
    "BINARY_MULTIPLY": "MUL",
    "BINARY_FLOOR_DIVIDE": "FLOORDIV",
    "BINARY_MODULO": "MOD",
}
# Steps that push one value, and the binary operators' steps.
_LEAF_STEPS = ("ARG", "CONST", "CELL", "GLOBAL", "DEFAULT")
_BINARY_STEPS = tuple(_BINARY.values())
# Bookkeeping instructions with no effect on the values (3.11+).
_IGNORED = {"RESUME", "NOP", "CACHE", "PRECALL", "COPY_FREE_VARS", "EXTENDED_ARG"}
# Code flags a translated function must not have: *args, **kwargs, generators, coroutines.
_REJECTED_FLAGS = 0x04 | 0x08 | 0x20 | 0x80 | 0x100 | 0x200


class _Untranslatable(Exception):
    """The function does something the native program does not do."""


_NULL = ("NULL",)  # the marker CPython pushes beside a callee; no value
_META = ("META",)  # the grid function's one parameter


def _push_with_null(stack: list, node: tuple) -> None:
    # The NULL CPython pushes beside a callee goes below it before 3.13, above it from 3.13.
    if _NULL_ABOVE:
        stack.extend((node, _NULL))
    else:
        stack.extend((_NULL, node))


def _push_global(stack: list, ins: dis.Instruction) -> None:
    # 3.11+: an odd argument also pushes NULL for a following call.
    node = ("GLOBAL", ins.argval)
    if _HAS_NULL_BIT and ins.arg is not None and (ins.arg & 1):
        _push_with_null(stack, node)
    else:
        stack.append(node)


def _attribute(stack: list, name: Any, method: bool) -> None:
    if not stack or stack[-1] in (_NULL, _META):
        raise _Untranslatable
    if not isinstance(name, str) or name.startswith("__"):
        raise _Untranslatable  # dunder names are the module type's own attributes
    node = ("ATTR", stack.pop(), name)
    if method:
        _push_with_null(stack, node)
    else:
        stack.append(node)


def _call(stack: list, n: int) -> None:
    if len(stack) < n + 1:
        raise _Untranslatable
    args = stack[len(stack) - n :]
    del stack[len(stack) - n :]
    callee = stack.pop()
    if callee == _NULL:
        if not stack:
            raise _Untranslatable
        callee = stack.pop()
    elif stack and stack[-1] == _NULL:
        stack.pop()
    if callee in (_NULL, _META) or any(a in (_NULL, _META) for a in args):
        raise _Untranslatable
    stack.append(("CALL", callee, tuple(args)))


def _value(node: tuple) -> tuple:
    if node in (_NULL, _META) or node[0] == "STR":
        raise _Untranslatable
    return node


def _symbolic(code: types.CodeType, param_index: dict[str, int]) -> tuple[list[tuple], bool]:
    """The expression trees of the returned items, by symbolic execution of the bytecode, and
    whether the one returned value is a tuple made elsewhere (a closure's or a default's)."""
    stack: list[tuple] = []
    instructions = list(dis.get_instructions(code))
    for position, ins in enumerate(instructions):
        op = ins.opname
        if op in _IGNORED:
            continue
        if op in ("LOAD_FAST", "LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW"):
            names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
            for name in names:
                index = code.co_varnames.index(name)
                if index >= code.co_argcount:
                    raise _Untranslatable  # a local variable
                # The first parameter is the mapping; the others take their defaults.
                stack.append(_META if index == 0 else ("DEFAULT", index))
        elif op == "LOAD_CONST":
            value = ins.argval
            if type(value) is int:
                stack.append(("CONST", value))
            elif type(value) is str:
                stack.append(("STR", value))
            else:
                stack.append(_constant_tuple(value))
        elif op == "RETURN_CONST":
            stack.append(_constant_tuple(ins.argval))
            return _returned(stack, position, instructions)
        elif op == "LOAD_DEREF":
            if ins.argval not in code.co_freevars:
                raise _Untranslatable  # a cell of the function's own
            stack.append(("CELL", code.co_freevars.index(ins.argval)))
        elif op == "LOAD_GLOBAL":
            _push_global(stack, ins)
        elif op == "LOAD_ATTR":
            # 3.12+: an odd argument is a method load (pushes NULL or self with the attribute).
            method = _HAS_METHOD_ATTR and ins.arg is not None and bool(ins.arg & 1)
            _attribute(stack, ins.argval, method)
        elif op == "LOAD_METHOD":
            _attribute(stack, ins.argval, True)
        elif op == "PUSH_NULL":
            stack.append(_NULL)
        elif op in ("CALL", "CALL_FUNCTION", "CALL_METHOD"):
            _call(stack, int(ins.arg or 0))
        elif op == "BINARY_SUBSCR":
            if len(stack) < 2:
                raise _Untranslatable
            key, container = stack.pop(), stack.pop()
            if container != _META or key[0] != "STR" or key[1] not in param_index:
                raise _Untranslatable
            stack.append(("ARG", param_index[key[1]]))
        elif op == "BINARY_OP" or op in _BINARY_310:
            name = _BINARY_310.get(op) or _BINARY.get(ins.argrepr)
            if name is None or len(stack) < 2:
                raise _Untranslatable
            right, left = _value(stack.pop()), _value(stack.pop())
            stack.append((name, left, right))
        elif op in ("BUILD_TUPLE", "BUILD_LIST"):
            n = int(ins.arg or 0)
            if not 1 <= n <= 3 or len(stack) < n:
                raise _Untranslatable
            items = tuple(_value(v) for v in stack[len(stack) - n :])
            del stack[len(stack) - n :]
            stack.append(("TUPLE", items))
        elif op == "RETURN_VALUE":
            return _returned(stack, position, instructions)
        else:
            raise _Untranslatable
    raise _Untranslatable


def _constant_tuple(value: Any) -> tuple:
    """A constant tuple of 1 to 3 ints as a TUPLE node."""
    if type(value) is not tuple or not 1 <= len(value) <= 3:
        raise _Untranslatable
    if any(type(v) is not int for v in value):
        raise _Untranslatable
    return ("TUPLE", tuple(("CONST", v) for v in value))


def _returned(stack: list, position: int, instructions: list) -> tuple[list[tuple], bool]:
    # Straight-line code only: the return is the last instruction and leaves nothing behind.
    # The items of a tuple built here, or one value that must be a tuple at run time.
    if position != len(instructions) - 1 or len(stack) != 1:
        raise _Untranslatable
    if stack[0][0] == "TUPLE":
        return list(stack[0][1]), False
    if stack[0][0] not in ("DEFAULT", "CELL", "GLOBAL", "ATTR"):
        raise _Untranslatable  # an int (or the mapping): never a grid
    return [stack[0]], True


def _emit(node: tuple, out: list[Step]) -> None:
    kind = node[0]
    if kind in _LEAF_STEPS:
        out.append((kind, node[1]))
    elif kind == "ATTR":
        _emit(node[1], out)
        out.append(("ATTR", node[2]))
    elif kind == "CALL":
        _emit(node[1], out)
        for arg in node[2]:
            _emit(arg, out)
        out.append(("CALL", len(node[2])))
    elif kind in _BINARY_STEPS:
        _emit(node[1], out)
        _emit(node[2], out)
        out.append((kind, 0))
    else:
        raise _Untranslatable


def _depth(program: list[Step]) -> int:
    depth = deepest = 0
    for op, operand in program:
        if op in _LEAF_STEPS:
            depth += 1
        elif op == "CALL":
            depth -= int(operand)
        elif op in _BINARY_STEPS:
            depth -= 1
        deepest = max(deepest, depth)
    return deepest


#: Translations by code object, then by the kernel's parameter names. Weak on the code: a
#: cache that held it would keep every grid function's code (and its constants) alive after the
#: function is gone. Equal code objects (same bytecode, constants and names) share an entry,
#: as their translations are the same.
_translations: weakref.WeakKeyDictionary[types.CodeType, dict[tuple[str, ...], Any]] = (
    weakref.WeakKeyDictionary()
)


def compile_grid(code: types.CodeType, param_names: tuple[str, ...]) -> tuple[Step, ...] | None:
    """The native program of a grid function's code, or None when it cannot have one.

    Parameters
    ----------
    code : types.CodeType
        The grid function's ``__code__``.
    param_names : tuple of str
        The kernel's declared parameters in order: ``meta["name"]`` becomes ("ARG", index).

    Returns
    -------
    tuple of (str, int or str), or None
        The steps (see ``Step``), ending with ("RETURN", n), n in 1..3; None for a function
        that is not a single side-effect-free expression of the forms this module translates.
        Kept while the code object lives (the kernel keeps a few programs natively; this
        serves the rest). Never raises.
    """
    if type(code) is not types.CodeType:
        return None
    by_names = _translations.get(code)
    if by_names is None:
        by_names = _translations[code] = {}
    try:
        return by_names[param_names]
    except KeyError:
        pass
    except TypeError:  # unhashable names: not a kernel's
        return None
    program = _translate(code, param_names)
    by_names[param_names] = program
    return program


def _translate(code: types.CodeType, param_names: tuple[str, ...]) -> tuple[Step, ...] | None:
    """``compile_grid`` without its cache: translates ``code`` anew."""
    if (
        code.co_argcount < 1
        or code.co_kwonlyargcount != 0
        or code.co_flags & _REJECTED_FLAGS
        or code.co_cellvars
    ):
        return None
    try:
        items, made_elsewhere = _symbolic(code, {name: i for i, name in enumerate(param_names)})
        program: list[Step] = []
        for item in items:
            _emit(item, program)
    except (_Untranslatable, IndexError, TypeError, ValueError):
        return None
    program.append(("RETURN_TUPLE", 0) if made_elsewhere else ("RETURN", len(items)))
    if len(program) > MAX_STEPS or _depth(program) > MAX_DEPTH:
        return None
    return tuple(program)


_HAS_NULL_BIT = sys.version_info >= (3, 11)  # LOAD_GLOBAL's low bit pushes NULL
_HAS_METHOD_ATTR = sys.version_info >= (3, 12)  # LOAD_ATTR's low bit is a method load
_NULL_ABOVE = sys.version_info >= (3, 13)  # the callee's NULL is pushed after it
