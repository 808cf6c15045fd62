"""How many of an installed library's grid functions fastkernel runs as native grid programs.

    python benchmarks/grid_forms.py fla liger_kernel conch

Compiles every module of each named package from its installed source (nothing is imported or
run) and finds the grid functions in it: functions named ``grid``, and lambdas whose one
parameter is named ``meta`` or ``META``. Each is given to
``fastkernel._grid_program.compile_grid`` with its own string constants as the kernel's
parameter names (so every ``meta["..."]`` it reads counts as a parameter). Prints, per package,
how many are of the translated forms and where the others are. A translated form still falls
back at run time when a value is not an int (see ``fastkernel/_grid_program.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import types
from collections.abc import Iterator

from fastkernel import _grid_program


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _nested(const)


def _is_grid(code: types.CodeType) -> bool:
    if code.co_argcount < 1:
        return False
    if code.co_name == "grid":
        return True
    return code.co_name == "<lambda>" and code.co_varnames[0] in ("meta", "META")


def scan(package: str) -> tuple[int, list[str]]:
    """(grid functions found, locations of those not translated) in an installed package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package}: not an installed package")
    found, declined = 0, []
    for root in spec.submodule_search_locations:
        root_path = pathlib.Path(root)
        for path in sorted(root_path.rglob("*.py")):
            try:
                module = compile(path.read_text(encoding="utf-8"), str(path), "exec")
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for code in _nested(module):
                if not _is_grid(code):
                    continue
                found += 1
                names = tuple(c for c in code.co_consts if isinstance(c, str))
                if _grid_program.compile_grid(code, names) is None:
                    declined.append(f"{path.relative_to(root_path.parent)}:{code.co_firstlineno}")
    return found, declined


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/grid_forms.py", description=__doc__)
    parser.add_argument("packages", nargs="+", help="installed packages to scan, e.g. fla")
    opts = parser.parse_args(argv)
    for package in opts.packages:
        found, declined = scan(package)
        print(f"{package}: {found - len(declined)} of {found} grid functions translated")
        for where in declined:
            print(f"  not translated: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
