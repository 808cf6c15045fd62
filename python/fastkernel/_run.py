"""``python -m fastkernel run [--stats] [-m module | -c command | script | -] [args...]``: run a
program with every Triton kernel launch served natively (:func:`fastkernel.patch`), the way
``coverage run`` runs one under measurement. The target runs as the interpreter runs it
(``python script``, ``python -m module``, ``python -c command``, a directory or zip archive with a
``__main__.py``, ``-`` for standard input): in a new ``__main__`` module that stays in
``sys.modules`` after it returns (for ``atexit`` handlers, threads and pickling), with the
``sys.argv``, ``sys.path[0]``, ``__file__``, ``__spec__``, ``__loader__`` and ``__package__``
the interpreter gives it (CPython's documented command-line behaviour and ``runpy`` module),
tracebacks that start at the target, and its exit status passed through.

The Python processes the program starts (subprocesses, multiprocessing's spawned children,
torchrun's workers) patch Triton too when they import it: the runner sets ``FASTKERNEL_PATCH=1``
and puts a startup hook first on ``PYTHONPATH`` (``_startup/sitecustomize.py``); with
``--stats`` each of them that launched a kernel prints its own table at exit, after the
program's exit handlers (multiprocessing's fork and forkserver children, which end with
``os._exit``: after its exit finalizers), headed by its process id and program.
"""

from __future__ import annotations

import argparse
import atexit
import builtins
import importlib.machinery
import importlib.util
import io
import os
import sys
import types
import zipfile


def _launched(kernel_stats: dict) -> bool:
    """Whether a kernel's counters (fastkernel.stats()) show a launch."""
    return bool(kernel_stats["hits"] or kernel_stats["misses"] or kernel_stats["fallbacks"])


def stats_table(stats: dict[str, dict]) -> str:
    """A text table of the kernels that launched: hits, misses and fallbacks with reasons."""
    rows = [(name, s) for name, s in sorted(stats.items()) if _launched(s)]
    if not rows:
        return "fastkernel: no Triton kernel launched"
    width = max(len("kernel"), *(len(name) for name, _ in rows))
    lines = [f"{'kernel':<{width}}  {'hits':>10}  {'misses':>7}  {'fallbacks':>9}"]
    for name, s in rows:
        lines.append(f"{name:<{width}}  {s['hits']:>10}  {s['misses']:>7}  {s['fallbacks']:>9}")
        for reason, count in sorted(s["fallback_reasons"].items()):
            lines.append(f"{'':<{width}}    {count} x {reason}")
    return "\n".join(lines)


class _CannotRun(Exception):
    """The target cannot be found or loaded: the interpreter's message and exit status."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def _new_main(**attributes) -> types.ModuleType:
    """A fresh ``__main__`` module, installed in ``sys.modules`` for good."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, **attributes)
    sys.modules["__main__"] = main
    return main


def _module_spec(name: str) -> importlib.machinery.ModuleSpec:
    """The spec ``python -m name`` runs (a package's ``__main__`` submodule), or _CannotRun with
    the interpreter's message."""
    if name.startswith("."):
        raise _CannotRun("Relative module names not supported")
    parent = name.rpartition(".")[0]
    try:
        if parent:
            __import__(parent)
        spec = importlib.util.find_spec(name)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise _CannotRun(
            f"Error while finding module specification for {name!r} ({type(exc).__name__}: {exc})"
        ) from None
    if spec is None:
        raise _CannotRun(f"No module named {name}")
    if spec.submodule_search_locations is not None:
        if name == "__main__" or name.endswith(".__main__"):
            raise _CannotRun("Cannot use package as __main__ module")
        try:
            return _module_spec(name + ".__main__")
        except _CannotRun as exc:
            raise _CannotRun(
                f"{exc}; {name!r} is a package and cannot be directly executed"
            ) from None
    if spec.loader is None:
        raise _CannotRun(f"{name!r} is a namespace package and cannot be executed")
    return spec


