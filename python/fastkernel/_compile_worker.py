"""A compile worker: ``python -m fastkernel._compile_worker`` reads a pickled job list on stdin
and compiles each specialization into the on-disk kernel cache, where the process that started
it (fastkernel.autotune's parallel compile) then loads it.

A fresh interpreter rather than a multiprocessing child: the spawn start method re-imports the
parent's ``__main__``, which would re-run a user script that has no ``__main__`` guard.

stdin: pickle of ``{"sys_path": [...], "jobs": [(module, qualname, target, spec), ...]}``.
Exit status 0; a job that fails is reported on stderr and left to the parent to compile.
"""

from __future__ import annotations

import importlib
import pickle
import sys
from typing import Any


def _jit_function(module: str, qualname: str):
    from triton.runtime.jit import JITFunction

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    for _ in range(16):  # Autotuned -> FastKernel -> JITFunction
        inner = getattr(obj, "jit_function", None)
        if isinstance(inner, JITFunction):
            return inner
        if isinstance(obj, JITFunction):
            return obj
        obj = getattr(obj, "fn", None)
    raise TypeError(f"{module}.{qualname} is not a triton.jit function")


def main() -> int:
    request = pickle.load(sys.stdin.buffer)
    sys.path[:0] = [p for p in request["sys_path"] if p not in sys.path]
    from fastkernel import cache

    for module, qualname, target, spec in request["jobs"]:
        try:
            cache.load_or_compile(_jit_function(module, qualname), target, spec)
        except Exception as exc:  # noqa: BLE001 - reported; the parent compiles it itself
            print(
                f"fastkernel compile worker: {module}.{qualname}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
