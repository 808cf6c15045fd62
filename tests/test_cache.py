"""The on-disk kernel cache (fastkernel/cache.py), on CPU against the recording stand-in driver.

What is checked: every ingredient of the key changes it; a bad entry (truncated, corrupted,
foreign, from another toolchain) is removed and recompiled, never loaded; processes compiling
the same kernel at once leave one good entry; a warm process launches the same bytes as the cold
one without calling Triton's compiler; export/import; the controls and the CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import pathlib
import re
import struct
import subprocess
import sys
import textwrap
import time
import unittest.mock

import kernels
import pytest
import torch
import triton
import triton.language as tl
from conftest import DISTINCT_LAUNCH_FACTS

import fastkernel
from fastkernel import __main__ as cli
from fastkernel import _triton_abi as abi
from fastkernel import cache
from fastkernel import fastkernel as fk

TESTS = os.path.dirname(os.path.abspath(__file__))
T90 = abi.cuda_target(9, 0)


@pytest.fixture
def cache_root(tmp_path, monkeypatch) -> pathlib.Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("FASTKERNEL_CACHE_DIR", str(root))
    monkeypatch.delenv("FASTKERNEL_CACHE", raising=False)
    monkeypatch.delenv("FASTKERNEL_ALWAYS_COMPILE", raising=False)
    return root


@pytest.fixture
def compiles(monkeypatch) -> list:
    """Counts calls of Triton's compiler through fastkernel."""
    calls = []
    real = abi.compile_specialization

    def counting(jit_fn, target, spec):
        calls.append(jit_fn.__name__)
        return real(jit_fn, target, spec)

    monkeypatch.setattr(abi, "compile_specialization", counting)
    return calls


def entry_files(root: pathlib.Path) -> list:
    return sorted((root / "entries").rglob("*.fkc")) if (root / "entries").is_dir() else []


def temp_files(root: pathlib.Path) -> list:
    return sorted(root.rglob("*.tmp"))


def key_of(kernel, args, kwargs, target=T90) -> str:
    return cache.entry_key(kernel, target, abi.specialize(kernel, target, args, kwargs))


def resign(data: bytes, edit) -> bytes:
    """An entry's bytes with its header changed by ``edit`` and a valid checksum."""
    entry = cache.decode_entry(data)
    header = json.loads(json.dumps(dict(entry.header)))
    edit(header)
    return cache.encode_entry(header, entry.cubin)


def normalized(launch, tensors) -> dict:
    """A launch with tensor addresses replaced by the tensor's index (they differ by process)."""
    ptrs = {struct.pack("<Q", t.data_ptr()): f"tensor{i}" for i, t in enumerate(tensors)}
    return {
        "name": launch.name,
        "grid": list(launch.grid),
        "block": list(launch.block),
        "shared_mem": launch.shared_mem,
        "is_ex": launch.is_ex,
        "layout": [list(p) for p in launch.param_layout],
        "params": [ptrs.get(p, p.hex()) for p in launch.params],
    }


# -- the key ----------------------------------------------------------------------------------

MODULE = """\
import types
import triton
import triton.language as tl
from conftest import DISTINCT_LAUNCH_FACTS

SCALE = tl.constexpr({scale})
OFFSET = {offset}
CONFIG = types.SimpleNamespace(k=2)


@triton.jit
def helper(x):
    return x {helper_op} 2


@triton.jit
def kern(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, helper(x) {kern_op} SCALE, mask=mask)


@triton.jit
def with_global(out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32) + OFFSET)


@triton.jit
def with_object_global(out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32) + CONFIG.k)
"""


@pytest.fixture
def make_module(tmp_path):
    """Writes MODULE with the given substitutions to a fresh file and imports it (jit functions
    need a source file); every variant keeps the same line numbers."""
    count = [0]

    def make(scale=2, offset=3, helper_op="*", kern_op="+"):
        count[0] += 1
        name = f"fk_cache_mod_{os.getpid()}_{id(tmp_path)}_{count[0]}"
        path = tmp_path / f"{name}.py"
        path.write_text(
            MODULE.format(scale=scale, offset=offset, helper_op=helper_op, kern_op=kern_op)
        )
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    return make


def test_key_changes_with_each_ingredient(cache_root, make_module, monkeypatch, tmp_path):
    x = torch.randn(64)
    base_mod = make_module()
    args, kw = (x, x, 64), {"BLOCK": 64}
    base = key_of(base_mod.kern, args, kw)
    # The same source in another file and module shares the entry: no path is in the key, so a
    # cache made on one machine serves another with another install location.
    assert key_of(make_module().kern, args, kw) == base
    assert key_of(base_mod.kern, args, kw) == base  # and it is stable

    keys = {
        "kernel source": key_of(make_module(kern_op="-").kern, args, kw),
        "called jit function's source": key_of(make_module(helper_op="+").kern, args, kw),
        "constexpr global": key_of(make_module(scale=3).kern, args, kw),
        "constexpr value": key_of(base_mod.kern, args, {"BLOCK": 32}),
        "int specialized to 1": key_of(base_mod.kern, (x, x, 1), kw),
        "int divisible by 16 or not": key_of(base_mod.kern, (x, x, 63), kw),
        "pointer alignment": key_of(base_mod.kern, (x[1:], x, 64), kw),
        "pointer dtype": key_of(base_mod.kern, (x.half(), x, 64), kw),
        "compile option": key_of(base_mod.kern, args, {**kw, "num_warps": 8}),
        "target": key_of(base_mod.kern, args, kw, target=abi.cuda_target(8, 0)),
    }
    with monkeypatch.context() as m:
        m.setenv("TRITON_DISABLE_LINE_INFO", "1")  # one of Triton's cache-invalidating variables
        keys["cache-invalidating env var"] = key_of(base_mod.kern, args, kw)
    with monkeypatch.context() as m:
        m.setattr(triton, "__version__", "3.9.0+other")
        keys["triton version"] = key_of(base_mod.kern, args, kw)
    with monkeypatch.context() as m:
        m.setattr(cache.key, "_triton_key_digest", lambda memo_dir: "0" * 64)
        keys["triton_key (compiler sources, libtriton)"] = key_of(base_mod.kern, args, kw)
    with monkeypatch.context() as m:
        # Another ptxas (TRITON_PTXAS_BLACKWELL_PATH, as Triton's knobs find it) reporting
        # another version: the memoized backend digest is taken again for the new binary.
        other_ptxas = tmp_path / "ptxas-blackwell"
        other_ptxas.write_bytes(b"#!/bin/sh\n")
        m.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(other_ptxas))
        m.setattr(abi.backend_for(T90), "hash", lambda: "ptxas 99.9-90")
        keys["backend hash (ptxas version)"] = key_of(base_mod.kern, args, kw)
    with monkeypatch.context() as m:
        m.setattr(fastkernel, "__version__", "9.9.9")
        keys["fastkernel version"] = key_of(base_mod.kern, args, kw)
    assert key_of(base_mod.kern, args, kw) == base  # every change above was undone
    for what, key in keys.items():
        assert key != base, what
    assert len(set(keys.values())) == len(keys)


