"""Kernel bundles: the compiled specializations of a kernel, written for C++ callers.

``fastkernel.export(kernel, path)`` writes every specialization the kernel has registered (so:
run the kernel with the argument kinds you need, then export) as a directory of cubins and a
``manifest.txt`` that ``fastkernel::Bundle::load`` (csrc/include/fastkernel/bundle.h) reads with
no Python: per entry, the launch facts, the parameter plan, and for each runtime parameter the
specialization an argument must have (Triton's rules: pointer alignment, int == 1 / % 16 and
width, None), and a SHA-256 digest binding the entry's lines to its cubin. C++ passes the
runtime parameters in declared order, constexprs excluded; the entry's constexprs are fixed at
compile time.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

from . import _C, _arguments, _bundle_files
from . import _triton_abi as abi

# The C++ enums' values, as the native module exports them (csrc/python/module.cpp).
_KIND = _C.ARG_KINDS
_WIDTH = _C.INT_WIDTHS
_NOT_SPECIALIZED = _C.VALUE_CLASSES["not_specialized"]
_DIVISIBLE_16 = _C.VALUE_CLASSES["divisible_16"]
_OTHER = _C.VALUE_CLASSES["other"]
_EQUALS_ONE = _C.VALUE_CLASSES["equals_one"]


def _divisible(attrs, index: int) -> bool:
    return any(attr[0] == "tt.divisibility" and attr[1] == 16 for attr in attrs.get((index,), []))


def _pattern(
    param, index: int, spec: abi.Specialization, spec_flags
) -> tuple[int, int, int, int, int, int, str]:
    """(kind, width, class, specialize, align, any_width, type) of one runtime parameter."""
    ty = spec.signature[param.name]
    specialize, align = spec_flags
    annotated = bool(param.annotation_type)
    cls = (
        _NOT_SPECIALIZED
        if not specialize
        else _DIVISIBLE_16
        if _divisible(spec.attrs, index)
        else _OTHER
    )
    if ty == "constexpr":  # an argument Triton specialized away: == 1 or None
        value = spec.constexprs.get((index,))
        if value is None:
            return (_KIND["none"], 0, _NOT_SPECIALIZED, int(specialize), int(align), 0, "None")
        if type(value) is int and value == 1:
            return (_KIND["int"], 0, _EQUALS_ONE, int(specialize), int(align), 0, "==1")
        raise ValueError(
            f"parameter '{param.name}' was passed a constexpr object "
            f"({value!r}); C++ cannot pass one"
        )
    if ty.startswith("*"):
        return (_KIND["tensor"], 0, cls, int(specialize), int(align), 0, ty)
    if ty in _WIDTH:
        return (_KIND["int"], _WIDTH[ty], cls, int(specialize), int(align), int(annotated), ty)
    if ty in ("u1", "i1"):
        return (_KIND["bool"], 0, _NOT_SPECIALIZED, 0, 0, 0, ty)
    if ty in ("fp16", "bf16", "fp32", "fp64"):
        return (_KIND["float"], 0, _NOT_SPECIALIZED, 0, 0, int(annotated), ty)
    raise ValueError(
        f"parameter '{param.name}' has launch type {ty!r}, which C++ bundles do not support yet"
    )


#: The manifest format ``fastkernel::Bundle::load`` reads (csrc/include/fastkernel/bundle.h).
BUNDLE_VERSION: int = _C.BUNDLE_FORMAT_VERSION


def entry_digest(entry_lines: list[str], cubin: bytes) -> str:
    """The digest an entry's ``digest`` line records: SHA-256 (hex) of its manifest lines from
    ``entry`` up to the digest line, each ending in a newline, followed by its cubin's bytes. The
    loader recomputes it, so a changed launch fact, plan line or cubin byte, or a cubin swapped
    for another entry's, is refused at load."""
    return hashlib.sha256("".join(line + "\n" for line in entry_lines).encode() + cubin).hexdigest()


def check_bundle(path) -> list[str]:
    """Load the bundle directory ``path`` as ``fastkernel::Bundle::load`` does, with every check
    it makes (csrc/bundle.cpp: files opened without following links, regular and within the
    size limits; plain cubin names; each number in range; each entry's parameter plan exactly
    Triton's; each cubin's ELF extents inside its file; each entry's SHA-256 digest over its
    lines and cubin), without a GPU or driver: nothing is loaded on a device. For a bundle
    about to ship, or one received.

    Parameters
    ----------
    path : str or os.PathLike
        The bundle directory (``manifest.txt`` and the cubins it names).

    Returns
    -------
    list of str
        Each entry as a C++ mismatch error lists it, in manifest order:
        ``"add_kernel[*fp32 %16, *fp32 %16, *fp32 %16, i32 %16] {BLOCK=1024} sm_90"``
        (each runtime parameter's type and specialization, the constexprs, the target).

    Raises
    ------
    TypeError
        ``path`` is not a str or os.PathLike.
    FileNotFoundError, NotADirectoryError
        ``path`` does not exist, or is not a directory.
    fastkernel.BundleError
        ``Bundle::load`` refused the bundle (a ValueError; the message is the loader's, naming
        the file and line).
    """
    root = _arguments.path("check_bundle", "path", path)
    if not root.is_dir():
        error = NotADirectoryError if root.exists() else FileNotFoundError
        raise error(f"check_bundle(): '{root}' is not a bundle directory")
    return _C.check_bundle(os.fspath(root))


