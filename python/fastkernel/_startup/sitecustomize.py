"""Run at the start of every Python process that ``python -m fastkernel run`` starts, directly
or not (torchrun's workers, multiprocessing's spawned children, a subprocess running Python):
the runner puts this directory first on ``PYTHONPATH``, so the interpreter's ``site`` module
imports this file as ``sitecustomize`` (CPython's documented startup, Lib/site.py).

It imports nothing heavy. A finder on ``sys.meta_path`` waits for the process to import Triton
and then calls ``fastkernel.patch()`` once Triton and torch are both fully imported (fastkernel
imports torch, and torch may import Triton while it initializes); a process that never imports
Triton never imports fastkernel, torch or Triton. An exit handler registered here, before the
program's own, prints the process's ``--stats`` table after them. Then the ``sitecustomize``
this file shadows on ``sys.path``, if there is one, runs as it would have.

Python that cannot import this fastkernel (another environment or interpreter started by the
program) is left as it is. Written for every Python 3 the program may start: no syntax newer
than 3.6.
"""

import atexit
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
#: Modules whose import must be complete before the patch (it imports both).
_WATCHED = ("triton", "torch")
#: Marks this hook's finder, also when another copy of this file (another fastkernel on
#: PYTHONPATH, a nested runner) installed it: one per process.
_MARK = "fastkernel_startup_hook"


def _enabled(name):
    # A flag read as fastkernel reads it (fastkernel/_env.py flag), without importing it.
    value = os.environ.get(name, "").strip().lower()
    return value not in ("", "0", "false", "off", "no")


def _imported(name, finished):
    """Whether module ``name`` is in sys.modules and done executing (``finished``: the names
    whose execution this hook saw end, whose spec still says initializing until the import
    machinery returns)."""
    module = sys.modules.get(name)
    if module is None:
        return False
    spec = getattr(module, "__spec__", None)
    return name in finished or not getattr(spec, "_initializing", False)


class _PatchWhenTritonIsImported:
    """A ``sys.meta_path`` finder that finds nothing itself: it wraps the loader of Triton and
    torch so that it hears when each has executed, and patches when both are in."""

    fastkernel_startup_hook = True

    def __init__(self):
        self.finished = set()
        self.done = False

    def find_spec(self, name, path=None, target=None):
        if name not in _WATCHED or self.done:
            return None
        for finder in sys.meta_path:
            if getattr(finder, _MARK, False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self)  # type: ignore[assignment]  # duck-typed
        return spec

    def module_finished(self, name):
        self.finished.add(name)
        self.patch_when_ready()

    def patch_when_ready(self):
        if self.done or not _imported("triton", self.finished):
            return
        if "torch" in sys.modules and not _imported("torch", self.finished):
            return  # torch imported Triton while it initializes: patched when torch is done
        self.done = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _patch()


class _Loader:
    """The module's own loader, telling the finder when the module has executed; everything
    else (``get_data``, ``is_package``, resource readers, ...) is the loader's. The module
    keeps its own loader as ``__loader__`` and ``__spec__.loader``."""

    def __init__(self, loader, finder):
        self.loader = loader
        self.finder = finder

    def __getattr__(self, name):
        if name in ("loader", "finder"):  # not set yet: no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        spec = module.__spec__
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        self.loader.exec_module(module)
        self.finder.module_finished(spec.name if spec is not None else module.__name__)


def _patch():
    try:
        import fastkernel

        if _forked:
            from fastkernel import _run

            _run.print_at_multiprocessing_exit()
        # Importing fastkernel patched (FASTKERNEL_PATCH=1); when fastkernel is what imported
        # Triton, its import is not over yet and patches when it is.
        if not getattr(fastkernel.__spec__, "_initializing", False):
            fastkernel.patch()
    except ImportError:
        return  # a Python without this fastkernel: the program's own business
    except Exception as exc:  # never break the program's import of Triton
        sys.stderr.write(f"fastkernel: could not patch Triton in process {os.getpid()}: {exc!r}\n")


def _print_stats_at_exit():
    if "fastkernel" not in sys.modules:  # imported by the patch: Triton was never imported
        return
    try:
        from fastkernel import _run
    except ImportError:
        return
    _run.print_stats_at_exit()


#: Whether this process is a child forked (os.fork) from one that ran this hook.
_forked = False


def _after_fork_in_child():
    """With --stats, in a forked child (multiprocessing's fork and forkserver children end with
    ``os._exit``, which runs no atexit handler): the table comes from multiprocessing's exit
    finalizers (fastkernel/_run.py). A child forked before fastkernel was imported arranges that
    when it patches."""
    global _forked
    _forked = True
    fastkernel = sys.modules.get("fastkernel")
    if fastkernel is None or getattr(fastkernel.__spec__, "_initializing", False):
        return
    try:
        from fastkernel import _run
    except ImportError:
        return
    _run.after_fork_in_child()


def _install():
    if not _enabled("FASTKERNEL_PATCH") or any(getattr(f, _MARK, False) for f in sys.meta_path):
        return
    atexit.register(_print_stats_at_exit)
    if _enabled("FASTKERNEL_RUN_STATS") and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    finder = _PatchWhenTritonIsImported()
    sys.meta_path.insert(0, finder)
    finder.patch_when_ready()  # Triton imported already (by a .pth file)


def _is_startup_hook(path):
    """Whether ``path`` is this file or another fastkernel's copy of it."""
    directory = os.path.realpath(os.path.dirname(path))
    return directory == _HERE or (
        os.path.basename(directory) == "_startup"
        and os.path.basename(os.path.dirname(directory)) == "fastkernel"
    )


def _run_shadowed_sitecustomize():
    """The first ``sitecustomize`` on sys.path after the startup hooks, run as ``site`` would
    have run it (an exception it raises is reported by ``site``, as without the hook)."""
    for entry in sys.path:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None or spec.origin is None:
            continue
        if _is_startup_hook(spec.origin):
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
        return


_install()
_run_shadowed_sitecustomize()