def test_key_covers_dtype_and_jit_function_constexprs(cache_root):
    x = torch.randn(64)

    def key(dtype, fn):
        return key_of(kernels.cast_kernel, (x, x, 64), {"OUT_DTYPE": dtype, "FN": fn, "BLOCK": 64})

    keys = [
        key(tl.float16, kernels.times_two),
        key(tl.bfloat16, kernels.times_two),
        key(tl.float16, kernels.times_three),
    ]
    assert len(set(keys)) == 3


def test_key_covers_a_non_constexpr_global_that_triton_does_not_hash(
    cache_root, make_module, monkeypatch
):
    monkeypatch.setenv("TRITON_ALLOW_NON_CONSTEXPR_GLOBALS", "1")
    out = torch.empty(16)
    three, four = make_module(offset=3), make_module(offset=4)
    # Same function source, different global: Triton's own cache_key is equal...
    assert three.with_global.cache_key == four.with_global.cache_key
    # ...but the binaries differ (the value is compiled in), and so do the entries.
    assert key_of(three.with_global, (out,), {"BLOCK": 16}) != key_of(
        four.with_global, (out,), {"BLOCK": 16}
    )


def test_entries_store_every_launch_metadata_field():
    """An entry's header holds every field of abi.LaunchMetadata but the cubin, each as a JSON
    type; the set is pinned to FORMAT_VERSION, so a field added to LaunchMetadata fails here
    until the version is bumped (entries of the old version are then refused and rewritten)."""
    assert set(cache.entry.LAUNCH_FIELDS) | {"cubin"} == {
        f.name for f in dataclasses.fields(abi.LaunchMetadata)
    }
    assert set(cache.entry.LAUNCH_FIELDS.values()) <= {str, int, bool, list}
    pinned = {
        2: {
            "name": str,
            "block_x": int,
            "shared_mem": int,
            "num_ctas": int,
            "cooperative_grid": bool,
            "pdl": bool,
            "global_scratch_size": int,
            "global_scratch_align": int,
            "profile_scratch_size": int,
            "profile_scratch_align": int,
            "tensordesc_meta": list,
        }
    }
    assert cache.entry.LAUNCH_FIELDS == pinned[cache.entry.FORMAT_VERSION]


def test_launch_facts_come_from_the_native_field_list():
    """abi.launch_facts fills _C.LaunchFacts by the native struct's own field list: every field
    not supplied by the registration is LaunchMetadata's of the same name."""
    from fastkernel import _C

    meta = abi.LaunchMetadata(name="k", cubin=b"", **DISTINCT_LAUNCH_FACTS)
    facts = abi.launch_facts(meta, device=3, plan=[(0, "*fp32")], num_scratch_params=2)
    registration = set(abi.REGISTRATION_FACTS) | {"kernel_name"}
    assert set(abi.REGISTRATION_FACTS) < set(_C.LaunchFacts.FIELDS)
    for field in _C.LaunchFacts.FIELDS:
        if field not in registration:
            assert getattr(facts, field) == getattr(meta, field), field
    assert (facts.kernel_name, facts.device, facts.plan) == ("k", 3, [(0, "*fp32")])
    with pytest.raises(TypeError, match="block_x"):
        abi.launch_facts(meta, block_x=64)


def test_values_are_rendered_with_their_type():
    rendered = [
        cache.key.render(v)
        for v in (
            1,
            True,
            1.0,
            "1",
            None,
            (1,),
            [1],
            tl.constexpr(1),
            tl.float16,
            tl.pointer_type(tl.float16),
            tl.pointer_type(tl.float16, const=True),
        )
    ]
    assert len({json.dumps(r) for r in rendered}) == len(rendered)
    assert cache.key.render(0.1) == ["float", (0.1).hex()]  # exact, not a rounded repr
    with pytest.raises(cache.Uncacheable, match="SimpleNamespace"):
        import types

        cache.key.render(types.SimpleNamespace(k=2))


# -- the miss path ------------------------------------------------------------------------------


def test_cold_then_warm_in_one_process(stand_in, cache_root, compiles):
    x = torch.randn(64)
    cold = fk(kernels.add_kernel)
    handle = cold[(1,)](x, x, x, 64, BLOCK=64)
    assert compiles == ["add_kernel"]
    (path,) = entry_files(cache_root)
    entry = cache.read_entry(path)
    assert entry.cubin == handle.asm["cubin"]
    assert entry.header["launch"]["name"] == "add_kernel"
    assert entry.header["launch"]["block_x"] == 128
    assert entry.header["kernel"] == "kernels:add_kernel"

    warm = fk(kernels.add_kernel)  # a new kernel object: an empty native table
    cached = warm[(1,)](x, x, x, 64, BLOCK=64)
    assert compiles == ["add_kernel"]
    assert isinstance(cached, cache.CachedKernel)
    assert cached.name == "add_kernel" and cached.key == path.stem
    assert cached.asm["cubin"] == handle.asm["cubin"]
    assert cached.metadata.num_warps == handle.metadata.num_warps
    assert cached.metadata.shared == handle.metadata.shared
    assert cached.target == handle.metadata.target
    assert cached.hash == handle.hash  # Triton's own key of the binary
    assert (cached.src.signature, cached.src.constants, cached.src.attrs) == (
        handle.src.signature,
        handle.src.constants,
        handle.src.attrs,
    )
    assert cached.src.hash() == handle.src.hash()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cached.name = "other"  # read-only
    first, second = stand_in.launches()
    assert first.params == second.params and first.raw == second.raw
    assert first.image == second.image  # the disk cache's cubin is the one compiled
    assert (warm.stats()["misses"], stand_in.module_loads()) == (1, 2)
    assert warm[(1,)](x, x, x, 64, BLOCK=64) is cached  # then a native hit, as always
    assert warm.stats()["hits"] == 1


def _damage_truncate(path, other):
    path.write_bytes(path.read_bytes()[:-100])


def _damage_flip(path, other):
    data = bytearray(path.read_bytes())
    data[-50] ^= 0x40
    path.write_bytes(bytes(data))


def _damage_empty(path, other):
    path.write_bytes(b"")


def _damage_garbage(path, other):
    path.write_bytes(os.urandom(4096))


def _damage_foreign(path, other):
    path.write_bytes(other.read_bytes())  # a valid entry of another kernel, under this key


def _damage_toolchain(path, other):
    path.write_bytes(resign(path.read_bytes(), lambda h: h["toolchain"].update(triton="0.0.0")))