def _prepare(ns: argparse.Namespace) -> tuple[types.CodeType, types.ModuleType]:
    """Sets ``sys.argv`` and ``sys.path[0]`` as the interpreter would for the target, installs
    its ``__main__`` module and compiles its code (a SyntaxError propagates)."""
    if ns.module:
        spec = _module_spec(ns.target)
        code = spec.loader.get_code(spec.name)  # type: ignore[union-attr]
        if code is None:
            raise _CannotRun(f"No code object available for {ns.target}")
        sys.argv = [spec.origin or ns.target, *ns.args]
        sys.path[0] = os.getcwd()
        main = _new_main(
            __file__=spec.origin,
            __cached__=spec.cached,
            __loader__=spec.loader,
            __package__=spec.parent,
            __spec__=spec,
        )
        return code, main
    if ns.command is not None:
        sys.argv = ["-c", *ns.args]
        sys.path[0] = ""
        main = _new_main(
            __loader__=importlib.machinery.BuiltinImporter, __package__=None, __spec__=None
        )
        return compile(ns.command, "<string>", "exec", dont_inherit=True), main
    target = ns.target
    sys.argv = [target, *ns.args]
    if target == "-":
        sys.path[0] = ""
        main = _new_main(
            __loader__=importlib.machinery.BuiltinImporter, __package__=None, __spec__=None
        )
        return compile(sys.stdin.buffer.read(), "<stdin>", "exec", dont_inherit=True), main
    path = os.path.abspath(target)
    if os.path.isdir(path) or (os.path.isfile(path) and zipfile.is_zipfile(path)):
        # A directory or zip archive goes first on sys.path and its __main__ module runs.
        sys.path[0] = path
        found = importlib.machinery.PathFinder.find_spec("__main__", [path])
        if found is None or found.loader is None:
            raise _CannotRun(f"can't find '__main__' module in {path!r}")
        code = found.loader.get_code("__main__")  # type: ignore[attr-defined]
        main = _new_main(
            __file__=found.origin,
            __cached__=None,
            __loader__=found.loader,
            __package__="",
            __spec__=found,
        )
        return code, main
    try:
        with io.open_code(path) as f:
            source = f.read()
    except OSError as exc:
        message = f"can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}"
        raise _CannotRun(message, 2) from None
    # The script's own directory, symbolic links resolved, as the interpreter puts it first.
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    main = _new_main(
        __file__=path,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __package__=None,
        __spec__=None,
    )
    return compile(source, path, "exec", dont_inherit=True), main


def _from_target(tb: types.TracebackType | None, code: types.CodeType | None):
    """The traceback from the target's own frame on; None when the error came before the
    target ran (a SyntaxError compiling it, reported without frames as the interpreter does)."""
    frame = tb
    while frame is not None and frame.tb_frame.f_code is not code:
        frame = frame.tb_next
    return frame


#: Set by the runner for the Python processes its program starts (see _startup/sitecustomize.py):
#: each prints its own --stats table at exit.
STATS_VARIABLE = "FASTKERNEL_RUN_STATS"
#: The process id of the runner itself, which prints its table without a header; 0 in the
#: processes its program starts (a process forked from the runner is one of them).
_runner_pid = 0
#: Each kernel's counters when this process was forked from one that had imported fastkernel
#: (kernel.counters_now): a forked child inherits its parent's counters, and its table counts
#: only its own launches. None in a process not forked so.
_counters_at_fork = None
#: The process that printed its table: one table per process, whichever exit path runs first.
_printed_pid = 0


def print_stats_at_exit() -> None:
    """With --stats, this process's table at its exit, once (called by atexit in the runner and
    in the processes its program starts, and by multiprocessing's exit finalizers in its fork
    and forkserver children). A process other than the runner prints its table only when a
    kernel launched in it, headed by its process id and program."""
    global _printed_pid
    from . import _env

    if not _env.flag(STATS_VARIABLE) or _printed_pid == os.getpid():
        return
    _printed_pid = os.getpid()
    _print_stats(child=os.getpid() != _runner_pid)


def after_fork_in_child() -> None:
    """In a child forked (``os.fork``) from a process that had imported fastkernel, with
    --stats: keeps each kernel's counters as the fork left them, then arranges the table at exit
    (:func:`print_at_multiprocessing_exit`)."""
    global _counters_at_fork
    from .kernel import counters_now

    _counters_at_fork = counters_now()
    print_at_multiprocessing_exit()


def print_at_multiprocessing_exit() -> None:
    """Makes a forked child print its table as the last of multiprocessing's exit finalizers.
    multiprocessing's fork and forkserver children end with ``os._exit``, which runs no atexit
    handler (Python 3.13 clears those inherited and runs only its own), after
    ``util._exit_function`` has run the finalizers (multiprocessing/process.py,
    ``BaseProcess._bootstrap``). The bootstrap first clears the finalizers the child inherited,
    then calls the after-fork callbacks (``util._run_after_forkers``): one of those registers the
    finalizer again. Nothing to do without multiprocessing: an exit through ``sys.exit`` runs
    the atexit handlers."""
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    _finalize_at_multiprocessing_exit(print_stats_at_exit)
    util.register_after_fork(print_stats_at_exit, _finalize_at_multiprocessing_exit)


def _finalize_at_multiprocessing_exit(printer) -> None:
    """Registers ``printer`` as the last of multiprocessing's exit finalizers."""
    sys.modules["multiprocessing.util"].Finalize(None, printer, exitpriority=-sys.maxsize)


def _child_environment(stats: bool) -> None:
    """Makes the Python processes the program starts patch Triton too: ``FASTKERNEL_PATCH=1``
    and the startup hook's directory first on ``PYTHONPATH`` (inherited by subprocesses,
    multiprocessing's spawned children and torchrun's workers)."""
    hook = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_startup")
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = hook + (os.pathsep + path if path else "")
    os.environ["FASTKERNEL_PATCH"] = "1"
    if stats:
        os.environ[STATS_VARIABLE] = "1"