def _write_bundle(root: pathlib.Path, manifest: bytes, cubins: dict[str, bytes]) -> None:
    """:func:`fastkernel._bundle_files.write` under a lock file (``.export.lock``), so that
    processes exporting into one directory take turns."""
    from .cache.store import cross_process_lock

    root.mkdir(parents=True, exist_ok=True)
    with cross_process_lock(lambda: root / ".export.lock", f"exporting a bundle to {root}"):
        _bundle_files.write(root, manifest, cubins)


def export(kernel, path) -> list[pathlib.Path]:
    """Write ``kernel``'s registered specializations to the bundle directory ``path``.

    Parameters
    ----------
    kernel : fastkernel.FastKernel
        A kernel that has been launched (each launch kind registers a specialization).
    path : str or os.PathLike
        The bundle directory (created). Every entry is made and checked before anything is
        written; the cubins are written under names made from their SHA-256, then the
        manifest replaces any earlier one atomically, then the cubins no manifest names any
        more are removed. A reader (``Bundle::load`` reads the new manifest when a cubin of
        the one it read is gone), or an export killed at any point, sees a whole bundle: the
        earlier one or the new one. One export into a directory at a time (a lock file,
        ``.export.lock``, serializes processes).

    Returns
    -------
    list of pathlib.Path
        The cubin files the manifest names, one per distinct binary (entries whose cubins
        are the same bytes share one file; registrations that are one entry for C++, with
        the same argument patterns, launch facts and cubin, are written as one entry).

    Raises
    ------
    TypeError
        ``kernel`` is not a ``@fastkernel`` kernel (an autotuner or heuristics wrapper is not:
        export the kernel it wraps), or ``path`` is not a str or os.PathLike.
    ValueError
        It has no registered specialization, or one uses an argument kind C++ bundles do not
        support (constexpr objects in runtime parameters, tuples, host tensor descriptors).
        Nothing is written.
    OSError
        The directory cannot be made or a file written (``path`` names a file, no permission,
        a full disk).
    """
    from .kernel import FastKernel, _specialization_flags

    _arguments.instance("export", "kernel", kernel, FastKernel, "a @fastkernel kernel")
    root = _arguments.path("export", "path", path)
    registrations = list(kernel._registrations.values())
    if not registrations:
        raise ValueError(f"{kernel.__name__} has no registered specialization: launch it first")
    flags = [_specialization_flags(p) for p in kernel.jit_function.params]
    runtime = [(i, p) for i, p in enumerate(kernel.params) if not p.is_constexpr]
    runtime_index = {i: r for r, (i, _) in enumerate(runtime)}
    lines = [f"fastkernel-bundle {BUNDLE_VERSION}"]
    cubins: dict[str, bytes] = {}
    # Two registrations can be one entry for C++ (Triton keys an annotated parameter by its
    # annotation, fastkernel's Python key by the value's kind): written once, or every call
    # matching them would be refused as ambiguous.
    seen = set()
    for target, spec, meta in registrations:
        facts = abi.launch_facts(
            meta, device=0, plan=[], num_scratch_params=abi.num_scratch_params()
        )
        constexprs = {
            kernel.params[k[0]].name: v
            for k, v in spec.constexprs.items()
            if kernel.params[k[0]].is_constexpr
        }
        body = ["constexprs " + " ".join(f"{k}={v!r}" for k, v in constexprs.items())]
        for index, param in runtime:
            body.append(
                "arg " + " ".join(str(x) for x in _pattern(param, index, spec, flags[index]))
            )
        for index, ty in spec.plan:
            if abi.descriptor_rank(ty) is not None:
                raise ValueError(
                    f"{kernel.__name__}: a specialization takes host tensor "
                    f"descriptors, which C++ bundles do not support"
                )
            if index not in runtime_index:
                raise ValueError(
                    f"{kernel.__name__}: a specialization takes tuple arguments, "
                    f"which C++ bundles do not support"
                )
            body.append(f"plan {runtime_index[index]} {ty}")
        launch = (
            meta.name,
            target.arch,
            *(int(getattr(facts, name)) for name in _C.BUNDLE_ENTRY_FACTS),
        )
        identity = (launch, tuple(body), hashlib.sha256(meta.cubin).digest())
        if identity in seen:
            continue
        seen.add(identity)
        cubin = _bundle_files.cubin_name(meta.name, meta.cubin)
        cubins[cubin] = meta.cubin
        entry = [" ".join(str(x) for x in ("entry", kernel.__name__, cubin, *launch)), *body]
        lines += entry
        lines.append(f"digest {entry_digest(entry, meta.cubin)}")
        lines.append("end")
    # Everything is checked: only now is anything written.
    _write_bundle(root, ("\n".join(lines) + "\n").encode(), cubins)
    return [root / name for name in cubins]