def _damage_extended(path, other):
    path.write_bytes(path.read_bytes() + b"\0")


@pytest.mark.parametrize(
    "damage,reason",
    [
        (_damage_truncate, "truncated"),
        (_damage_extended, "truncated or extended"),
        (_damage_flip, "checksum"),
        (_damage_empty, "shorter than"),
        (_damage_garbage, "bad magic"),
        (_damage_foreign, "foreign entry"),
        (_damage_toolchain, "another toolchain"),
    ],
    ids=["truncated", "extended", "corrupted", "empty", "garbage", "foreign", "toolchain"],
)
def test_bad_entry_is_removed_and_recompiled(
    stand_in, cache_root, compiles, caplog, damage, reason
):
    x, out = torch.randn(64), torch.empty(16)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    fk(kernels.constexpr_kernel)[(1,)](out, SCALE=2.0, MODE="double", BLOCK=16)
    key = key_of(kernels.add_kernel, (x, x, x, 64), {"BLOCK": 64})
    path = cache.entry_path(cache_root, key)
    (other,) = [p for p in entry_files(cache_root) if p != path]
    good = path.read_bytes()
    damage(path, other)

    with caplog.at_level(logging.WARNING, logger="fastkernel.cache"):
        handle = fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert compiles == ["add_kernel", "constexpr_kernel", "add_kernel"]
    assert not isinstance(handle, cache.CachedKernel)
    (record,) = [r for r in caplog.records if r.name == "fastkernel.cache"]
    assert "removed cache entry" in record.getMessage() and reason in record.getMessage()
    # Rewritten whole: the same bytes but for the creation time, which the header records.
    assert cache.read_entry(path).cubin == cache.decode_entry(good).cubin
    launches = stand_in.launches()
    assert launches[0].raw == launches[2].raw
    assert temp_files(cache_root) == []


