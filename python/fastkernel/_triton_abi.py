"""The installed Triton's launch ABI and compile entry points, in one place.

Everything fastkernel needs to know about how a particular Triton version specializes,
compiles and calls a kernel lives here, so that a Triton release that changes one of these
facts changes one module. Facts come from Triton 3.5-3.9's ``triton/runtime/jit.py``
(``JITFunction.run``, ``create_function_from_signature``, ``_pack_args``),
``triton/backends/nvidia/driver.py`` (``CudaLauncher``) and ``driver.c`` (``_launch``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import LazyDict, make_backend
from triton.runtime import jit as triton_jit

TRITON_VERSION: tuple[int, int] = tuple(int(p) for p in triton.__version__.split(".")[:2])  # type: ignore


#: Immutable objects Triton specializes as constexprs: dtypes and jit functions (JITCallable in
#: Triton >= 3.6 also covers constexpr_function helpers; 3.5 has only JITFunction).
IDENTITY_CONSTEXPR_TYPES = (
    triton.language.dtype,
    getattr(triton_jit, "JITCallable", triton_jit.JITFunction),
)


def num_scratch_params() -> int:
    """Device pointers Triton appends after the declared parameters: ``global_scratch`` and
    ``profile_scratch`` in every supported Triton (>= 3.5; driver.c ``launchKernel``)."""
    return 2


@functools.cache
def cuda_target(major: int, minor: int) -> GPUTarget:
    """The compile target Triton's CUDA driver reports for a device of this capability."""
    return GPUTarget("cuda", major * 10 + minor, 32)


@functools.cache
def backend_for(target: GPUTarget):
    """Triton's compiler backend for ``target`` (works without a GPU)."""
    return make_backend(target)


@functools.cache
def options_class(target: GPUTarget) -> type:
    """The backend's options dataclass (``CUDAOptions``, ``HIPOptions``), as its
    ``parse_options`` returns it."""
    return type(backend_for(target).parse_options({}))


def option_names(target: GPUTarget) -> list[str]:
    """Keyword arguments that are compile options (fields of the backend's options dataclass)."""
    return [f.name for f in dataclasses.fields(options_class(target))]


def make_binder(jit_fn: triton_jit.JITFunction, target: GPUTarget):
    """Triton's own argument binder and specializer for ``jit_fn`` (jit.py create_binder)."""
    return triton_jit.create_function_from_signature(
        jit_fn.signature, jit_fn.params, backend_for(target)
    )


def runtime_options(
    jit_fn: triton_jit.JITFunction, kwargs: dict[str, Any], knob_word: int | None = None
) -> dict[str, Any]:
    """The keyword options JITFunction.run adds before specializing (knobs that change the binary).

    With ``knob_word`` (the knob word of a native key, :func:`knob_state`), the knob values that
    word stands for, which the knobs may no longer hold: a key is built before the call's
    Python runs (pre-run hooks, another thread), and the binary registered under it must be the
    one its word names. Otherwise, and for a word never handed out, the knobs as they are now.
    """
    from triton import knobs

    debug, instrumentation_mode, fpsan = binary_knobs(knob_word)
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", jit_fn.debug) or debug
    compilation = knobs.compilation
    if hasattr(compilation, "instrumentation_mode"):
        kwargs["instrumentation_mode"] = instrumentation_mode
    if hasattr(compilation, "fpsan_homomorphic_casts"):
        kwargs["fpsan_homomorphic_casts"] = fpsan
    return kwargs


@dataclasses.dataclass
class Specialization:
    """What Triton decided for one call: the compile inputs and the launch parameter plan."""

    signature: dict[str, Any]
    constexprs: dict[tuple[int, ...], Any]
    attrs: dict[tuple[int, ...], Any]
    options: Any
    #: (argument index, Triton type) of each parameter the kernel receives, in order.
    plan: list[tuple[int, str]]


class UnsupportedByNativePath(Exception):
    """The call compiles, but its launch ABI is outside what the native trampoline packs."""


