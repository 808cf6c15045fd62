"""Call-surface fuzzing, differential: generated calls of kernels with every kind of parameter,
each made through Triton's own launcher and through fastkernel on the same arguments, against
the recording stand-in driver (CPU tensors stand in for device tensors).

For every call one of these must hold, else it is a failure:

- both launched, and fastkernel's launch is Triton's byte for byte (entry point, grid, block,
  shared memory, stream, attributes, every parameter's bytes);
- fastkernel raised a typed error (``TypeError``, ``ValueError``, ``OverflowError``, ...) whose
  message names the argument, the grid or the call's arity (whether Triton launched the call or
  not: fastkernel may refuse more, e.g. an int out of its declared width that Triton truncates),
  or raised Triton's own error for a call it handed to Triton.

fastkernel launching a call that Triton's launcher refuses is a failure.

The run has its own empty kernel cache, and every ``WARM_EVERY`` calls the kernels are wrapped
anew, so that the new wrappers' misses are served from the cache's warm index as a new process's
would be: a warm index record that does not fit the call it was written for (logged as such) is
a failure too.

The calls are mostly near-valid (each argument of its parameter's kind with values at the edges
of Triton's specialization classes: ints 1, multiples of 16, the i32/i64/u64 boundaries, out of
range; pointers at every 4-byte offset; floats inf, nan, large; None) and sometimes of another
kind (strings, lists, objects, numpy scalars, missing or extra arguments, unknown keywords, bad
grids).

    python scripts/reliability/fuzz_calls.py [--calls 100000] [--seed 0]

Exit status 0 when nothing failed. Needs no GPU.
"""

from __future__ import annotations

import argparse
import collections
import enum
import logging
import os
import pathlib
import random
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"

INTS = [
    0,
    1,
    2,
    15,
    16,
    17,
    32,
    48,
    2**31 - 1,
    2**31,
    2**32,
    2**40,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -1,
    -16,
    -(2**31),
    -(2**31) - 1,
    -(2**63),
    -(2**63) - 1,
]
FLOATS = [0.0, -1.5, 3.14159, 1e40, -1e-40, float("inf"), float("-inf"), float("nan")]


class Mode(enum.IntEnum):
    A = 1
    B = 16


def _other_kind(rng: random.Random, tensors: list[Any]) -> Any:
    import numpy as np

    return rng.choice(
        [
            "abc",
            b"x",
            [1, 2],
            (1,),
            object(),
            1 + 2j,
            np.float64(1.5),
            np.float32(2.0),
            np.int64(3),
            Mode.B,
            None,
            True,
            rng.choice(INTS),
            rng.choice(FLOATS),
            rng.choice(tensors),
        ]
    )


