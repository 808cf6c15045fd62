"""The disk cache as untrusted input, on CPU against the recording stand-in driver: what another
user could write, and what damage with a valid checksum looks like, never launches; the cache
is private to the user; ``cache import`` reads an import directory as hostile input. See the
README's threat model ("The kernel cache and its threat model")."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import stat

import kernels
import pytest
import torch
from test_cache import binder_calls, cache_root, compiles, entry_files, index_files, resign  # noqa: F401 - fixtures

from fastkernel import _C, cache
from fastkernel import _triton_abi as abi
from fastkernel import fastkernel as fk
from fastkernel.cache import files as _cache_files


def _one_entry(stand_in, root: pathlib.Path) -> pathlib.Path:
    x = torch.randn(64)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    (path,) = entry_files(root)
    stand_in.reset()
    return path


def _launch_fresh(n: int = 64):
    """A fresh kernel object's first call: a miss that reads the disk cache."""
    x = torch.randn(n)
    k = fk(kernels.add_kernel)
    k[(1,)](x, x, x, n, BLOCK=64)
    return k


# -- private to the user -------------------------------------------------------------------------


def test_the_cache_is_created_private_to_the_user(stand_in, cache_root):
    path = _one_entry(stand_in, cache_root)
    assert stat.S_IMODE(os.stat(cache_root).st_mode) == 0o700
    for directory in (
        cache_root / "entries",
        path.parent,
        cache_root / "index",
        cache_root / "toolchain",
    ):
        assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700, directory
    files = [path, *index_files(cache_root), *(cache_root / "toolchain").iterdir()]
    assert files and all(stat.S_IMODE(os.lstat(f).st_mode) == 0o600 for f in files)


def test_a_missing_cache_root_is_made_with_its_parents_and_other_roots_are_judged(tmp_path):
    """The root is stat'ed first and made only when missing: a missing one (parents too) is
    created private; a file, or a link to nowhere, is refused with the reason."""
    nested = tmp_path / "a" / "b" / "cache"
    assert _cache_files.usable_root(nested) is None
    assert stat.S_IMODE(os.stat(nested).st_mode) == 0o700
    assert _cache_files.usable_root(nested) is None  # existing: used as it is
    a_file = tmp_path / "file"
    a_file.write_bytes(b"")
    assert _cache_files.usable_root(a_file) == "it is not a directory"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    assert _cache_files.usable_root(dangling).startswith("it cannot be created or read")


@pytest.mark.parametrize(
    "mode,said", [(0o777, "writable by group and others"), (0o770, "writable by group")]
)
def test_a_cache_writable_by_others_is_not_used(stand_in, cache_root, compiles, caplog, mode, said):
    _one_entry(stand_in, cache_root)
    os.chmod(cache_root, mode)
    before = sorted(p.relative_to(cache_root) for p in cache_root.rglob("*"))
    with caplog.at_level(logging.WARNING, logger="fastkernel.cache"):
        for _ in range(2):
            _launch_fresh()
    assert len(stand_in.launches()) == 2
    assert len(compiles) == 3  # compiled each time: nothing read from it
    assert sorted(p.relative_to(cache_root) for p in cache_root.rglob("*")) == before  # nor written
    warnings = [
        r.getMessage() for r in caplog.records if "cannot use the kernel cache" in r.getMessage()
    ]
    assert len(warnings) == 1 and said in warnings[0] and "chmod 700" in warnings[0]


def test_a_cache_owned_by_another_user_is_not_used(
    stand_in, cache_root, compiles, monkeypatch, caplog
):
    _one_entry(stand_in, cache_root)
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 1)  # everything now belongs to "another"
    with caplog.at_level(logging.WARNING, logger="fastkernel.cache"):
        _launch_fresh()
    assert len(compiles) == 2 and len(stand_in.launches()) == 1
    assert f"owned by uid {real}, not by this user" in caplog.text


def test_an_entry_writable_by_others_is_not_loaded(stand_in, cache_root, compiles, caplog):
    path = _one_entry(stand_in, cache_root)
    os.chmod(path, 0o666)
    with caplog.at_level(logging.WARNING, logger="fastkernel.cache"):
        _launch_fresh()
    assert len(compiles) == 2  # compiled again, and written back private
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert "writable by group and others" in caplog.text