def specialize(
    jit_fn,
    target: GPUTarget,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    knob_word: int | None = None,
) -> Specialization:
    """Specialize a call exactly as ``JITFunction.run`` would, without a GPU; with the knob
    values of ``knob_word`` where given (:func:`runtime_options`).

    Raises
    ------
    TypeError, KeyError
        As Triton raises them for a bad call.
    UnsupportedByNativePath
        For launch types the native packer does not build (im2col descriptors).
    """
    from triton import knobs

    backend = backend_for(target)
    kwargs = runtime_options(jit_fn, kwargs, knob_word)
    binder = make_binder(jit_fn, target)
    bound_args, specialization, options = binder(*args, **kwargs)
    if getattr(knobs.runtime, "add_stages_inspection_hook", None) is not None:  # Triton >= 3.6
        raise UnsupportedByNativePath("a stages-inspection hook is set")
    options, signature, constexprs, attrs = jit_fn._pack_args(
        backend, kwargs, bound_args, specialization, options
    )
    for name, ty in signature.items():
        value = bound_args.get(name)
        if (
            isinstance(ty, str)
            and ty[:1] != "*"
            and ty != "constexpr"
            and _is_one_element_tensor(value)
        ):
            # An annotated scalar given a one-element tensor: Triton's launcher packs the
            # tensor's value (PyFloat_AsDouble / PyLong_AsLong call __float__ / __index__,
            # which read the device memory); the native packer holds only its address.
            raise UnsupportedByNativePath(
                f"argument '{name}' is a one-element tensor for a {ty} parameter, whose value "
                "Triton's launcher reads"
            )
    return Specialization(signature, constexprs, attrs, options, launch_plan(signature))


def _is_one_element_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.numel() == 1


def descriptor_rank(ty: str) -> int | None:
    """The rank of a host tensor descriptor's Triton type (``"tensordesc<fp16[64, 64]>"``), or
    None for any other type. The rank is the block shape's (backends/driver.py
    ``_parse_descriptor``); im2col descriptors (``tensordesc_im2col<...>``) are not host
    TensorDescriptors of this kind and give None."""
    if not isinstance(ty, str) or not ty.startswith("tensordesc<"):
        return None
    match = re.match(r"tensordesc<([^[>]*)\[([^\]]*)\]", ty)
    if match is None or ",input_rank=" in ty:
        return None
    return match.group(2).count(",") + 1


def descriptor_leaves(rank: int) -> int:
    """Bound-call slots a host descriptor takes: base, shape[rank], strides[rank], nan padding,
    round to tf32 (csrc/include/fastkernel/tensor_map.h ``descriptor_leaves``)."""
    return 2 * rank + 3


def launch_plan(signature: dict[str, Any]) -> list[tuple[int, str]]:
    """(bound-argument slot, Triton type) of each kernel parameter, in order, from a
    specialization's signature: constexprs dropped, tuples flattened depth-first into the slots
    after the declared parameters (the native bound call's layout). A host tensor descriptor
    takes ``descriptor_leaves(rank)`` slots there and appears once, as (its first slot, its
    ``tensordesc<...>`` type): :func:`expand_descriptors` turns it into the parameters the
    compiled kernel takes. Raises UnsupportedByNativePath for launch types the trampoline does
    not pack (im2col descriptors).
    """
    plan: list[tuple[int, str]] = []
    # Tuple arguments are flattened (Triton's launcher does the same): their leaves, in
    # depth-first order, take the native bound call's slots after the declared parameters.
    next_leaf = [len(signature)]

    def add(slot: int, ty: Any) -> None:
        if ty == "constexpr":
            return
        if (
            not isinstance(ty, str)
            or ty == "nvTmaDesc"
            or (ty.startswith("tensordesc") and descriptor_rank(ty) is None)
        ):
            raise UnsupportedByNativePath(f"parameter {slot} has launch type {ty!r}")
        plan.append((slot, ty))

    def add_descriptor(ty: str, rank: int) -> None:
        slot = next_leaf[0]
        next_leaf[0] += descriptor_leaves(rank)
        add(slot, ty)

    def add_leaves(types: tuple) -> None:
        for ty in types:
            if isinstance(ty, tuple):
                add_leaves(ty)
            elif (rank := descriptor_rank(ty)) is not None:
                if TRITON_VERSION <= (3, 7):  # its launcher expands top-level descriptors only
                    raise UnsupportedByNativePath("a tensor descriptor inside a tuple")
                add_descriptor(ty, rank)
            else:
                slot = next_leaf[0]
                next_leaf[0] += 1
                add(slot, ty)

    for index, ty in enumerate(signature.values()):
        if isinstance(ty, tuple):
            add_leaves(ty)
        elif (rank := descriptor_rank(ty)) is not None:
            add_descriptor(ty, rank)
        else:
            add(index, ty)
    return plan


