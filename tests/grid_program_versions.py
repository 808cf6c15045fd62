"""Checks fastkernel._grid_program's translation on the running CPython, without torch or
Triton: run as a script by test_grid_program.py under every CPython 3.10-3.13 it finds, since
each of them writes the same grid functions in different bytecode.

For each grid function below, the translated program is run by a reference interpreter of the
program steps (the native evaluator's semantics, written in Python) and compared with calling
the function, on random arguments. Prints one line per problem; exits 1 if there was any.
"""

from __future__ import annotations

import importlib.util
import pathlib
import random
import sys
import types

# A stand-in for the triton module: imported at module level, as libraries import Triton (the
# compiler then emits the attribute loads it emits for an imported module).
_fake = types.ModuleType("_fk_fake_triton")
_fake.cdiv = lambda x, y: (x + y - 1) // y
_fake.next_power_of_2 = lambda n: 1 << (n - 1).bit_length()
sys.modules["_fk_fake_triton"] = _fake
import _fk_fake_triton as triton  # noqa: E402
from _fk_fake_triton import cdiv  # noqa: E402

_path = (
    pathlib.Path(__file__).resolve().parent.parent / "python" / "fastkernel" / "_grid_program.py"
)
_spec = importlib.util.spec_from_file_location("_grid_program_under_test", _path)
gp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gp)

NAMES = ("x_ptr", "n", "BLOCK", "H")
G = 7
GRID = (9, 8)


def grids(h: int, b: int) -> dict:
    return {
        "tutorial": lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
        "imported_name": lambda meta: (cdiv(meta["n"], meta["BLOCK"]), G),
        "fla": lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]), h, b * h),
        "max_min": lambda meta: (max(1, meta["n"] // 1000), min(meta["BLOCK"], 8, 9)),
        "arithmetic": lambda meta: (
            (meta["n"] - 1000) // 7 + 200,
            (meta["n"] - 1000) % -7 + 1,
            meta["H"] * 3 - 2,
        ),
        "next_power_of_2": lambda meta: (triton.next_power_of_2(meta["n"]) // 8 + 1,),
        "nested": lambda meta: (max(triton.cdiv(meta["n"], 2), cdiv(b, 1)) * G,),
        "default": lambda meta, g=(3, 4): g,
        "defaults": lambda meta, a=2, c=5: (a * meta["H"], c + a),
        "global_tuple": lambda meta: GRID,
        "list": lambda meta: [h, meta["H"]],
        "constant": lambda meta: (1, 2, 3),
    }


def run(program, fn, meta):
    """The native evaluator's semantics, in Python."""
    stack: list = []
    for op, a in program:
        if op == "ARG":
            stack.append(meta[NAMES[a]])
        elif op == "CONST":
            stack.append(a)
        elif op == "CELL":
            stack.append(fn.__closure__[a].cell_contents)
        elif op == "GLOBAL":
            stack.append(fn.__globals__[a] if a in fn.__globals__ else fn.__builtins__[a])
        elif op == "DEFAULT":
            d = fn.__defaults__
            stack.append(d[a - (fn.__code__.co_argcount - len(d))])
        elif op == "ATTR":
            stack.append(getattr(stack.pop(), a))
        elif op == "CALL":
            args = stack[len(stack) - a :]
            del stack[len(stack) - a :]
            callee = stack.pop()
            assert callee in (triton.cdiv, triton.next_power_of_2, max, min), callee
            stack.append(callee(*args))
        elif op in ("ADD", "SUB", "MUL", "FLOORDIV", "MOD"):
            r, left = stack.pop(), stack.pop()
            stack.append(
                {
                    "ADD": left + r,
                    "SUB": left - r,
                    "MUL": left * r,
                    "FLOORDIV": left // r,
                    "MOD": left % r,
                }[op]
            )
        elif op == "RETURN":
            return tuple(stack[len(stack) - a :])
        elif op == "RETURN_TUPLE":
            return stack[-1]
        else:
            raise AssertionError(f"unknown step {op}")
    raise AssertionError("no return")


def main() -> int:
    problems = 0
    rng = random.Random(0)
    for h, b in ((4, 3), (1, 17)):
        for name, fn in grids(h, b).items():
            program = gp.compile_grid(fn.__code__, NAMES)
            if program is None:
                print(f"not translated: {name}")
                problems += 1
                continue
            for _ in range(200):
                meta = {
                    "x_ptr": None,
                    "n": rng.randint(1, 10**6),
                    "BLOCK": rng.choice([16, 64, 1024]),
                    "H": rng.randint(1, 64),
                }
                want, got = tuple(fn(meta)), tuple(run(program, fn, meta))
                if want != got:
                    print(f"mismatch: {name} {meta}: {want} != {got}")
                    problems += 1
                    break
    print(f"{sys.version.split()[0]}: {problems} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