def test_links_in_the_cache_are_not_followed(stand_in, cache_root, compiles, tmp_path):
    path = _one_entry(stand_in, cache_root)
    # The entry as a link to a copy elsewhere: not read.
    elsewhere = tmp_path / "elsewhere.fkc"
    elsewhere.write_bytes(path.read_bytes())
    path.unlink()
    os.symlink(elsewhere, path)
    _launch_fresh()
    assert len(compiles) == 2
    assert not path.is_symlink()  # the compile replaced the link with a private file
    # Its directory as a link to a directory elsewhere: neither read nor written through.
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    shard = path.parent
    for f in shard.iterdir():
        f.rename(outside / f.name)
    shard.rmdir()
    os.symlink(outside, shard)
    before = sorted(p.name for p in outside.iterdir())
    _launch_fresh()
    assert len(compiles) == 3
    assert sorted(p.name for p in outside.iterdir()) == before


# -- damage with a valid checksum ------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit",
    [
        # A namedtuple field that is a keyword: CachedKernel.from_entry raised ValueError every call.
        lambda h: h["triton_metadata"].__setitem__("class", 1),
        lambda h: h["launch"].__setitem__("block_x", 4096),
        lambda h: h["launch"].__setitem__("num_ctas", 0),
        lambda h: h["launch"].__setitem__("global_scratch_align", 3),
        lambda h: h["launch"].__setitem__("shared_mem", 2**40),
        lambda h: h["launch"].__setitem__("name", "add kernel\n"),
        lambda h: h["launch"].__setitem__(
            "tensordesc_meta",
            [
                {
                    "swizzle": 9,
                    "elem_size": 4,
                    "elem_type": 7,
                    "block_size": [16],
                    "fp4_padded": False,
                }
            ],
        ),
        lambda h: h["target"].__setitem__("arch", -90),
    ],
    ids=["keyword", "block_x", "num_ctas", "align", "shared_mem", "name", "tensordesc", "arch"],
)
def test_a_resigned_entry_with_impossible_content_is_removed_and_recompiled(
    stand_in, cache_root, compiles, caplog, edit
):
    path = _one_entry(stand_in, cache_root)
    good = path.read_bytes()
    path.write_bytes(resign(good, edit))
    with caplog.at_level(logging.WARNING, logger="fastkernel.cache"):
        k = _launch_fresh()
        k[(1,)](torch.randn(64), torch.randn(64), torch.randn(64), 64, BLOCK=64)
    assert len(compiles) == 2
    assert k.stats()["hits"] == 1 and k.stats()["fallbacks"] == 0
    assert path.read_bytes() != resign(good, edit)  # replaced by the recompiled entry
    assert caplog.text.count(str(path)) == 1


def test_keys_that_are_not_exactly_a_sha256_hex_digest_are_refused(stand_in, cache_root):
    """An entry's key and an index record's entry key must be 64 lowercase hex digits, no more,
    no fewer (checked before any path is built from them)."""
    from fastkernel.cache import index as cache_index

    good = _one_entry(stand_in, cache_root).read_bytes()
    key = cache.decode_entry(good).key
    (record_path,) = index_files(cache_root)
    record = json.loads(record_path.read_text())
    target = abi.cuda_target(*_C.device_capability(0))
    decoded, _ = cache_index.decode_index_record(
        record_path.read_bytes(), record_path.stem, record["native_key"], target
    )
    assert decoded["entry"] == key  # the untouched record decodes
    for bad in (key + "0", key[:-1], key + "\n", key.upper(), key[:-1] + "g", ""):
        with pytest.raises(cache.CorruptEntry, match="not a sha256"):
            cache.decode_entry(resign(good, lambda h, bad=bad: h.__setitem__("key", bad)))
        lying = cache_index.encode_index_record(dict(record, entry=bad))
        with pytest.raises(ValueError, match="names no entry key"):
            cache_index.decode_index_record(lying, record_path.stem, record["native_key"], target)