#: Triton's device-side TMA element type -> the host CUtensorMapDataType
#: (backends/nvidia/driver.py ``TMA_DTYPE_DEVICE_TO_HOST``, the same in 3.5-3.9).
_TMA_DTYPE_DEVICE_TO_HOST = {**{i: i for i in range(16)}, 8: 10, 9: 8, 10: 9}

#: A tensor map description for the native launcher: (host data type, element size in bytes,
#: swizzle, block shape, fp4 padded, round_f32_to_tf32 selects TFLOAT32).
TensorMap = tuple[int, int, int, list[int], bool, bool]


def expand_descriptors(
    plan: list[tuple[int, str]],
    tensordesc_meta: list | None,
    version: tuple[int, int] = TRITON_VERSION,
) -> tuple[list[tuple[int, str]], list[TensorMap]]:
    """The parameters a compiled kernel takes for its host tensor descriptors, as the installed
    Triton's launcher passes them (backends/nvidia/driver.py ``make_tensordesc_arg`` and
    ``expand_signature``), reading the descriptor's leaves (base, shape, strides, nan, tf32 at
    slot offsets 0, 1, 1+rank, 1+2*rank, 2+2*rank):

    - with TMA lowering (``tensordesc_meta`` non-empty: sm_90 and later): a CUtensorMap
      (``"nvTmaDesc"``), then shape as i32 and strides as i64;
    - without (``tensordesc_meta`` empty): the base pointer, shape and strides as i64, the nan
      padding flag as i1 (and, Triton >= 3.7, the tf32 flag as i1), then shape as i32 and
      strides as i64 again.

    Returns the expanded plan and one :data:`TensorMap` per ``"nvTmaDesc"`` entry. Raises
    UnsupportedByNativePath for descriptor kinds the native encoder does not build: im2col,
    and padded fp4 under Triton <= 3.6 (which passes the doubled inner size to the kernel).
    """
    expanded: list[tuple[int, str]] = []
    maps: list[TensorMap] = []
    descriptor_index = 0
    for slot, ty in plan:
        rank = descriptor_rank(ty)
        if rank is None:
            expanded.append((slot, ty))
            continue
        shape = [slot + 1 + d for d in range(rank)]
        strides = [slot + 1 + rank + d for d in range(rank)]
        nan_slot, tf32_slot = slot + 1 + 2 * rank, slot + 2 + 2 * rank
        if tensordesc_meta:
            meta = tensordesc_meta[descriptor_index]
            if meta.get("is_im2col", False):
                raise UnsupportedByNativePath("im2col tensor descriptors")
            if meta["fp4_padded"] and version <= (3, 6):
                raise UnsupportedByNativePath("padded fp4 tensor descriptors on Triton <= 3.6")
            maps.append(
                (
                    _TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
                    int(meta["elem_size"]),
                    int(meta["swizzle"]),
                    [int(b) for b in meta["block_size"]],
                    bool(meta["fp4_padded"]),
                    version >= (3, 7),
                )
            )
            expanded.append((slot, "nvTmaDesc"))
        else:
            dtype = ty[len("tensordesc<") : ty.index("[")]
            expanded.append((slot, "*" + dtype))
            expanded += [(s, "i64") for s in shape + strides]
            expanded.append((nan_slot, "i1"))
            if version >= (3, 7):
                expanded.append((tf32_slot, "i1"))
        expanded += [(s, "i32") for s in shape] + [(s, "i64") for s in strides]
        descriptor_index += 1
    return expanded, maps