def _report_from_target(exc: BaseException, trimmed: types.TracebackType | None) -> None:
    """Makes the interpreter's report of ``exc``, uncaught, show ``trimmed`` (the traceback from
    the target's frame) rather than the runner's frames, whatever sys.excepthook is then."""
    if trimmed is None:
        return
    hook = sys.excepthook  # the program's own, if it set one

    def report(kind, value, tb):
        sys.excepthook = hook
        if value is exc:  # its traceback has grown by the runner's frames since
            value, tb = exc.with_traceback(trimmed), trimmed
        hook(kind, value, tb)

    sys.excepthook = report


def _print_stats(child: bool = False) -> None:
    """The --stats table, on the interpreter's own stderr (the program may have replaced or
    closed its streams), once the program, its threads and its exit handlers are done. For a
    ``child`` process of the runner's program: headed by its process id and program, and not
    printed when no kernel launched."""
    from .kernel import stats_since

    stats = stats_since(_counters_at_fork)
    if child and not any(_launched(s) for s in stats.values()):
        return

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # replaced by None, or closed
            pass
    out = sys.__stderr__
    if out is None or out.closed:
        return
    table = stats_table(stats)
    if child:
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        table = f"fastkernel: process {os.getpid()} ({program})\n{table}"
    # One write, newline included: processes sharing one stderr (torchrun's workers) each end
    # their table before another's can start (print writes the newline separately).
    out.write(table + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fastkernel run",
        description="Run a Python program with fastkernel.patch() on, as the interpreter runs "
        "it; the Python processes it starts patch Triton too when they import it.",
    )
    parser.add_argument(
        "--stats",
        action="store_true",
        help="print at exit, on stderr, every kernel that launched: native hits, "
        "misses (compiles or cache loads), fallbacks and their reasons; each Python process "
        "the program starts that launched a kernel prints its own table",
    )
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "-m",
        dest="module",
        action="store_true",
        help="target is a module name, run as `python -m target`",
    )
    how.add_argument(
        "-c", dest="command", metavar="COMMAND", help="run COMMAND, as `python -c COMMAND`"
    )
    parser.add_argument(
        "target",
        nargs="?",
        help="the script, directory or zip archive (- for standard input), or with -m the module",
    )
    parser.add_argument("args", nargs="*", help="its arguments (every word after the target)")
    argv = list(sys.argv[1:] if argv is None else argv)
    # fastkernel's options come before the target; every word after it is the target's own,
    # options included (argparse alone would read a target's `-h` as its own).
    split = 0
    command = False
    while split < len(argv) and argv[split].startswith("-") and argv[split] != "-":
        command = argv[split] == "-c"
        split += 2 if command else 1
        if command:  # every word after `-c COMMAND` is the command's
            break
    if command:
        ns = parser.parse_args(argv[:split])
        ns.args = argv[split:]
    else:
        ns = parser.parse_args(argv[: split + 1])
        ns.args = argv[split + 1 :]
        if ns.target is None:
            parser.error(
                "a target is required: a script, a directory or zip archive, -, "
                "-m module or -c command"
            )

    import fastkernel

    global _runner_pid
    _runner_pid = os.getpid()
    fastkernel.patch()
    _child_environment(ns.stats)
    if ns.stats:
        # Registered before the program runs, so it runs after the program's own exit handlers
        # (atexit calls them last in, first out) and after its non-daemon threads have ended.
        atexit.register(print_stats_at_exit)
        os.register_at_fork(after_in_child=after_fork_in_child)
    code = main_module = None
    try:
        code, main_module = _prepare(ns)
        try:
            exec(code, main_module.__dict__)
        finally:
            if main_module.__spec__ is None and "__file__" in main_module.__dict__:
                # The interpreter removes a script's __file__ (and __cached__) once it has run.
                del main_module.__file__
                main_module.__dict__.pop("__cached__", None)
    except _CannotRun as exc:
        print(f"{sys.executable}: {exc}", file=sys.stderr)
        return exc.status
    except SystemExit as exc:
        status = exc.code
        if status is None:
            return 0
        if isinstance(status, int):
            return status
        print(status, file=sys.stderr)  # sys.exit("message"), as the interpreter reports it
        return 1
    except KeyboardInterrupt as exc:
        # The interpreter reports it (through sys.excepthook) and exits as interrupted (by
        # SIGINT, after the exit handlers): only the report starts at the target's frame.
        _report_from_target(exc, _from_target(exc.__traceback__, code))
        raise
    except BaseException as exc:
        # Reported as the interpreter reports an uncaught exception, from the target's frame.
        trimmed = _from_target(exc.__traceback__, code)
        sys.excepthook(type(exc), exc.with_traceback(trimmed), trimmed)
        return 1
    return 0