def _encode_raw(header: bytes, cubin: bytes) -> bytes:
    """An entry file around arbitrary header bytes, with a valid checksum (the layout of
    fastkernel/cache.py: magic, format, lengths, sha256 of the rest, header, cubin)."""
    import hashlib
    import struct

    fixed = struct.pack("<8sIIQ", b"FKCACHE\0", cache.FORMAT_VERSION, len(header), len(cubin))
    return fixed + hashlib.sha256(fixed + header + cubin).digest() + header + cubin


def test_a_header_nested_past_the_recursion_limit_is_removed(stand_in, cache_root, compiles):
    path = _one_entry(stand_in, cache_root)
    cubin = cache.decode_entry(path.read_bytes()).cubin
    # 100,000 levels: past the recursion limit of every supported Python (3.13's JSON decoder
    # takes 5,000), and within the header size limit.
    depth = 100_000
    path.write_bytes(_encode_raw(b'{"deep":' + b"[" * depth + b"]" * depth + b"}", cubin))
    with pytest.raises(cache.CorruptEntry, match="unreadable header"):
        cache.read_entry(path)
    k = _launch_fresh()
    assert len(compiles) == 2 and k.stats()["fallbacks"] == 0


def test_an_entry_that_verifies_but_cannot_be_registered_is_discarded(
    stand_in, cache_root, compiles, caplog
):
    """The symbol name is a valid name, but not in the cubin: the driver refuses it. Before,
    every call fell back to Triton and the entry stayed; now it is removed and recompiled."""
    path = _one_entry(stand_in, cache_root)
    path.write_bytes(
        resign(path.read_bytes(), lambda h: h["launch"].__setitem__("name", "no_such_kernel"))
    )
    with caplog.at_level(logging.WARNING, logger="fastkernel.cache"):
        k = _launch_fresh()
        k[(1,)](torch.randn(64), torch.randn(64), torch.randn(64), 64, BLOCK=64)
    assert len(compiles) == 2
    assert k.stats() | {"fallback_reasons": None, "table_bytes": None} == {
        "hits": 1,
        "misses": 1,
        "fallbacks": 0,
        "specializations": 1,
        "evictions": 0,
        "fallback_reasons": None,
        "table_bytes": None,
    }
    assert "no_such_kernel" not in path.read_bytes().decode("latin-1")
    assert caplog.text.count("registering the cubin failed") == 1


_GOOD_FACTS = {
    "device": 0,
    "block_x": 128,
    "num_ctas": 1,
    "num_scratch_params": 2,
    "plan": [(0, "*fp32"), (1, "*fp32"), (2, "*fp32"), (3, "i32")],
    "tensor_maps": [],
}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"name": ""}, "kernel name must be non-empty and hold no NUL byte"),
        ({"name": "add_kernel\x00tail"}, "kernel name must be non-empty and hold no NUL byte"),
        ({"device": -1}, "device must be >= 0"),
        ({"block_x": 0}, "block size must be in"),
        ({"block_x": 1025}, "block size must be in"),
        ({"num_ctas": 0}, "num_ctas >= 1"),
        ({"num_scratch_params": 3}, "num_scratch_params must be 0, 1 or 2"),
        ({"plan": [(0, "*fp32"), (1, "fp128")]}, "unsupported parameter type 'fp128'"),
        ({"plan": [(0, "*fp32"), (128, "i32")]}, "parameter plan index out of range"),
        ({"plan": [(-1, "i32")]}, "parameter plan index out of range"),
        ({"plan": [(0, "nvTmaDesc")]}, "more tensor-map parameters than tensor map descriptions"),
        (
            {"plan": [(0, "*fp32")], "tensor_maps": [(7, 4, 0, [64], False, False)]},
            "tensor map descriptions do not match",
        ),
        (
            {"plan": [(122, "nvTmaDesc")], "tensor_maps": [(7, 4, 0, [64, 64], False, False)]},
            "descriptor leaves run past the 128 bound arguments",
        ),
        (
            {"plan": [(0, "nvTmaDesc")], "tensor_maps": [(7, 4, 0, [8] * 6, False, False)]},
            "a tensor map must have 1 to 5 block dimensions",
        ),
        (
            {"plan": [(0, "nvTmaDesc")], "tensor_maps": [(16, 4, 0, [64], False, False)]},
            "malformed tensor map description",
        ),
        (
            {"plan": [(0, "nvTmaDesc")], "tensor_maps": [(7, 9, 0, [64], False, False)]},
            "malformed tensor map description",
        ),
    ],
)
def test_the_native_registration_checks_refuse_launch_facts_a_launch_could_not_trust(
    stand_in, cache_root, change, message
):
    """Behind the cache header's schema, the native registration (``make_launch_record``) checks
    every launch fact a record's launches read: indices against the bound-argument array (a
    descriptor's leaves included), block and cluster sizes, parameter types, tensor-map
    descriptions. Each refusal is a ValueError naming the fact; nothing is registered. The same
    facts with the change left out register."""
    x = torch.randn(64)
    k = fk(kernels.add_kernel)
    k[(1,)](x, x, x, 64, BLOCK=64)
    (path,) = entry_files(cache_root)
    entry = cache.read_entry(path)
    key = b"\x07" * 8  # a key no call builds: registering it changes no call

    def register(facts):
        launch = _C.LaunchFacts(
            kernel_name=facts.get("name", entry.header["launch"]["name"]),
            device=facts["device"],
            block_x=facts["block_x"],
            num_ctas=facts["num_ctas"],
            plan=facts["plan"],
            num_scratch_params=facts["num_scratch_params"],
            tensor_maps=[_C.TensorMapFacts(*t) for t in facts["tensor_maps"]],
        )
        k._insert(key, _C.LaunchRecord(launch, entry.cubin, None))

    before = k.stats()["specializations"]
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        register(_GOOD_FACTS | change)
    assert k.stats()["specializations"] == before
    register(_GOOD_FACTS)
    assert k.stats()["specializations"] == before + 1