class Generator:
    """Draws near-valid calls. Each call follows one of ``pool`` templates per kernel, drawn
    once from the seed: a template fixes what Triton specializes on (each argument's kind, each
    int's class and width, each pointer's dtype and alignment, None or not, call-site options),
    and the call draws fresh values within it. So a long run makes many calls of a bounded set
    of specializations (compiles stay few, hits are many) while covering every class edge."""

    def __init__(self, rng: random.Random, seed: int, pool: int):
        import torch

        self.rng = rng  # values, grids, call-shape mutations
        self.seed = seed
        self.pool = pool
        self.base = {
            d: torch.zeros(64 + 16, dtype=d) for d in (torch.float32, torch.float16, torch.int32)
        }
        self.tensors = [b[o : o + 32] for b in self.base.values() for o in range(0, 5)]
        self.t = random.Random(0)  # the current template's choices (set by template())

    def template(self, kernel: str) -> None:
        number = self.rng.randrange(self.pool)
        self.t = random.Random(f"{self.seed}/{kernel}/{number}")

    def other(self, p: float) -> bool:
        return self.t.random() < p

    def pointer(self):
        import torch

        if self.other(0.03):
            return _other_kind(self.rng, self.tensors)
        if self.other(0.01):
            return torch.empty(0)
        base = self.base[self.t.choice(list(self.base))]
        if self.t.random() < 0.6:  # 16-byte aligned
            offset = self.rng.choice([0, 16 // base.element_size()])
        else:
            offset = self.rng.choice([o for o in range(1, 16 // base.element_size())])
        return base[offset : offset + 32]

    def int_value(self):
        if self.other(0.03):
            return _other_kind(self.rng, self.tensors)
        cls = self.t.choice(["one", "div16", "other", "edge"])
        if cls == "one":
            return 1
        if cls == "edge":
            return self.t.choice(INTS)  # the template fixes the edge: its class and width
        width = self.t.choice(
            [(2, 2**31 - 16), (2**31, 2**62), (2**63, 2**64 - 16), (-(2**63), -(2**31))]
        )
        value = self.rng.randint(*width)
        if cls == "div16":
            return value - value % 16
        return value - value % 16 + self.rng.choice([1, 3, 5, 7, 9, 15])

    def float_value(self):
        if self.other(0.03):
            return _other_kind(self.rng, self.tensors)
        return self.rng.choice(FLOATS) if self.rng.random() < 0.3 else self.rng.uniform(-10, 10)

    def grid(self):
        r = self.rng
        if r.random() < 0.95:
            return (r.randint(1, 3),)
        return r.choice(
            [(0,), (2, 3), (1, 1, 2), (-1,), (), (1, 1, 1, 1), "x", (2**31,), lambda meta: (1,)]
        )


def _kernels(g: Generator) -> dict[str, tuple[Any, Callable[[], tuple[tuple, dict]]]]:
    """Each fuzzed kernel and a function drawing (args, kwargs) for it."""
    import kernels
    import triton.language as tl

    def add():
        return (g.pointer(), g.pointer(), g.pointer(), g.int_value()), {"BLOCK": 32}

    def scalars():
        return (
            (
                g.pointer(),
                g.int_value(),
                g.int_value(),
                g.int_value(),
                g.float_value(),
                g.float_value(),
                g.float_value(),
                g.float_value(),
                g.t.choice([True, False]),
                None if g.t.random() < 0.5 else g.pointer(),
                1 if g.t.random() < 0.5 else g.int_value(),
            ),
            {"BLOCK": 32},
        )

    def typed():
        return (g.pointer(), g.int_value(), g.int_value(), g.t.choice([0, 1, 255, 256, -1, 7])), {
            "BLOCK": 32
        }

    def no_spec():
        return (g.pointer(), g.pointer(), g.int_value()), {"BLOCK": 32}

    def tuples():
        pair = (g.pointer(), g.int_value()) if not g.other(0.05) else _other_kind(g.rng, g.tensors)
        nested = (g.float_value(), (g.float_value(), g.pointer()))
        return (g.pointer(), pair, g.int_value(), nested), {"BLOCK": 32}

    def constexprs():
        return (g.pointer(),), {
            "SCALE": g.t.choice([2, 2.5, tl.constexpr(3)]),
            "MODE": g.t.choice(["double", "single"]),
            "BLOCK": 32,
        }

    return {
        "add_kernel": (kernels.add_kernel, add),
        "scalars_kernel": (kernels.scalars_kernel, scalars),
        "typed_kernel": (kernels.typed_kernel, typed),
        "no_spec_kernel": (kernels.no_spec_kernel, no_spec),
        "tuple_kernel": (kernels.tuple_kernel, tuples),
        "constexpr_kernel": (kernels.constexpr_kernel, constexprs),
    }


def _mutate_call(g: Generator, jit_fn, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Sometimes a call of the wrong shape: an argument missing or extra, an unknown keyword, a
    positional argument passed by keyword; and, per template, options at the call site."""
    rng = g.rng
    if g.t.random() < 0.15:
        kwargs = {**kwargs, "num_warps": g.t.choice([1, 2, 8])}
    x = rng.random()
    if x < 0.03 and args:
        return args[:-1], kwargs
    if x < 0.05:
        return args + (rng.choice(INTS),), kwargs
    if x < 0.07:
        return args, {**kwargs, "bogus": 1}
    if x < 0.12 and args:
        name = jit_fn.arg_names[len(args) - 1]
        return args[:-1], {**kwargs, name: args[-1]}
    return args, kwargs


TYPED = (
    TypeError,
    ValueError,
    OverflowError,
    KeyError,
    IndexError,
    RuntimeError,
    NotImplementedError,
)


def _short(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor({value.dtype}, offset {value.data_ptr() % 16})"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_describe(v)}" for k, v in value.items()) + "}"
    return _short(value)


def _names_argument(message: str, jit_fn) -> bool:
    return (
        any(f"'{p}'" in message for p in jit_fn.arg_names)
        or "grid" in message
        or "arguments but" in message
        or "keyword argument" in message
        or "missing" in message
    )


#: Calls between two fresh sets of fastkernel wrappers (their misses read the warm index).
WARM_EVERY = 500


class _WarmMisfits(logging.Handler):
    """Collects fastkernel's log lines saying a warm index record does not fit its call."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "warm index record does not fit" in message:
            self.messages.append(message)


def run(calls: int, seed: int, pool: int = 40, report_every: int = 0) -> dict[str, Any]:
    """``calls`` generated calls (``seed``; ``pool`` specialization templates per kernel) in a
    private, initially empty kernel cache. Returns the outcome counts, the failures, the seconds
    taken, the kernels' stats summed over their wrappers, and what their misses took from the
    cache (``fastkernel.cache.counters()`` over the run: ``warm`` misses served through the warm
    index)."""
    previous = os.environ.get("FASTKERNEL_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="fastkernel-fuzz-cache-") as cache_dir:
        os.environ["FASTKERNEL_CACHE_DIR"] = cache_dir
        try:
            return _run(calls, seed, pool, report_every)
        finally:
            if previous is None:
                del os.environ["FASTKERNEL_CACHE_DIR"]
            else:
                os.environ["FASTKERNEL_CACHE_DIR"] = previous


def _run(calls: int, seed: int, pool: int, report_every: int) -> dict[str, Any]:
    sys.path.insert(0, str(TESTS))
    from stand_in_driver.recording import RecordingDriver, build_recording_driver

    path = build_recording_driver()
    os.environ.setdefault("FASTKERNEL_CUDA_DRIVER", str(path))
    from triton_reference import TritonReference, assert_same_launch

    from fastkernel import _C, cache, fastkernel

    recording = RecordingDriver(path)
    stream = 0x5EED5
    _C._testing.set_host_testing(True, 0, stream)
    rng = random.Random(seed)
    gen = Generator(rng, seed, pool)
    table = _kernels(gen)
    stats: dict[str, collections.Counter] = {name: collections.Counter() for name in table}

    def fresh_wrappers() -> dict[str, Any]:
        return {name: fastkernel(jit) for name, (jit, _) in table.items()}

    def retire(wrappers: dict[str, Any]) -> None:
        for name, wrapper in wrappers.items():  # the counters (hits, misses, fallbacks, ...)
            stats[name].update({k: v for k, v in wrapper.stats().items() if isinstance(v, int)})

    counts: dict[str, int] = collections.Counter()
    failures: list[str] = []
    misfits = _WarmMisfits()
    fastkernel_log = logging.getLogger("fastkernel")
    fastkernel_log.addHandler(misfits)
    start = time.perf_counter()
    cache_before = cache.counters()
    try:
        _fuzz(
            calls,
            rng,
            gen,
            table,
            fresh_wrappers,
            retire,
            recording,
            TritonReference(recording, stream),
            assert_same_launch,
            counts,
            failures,
            start,
            report_every,
        )
    finally:
        _C._testing.set_host_testing(False, 0, 0)
        fastkernel_log.removeHandler(misfits)
    failures += [f"a warm index record did not fit its call: {m}" for m in misfits.messages]
    return {
        "calls": calls,
        "outcomes": dict(counts),
        "failures": failures,
        "seconds": time.perf_counter() - start,
        "stats": {name: dict(counter) for name, counter in stats.items()},
        "cache": {k: n - cache_before[k] for k, n in cache.counters().items()},
    }


def _fuzz(
    calls,
    rng,
    gen,
    table,
    fresh_wrappers,
    retire,
    recording,
    reference_launcher,
    assert_same_launch,
    counts,
    failures,
    start,
    report_every,
) -> None:
    fast = fresh_wrappers()
    with reference_launcher:
        for i in range(calls):
            if i and i % WARM_EVERY == 0:
                retire(fast)
                fast = fresh_wrappers()
            name = rng.choice(list(table))
            jit, draw = table[name]
            gen.template(name)
            args, kwargs = _mutate_call(gen, jit, *draw())
            grid = gen.grid()
            if recording.launch_count() > 3000:
                recording.reset()
            before = recording.launch_count()
            try:
                jit[grid](*args, **kwargs)
                theirs, their_exc = (
                    (recording.last_launch() if recording.launch_count() > before else None),
                    None,
                )
            except Exception as exc:  # noqa: BLE001 - Triton's verdict on this call
                theirs, their_exc = None, exc
            middle = recording.launch_count()
            try:
                fast[name][grid](*args, **kwargs)
                ours, our_exc = (
                    (recording.last_launch() if recording.launch_count() > middle else None),
                    None,
                )
            except Exception as exc:  # noqa: BLE001 - fastkernel's verdict, checked below
                ours, our_exc = None, exc
            where = f"call {i} {name}[{_short(grid)}]({_describe(args)}, {_describe(kwargs)})"
            if our_exc is None:
                if their_exc is not None:
                    failures.append(f"{where}: fastkernel launched; Triton raised {their_exc!r}")
                elif (theirs is None) != (ours is None):
                    failures.append(f"{where}: one launched and the other did not")
                elif theirs is None:
                    counts["launched nothing (an empty grid), as Triton"] += 1
                else:
                    try:
                        assert_same_launch(ours, theirs)
                        counts["launched, the same bytes as Triton"] += 1
                    except AssertionError as exc:
                        failures.append(f"{where}: {exc}")
            elif type(our_exc).__module__.startswith("triton") or (
                their_exc is not None
                and type(our_exc) is type(their_exc)
                and str(our_exc) == str(their_exc)
            ):
                counts["raised Triton's own error"] += 1
            elif not isinstance(our_exc, TYPED):
                failures.append(f"{where}: fastkernel raised an untyped {our_exc!r}")
            elif not _names_argument(str(our_exc), jit):
                failures.append(f"{where}: fastkernel's error names no argument: {our_exc!r}")
            elif their_exc is None:
                counts["raised a typed error naming the argument (Triton launched)"] += 1
            else:
                counts["raised a typed error naming the argument (Triton raised)"] += 1
            if report_every and (i + 1) % report_every == 0:
                print(
                    f"  {i + 1} calls, {len(failures)} failures, "
                    f"{time.perf_counter() - start:.0f} s",
                    flush=True,
                )
    retire(fast)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--templates",
        type=int,
        default=40,
        help="specialization templates per kernel (bounds the compiles)",
    )
    opts = parser.parse_args(argv)
    result = run(opts.calls, opts.seed, opts.templates, report_every=max(opts.calls // 10, 1))
    print(
        f"{result['calls']} generated calls over {len(result['stats'])} kernels, "
        f"{opts.templates} templates each (seed {opts.seed}), {result['seconds']:.0f} s:"
    )
    for outcome, count in sorted(result["outcomes"].items()):
        print(f"  {outcome:48} {count}")
    hits = sum(s["hits"] for s in result["stats"].values())
    fallbacks = sum(s["fallbacks"] for s in result["stats"].values())
    print(f"  {'fastkernel native hits / fallbacks to Triton':48} {hits} / {fallbacks}")
    served = result["cache"]
    print(
        f"  {'misses: compiled / from the disk cache (warm index)':48} {served['compiled']} / "
        f"{served['loaded']} ({served['warm']})"
    )
    print(f"  {'failures':48} {len(result['failures'])}")
    for failure in result["failures"][:20]:
        print(f"    {failure[:400]}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