@pytest.mark.stand_in
def test_concurrent_processes_leave_one_good_entry(cache_root, tmp_path):
    """Processes compile (and, in alternate rounds, load) the same kernel into one directory at
    once, then keep rewriting and reading that entry until a common deadline; every read they
    make verifies, and one whole entry is left."""
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        import json, logging, os, sys, time, torch
        from fastkernel import fastkernel, _C, cache
        import kernels
        bad = []
        class Catch(logging.Handler):
            def emit(self, record):
                bad.append(record.getMessage())
        logging.getLogger("fastkernel.cache").addHandler(Catch(logging.WARNING))
        _C._testing.set_host_testing(True, 0, 0x5EED5)
        x = torch.randn(64)
        open(sys.argv[1], "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        time.sleep(0.05)
        deadline = float(open({str(go)!r}).read())
        kinds = []
        for i in range(6):
            os.environ["FASTKERNEL_ALWAYS_COMPILE"] = "1" if i % 2 == 0 else "0"
            handle = fastkernel(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
            kinds.append(type(handle).__name__)
        # The store and the load the miss path uses, as fast as they go, against the others.
        path = cache.entry_path(cache.cache_dir(), handle.key)
        data = path.read_bytes()
        rounds = 0
        while time.time() < deadline or rounds < 50:
            cache.atomic_write(path, data)
            try:
                cache.read_entry(path)
            except Exception as exc:
                bad.append(repr(exc))
            rounds += 1
        print(json.dumps({{"bad": bad, "kinds": kinds, "rounds": rounds}}))
    """)
    procs, ready = [], []
    for i in range(3):
        ready.append(tmp_path / f"ready{i}")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script, str(ready[-1])],
                cwd=TESTS,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.time() + 120
    while not all(r.exists() for r in ready) and time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.02)
    (tmp_path / "go.tmp").write_text(str(time.time() + 3.0))
    os.replace(tmp_path / "go.tmp", go)
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    for result in results:
        assert result["bad"] == []  # no torn or corrupt entry was ever read
        assert result["kinds"][0::2] == ["CompiledKernel"] * 3
        assert result["kinds"][1::2] == ["CachedKernel"] * 3
    (path,) = entry_files(cache_root)
    entry = cache.read_entry(path)
    assert entry.header["launch"]["name"] == "add_kernel"
    assert temp_files(cache_root) == []


WARM_SCRIPT = """
    import hashlib, json, os, struct, sys, torch, triton
    from fastkernel import fastkernel, _C, cache
    from fastkernel import _triton_abi as abi
    from stand_in_driver.recording import RecordingDriver
    import kernels

    def refuse(*args, **kwargs):
        raise AssertionError("Triton's compiler was called on the warm path")

    abi.compile_specialization = refuse
    triton.compile = refuse
    triton.compiler.compile = refuse
    triton.compiler.compiler.compile = refuse

    driver = RecordingDriver(os.environ["FASTKERNEL_CUDA_DRIVER"])
    _C._testing.set_host_testing(True, 0, 0x5EED5)
    x, out = torch.randn(64), torch.empty(16)
    add, scalars = fastkernel(kernels.add_kernel), fastkernel(kernels.scalars_kernel)
    handles = [add[(2,)](x, x, x, 64, BLOCK=64),
               scalars[(1,)](out, 5, 2**40, 2**63 + 5, 1.25, 0.3, -2.7, 3.14159, True, None, 1,
                             BLOCK=16)]
    tensors = [x, out]
    ptrs = {struct.pack("<Q", t.data_ptr()): "tensor%d" % i for i, t in enumerate(tensors)}
    print(json.dumps({
        "handles": [type(h).__name__ for h in handles],
        "cubins": [hashlib.sha256(h.asm["cubin"]).hexdigest() for h in handles],
        "misses": add.stats()["misses"] + scalars.stats()["misses"],
        "launches": [{"name": l.name, "grid": list(l.grid), "block": list(l.block),
                      "shared_mem": l.shared_mem, "is_ex": l.is_ex,
                      "layout": [list(p) for p in l.param_layout],
                      "params": [ptrs.get(p, p.hex()) for p in l.params]}
                     for l in driver.launches()],
    }))
"""


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=TESTS,
        timeout=300,
    )


def test_warm_process_launches_the_same_bytes_without_the_compiler(stand_in, cache_root):
    x, out = torch.randn(64), torch.empty(16)
    add, scalars = fk(kernels.add_kernel), fk(kernels.scalars_kernel)
    handles = [
        add[(2,)](x, x, x, 64, BLOCK=64),
        scalars[(1,)](out, 5, 2**40, 2**63 + 5, 1.25, 0.3, -2.7, 3.14159, True, None, 1, BLOCK=16),
    ]
    cold = [normalized(launch, [x, out]) for launch in stand_in.launches()]
    assert len(entry_files(cache_root)) == 2

    result = run_python(WARM_SCRIPT)
    assert result.returncode == 0, result.stderr
    warm = json.loads(result.stdout.strip().splitlines()[-1])
    assert warm["handles"] == ["CachedKernel", "CachedKernel"]
    assert warm["cubins"] == [hashlib.sha256(h.asm["cubin"]).hexdigest() for h in handles]
    assert warm["misses"] == 2
    assert warm["launches"] == cold


# -- controls -----------------------------------------------------------------------------------


def test_cache_off_reads_and_writes_nothing(stand_in, cache_root, compiles, monkeypatch):
    monkeypatch.setenv("FASTKERNEL_CACHE", "0")
    x = torch.randn(64)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert compiles == ["add_kernel", "add_kernel"]
    assert not cache_root.exists()


def test_always_compile_compiles_and_still_writes(stand_in, cache_root, compiles, monkeypatch):
    x = torch.randn(64)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    (path,) = entry_files(cache_root)
    before = path.stat()
    monkeypatch.setenv("FASTKERNEL_ALWAYS_COMPILE", "1")
    handle = fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert compiles == ["add_kernel", "add_kernel"]
    assert not isinstance(handle, cache.CachedKernel)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns)  # rewritten
    assert entry_files(cache_root) == [path]


def test_cache_dir_is_read_at_call_time(stand_in, tmp_path, monkeypatch):
    x = torch.randn(64)
    for name in ("one", "two"):
        monkeypatch.setenv("FASTKERNEL_CACHE_DIR", str(tmp_path / name))
        fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
        assert len(entry_files(tmp_path / name)) == 1


def test_default_dir_follows_xdg(monkeypatch, tmp_path):
    if sys.platform in ("win32", "darwin"):
        pytest.skip("XDG is the Linux convention")
    monkeypatch.delenv("FASTKERNEL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "fastkernel"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the spec says: ignore relative
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "fastkernel"


def test_uncacheable_kernel_runs_and_logs_once(
    stand_in, cache_root, make_module, monkeypatch, caplog
):
    """A kernel whose key has a value with no stable rendering (here a global object, allowed by
    TRITON_ALLOW_NON_CONSTEXPR_GLOBALS) still launches, but nothing is written."""
    monkeypatch.setenv("TRITON_ALLOW_NON_CONSTEXPR_GLOBALS", "1")
    module = make_module()
    out = torch.empty(16)
    with caplog.at_level(logging.WARNING, logger="fastkernel.cache"):
        for _ in range(2):
            handle = fk(module.with_object_global)[(1,)](out, BLOCK=16)
            assert handle is not None
    (record,) = [r for r in caplog.records if r.name == "fastkernel.cache"]
    assert "with_object_global is not cached on disk" in record.getMessage()
    assert "SimpleNamespace" in record.getMessage()
    assert entry_files(cache_root) == []
    assert len(stand_in.launches()) == 2


def test_unwritable_cache_dir_still_runs(stand_in, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FASTKERNEL_CACHE_DIR", str(blocker / "cache"))
    x = torch.randn(64)
    with caplog.at_level(logging.WARNING, logger="fastkernel.cache"):
        fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert len(stand_in.launches()) == 1
    assert any("cannot use the kernel cache" in r.getMessage() for r in caplog.records)


# -- shipping and the CLI -------------------------------------------------------------------------


def test_export_import_round_trip_skips_a_mismatched_toolchain(
    stand_in, tmp_path, monkeypatch, capsys, caplog
):
    x, out = torch.randn(64), torch.empty(16)
    monkeypatch.setenv("FASTKERNEL_CACHE_DIR", str(tmp_path / "builder"))
    add_handle = fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    fk(kernels.constexpr_kernel)[(1,)](out, SCALE=2.0, MODE="double", BLOCK=16)
    shipped = tmp_path / "shipped"
    assert cli.main(["cache", "export", str(shipped)]) == 0
    assert "exported 2 entries" in capsys.readouterr().out
    files = sorted(shipped.glob("*.fkc"))
    assert len(files) == 2
    # One entry was built by another Triton: it must not be installed.
    constexpr_key = key_of(
        kernels.constexpr_kernel, (out,), {"SCALE": 2.0, "MODE": "double", "BLOCK": 16}
    )
    foreign = shipped / f"{constexpr_key}.fkc"
    foreign.write_bytes(
        resign(foreign.read_bytes(), lambda h: h["toolchain"].update(triton="3.0.0"))
    )

    fleet = tmp_path / "fleet"
    monkeypatch.setenv("FASTKERNEL_CACHE_DIR", str(fleet))
    with caplog.at_level(logging.WARNING, logger="fastkernel.cache"):
        assert cli.main(["cache", "import", str(shipped)]) == 0
    assert "imported 1 entry into" in capsys.readouterr().out
    (skip,) = [r for r in caplog.records if r.name == "fastkernel.cache"]
    assert "skipped" in skip.getMessage() and "triton 3.0.0" in skip.getMessage()
    assert [p.name for p in entry_files(fleet)] == [
        f for f in os.listdir(shipped) if f != foreign.name
    ]

    def refuse(*args):
        raise RuntimeError("compiler called")

    monkeypatch.setattr(abi, "compile_specialization", refuse)
    handle = fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert isinstance(handle, cache.CachedKernel)
    assert handle.asm["cubin"] == add_handle.asm["cubin"]
    with pytest.raises(RuntimeError, match="compiler called"):
        fk(kernels.constexpr_kernel)[(1,)](out, SCALE=2.0, MODE="double", BLOCK=16)


def test_cli_info_list_clear(stand_in, cache_root, capsys):
    x, out = torch.randn(64), torch.empty(16)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    fk(kernels.add_kernel)[(1,)](x[1:], x, x, 63, BLOCK=64)
    fk(kernels.constexpr_kernel)[(1,)](out, SCALE=2.0, MODE="double", BLOCK=16)
    size = sum(p.stat().st_size for p in entry_files(cache_root))

    assert cli.main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert str(cache_root) in info and "state      enabled" in info
    assert "entries    3 (" in info and "of 2 kernels" in info
    assert f"triton {triton.__version__}" in info

    assert cli.main(["cache", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert sum("kernels:add_kernel" in line for line in lines) == 2
    assert sum("kernels:constexpr_kernel" in line and "cuda:90" in line for line in lines) == 1

    assert cli.main(["cache", "clear"]) == 0
    assert f"removed 3 entries ({cache.cli._human(size)})" in capsys.readouterr().out
    assert entry_files(cache_root) == []
    assert cli.main(["cache", "info"]) == 0
    assert "entries    0 (0 B)" in capsys.readouterr().out


def test_cli_info_counts_the_warm_index_records(stand_in, cache_root, capsys):
    x = torch.randn(64)
    assert cli.main(["cache", "info"]) == 0
    assert "warm index 0 records" in capsys.readouterr().out
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    fk(kernels.add_kernel)[(1,)](x[1:], x, x, 63, BLOCK=64)
    assert len(index_files(cache_root)) == 2
    assert cli.main(["cache", "info"]) == 0
    assert "warm index 2 records" in capsys.readouterr().out


def test_clear_removes_only_what_fastkernel_wrote(stand_in, cache_root, capsys):
    x = torch.randn(64)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    # Files of the user's own under the cache's directories (a cache directory pointed at a
    # directory that already held them): clear must not take them.
    (cache_root / "index" / "notes.md").write_text("mine")
    (cache_root / "toolchain" / "build.sh").write_text("mine")
    shard = next((cache_root / "entries").iterdir())
    (shard / "README").write_text("mine")
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert entry_files(cache_root) == []
    left = sorted(str(p.relative_to(cache_root)) for p in cache_root.rglob("*") if p.is_file())
    assert left == [f"entries/{shard.name}/README", "index/notes.md", "toolchain/build.sh"]


def _temporary(directory: pathlib.Path, target: str, age_s: float, pid: int = 4242) -> pathlib.Path:
    """A temporary file as ``files.write_file`` names one, last changed ``age_s`` seconds ago."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".{target}.{pid}.{os.urandom(6).hex()}.tmp"
    path.write_bytes(b"half a write")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_prune_takes_only_the_stale_temporaries_of_killed_writers(
    stand_in, cache_root, tmp_path, capsys
):
    x = torch.randn(64)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    (entry,) = entry_files(cache_root)
    index_records = sorted((cache_root / "index").rglob("*.json"))
    kept = {p: p.read_bytes() for p in [entry, *index_records]}
    hour = cache.store.STALE_TEMP_SECONDS
    stale = [
        _temporary(entry.parent, entry.name, 2 * hour),
        _temporary(index_records[0].parent, index_records[0].name, 2 * hour, pid=7),
        _temporary(cache_root / "autotune" / "ab", "ab.json", 3 * hour),
        _temporary(cache_root / "toolchain", "triton-0123.txt", 25 * hour),
    ]
    in_progress = _temporary(entry.parent, entry.name, 5)  # a write happening now
    # Not a write's temporary: a user's file under a cache directory, a file outside the four
    # directories fastkernel writes, and a link named as a temporary to a file outside the
    # cache (never followed, never taken).
    mine = entry.parent / ".notes.tmp"
    mine.write_text("mine")
    os.utime(mine, (0, 0))
    outside = _temporary(cache_root / "elsewhere", "x.fkc", 2 * hour)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = entry.parent / f".{entry.name}.99.{'ab' * 6}.tmp"
    link.symlink_to(victim)

    assert cli.main(["cache", "info"]) == 0
    assert "temporary  5 (writes in progress, or left by killed writers" in capsys.readouterr().out
    assert cli.main(["cache", "prune"]) == 0
    assert "removed 4 temporary files of interrupted writes" in capsys.readouterr().out
    assert not any(p.exists() for p in stale)
    assert in_progress.exists() and mine.exists() and outside.exists()
    assert link.is_symlink() and victim.read_text() == "keep"
    assert {p: p.read_bytes() for p in kept} == kept  # entries and records untouched
    # With no age limit the write "in progress" goes too; the entry still serves a new process.
    assert cli.main(["cache", "prune", "--older-than", "0"]) == 0
    assert "removed 1 temporary file of" in capsys.readouterr().out
    assert not in_progress.exists() and cache.store.temp_files(cache_root) == []
    assert isinstance(
        fk(triton.jit(kernels.add_kernel.fn))[(1,)](x, x, x, 64, BLOCK=64), cache.CachedKernel
    )


def test_prune_checks_its_argument(cache_root, capsys):
    with pytest.raises(TypeError, match="argument 'older_than' must be a number of seconds"):
        cache.prune(cache_root, "3600")
    with pytest.raises(TypeError, match="argument 'older_than'"):
        cache.prune(cache_root, True)
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="argument 'older_than' must be finite and >= 0"):
            cache.prune(cache_root, bad)
    for bad in ("-1", "nan", "inf", "soon"):
        with pytest.raises(SystemExit) as exc:
            cli.main(["cache", "prune", "--older-than", bad])
        assert exc.value.code == 2
        assert "--older-than" in capsys.readouterr().err
    assert cache.prune(cache_root) == 0  # no cache directory yet: nothing to take


def test_the_directory_functions_check_their_arguments_kinds_first(cache_root, tmp_path):
    """Each path argument of the cache's directory functions is checked for its kind, with a
    TypeError naming it, before any value is (prune's older_than included)."""
    calls = {
        "scan": (lambda: cache.scan(5), "scan(): argument 'root' must be a str or os.PathLike"),
        "clear": (lambda: cache.clear(5), "clear(): argument 'root'"),
        "prune": (lambda: cache.prune(5, older_than=-1), "prune(): argument 'root'"),
        "export dest": (lambda: cache.export_entries(5), "export_entries(): argument 'dest'"),
        "export root": (
            lambda: cache.export_entries(tmp_path / "out", root=5.0),
            "export_entries(): argument 'root' must be a str or os.PathLike or None, not float",
        ),
        "import src": (lambda: cache.import_entries(None), "import_entries(): argument 'src'"),
        "import root": (
            lambda: cache.import_entries(tmp_path, root=[cache_root]),
            "import_entries(): argument 'root'",
        ),
    }
    for call, match in calls.values():
        with pytest.raises(TypeError, match=re.escape(match)):
            call()
    assert not (tmp_path / "out").exists()
    # An int too large for a float is a value out of range, not an OverflowError.
    with pytest.raises(ValueError, match="argument 'older_than' must be finite and >= 0"):
        cache.prune(cache_root, 10**400)
    assert cache.prune(str(cache_root), older_than=10**6) == 0  # a str path and an int: fine


def _kernel_target_spec():
    x = torch.empty(64)
    spec = abi.specialize(kernels.add_kernel, T90, (x, x, x, 64), {"BLOCK": 64})
    return kernels.add_kernel, T90, spec


_J, _T, _S = (
    "jit_fn' must be a triton.runtime.jit.JITFunction",
    "target' must be a",
    "spec' must be",
)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda j, t, s, d: cache.decode_entry("x"), "decode_entry(): argument 'data' must be a"),
        (lambda j, t, s, d: cache.decode_entry(b"", 5), "decode_entry(): argument 'path'"),
        (lambda j, t, s, d: cache.encode_entry(5, 5), "encode_entry(): argument 'header'"),
        (lambda j, t, s, d: cache.encode_entry({}, "x"), "encode_entry(): argument 'cubin'"),
        (lambda j, t, s, d: cache.entry_path(5, "x"), "entry_path(): argument 'root'"),
        (lambda j, t, s, d: cache.entry_path(d, 5), "entry_path(): argument 'key' must be a str"),
        (lambda j, t, s, d: cache.read_entry(None), "read_entry(): argument 'path'"),
        (lambda j, t, s, d: cache.read_entry(d, "yes"), "read_entry(): argument 'trusted'"),
        (lambda j, t, s, d: cache.iter_entry_files(5), "iter_entry_files(): argument 'root'"),
        (lambda j, t, s, d: cache.iter_entry_files(d, 1), "iter_entry_files(): argument 'strict'"),
        (lambda j, t, s, d: cache.atomic_write(5, b""), "atomic_write(): argument 'path'"),
        (lambda j, t, s, d: cache.atomic_write(d / "f", "x"), "atomic_write(): argument 'data'"),
        (lambda j, t, s, d: cache.discard(5, "r"), "discard(): argument 'handle'"),
        (
            lambda j, t, s, d: cache.toolchain_fingerprint(None),
            "toolchain_fingerprint(): argument 'target'",
        ),
        (
            lambda j, t, s, d: cache.toolchain_fingerprint(t, 5),
            "toolchain_fingerprint(): argument 'memo_dir'",
        ),
        (lambda j, t, s, d: cache.key_document(j.fn, t, s), "key_document(): argument '" + _J),
        (lambda j, t, s, d: cache.key_document(j, (9, 0), s), "key_document(): argument '" + _T),
        (lambda j, t, s, d: cache.key_document(j, t, None), "key_document(): argument '" + _S),
        (lambda j, t, s, d: cache.key_document(j, t, s, env={}), "key_document(): argument 'env'"),
        (
            lambda j, t, s, d: cache.entry_key(j, t, s, memo_dir=1),
            "entry_key(): argument 'memo_dir'",
        ),
        (lambda j, t, s, d: cache.entry_key(5, None, None), "entry_key(): argument '" + _J),
        (lambda j, t, s, d: cache.is_cached(j, t, {}), "is_cached(): argument '" + _S),
        (
            lambda j, t, s, d: cache.load_or_compile(j, "sm90", s),
            "load_or_compile(): argument '" + _T,
        ),
        (
            lambda j, t, s, d: cache.compile_and_store(j, t, 5),
            "compile_and_store(): argument '" + _S,
        ),
        (lambda j, t, s, d: cache.warm_lookup(j, t, "k"), "warm_lookup(): argument 'native_key'"),
        (lambda j, t, s, d: cache.warm_lookup(j, t, b"", 5), "warm_lookup(): argument 'tuned'"),
        (lambda j, t, s, d: cache.warm_store(j, t, b"", None), "warm_store(): argument '" + _S),
        (
            lambda j, t, s, d: cache.decode_index_record("{}", "i", "k", t),
            "decode_index_record(): argument 'data'",
        ),
        (
            lambda j, t, s, d: cache.decode_index_record(b"{}", "i", b"k", t),
            "decode_index_record(): argument 'native_key'",
        ),
        (
            lambda j, t, s, d: cache.decode_index_record(b"{}", "i", "k", 90),
            "decode_index_record(): argument '" + _T,
        ),
    ],
)
def test_the_cache_functions_name_an_argument_of_the_wrong_kind(cache_root, call, match):
    """The lower-level functions of fastkernel.cache refuse an argument of the wrong kind with
    a TypeError naming it, before using any value (a wrong kind is not an uncacheable kernel,
    a corrupt entry or a malformed record)."""
    with pytest.raises(TypeError, match=re.escape(match)):
        call(*_kernel_target_spec(), cache_root)
    assert not cache_root.exists() or entry_files(cache_root) == []