def ast_source(jit_fn, spec: Specialization) -> ASTSource:
    """The compile source ``JITFunction.run`` makes for a specialization of ``jit_fn``:
    ``self.ASTSource(self, signature, constexprs, attrs)`` (``runtime/jit.py``), where
    ``create_binder`` sets ``ASTSource`` to Triton's ``ASTSource``, or, for a Gluon kernel
    (``jit_fn.is_gluon()``), to ``GluonASTSource`` (``experimental/gluon/_runtime.py``), whose
    ``make_ir`` sets the module's target, warp and CTA attributes that Gluon's layouts need.
    Both hash alike, so Triton's own cache cannot tell which one compiled a binary."""
    cls = ASTSource
    is_gluon = getattr(jit_fn, "is_gluon", None)
    if is_gluon is not None and is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource

        cls = GluonASTSource
    return cls(jit_fn, spec.signature, spec.constexprs, spec.attrs)


def compile_specialization(jit_fn, target: GPUTarget, spec: Specialization):
    """Compile with Triton (its on-disk cache applies); returns Triton's CompiledKernel."""
    return triton.compile(ast_source(jit_fn, spec), target=target, options=spec.options.__dict__)


def compiled_kernel(src: ASTSource, metadata: Mapping[str, Any], binary: bytes):
    """Triton's ``CompiledKernel`` of a binary held in memory, made by Triton's own constructor
    (``CompiledKernel.__init__``, triton/compiler/compiler.py) from the two files of a cache
    group as Triton's cache stores one: the metadata as JSON (its ``target`` a dict) and the
    binary, under the backend's extension (``cubin``). The files exist only while the
    constructor reads them, so its ``metadata_group`` (what Triton passes its load hooks) is
    empty. Triton loads the binary and makes the launcher when the kernel is first used
    (``_init_handles``), as for any ``CompiledKernel``; the module it loads is the kernel's own.

    Parameters
    ----------
    src : triton.compiler.ASTSource
        The specialization's compile source (what Triton's launcher is made from).
    metadata : mapping
        Triton's compiled metadata, as ``CompiledKernel.metadata`` holds it: ``name``,
        ``hash``, ``target`` as a ``GPUTarget``, ...; every other value JSON-serializable.
    binary : bytes
        The compiled binary (a cubin).
    """
    import json
    import os
    import tempfile

    from triton.compiler.compiler import CompiledKernel

    fields = dict(metadata)
    target = fields["target"]
    fields["target"] = {
        "backend": target.backend,
        "arch": target.arch,
        "warp_size": target.warp_size,
    }
    extension = backend_for(target).binary_ext
    with tempfile.TemporaryDirectory(prefix="fastkernel-kernel-") as tmp:
        group = {"kernel.json": os.path.join(tmp, "kernel.json")}
        group[f"kernel.{extension}"] = os.path.join(tmp, f"kernel.{extension}")
        with open(group["kernel.json"], "w", encoding="utf-8") as f:
            json.dump(fields, f)
        with open(group[f"kernel.{extension}"], "wb") as f:
            f.write(binary)
        kernel = CompiledKernel(src, group, str(fields["hash"]))
    kernel.metadata_group = {}
    return kernel


@dataclasses.dataclass
class LaunchMetadata:
    """The compiled metadata the launch record needs (CompiledKernel.metadata)."""

    name: str
    cubin: bytes
    block_x: int
    shared_mem: int
    num_ctas: int
    cooperative_grid: bool
    pdl: bool
    global_scratch_size: int
    global_scratch_align: int
    profile_scratch_size: int
    profile_scratch_align: int
    #: Triton's ``tensordesc_meta``: one dict per host descriptor parameter under TMA lowering
    #: (swizzle, elem_size, elem_type, block_size, fp4_padded), empty otherwise.
    tensordesc_meta: list[dict[str, Any]] = dataclasses.field(default_factory=list)


#: The launch facts a registration supplies (per device and call pattern); every other field
#: of ``_C.LaunchFacts`` is the binary's, read from :class:`LaunchMetadata` by name.
REGISTRATION_FACTS = ("device", "plan", "num_scratch_params", "tensor_maps")


