"""Run at the start of every Python process that ``python -m fastkernel run`` starts, directly
or not (torchrun's workers, multiprocessing's spawned children, a subprocess running Python):
the runner puts this directory first on ``PYTHONPATH``, so the interpreter's ``site`` module
imports this file as ``sitecustomize`` (CPython's documented startup, Lib/site.py).

It imports nothing heavy. A finder on ``sys.meta_path`` waits for the process to import Triton
and then calls ``fastkernel.patch()`` (through ``import fastkernel`` with ``FASTKERNEL_PATCH=1``,
set by the runner), once Triton and torch are both fully imported; a process that never
imports Triton never imports fastkernel, torch or Triton. Then the ``sitecustomize`` this file
shadows on ``sys.path``, if there is one, runs as it would have.

Python that cannot import this fastkernel (another environment or interpreter started by the
program) is left as it is. Written for every Python the program may start: no syntax newer
than 3.8.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
#: Modules whose import must be complete before the patch (it imports both).
_WATCHED = ("triton", "torch")


class _PatchWhenTritonIsImported(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of Triton and torch so that the patch is applied
    when the later of the two finishes executing (torch may import Triton while it initializes)."""

    def __init__(self):
        self.finished = set()
        self.patching = False

    def find_spec(self, name, path=None, target=None):
        if name not in _WATCHED or self.patching:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self)
        return spec

    def module_finished(self, name):
        self.finished.add(name)
        if "triton" not in self.finished or self.patching:
            return
        torch = sys.modules.get("torch")
        spec = getattr(torch, "__spec__", None)
        if (
            torch is not None
            and "torch" not in self.finished
            and getattr(spec, "_initializing", False)
        ):
            return  # torch imported Triton while it initializes: patched when torch finishes
        self.patching = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _patch()


class _Loader(importlib.abc.Loader):
    """The module's own loader, telling the finder when the module has executed. The module
    keeps its own loader as ``__loader__`` and ``__spec__.loader``."""

    def __init__(self, loader, finder):
        self.loader = loader
        self.finder = finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        spec = module.__spec__
        if spec is not None:
            spec.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        self.loader.exec_module(module)
        self.finder.module_finished(spec.name if spec is not None else module.__name__)


def _patch():
    try:
        import fastkernel
        from fastkernel import _run

        # Importing fastkernel patched (FASTKERNEL_PATCH=1); when fastkernel is what imported
        # Triton, its import is not over yet and patches when it is.
        if not getattr(fastkernel.__spec__, "_initializing", False):
            fastkernel.patch()
    except ImportError:
        return  # a Python without this fastkernel: the program's own business
    except Exception as exc:  # never break the program's import of Triton
        sys.stderr.write(f"fastkernel: could not patch Triton in process {os.getpid()}: {exc!r}\n")
        return
    _run.started_by_runner()


def _install():
    # FASTKERNEL_PATCH read as fastkernel reads it (fastkernel/_env.py flag), without importing it.
    if os.environ.get("FASTKERNEL_PATCH", "").strip().lower() in ("", "0", "false", "off", "no"):
        return
    if all(name in sys.modules for name in _WATCHED):  # imported by a .pth file already
        _patch()
        return
    sys.meta_path.insert(0, _PatchWhenTritonIsImported())


def _run_shadowed_sitecustomize():
    """The ``sitecustomize`` module this one hides, run as ``site`` would have run it."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
_run_shadowed_sitecustomize()