@pytest.mark.parametrize("key", ["", "ab", "../" + "0" * 61, "A" * 64, "0" * 65])
def test_entry_path_takes_only_entry_keys(tmp_path, key):
    with pytest.raises(ValueError, match="argument 'key' must be 64 lowercase hex digits"):
        cache.entry_path(tmp_path, key)
    assert cache.entry_path(tmp_path, "0" * 64).name == "0" * 64 + cache.ENTRY_SUFFIX


def test_cli_errors_are_messages_and_a_failing_exit(stand_in, cache_root, tmp_path, capsys):
    x = torch.randn(64)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        (["cache", "export", str(a_file)], "a-file"),
        (["cache", "import", str(tmp_path / "missing")], "No such file or directory"),
        (["cache", "import", str(a_file)], "Not a directory"),
    ]
    for argv, message in cases:
        assert cli.main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and "Traceback" not in err
    # A clear that cannot remove an entry says so.
    real_unlink = pathlib.Path.unlink

    def refusing(self, *args, **kwargs):
        if self.suffix == cache.ENTRY_SUFFIX:
            raise PermissionError(13, "Permission denied", str(self))
        return real_unlink(self, *args, **kwargs)

    with unittest.mock.patch.object(pathlib.Path, "unlink", refusing):
        assert cli.main(["cache", "clear"]) == 1
    assert "could not remove 1 file (0 entries removed)" in capsys.readouterr().err
    assert len(entry_files(cache_root)) == 1


