"""Types of ``fastkernel._C``, the native extension (csrc/python/module.cpp).

A build configured with ``-DFASTKERNEL_TESTING=ON`` has more (``_testing``, ``BenchFloor``,
``BenchBundle``, ``bench_floor``, ``bench_call_loop``); those are for the repository's tests and
benchmark and are not described here.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

TORCH_VERSION: str
"""The torch version the extension was compiled against."""
ARG_KINDS: dict[str, int]
"""ArgKind values (csrc/include/fastkernel/specialization.h) by lower-case name."""
INT_WIDTHS: dict[str, int]
"""IntWidth values by Triton type (``i32``, ``i64``, ``u64``)."""
VALUE_CLASSES: dict[str, int]
"""ValueClass values: ``not_specialized``, ``divisible_16``, ``other``, ``equals_one``."""
MAX_KEY_WORDS: int
"""The most 64-bit words one specialization key holds (``kMaxKeyWords``,
csrc/include/fastkernel/specialization.h); a call whose key would be longer falls back."""
TUNE_FLAGS: dict[str, int]
"""TuneFlag bits (csrc/include/fastkernel/specialization.h): ``config_provided``, ``value``,
``layout``, ``sizes``, ``strides``, ``may_be_provided``."""
BUNDLE_FORMAT_VERSION: int
"""The manifest format version ``fastkernel::Bundle::load`` reads."""
BUNDLE_ENTRY_FACTS: tuple[str, ...]
"""The :class:`LaunchFacts` fields a manifest ``entry`` line carries, in order (bundle.h)."""
GRID_PROGRAM_STEPS: tuple[str, ...]
"""The step names of a grid program (fastkernel._grid_program), in the evaluator's order."""

class BundleError(ValueError):
    """A kernel bundle refused by ``fastkernel::Bundle::load``; the message is the loader's."""

def check_bundle(directory: str) -> list[str]: ...

class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the CUDA error."""

class DriverUnavailableError(RuntimeError):
    """The CUDA driver library cannot be opened or lacks a needed entry point."""

class Kernel:
    """Native state of a fastkernel kernel: parameters, launch table, launch entry.
    ``kernel[grid]`` is a :class:`BoundLaunch`. The underscored methods are for its Python
    subclasses (kernel.py), which call them on themselves."""

    #: The wrapped ``triton.jit`` function, held in a native slot (AttributeError while unset).
    jit_function: Any
    def __getitem__(self, grid: Any) -> BoundLaunch: ...
    def _configure(
        self,
        name: str,
        params: list[Any],
        option_names: Sequence[str],
        miss_handler: Callable[..., Any],
        scratch_allocator: Any,
        pre_run_hooks: Any = None,
    ) -> None: ...
    def _insert(self, key: bytes, record: LaunchRecord) -> None: ...
    def _set_publish(self, owner: Any, name: str) -> None: ...
    def _set_hooks_through_triton(self, on: bool) -> None: ...
    def _set_under_types(self, types: tuple[type, ...]) -> None: ...
    def _set_capacity(self, capacity: int) -> None: ...
    def _clear_records(self) -> None: ...
    def _invalidate_records(self) -> None: ...
    def _counters(self) -> dict[str, int]: ...
    def _grid_counts(self) -> tuple[int, int]: ...

class BoundLaunch:
    """A kernel with its grid: call it with the kernel's arguments to launch."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class GridMeta(Mapping[str, Any]):
    """What a callable grid receives: every declared parameter by name, mapped to its argument."""

    def __getitem__(self, key: str) -> Any: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...
    def copy(self) -> dict[str, Any]: ...

class TensorMapFacts:
    """How a launch encodes one host tensor descriptor (an ``nvTmaDesc`` plan entry): Triton's
    tensordesc_meta entry."""

    FIELDS: tuple[str, ...]
    data_type: int
    elem_size: int
    swizzle: int
    block: list[int]
    fp4_padded: bool
    tf32_rounding: bool
    def __init__(
        self,
        data_type: int,
        elem_size: int,
        swizzle: int,
        block: Sequence[int],
        fp4_padded: bool = False,
        tf32_rounding: bool = False,
    ) -> None: ...