def launch_facts(meta: LaunchMetadata, **registration: Any) -> Any:
    """The ``_C.LaunchFacts`` of ``meta``'s binary for one registration, field by field in the
    order the native struct declares (``_C.LaunchFacts.FIELDS``): the fields in
    :data:`REGISTRATION_FACTS` from ``registration`` (keywords), ``kernel_name`` from
    ``meta.name``, every other one from ``meta``'s field of the same name. Raises TypeError
    when ``registration`` names another field, AttributeError when the native struct has a
    fact :class:`LaunchMetadata` lacks (a field added on one side only)."""
    from . import _C

    unknown = set(registration) - set(REGISTRATION_FACTS)
    if unknown:
        raise TypeError(f"launch_facts: {sorted(unknown)} are not registration facts")
    values = {}
    for field in _C.LaunchFacts.FIELDS:
        if field in REGISTRATION_FACTS:
            if field in registration:
                values[field] = registration[field]
        elif field == "kernel_name":
            values[field] = meta.name
        else:
            values[field] = getattr(meta, field)
    return _C.LaunchFacts(**values)


def launch_metadata(compiled) -> LaunchMetadata:
    """Read the launch facts of a CompiledKernel (never hard-coding sizes or counts)."""
    md = compiled.metadata
    try:
        from triton._instrumentation import is_enabled

        if is_enabled(md, "gsan"):
            raise UnsupportedByNativePath("GSan instrumentation appends launch parameters")
    except ImportError:
        pass
    return LaunchMetadata(
        name=md.name,
        cubin=compiled.asm["cubin"],
        block_x=32 * md.num_warps,
        shared_mem=md.shared,
        num_ctas=getattr(md, "num_ctas", 1),
        cooperative_grid=bool(getattr(md, "launch_cooperative_grid", False)),
        pdl=bool(getattr(md, "launch_pdl", False)),
        global_scratch_size=getattr(md, "global_scratch_size", 0) or 0,
        global_scratch_align=getattr(md, "global_scratch_align", 1) or 1,
        profile_scratch_size=getattr(md, "profile_scratch_size", 0) or 0,
        profile_scratch_align=getattr(md, "profile_scratch_align", 1) or 1,
        tensordesc_meta=[dict(m) for m in (getattr(md, "tensordesc_meta", None) or [])],
    )


def allocate_scratch(size: int, align: int, stream: int | None, kind: str):
    """Allocate a scratch buffer the way Triton's CudaLauncher does.

    ``global`` scratch comes from ``triton.set_allocator``'s allocator (Triton raises a
    RuntimeError naming ``triton.set_allocator`` when none is set); ``profile`` scratch from the
    profile allocator when one is set, else from the driver's default profile scratch.
    """
    from triton.runtime import _allocation

    if kind == "global":
        buffer = _allocation._allocator.get()(size, align, stream)
    elif _allocation.has_profile_allocator():
        buffer = _allocation._profile_allocator.get()(size, align, stream)
    else:
        buffer = triton.runtime.driver.active.allocate_default_profile_scratch(size, align, stream)
    if _stream_is_capturing():
        # A captured launch replays with this buffer's address: it must outlive the graph,
        # which fastkernel cannot see, so it lives as long as the process.
        CAPTURED_SCRATCH.append(buffer)
    return buffer


#: Scratch buffers of launches captured into CUDA graphs (kept alive for their replays).
CAPTURED_SCRATCH: list[Any] = []


def _stream_is_capturing() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# ---- knobs and launch hooks -----------------------------------------------------------------
#
# JITFunction.run reads knobs.runtime.debug, knobs.compilation.instrumentation_mode and
# fpsan_homomorphic_casts into the compile options, refuses nothing when a stages-inspection
# hook is set (it appends to the cache key), and passes knobs.runtime.launch_enter_hook /
# launch_exit_hook to the launcher, which calls them around the launch (driver.c launchHook).
# Triton 3.9 keeps hooks in HookChain objects (empty chains are no-ops); earlier versions
# keep a plain callable or None.