# -- the warm index --------------------------------------------------------------------------------


def test_an_index_record_resigned_onto_another_call_does_not_serve_it(
    stand_in, cache_root, compiles, binder_calls, caplog
):
    """The aligned call's record written in the unaligned call's place, with the place's
    native key and a valid checksum (a deliberate forgery): the spec does not fit the call's
    pointer alignment, so the binder decides and the unaligned binary launches."""
    x = torch.randn(1025)
    k = fk(kernels.add_kernel)
    k[(1,)](x, x, x, 1024, BLOCK=1024)  # aligned out_ptr
    k[(1,)](x, x, x[1:], 1024, BLOCK=1024)  # unaligned out_ptr
    records = {json.loads(r.read_text())["entry"]: r for r in index_files(cache_root)}
    assert len(records) == 2
    aligned_path, unaligned_path = (
        records[key]
        for key in (
            json.loads(index_files(cache_root)[0].read_text())["entry"],
            json.loads(index_files(cache_root)[1].read_text())["entry"],
        )
    )
    launches = stand_in.launches()
    # (Binaries that differ: at BLOCK=64 the two specializations compile to one cubin.)
    assert launches[0].image != launches[1].image
    by_path = {}
    for path in (aligned_path, unaligned_path):
        by_path[path] = json.loads(path.read_text())
    a, b = by_path[aligned_path], by_path[unaligned_path]
    for target, source in ((aligned_path, b), (unaligned_path, a)):
        forged = dict(source, index=target.stem, native_key=by_path[target]["native_key"])
        target.write_bytes(cache.index.encode_index_record(forged))
    fresh = fk(kernels.add_kernel)
    with caplog.at_level(logging.WARNING, logger="fastkernel"):
        fresh[(1,)](x, x, x[1:], 1024, BLOCK=1024)
        fresh[(1,)](x, x, x, 1024, BLOCK=1024)
    for ours, expected in zip(stand_in.launches()[-2:], (launches[1], launches[0])):
        assert (ours.image, ours.raw) == (expected.image, expected.raw)
    assert len(binder_calls) == 4 and len(compiles) == 2
    assert "does not fit the call" in caplog.text


def test_an_index_record_without_a_valid_checksum_is_not_used(
    stand_in, cache_root, compiles, binder_calls
):
    x = torch.randn(64)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    (record,) = index_files(cache_root)
    doc = json.loads(record.read_text())
    doc["spec"]["options"] = doc["spec"]["options"][:-1]  # any change, checksum left alone
    record.write_text(json.dumps(doc))
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    assert len(binder_calls) == 2 and len(compiles) == 1


