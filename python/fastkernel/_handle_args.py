"""How the arguments of a handle's launch (``compiled[grid](*args)``, ``compiled.run(...)``)
meet the binary's signature, which Triton's launcher and the native launch both pack by.

Triton 3.7 and later launch a binary with ``launchKernel`` in triton/backends/nvidia/driver.c,
whose ``extractArgs`` walks the binary's signature and reads the argument at each position it
does not call ``constexpr``, recursing into tuples; it counts neither the arguments nor a
tuple's elements, so a call that stops early or a short tuple is read past (a crash, or a launch
of whatever lies there). Where the signature holds a host tensor descriptor, Triton first
rebuilds the arguments with ``make_tensordesc_args`` (triton/backends/driver.py, C++ in 3.9),
which asserts that the argument list and each tuple on a descriptor's path have the
signature's lengths: a mismatch aborts the process. ``extractArgs`` takes a tuple argument
through ``PySequence_Fast``, which for anything but a tuple or list makes a temporary list and
frees it before its items are read: a ``range`` or an array there launches freed memory. Triton
3.5 and 3.6 parse every argument with ``PyArg_ParseTuple``, tuples to their exact lengths
(triton/backends/nvidia/driver.py).

The native launch plan (:func:`fastkernel._triton_abi.launch_plan`) flattens the binary's
tuple types depth-first into leaf slots, one per element that is not a tuple, constexpr ones
included, and ``descriptor_leaves(rank)`` per descriptor; the native key gives the call's own
tuples and descriptors their leaf slots the same way. Where the call's shape differs, the
leaves would land in the wrong slots: :meth:`HandleSignature.check` tells the native launch
so, and raises for what Triton's launcher would read past.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from . import _triton_abi as abi

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # no host descriptors in this Triton: no argument is one
    TensorDescriptor = None


def omissible_from(types: Iterable[Any]) -> int:
    """The first parameter a handle's launch may leave out, with every one after it: past the
    last parameter the binary reads on Triton 3.7 and later, whose launcher steps over the
    position of a parameter its signature calls ``constexpr`` (a declared constexpr, or an int
    of 1 or a None specialized away) without reading an argument there, so a call may stop
    before the trailing ones (FlagGems' ``LibEntry`` launches its handles so from Triton 3.7:
    the runtime arguments only); none (the parameter count) on Triton 3.5 and 3.6, and for a
    binary with a tensor descriptor, whose arguments Triton rebuilds to the signature's exact
    length.

    ``types``: the binary's parameter types in order (``compiled.src.signature`` values, one
    per declared parameter; a tuple type is a Python tuple of types)."""
    types = list(types)
    if abi.TRITON_VERSION < (3, 7) or any(_holds_descriptor(ty) for ty in types):
        return len(types)
    return max((i + 1 for i, ty in enumerate(types) if ty != "constexpr"), default=0)


def _holds_descriptor(ty: Any) -> bool:
    """Whether Triton rebuilds an argument of type ``ty`` (``_is_descriptor`` in
    triton/backends/driver.py: every ``tensordesc`` type, im2col ones included)."""
    if isinstance(ty, tuple):
        return any(_holds_descriptor(t) for t in ty)
    return isinstance(ty, str) and ty.startswith("tensordesc")


def _elements(n: int) -> str:
    return f"{n} element" if n == 1 else f"{n} elements"


class HandleSignature:
    """One binary's signature, as a handle's launch arguments must meet it.

    ``kernel``: the kernel's name (for messages); ``params``: (name, declared constexpr) of each
    declared parameter (a declared constexpr takes no leaf slot in the native key and is never
    read by Triton's launcher); ``types``: the binary's parameter types (``src.signature``
    values)."""

    __slots__ = ("kernel", "names", "required", "count", "exact", "_checked")

    def __init__(self, kernel: str, params: list[tuple[str, bool]], types: list[Any]):
        self.kernel = kernel
        self.names = [name for name, _ in params]
        #: The arguments a launch must pass (:func:`omissible_from`).
        self.required = omissible_from(types)
        self.count = len(types)
        #: Whether Triton takes exactly ``count`` arguments (a binary with a tensor descriptor).
        self.exact = any(_holds_descriptor(ty) for ty in types)
        self._checked = [
            (i, name, ty)
            for i, ((name, constexpr), ty) in enumerate(zip(params, types))
            if not constexpr
        ]

    @classmethod
    def of(cls, compiled: Any, fn: Any = None) -> HandleSignature:
        """The signature of a ``CompiledKernel`` (or a disk-cache ``CachedKernel``): the
        parameters of its kernel ``fn`` (a ``JITFunction``; ``compiled.src.fn`` by default) and
        the binary's types (``src.signature``)."""
        fn = compiled.src.fn if fn is None else fn
        params = [(p.name, bool(p.is_constexpr)) for p in fn.params]
        return cls(fn.__name__, params, list(compiled.src.signature.values()))

    def check(self, args: tuple) -> str | None:
        """None when the positional ``args`` meet the signature as the native launch plan takes
        them: every tuple with its type's elements, every descriptor its type's rank. Else why
        not, for Triton's runner, where the call differs only where Triton's launcher reads
        nothing: elements past a tuple type's, trailing ``constexpr`` elements left out, a tuple
        or descriptor where the binary's type is ``constexpr`` (the native slots would take the
        wrong leaves, where Triton reads each argument by its position).

        Raises
        ------
        TypeError
            Naming the parameter (``pair``, or ``pair[1]`` inside one), in Python's order:
            arity (from Triton 3.7: a call that stops before a parameter the binary reads, or
            that passes more arguments than a binary with a descriptor takes, which Triton
            reads past or aborts on), then kinds in parameter order (something other than a
            tuple or list for a tuple type, which Triton would read as freed memory; a tuple or
            list where the binary takes a descriptor; a tuple or a host descriptor where it
            takes a scalar, which Triton's launcher refuses too), then values in parameter
            order (a tuple with fewer elements than the launcher reads, up to its last element
            that is not ``constexpr``, or another length on a descriptor's path; a descriptor
            whose ``block_shape`` is not of its type's rank).
        """
        if abi.TRITON_VERSION >= (3, 7):
            if len(args) < self.required:
                raise TypeError(
                    f"{self.kernel} missing required argument '{self.names[len(args)]}'"
                )
            if self.exact and len(args) > self.count:
                raise TypeError(
                    f"{self.kernel} takes {self.count} arguments but {len(args)} were given"
                )
        checked = [(name, ty, args[i]) for i, name, ty in self._checked if i < len(args)]
        for name, ty, arg in checked:
            self._leaf(ty, arg, name, values=False)
        reason = None
        for name, ty, arg in checked:
            reason = self._leaf(ty, arg, name, values=True) or reason
        return reason

    def _refuse(self, path: str, expected: str, got: str) -> NoReturn:
        raise TypeError(
            f"{self.kernel}: argument '{path}': expected {expected} (the binary's signature), "
            f"got {got}"
        )

    @staticmethod
    def _runner(path: str, detail: str) -> str:
        return (
            f"a launch of a CompiledKernel whose argument '{path}' {detail}: it launches "
            "through Triton's own launcher"
        )

    def _leaf(self, ty: Any, arg: Any, path: str, values: bool) -> str | None:
        """Checks one argument against its type: its kind, and with ``values`` its shape; the
        reason for Triton's runner, if any."""
        if isinstance(ty, tuple):
            return self._tuple(ty, arg, path, values)
        if _holds_descriptor(ty):
            # Any host descriptor class (Triton's, Gluon's, a subclass): Triton reads its fields.
            if isinstance(arg, (tuple, list)):
                self._refuse(path, ty, type(arg).__name__)
            rank = abi.descriptor_rank(ty)  # None for im2col, which the native plan refuses
            if values and rank is not None:
                block_shape = getattr(arg, "block_shape", None)
                arg_rank = len(block_shape) if isinstance(block_shape, (tuple, list)) else None
                if arg_rank != rank:
                    self._refuse(path, f"a tensor descriptor of rank {rank}", f"rank {arg_rank}")
            return None
        # The native key gives a tuple's elements, and Triton's own descriptor's fields, slots.
        descriptor = TensorDescriptor is not None and type(arg) is TensorDescriptor
        if isinstance(arg, tuple) or descriptor:
            what = "a tuple" if isinstance(arg, tuple) else "a tensor descriptor"
            if ty == "constexpr":  # Triton's launcher steps over it
                return self._runner(path, f"is {what} where the binary's type is constexpr")
            self._refuse(path, f"type {ty}", what)
        return None

    def _tuple(self, ty: tuple, arg: Any, path: str, values: bool) -> str | None:
        expected = f"a tuple of {_elements(len(ty))}"
        if not isinstance(arg, (tuple, list)):
            self._refuse(path, expected, type(arg).__name__)
        reason = None
        if values:
            exact = _holds_descriptor(ty)  # Triton rebuilds it to the type's length
            reads = max((i + 1 for i, t in enumerate(ty) if t != "constexpr"), default=0)
            if len(arg) < reads or (exact and len(arg) != len(ty)):
                self._refuse(path, expected, _elements(len(arg)))
            if len(arg) != len(ty):
                reason = self._runner(
                    path, f"has {_elements(len(arg))} where the binary's tuple type has {len(ty)}"
                )
        for i, (element_type, element) in enumerate(zip(ty, arg)):
            reason = self._leaf(element_type, element, f"{path}[{i}]", values) or reason
        return reason


#: The arguments Triton's launcher object (``CompiledKernel.run``) takes before the kernel's:
#: grid x, y, z, stream, function, packed metadata, launch metadata, enter and exit hooks
#: (``CudaLauncher.__call__`` in triton/backends/nvidia/driver.py, the same from 3.5 to 3.9;
#: csrc/python/handle_launch.cpp ``kRunLeadingArgs``).
RUN_LEADING_ARGS = 9


def checked_launcher(signature: HandleSignature, triton_run: Any) -> Callable[..., Any]:
    """``triton_run`` (Triton's launcher object of a handle, called as ``run(gx, gy, gz,
    stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)``)
    behind :meth:`HandleSignature.check` for the kernel arguments ``args``. A call whose
    leading arguments do not bind (too few, an unknown keyword) goes to ``triton_run``
    unchecked, which raises its own TypeError."""
    parsed: list = []  # the launcher's call signature, read on the first call with keywords

    def kernel_args(args: tuple, kwargs: dict) -> tuple | None:
        if not kwargs:
            return args[RUN_LEADING_ARGS:] if len(args) >= RUN_LEADING_ARGS else None
        if not parsed:
            call = inspect.signature(triton_run)
            named = [p for p in call.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
            var = [p.name for p in call.parameters.values() if p.kind is p.VAR_POSITIONAL]
            parsed.append((call, RUN_LEADING_ARGS - len(named), var[0] if var else None))
        call, skip, var_name = parsed[0]
        try:
            bound = call.bind(*args, **kwargs)
        except TypeError:
            return None
        extra: tuple = bound.arguments.get(var_name, ()) if var_name else ()
        return extra[skip:] if len(extra) >= skip else None

    def run(*args: Any, **kwargs: Any) -> Any:
        checked = kernel_args(args, kwargs)
        if checked is not None:
            signature.check(checked)
        return triton_run(*args, **kwargs)

    return run