_BINARY_KNOB_WORDS: dict[tuple[Any, ...], int] = {}
#: The inverse: the knob values (binary_knobs) each word handed out stands for.
_KNOB_VALUES_OF_WORD: dict[int, tuple[Any, ...]] = {}


def knob_dicts() -> list[dict]:
    """The dicts whose modification can change a knob the native path reads."""
    from triton import knobs

    return [knobs.runtime.__dict__, knobs.compilation.__dict__]


def knob_classes() -> list[type]:
    """The knob classes on which attribute assignment must notify the native path."""
    from triton import knobs

    return [type(knobs.runtime), type(knobs.compilation)]


def _hook_parts(hook) -> tuple[list | None, bool, Any]:
    """How the native launch calls a launch hook knob (triton/knobs.py): (the HookChain's list
    of hooks, whether the chain runs them in reverse, None) for a HookChain, (None, False, the
    callable) for a plain callable set in its place, (None, False, None) when unset."""
    if hook is None:
        return None, False, None
    calls = getattr(hook, "calls", None)
    if type(hook).__name__ == "HookChain" and isinstance(calls, list):
        return calls, bool(getattr(hook, "reversed", False)), None
    return None, False, hook


#: Triton's hooks around compiling and loading a kernel (triton/knobs.py runtime_knobs):
#: JITFunction.run calls the first two when it compiles, CompiledKernel._init_handles the others
#: when it loads a module. The native path compiles through its own cache and loads its own
#: modules, so none of them would run.
COMPILE_HOOK_KNOBS = (
    "jit_cache_hook",
    "jit_post_compile_hook",
    "kernel_load_start_hook",
    "kernel_load_end_hook",
)


def compile_hook_set() -> str | None:
    """The name of the first of :data:`COMPILE_HOOK_KNOBS` that is set (a callable, or a
    HookChain holding at least one hook), or None. A specialization missed while one is set
    is compiled, loaded and launched by Triton, so the hook sees it (torch's NVSHMEM support
    initializes each module in ``jit_post_compile_hook``)."""
    from triton import knobs

    for name in COMPILE_HOOK_KNOBS:
        hook = getattr(knobs.runtime, name, None)
        if hook is None:
            continue
        calls, _reversed, callable_ = _hook_parts(hook)
        if calls or callable_ is not None:
            return name
    return None


#: The compile options JITFunction.run adds to a call's keywords before its pre-run hooks see
#: them: ``debug`` in every supported Triton, ``instrumentation_mode`` from 3.6,
#: ``fpsan_homomorphic_casts`` from 3.9. Read from the keys run's code stores (its constants).
RUN_ADDED_OPTIONS = tuple(
    name
    for name in ("debug", "instrumentation_mode", "fpsan_homomorphic_casts")
    if name in triton_jit.JITFunction.run.__code__.co_consts
)


def add_run_options(jit_fn, kwargs: dict) -> None:
    """Adds to ``kwargs`` the options of :data:`RUN_ADDED_OPTIONS`, valued as JITFunction.run
    values them (``debug``: the call's, else the kernel's, or ``knobs.runtime.debug``)."""
    from triton import knobs

    for name in RUN_ADDED_OPTIONS:
        if name == "debug":
            kwargs[name] = kwargs.get(name, getattr(jit_fn, "debug", None)) or knobs.runtime.debug
        else:
            kwargs[name] = getattr(knobs.compilation, name)


def binary_knobs(knob_word: int | None = None) -> tuple[bool, str, bool]:
    """The knob values that change the compiled binary: (debug, instrumentation mode,
    fpsan homomorphic casts), as JITFunction.run reads them into the compile options. With
    ``knob_word`` (a native key's, :func:`key_knob_word`), the values that word was handed out
    for by :func:`knob_state`; the knobs as they are now otherwise, or for an unknown word."""
    from triton import knobs

    if knob_word is not None and (values := _KNOB_VALUES_OF_WORD.get(knob_word)) is not None:
        return values

    runtime, compilation = knobs.runtime, knobs.compilation
    return (
        bool(runtime.debug),
        str(getattr(compilation, "instrumentation_mode", "")),
        bool(getattr(compilation, "fpsan_homomorphic_casts", False)),
    )