def test_no_home_directory_leaves_the_cache_off_and_kernels_running(
    stand_in, monkeypatch, tmp_path, caplog
):
    # Containers run under a user id with no password entry and no HOME: pathlib cannot find a
    # home directory. The launch still runs; XDG_CACHE_HOME (absolute) still locates the cache.
    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(pathlib.Path, "home", staticmethod(no_home))
    monkeypatch.delenv("FASTKERNEL_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("FASTKERNEL_CACHE", raising=False)
    x = torch.randn(64)
    with caplog.at_level(logging.WARNING, logger="fastkernel"):
        fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert "cannot locate the kernel cache: Could not determine home directory" in caplog.text
    assert len(stand_in.launches()) == 1
    assert cli.main(["cache", "info"]) == 1  # a message, not a traceback
    monkeypatch.setenv("FASTKERNEL_CACHE_DIR", "~no-such-user-fk/cache")
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert len(stand_in.launches()) == 2
    monkeypatch.delenv("FASTKERNEL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert len(entry_files(tmp_path / "xdg" / "fastkernel")) == 1


def test_the_warm_index_keeps_a_kernels_debug_option_apart(stand_in, cache_root):
    # Another process (here a new kernel object of the same source) whose kernel is
    # triton.jit(debug=True): the warm index record of the non-debug binary is not its own.
    x = torch.randn(64)
    plain = fk(triton.jit(kernels.add_kernel.fn))[(1,)](x, x, x, 64, BLOCK=64)
    assert plain.metadata.debug is False
    debug = fk(triton.jit(kernels.add_kernel.fn, debug=True))[(1,)](x, x, x, 64, BLOCK=64)
    assert debug.metadata.debug is True
    again = fk(triton.jit(kernels.add_kernel.fn, debug=True))[(1,)](x, x, x, 64, BLOCK=64)
    assert isinstance(again, cache.CachedKernel) and again.metadata.debug is True


def test_cli_runs_as_a_module(cache_root):
    result = subprocess.run(
        [sys.executable, "-m", "fastkernel", "cache", "info"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "FASTKERNEL_CACHE": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert "disabled (FASTKERNEL_CACHE=0)" in result.stdout


# -- the warm index ---------------------------------------------------------------------------------


@pytest.fixture
def binder_calls(monkeypatch) -> list:
    """Counts Triton binder runs (abi.specialize) through fastkernel."""
    calls = []
    real = abi.specialize

    def counting(jit_fn, target, args, kwargs, *knob_word):
        calls.append(jit_fn.__name__)
        return real(jit_fn, target, args, kwargs, *knob_word)

    monkeypatch.setattr(abi, "specialize", counting)
    return calls


def index_files(root: pathlib.Path) -> list:
    return sorted((root / "index").glob("*/*.json"))


def test_a_warm_kernel_skips_tritons_binder_and_launches_the_same_bytes(
    stand_in, cache_root, compiles, binder_calls
):
    x, y = torch.randn(64), torch.randn(65)
    cold = fk(kernels.tuple_kernel)
    for args in [(x, (x, 3), 64, (7, (2.5, x))), (x, (y[1:], 1), 63, (7, (2.5, x)))]:
        cold[(1,)](*args, BLOCK=64)
    assert len(binder_calls) == 2 and len(compiles) == 2 and len(index_files(cache_root)) == 2
    warm = fk(kernels.tuple_kernel)
    for args in [(x, (x, 3), 64, (7, (2.5, x))), (x, (y[1:], 1), 63, (7, (2.5, x)))]:
        handle = warm[(1,)](*args, BLOCK=64)
        assert isinstance(handle, cache.CachedKernel)
    assert len(binder_calls) == 2 and len(compiles) == 2  # neither binder nor compiler ran
    launches = stand_in.launches()
    assert [l.raw for l in launches[2:]] == [l.raw for l in launches[:2]]
    # What export needs came from the index too.
    assert [r[1].plan for r in warm._registrations.values()] == [
        r[1].plan for r in cold._registrations.values()
    ]


def test_a_warm_kernel_with_typed_ints_of_1_skips_tritons_binder(
    stand_in, cache_root, compiles, binder_calls, caplog
):
    """An int parameter annotated with a Triton type (``n: tl.int32``) that is 1 stays a
    parameter of the binary, as Triton specializes it: its warm index record fits the call."""
    out = torch.empty(32)
    calls = [(out, 1, 1, 1), (out, 1, 5, 0), (out, 7, 1, 255)]
    cold = fk(kernels.typed_kernel)
    for args in calls:
        cold[(1,)](*args, BLOCK=32)
    assert len(binder_calls) == 3 and len(index_files(cache_root)) == 3
    warm = fk(kernels.typed_kernel)
    with caplog.at_level(logging.WARNING, logger="fastkernel"):
        for args in calls:
            assert isinstance(warm[(1,)](*args, BLOCK=32), cache.CachedKernel)
    assert "does not fit the call" not in caplog.text
    assert len(binder_calls) == 3  # every warm call was served by its index record
    launches = stand_in.launches()
    assert [l.raw for l in launches[3:]] == [l.raw for l in launches[:3]]


def test_a_warm_kernel_given_constexpr_objects_skips_tritons_binder(
    stand_in, cache_root, compiles, binder_calls
):
    """A ``tl.constexpr`` object passed for a constexpr parameter (as its value, or wrapping a
    float) is kept in the warm index record: a new wrapper's miss is served from it."""
    out = torch.empty(16)
    calls = [
        {"SCALE": tl.constexpr(3), "MODE": "double", "BLOCK": 16},
        {"SCALE": tl.constexpr(2.5), "MODE": tl.constexpr("single"), "BLOCK": 16},
    ]
    cold = fk(kernels.constexpr_kernel)
    for kwargs in calls:
        cold[(1,)](out, **kwargs)
    assert len(binder_calls) == 2 and len(index_files(cache_root)) == 2
    warm = fk(kernels.constexpr_kernel)
    for kwargs in calls:
        assert isinstance(warm[(1,)](out, **kwargs), cache.CachedKernel)
    assert len(binder_calls) == 2 and len(compiles) == 2  # neither binder nor compiler ran
    launches = stand_in.launches()
    assert [l.raw for l in launches[2:]] == [l.raw for l in launches[:2]]
    # The specializations read back are the binder's: constexpr objects, of the same values.
    assert [repr(r[1].constexprs) for r in warm._registrations.values()] == [
        repr(r[1].constexprs) for r in cold._registrations.values()
    ]
    assert all(type(r[1].constexprs[(1,)]) is tl.constexpr for r in warm._registrations.values())


def test_a_damaged_or_lying_index_record_falls_back_to_the_binder(
    stand_in, cache_root, compiles, binder_calls
):
    x = torch.randn(64)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    (record,) = index_files(cache_root)
    good = json.loads(record.read_text())
    lying = json.loads(record.read_text())
    lying["spec"]["signature"][3][1] = "i64"  # n as an i64: another binary, not the entry's
    for text in ['{"entry": "', json.dumps(lying)]:
        record.write_text(text)
        fresh = fk(kernels.add_kernel)
        fresh[(1,)](x, x, x, 64, BLOCK=64)
        assert stand_in.launches()[-1].raw == stand_in.launches()[0].raw
    assert len(binder_calls) == 3 and len(compiles) == 1  # binder each time; compiled once
    assert json.loads(record.read_text()) == good  # rewritten by the binder's result


def test_keys_holding_object_addresses_are_not_indexed(stand_in, cache_root):
    import triton.language as tl

    src, out = torch.randn(64), torch.empty(64, dtype=torch.float16)
    fk(kernels.cast_kernel)[(1,)](
        out, src, 64, OUT_DTYPE=tl.float16, FN=kernels.times_two, BLOCK=64
    )
    assert len(entry_files(cache_root)) == 1 and index_files(cache_root) == []


def test_an_index_record_in_another_keys_place_is_refused(
    stand_in, cache_root, compiles, binder_calls
):
    """A copied record names a real entry, but another specialization's: it must not serve."""
    x = torch.randn(1025)
    k = fk(kernels.add_kernel)
    k[(1,)](x, x, x, 1024, BLOCK=1024)  # aligned out_ptr
    k[(1,)](x, x, x[1:], 1024, BLOCK=1024)  # unaligned out_ptr: another specialization
    # (Binaries that differ: at BLOCK=64 the two specializations compile to one cubin.)
    assert stand_in.launches()[0].image != stand_in.launches()[1].image
    aligned, unaligned = (r.read_text() for r in index_files(cache_root))
    by_content = {json.loads(t)["entry"]: t for t in (aligned, unaligned)}
    assert len(by_content) == 2
    for record in index_files(cache_root):  # swap the two records' contents
        other = [t for t in (aligned, unaligned) if t != record.read_text()][0]
        record.write_text(other)
    fresh = fk(kernels.add_kernel)
    fresh[(1,)](x, x, x[1:], 1024, BLOCK=1024)
    last, unaligned = stand_in.launches()[-1], stand_in.launches()[1]
    assert (last.image, last.raw) == (unaligned.image, unaligned.raw)
    assert len(binder_calls) == 3  # the swapped record was refused: the binder decided


@pytest.mark.stand_in
def test_processes_cold_starting_together_compile_each_specialization_once(tmp_path):
    """Four processes start at once on one empty cache and launch the same three
    specializations: with the per-entry lock, three Triton compiles in all (one process compiles
    each, the others wait and read its entry); every launch native."""
    spec = importlib.util.spec_from_file_location(
        "cache_contention", pathlib.Path(TESTS).parent / "benchmarks" / "cache_contention.py"
    )
    contention = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(contention)
    result = contention.one_round(4, lock=True, driver=os.environ["FASTKERNEL_CUDA_DRIVER"])
    assert result["compiles"] == contention.SPECIALIZATIONS and result["all_native"]


def test_the_toolchain_signature_stats_every_file_triton_key_reads():
    """The stat signature that stands in for hashing Triton's sources covers each module
    triton/runtime/cache.py ``triton_key()`` opens: every module ``pkgutil.walk_packages``
    finds under the compiler, backends and language packages, the frontend and libtriton."""
    import os
    import pkgutil

    import triton

    from fastkernel.cache import key as cache_key

    root = os.path.dirname(os.path.abspath(triton.__file__))
    read = {os.path.join(root, "runtime", "cache.py")}
    for sub in ("compiler", "backends", "language"):
        for module in pkgutil.walk_packages([os.path.join(root, sub)], f"triton.{sub}."):
            read.add(module.module_finder.find_spec(module.name).origin)
    sources = set(cache_key._triton_key_sources())
    assert len(read) > 10
    assert read <= sources, read - sources
    assert any(path.endswith(os.path.join("_C", "libtriton.so")) for path in sources)


def test_the_options_digest_is_the_backends_own_hash_with_libraries_memoized(tmp_path, monkeypatch):
    """The options part of the entry key equals CUDAOptions.hash() (every field, extern
    libraries by content) while hashing libdevice once per stat signature, not per process."""
    from fastkernel.cache import key as cache_key

    backend = abi.backend_for(abi.cuda_target(9, 0))
    hashed = []
    real = cache_key._file_content_digest
    monkeypatch.setattr(
        cache_key, "_file_content_digest", lambda path: hashed.append(path) or real(path)
    )
    monkeypatch.setattr(cache_key, "_digests", {})
    memo = str(tmp_path / "toolchain")
    for options in (
        backend.parse_options({}),
        backend.parse_options({"num_warps": 8, "num_stages": 2, "debug": True}),
    ):
        assert options.extern_libs  # libdevice
        assert cache_key.options_digest(options, memo) == options.hash()
    assert len(hashed) == 1  # one library, hashed once
    monkeypatch.setattr(cache_key, "_digests", {})  # a fresh process: the memo file serves
    cache_key.options_digest(backend.parse_options({}), memo)
    assert len(hashed) == 1
    a = cache_key.options_digest(backend.parse_options({"num_warps": 4}), memo)
    assert a != cache_key.options_digest(backend.parse_options({"num_warps": 8}), memo)


def test_counters_tell_what_the_misses_took_from_the_cache(stand_in, cache_root, compiles):
    """fastkernel.cache.counters(): a cold miss compiles and stores; a new wrapper's miss loads
    through the warm index; a damaged entry is removed and compiled again; an entry others can
    write is refused (counted once per path) and compiled again; hits count nothing."""
    x = torch.randn(64)
    before = cache.counters()

    def counted() -> dict:
        now = cache.counters()
        return {name: n - before[name] for name, n in now.items() if n != before[name]}

    cold = fk(kernels.add_kernel)
    cold[(1,)](x, x, x, 64, BLOCK=64)
    cold[(1,)](x, x, x, 64, BLOCK=64)
    assert counted() == {"compiled": 1, "stored": 1}
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert counted() == {"compiled": 1, "stored": 1, "loaded": 1, "warm": 1}
    (path,) = entry_files(cache_root)
    path.write_bytes(path.read_bytes()[:-100])
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert counted() == {"compiled": 2, "stored": 2, "loaded": 1, "warm": 1, "removed": 1}
    path.chmod(0o666)
    for _ in range(2):
        fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
        path.chmod(0o666)  # the compile rewrote it private: make it untrusted again
    assert counted() == {
        "compiled": 4,
        "stored": 4,
        "loaded": 1,
        "warm": 1,
        "removed": 1,
        "untrusted": 1,
    }
    assert compiles == ["add_kernel"] * 4


def test_counters_of_a_cold_then_a_warm_process(stand_in, cache_root):
    """Two fresh processes on one empty cache: the first compiles and stores, the second loads
    through the warm index and compiles nothing."""
    script = """
        import json, os, torch
        from fastkernel import fastkernel, _C, cache
        from stand_in_driver.recording import RecordingDriver
        import kernels

        RecordingDriver(os.environ["FASTKERNEL_CUDA_DRIVER"])
        _C._testing.set_host_testing(True, 0, 0x5EED5)
        x = torch.randn(64)
        add = fastkernel(kernels.add_kernel)
        for _ in range(3):
            add[(2,)](x, x, x, 64, BLOCK=64)
        print(json.dumps(cache.counters()))
    """
    counts = []
    for _ in range(2):
        result = run_python(script)
        assert result.returncode == 0, result.stderr
        counts.append(json.loads(result.stdout.strip().splitlines()[-1]))
    zero = dict.fromkeys(["loaded", "warm", "compiled", "stored", "removed", "untrusted"], 0)
    assert counts == [zero | {"compiled": 1, "stored": 1}, zero | {"loaded": 1, "warm": 1}]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_counts_though_the_parent_held_the_counters_lock():
    """A fork while another thread of the parent counts leaves the child its own lock."""
    from fastkernel.cache import settings

    with settings._counts_lock:  # as a thread of the parent counting at the fork holds it
        pid = os.fork()
        if pid == 0:  # the child: a deadlock ends it by the alarm's signal instead
            import signal

            signal.alarm(30)
            settings.count("loaded")
            os._exit(0 if settings.counters()["loaded"] >= 1 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