def test_an_index_record_is_checked_over_its_stored_bytes(
    stand_in, cache_root, compiles, binder_calls
):
    """A record is stored as canonical JSON led by its checksum, which covers the bytes after
    it: the same content in another layout, or one byte changed, is refused (and rewritten)."""
    x = torch.randn(64)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    (record,) = index_files(cache_root)
    stored = record.read_bytes()
    doc = json.loads(stored)
    assert stored.startswith(b'{"checksum":"') and cache.index.encode_index_record(doc) == stored
    target = abi.cuda_target(*_C.device_capability(0))
    assert cache.index.decode_index_record(stored, record.stem, doc["native_key"], target)[0] == doc
    at = stored.index(b'"native_key":"') + len(b'"native_key":"')
    flipped = stored[:at] + (b"1" if stored[at : at + 1] == b"0" else b"0") + stored[at + 1 :]
    for data in (json.dumps(doc, sort_keys=True).encode(), flipped, stored[:-1], b""):
        with pytest.raises(ValueError, match="checksum does not hold"):
            cache.index.decode_index_record(data, record.stem, doc["native_key"], target)
        record.write_bytes(data)
        fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
        assert record.read_bytes() == stored  # the binder's result, written again
    assert len(binder_calls) == 5 and len(compiles) == 1


# -- cache import reads hostile input ---------------------------------------------------------------


def test_cache_import_follows_no_links_and_writes_only_into_the_cache(
    stand_in, cache_root, tmp_path, caplog
):
    _one_entry(stand_in, cache_root)
    export = tmp_path / "export"
    assert cache.export_entries(export, cache_root) == 1
    (good,) = export.iterdir()
    # A link to an entry elsewhere, a link to a directory of entries, and an entry too deep.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ("b" * 64 + ".fkc")).write_bytes(good.read_bytes())
    os.symlink(elsewhere / ("b" * 64 + ".fkc"), export / ("c" * 64 + ".fkc"))
    os.symlink(elsewhere, export / "linked-dir")
    deep = export.joinpath(*["d"] * 8)
    deep.mkdir(parents=True)
    (deep / good.name).write_bytes(good.read_bytes())
    seen = []
    real = cache.read_entry

    def reading(path, trusted=True):
        seen.append(pathlib.Path(path))
        return real(path, trusted)

    target = tmp_path / "target-cache"
    cache.clear(cache_root)
    import unittest.mock

    with unittest.mock.patch.object(cache.store, "read_entry", reading):
        imported, skipped = cache.import_entries(export, target)
    assert imported == 1 and skipped == 0
    assert seen == [good]
    assert [p.name for p in entry_files(target)] == [good.name]
    assert stat.S_IMODE(os.lstat(entry_files(target)[0]).st_mode) == 0o600


def test_cache_import_refuses_to_write_through_a_linked_shard(stand_in, cache_root, tmp_path):
    _one_entry(stand_in, cache_root)
    export = tmp_path / "export"
    cache.export_entries(export, cache_root)
    (good,) = export.iterdir()
    target = tmp_path / "target-cache"
    outside = tmp_path / "outside"
    outside.mkdir()
    (target / "entries").mkdir(parents=True)
    os.chmod(target, 0o700)
    os.symlink(outside, target / "entries" / good.name[:2])
    with pytest.raises(_cache_files.UntrustedPath):
        cache.import_entries(export, target)
    assert list(outside.iterdir()) == []


def test_cache_import_caps_sizes_and_refuses_fifos_without_reading_them(
    stand_in, cache_root, tmp_path, caplog
):
    export = tmp_path / "export"
    export.mkdir()
    huge = export / ("e" * 64 + ".fkc")
    with open(huge, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB, sparse
    os.mkfifo(export / ("f" * 64 + ".fkc"))  # os.walk lists it; it is not a regular file
    with caplog.at_level(logging.WARNING, logger="fastkernel.cache"):
        imported, skipped = cache.import_entries(export, tmp_path / "target-cache")
    assert (imported, skipped) == (0, 1)
    assert "over the limit" in caplog.text