class LaunchFacts:
    """The launch facts of one compiled specialization (csrc/include/fastkernel/launch_record.h
    LaunchFacts); :class:`LaunchRecord` checks them."""

    FIELDS: tuple[str, ...]
    kernel_name: str
    device: int
    block_x: int
    shared_mem: int
    num_ctas: int
    cooperative_grid: bool
    pdl: bool
    plan: list[tuple[int, str]]
    num_scratch_params: int
    global_scratch_size: int
    global_scratch_align: int
    profile_scratch_size: int
    profile_scratch_align: int
    tensor_maps: list[TensorMapFacts]
    def __init__(
        self,
        *,
        kernel_name: str,
        device: int,
        block_x: int,
        shared_mem: int = 0,
        num_ctas: int = 1,
        cooperative_grid: bool = False,
        pdl: bool = False,
        plan: Sequence[tuple[int, str]],
        num_scratch_params: int = 2,
        global_scratch_size: int = 0,
        global_scratch_align: int = 1,
        profile_scratch_size: int = 0,
        profile_scratch_align: int = 1,
        tensor_maps: Sequence[TensorMapFacts] = (),
    ) -> None: ...

class LaunchRecord:
    """A compiled specialization loaded on its device and ready to launch: what a
    compile-on-miss handler returns (the native entry inserts it under the call's key and
    launches it) or what :meth:`Kernel._insert` registers. Unloaded when dropped uninserted."""

    kernel_name: str
    device: int
    inserted: bool
    n_regs: int
    n_spills: int
    n_max_threads: int
    def __init__(
        self,
        facts: LaunchFacts,
        cubin: bytes,
        compiled: Any,
        tuned_args: tuple[Any, ...] | None = None,
        published: Any = None,
        global_checks: tuple[tuple[dict[str, Any], str, Any], ...] | None = None,
    ) -> None: ...
    @staticmethod
    def for_hit_call(hit_call: Callable[..., Any]) -> LaunchRecord: ...

def configure_knob_watch(dicts: list[dict[str, Any]], refresh: Callable[[], object]) -> None: ...
def mark_knobs_dirty() -> None: ...
def launch_hooks_active() -> bool: ...
def set_constexpr_types(constexpr_type: type, identity_types: tuple[type, ...]) -> None: ...
def set_tensor_descriptor_type(type: type | None) -> None: ...
def set_grid_program_support(
    compiler: Callable[[Any, tuple[str, ...]], tuple[tuple[str, int | str], ...] | None],
    cdiv: Any,
    next_power_of_2: Any,
    max: Callable[..., Any],
    min: Callable[..., Any],
) -> None: ...
def set_pre_run_options(add_run_options: Callable[[Any, dict[str, Any]], Any] | None) -> None: ...
def set_launch_hook_support(
    lazy_dict_type: type,
    add_launch_metadata: Callable[..., Any],
    plain_check: Callable[[type], bool] | None = None,
) -> None: ...

class DispatchInput:
    """An instance attribute kept in the instance ``__dict__``; storing or deleting it calls
    ``on_change(obj)``."""

    name: str
    def __init__(self, name: str, on_change: Callable[[Any], object]) -> None: ...
    def __get__(self, obj: Any, cls: type | None = None) -> Any: ...
    def __set__(self, obj: Any, value: Any) -> None: ...
    def __delete__(self, obj: Any) -> None: ...

def install_patch(
    jit_type: type,
    factory: Callable[[Any], Kernel | None],
    triton_getitem: Callable[..., Any],
    type_served: Callable[[type], bool],
) -> None: ...
def uninstall_patch() -> None: ...
def forget_refused_types() -> None: ...
def install_handle_subscript(
    type: type, attr: str | None, slow: Callable[[Any, Any], Any]
) -> None: ...
def remember_handle_launch(compiled: Any, launcher: Kernel) -> None: ...
def handle_launcher(compiled: Any) -> Kernel | None: ...
def forget_handle_launches() -> None: ...

class RunLauncher:
    def __call__(self, *args: Any) -> Any: ...

def run_launcher(
    handle: Any,
    launcher: Kernel,
    triton_run: Callable[..., Any],
    function: int,
    packed_metadata: Any,
    hook_chain_type: type | None,
    on_fallback: Callable[[str], Any],
) -> RunLauncher: ...
def num_handle_launches() -> int: ...
def patched_dispatch(jit: Any) -> Any: ...

"""The dispatch kernel (kernel.py's NativeDispatch) serving ``jit`` under the patch, or None."""

def drop_patched_dispatch(jit: Any) -> None: ...

"""Forgets the dispatch serving ``jit``: its next launch asks the patch factory again."""

def patch_slot_is_native(type: type) -> bool: ...
def install_host_helpers(
    constexpr_function_type: type,
    constexpr_type: type,
    triton_call: Callable[..., Any],
    cdiv: Callable[..., Any],
    next_power_of_2: Callable[..., Any],
) -> None: ...
def driver_library_path() -> str: ...
def driver_loaded() -> bool: ...
def device_capability(device: int) -> tuple[int, int]: ...