def key_knob_word(native_key: bytes) -> int:
    """The knob word of a native specialization key: its last word (csrc/python/
    kernel_object.h finish_key: the launch device's word, then the knob word, little-endian)."""
    return int.from_bytes(native_key[-8:], "little")


def knob_state() -> tuple[Any, ...]:
    """The knob state for the native path: (key word, native path disabled, then for the enter
    and the exit hook knob each :func:`_hook_parts`).

    The key word is a small int, distinct for each distinct combination of the knobs that
    change the compiled binary, so a knob change selects (and compiles) a new binary.
    """
    from triton import knobs

    runtime = knobs.runtime
    values = binary_knobs()
    word = _BINARY_KNOB_WORDS.setdefault(values, len(_BINARY_KNOB_WORDS) + 1)
    _KNOB_VALUES_OF_WORD.setdefault(word, values)
    disabled = getattr(runtime, "add_stages_inspection_hook", None) is not None
    return (
        word,
        disabled,
        *_hook_parts(runtime.launch_enter_hook),
        *_hook_parts(runtime.launch_exit_hook),
    )


#: The class of the metadata launch hooks receive (triton/compiler/compiler.py LazyDict:
#: ``data`` and ``extras``, materialized by ``get()``).
HOOK_METADATA_TYPE = LazyDict


def _plain_lazy_dict_init(self, data):
    self.data = data
    self.extras = []


def plain_lazy_dict(cls: type = LazyDict) -> bool:
    """Whether ``cls(data)`` is exactly ``object.__new__(cls)`` followed by ``self.data = data;
    self.extras = []``, the body of Triton's ``LazyDict.__init__`` (triton/compiler/compiler.py):
    a plain class of ``type`` with object's ``__new__`` and ``__setattr__``, no ``__slots__``,
    and an ``__init__`` compiled from that body (same bytecode, constants, names and signature).
    The native launch then builds the metadata without calling ``__init__``; any other class
    (a Triton that changed it, a patched one) is constructed by calling it."""
    init = cls.__dict__.get("__init__")
    if (
        type(cls) is not type
        or cls.__bases__ != (object,)
        or "__slots__" in cls.__dict__
        or cls.__new__ is not object.__new__
        or cls.__setattr__ is not object.__setattr__
        or type(init) is not type(_plain_lazy_dict_init)
        or init.__defaults__ is not None
        or init.__kwdefaults__ is not None
        or init.__closure__ is not None
    ):
        return False
    got, want = init.__code__, _plain_lazy_dict_init.__code__
    # co_flags' bits above the low 16 are __future__ imports; CO_NESTED says only where the
    # function was defined. Neither changes what the body does.
    flags = 0xFFFF & ~inspect.CO_NESTED
    return (got.co_flags & flags) == (want.co_flags & flags) and all(
        getattr(got, field) == getattr(want, field)
        for field in (
            "co_code",
            "co_consts",
            "co_names",
            "co_varnames",
            "co_argcount",
            "co_posonlyargcount",
            "co_kwonlyargcount",
        )
    )


def add_launch_metadata(metadata, jit_fn, grid: tuple, compiled, args: tuple) -> None:
    """Add ``jit_fn``'s own ``launch_metadata`` callback to the launch hooks' metadata (a
    LazyDict), with the grid, the compiled metadata and the bound arguments by name, as
    CompiledKernel.launch_metadata does (triton/compiler/compiler.py). Called by the native
    launch only for kernels that have the callback, while a hook is set."""
    arg_dict = dict(zip(jit_fn.arg_names, args))
    metadata.add(jit_fn.launch_metadata, (grid, compiled.metadata, arg_dict))


# ---- globals a kernel read ------------------------------------------------------------------


def global_checks(jit_fn) -> tuple:
    """(globals dict, name, value) for each global ``jit_fn`` (and what it calls) read when it
    was compiled: JITFunction.run re-checks these on every call (jit.py ``used_global_vals``)."""
    return tuple(
        (globals_dict, name, value)
        for (name, _), (value, globals_dict) in jit_fn.used_global_vals.items()
    )
