"""A kernel bundle is untrusted input: ``fastkernel::Bundle::load`` (the C++ loader C++ callers
use, reached here through ``_C._testing.load_bundle``) refuses every damaged or hostile manifest
and cubin with a clear error, before anything reaches the driver. Runs against the recording
stand-in driver (CPU)."""

from __future__ import annotations

import os
import pathlib
import struct
import subprocess
import sys

import kernels
import pytest
import torch
from conftest import DISTINCT_LAUNCH_FACTS

import fastkernel
from fastkernel import _C
from fastkernel import fastkernel as fk
from fastkernel.bundle import entry_digest


@pytest.fixture
def bundle(stand_in, tmp_path) -> pathlib.Path:
    """An exported add_kernel bundle with two entries (aligned and unaligned output)."""
    k = fk(kernels.add_kernel)
    x, y, out = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    k[(4,)](x, y, out, 4096, BLOCK=1024)
    k[(4,)](x, y, out[1:], 4095, BLOCK=1024)
    path = tmp_path / "bundle"
    fastkernel.export(k, path)
    return path


def manifest_lines(path: pathlib.Path) -> list:
    return (path / "manifest.txt").read_text().splitlines()


def rewrite(path: pathlib.Path, lines: list, redigest: bool = True) -> None:
    """Write ``lines`` as the manifest. With ``redigest``, each entry's digest line is
    recomputed, as a writer that made the change on purpose would, so that the loader's other
    checks are the ones tested."""
    if redigest:
        lines = list(lines)
        start = None
        for i, line in enumerate(lines):
            tag = line.split(" ", 1)[0]
            if tag == "entry":
                start = i
            elif tag == "digest" and start is not None:
                cubin = (path / lines[start].split(" ")[2]).read_bytes()
                lines[i] = "digest " + entry_digest(lines[start:i], cubin)
                start = None
    (path / "manifest.txt").write_text("\n".join(lines) + "\n")


def first(lines: list, tag: str) -> int:
    return next(i for i, line in enumerate(lines) if line.split(" ", 1)[0] == tag)


def entry_fields(lines: list) -> list:
    return lines[first(lines, "entry")].split(" ")


def test_an_exported_bundle_loads_with_its_entries(bundle):
    entries = _C._testing.load_bundle(str(bundle))
    assert len(entries) == 2
    assert all(e.startswith("add_kernel[*fp32") for e in entries)


def test_the_loader_reads_each_launch_fact_the_writer_wrote(stand_in, tmp_path):
    """The writer orders an entry line's facts by _C.BUNDLE_ENTRY_FACTS and the C++ parser reads
    them in its own order: with every fact given a distinct value, each parsed fact is the one
    the kernel registered."""
    import dataclasses

    k = fk(kernels.add_kernel)
    x = torch.randn(64)
    k[(1,)](x, x, x, 64, BLOCK=64)
    (key,) = k._registrations
    target, spec, meta = k._registrations[key]
    distinct = dataclasses.replace(meta, **DISTINCT_LAUNCH_FACTS)
    k._registrations[key] = (target, spec, distinct)
    fastkernel.export(k, tmp_path / "bundle")
    (facts,) = _C._testing.bundle_facts(str(tmp_path / "bundle"))
    assert set(_C.BUNDLE_ENTRY_FACTS) < set(_C.LaunchFacts.FIELDS)
    for name in _C.BUNDLE_ENTRY_FACTS:
        expected = 2 if name == "num_scratch_params" else getattr(distinct, name)
        assert getattr(facts, name) == expected, name
    assert facts.kernel_name == meta.name


def _replace_entry_field(lines, index, value):
    fields = entry_fields(lines)
    fields[index] = value
    lines[first(lines, "entry")] = " ".join(fields)
    return lines


# Fields of an entry line: entry kernel cubin symbol arch block_x shared_mem num_ctas coop pdl
# num_scratch_params global_size global_align profile_size profile_align.
@pytest.mark.parametrize(
    "index,value,message",
    [
        (5, "2048", "block_x 2048 is outside"),
        (5, "0", "block_x 0 is outside"),
        (5, "-32", "block_x '-32' is not a non-negative integer"),
        (5, "128abc", "block_x '128abc' is not a non-negative integer"),
        (5, "0x80", "block_x '0x80' is not a non-negative integer"),
        (7, "17", "num_ctas 17 is outside"),
        (8, "2", "cooperative_grid 2 is outside"),
        (10, "3", "num_scratch_params 3 is outside"),
        (12, "3", "global_scratch_align 3 is not a power of two"),
        (11, "99999999999999999999999", "is not a non-negative integer"),
    ],
)
def test_out_of_range_launch_facts_are_refused(bundle, index, value, message):
    rewrite(bundle, _replace_entry_field(manifest_lines(bundle), index, value))
    with pytest.raises(RuntimeError, match=message):
        _C._testing.load_bundle(str(bundle))


@pytest.mark.parametrize(
    "mutate,message",
    [
        # A plan index past the arguments would make a launch read past the argument array.
        (lambda ls: ls.__setitem__(first(ls, "plan"), "plan 9 *fp32"), "parameter plan"),
        (lambda ls: ls.__setitem__(first(ls, "plan"), "plan 70000 *fp32"), "plan index 70000"),
        # Fewer parameters than the patterns make: the driver would read unset parameter slots.
        (lambda ls: ls.pop(first(ls, "plan")), "parameter plan"),
        (lambda ls: ls.insert(first(ls, "plan"), ls[first(ls, "plan")]), "parameter plan"),
        # A pointer argument packed as an int.
        (lambda ls: ls.__setitem__(first(ls, "plan"), "plan 0 i32"), "does not fit its pattern"),
        (lambda ls: ls.__setitem__(first(ls, "plan"), "plan 0 nvTmaDesc"), "malformed plan line"),
        (lambda ls: ls.__setitem__(first(ls, "arg"), "arg 9 0 0 1 1 0 *fp32"), "kind 9 is outside"),
        (
            lambda ls: ls.insert(first(ls, "plan"), ls[first(ls, "entry")]),
            "before the previous entry's 'end'",
        ),
        (lambda ls: ls.insert(1, "plan 0 *fp32"), "outside an entry"),
        (lambda ls: ls.insert(2, "launch now"), "unknown line 'launch'"),
        (lambda ls: ls.__setitem__(0, "fastkernel-bundle 3"), "not a version-2 kernel bundle"),
        (
            lambda ls: ls.__setitem__(0, "fastkernel-bundle 1"),
            "version-1 kernel bundle, whose entries carry no digest: export it again",
        ),
        (lambda ls: ls.pop(first(ls, "digest")), "has no digest line"),
        (lambda ls: ls.insert(first(ls, "digest") + 1, "plan 0 *fp32"), "after the entry's digest"),
    ],
)
def test_malformed_manifests_are_refused(bundle, mutate, message):
    lines = manifest_lines(bundle)
    mutate(lines)
    rewrite(bundle, lines)
    with pytest.raises(RuntimeError, match=message):
        _C._testing.load_bundle(str(bundle))


def test_an_entry_packing_more_parameters_than_a_launch_holds_is_refused(bundle):
    """255 pointer arguments, each passed: consistent and re-digested, but more than the 254
    parameters (besides the two scratch pointers) a launch packs. Refused at load, where every
    launch would otherwise raise."""
    lines = manifest_lines(bundle)
    start, end = first(lines, "arg"), first(lines, "digest")
    wide = [lines[start]] * 255 + [f"plan {i} *fp32" for i in range(255)]
    rewrite(bundle, lines[:start] + wide + lines[end:])
    with pytest.raises(RuntimeError, match="255 parameters; a launch packs at most 254"):
        _C._testing.load_bundle(str(bundle))


def test_a_truncated_manifest_is_refused(bundle):
    lines = manifest_lines(bundle)
    rewrite(bundle, lines[: first(lines, "digest") - 1])
    with pytest.raises(RuntimeError, match="truncated"):
        _C._testing.load_bundle(str(bundle))


def test_a_cubin_outside_the_bundle_directory_is_refused(bundle, tmp_path):
    lines = manifest_lines(bundle)
    cubin = entry_fields(lines)[2]
    (tmp_path / "outside.cubin").write_bytes((bundle / cubin).read_bytes())
    rewrite(bundle, _replace_entry_field(lines, 2, "../outside.cubin"), redigest=False)
    with pytest.raises(RuntimeError, match="not a plain file name in the bundle directory"):
        _C._testing.load_bundle(str(bundle))


def test_symbolic_links_are_not_followed(bundle, tmp_path):
    cubin = entry_fields(manifest_lines(bundle))[2]
    target = tmp_path / "elsewhere.cubin"
    (bundle / cubin).rename(target)
    os.symlink(target, bundle / cubin)
    with pytest.raises(RuntimeError, match="symbolic link"):
        _C._testing.load_bundle(str(bundle))
    manifest = bundle / "manifest.txt"
    manifest.rename(tmp_path / "manifest.txt")
    os.symlink(tmp_path / "manifest.txt", manifest)
    with pytest.raises(RuntimeError, match="symbolic link"):
        _C._testing.load_bundle(str(bundle))


def test_a_missing_cubin_is_refused_naming_it(bundle):
    """A cubin gone while its manifest stays the same is missing, not re-exported: Bundle::load
    reads the manifest again, finds it unchanged, and refuses the bundle."""
    cubin = entry_fields(manifest_lines(bundle))[2]
    (bundle / cubin).unlink()
    with pytest.raises(RuntimeError, match=f"cannot read '.*/{cubin}': No such file"):
        _C._testing.load_bundle(str(bundle))
    with pytest.raises(fastkernel.BundleError, match=f"{cubin}': No such file"):
        fastkernel.check_bundle(bundle)


def test_a_fifo_or_device_is_refused_without_reading_it(bundle):
    """A FIFO would block forever and /dev/zero never ends: neither is a regular file."""
    cubin = entry_fields(manifest_lines(bundle))[2]
    (bundle / cubin).unlink()
    os.mkfifo(bundle / cubin)
    with pytest.raises(RuntimeError, match="not a regular file"):
        _C._testing.load_bundle(str(bundle))
    rewrite(bundle, _replace_entry_field(manifest_lines(bundle), 2, "zero"), redigest=False)
    os.symlink("/dev/zero", bundle / "zero")  # refused as a link, and as a device if followed
    with pytest.raises(RuntimeError, match="symbolic link|not a regular file"):
        _C._testing.load_bundle(str(bundle))


def test_an_oversized_manifest_is_refused_before_it_is_read(bundle):
    manifest = bundle / "manifest.txt"
    with open(manifest, "r+b") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of size, nothing written
    with pytest.raises(RuntimeError, match="over the limit"):
        _C._testing.load_bundle(str(bundle))


def _section_table(image: bytes):
    (shoff,) = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", image, 0x3A)
    return shoff, shentsize, shnum


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda b: b[: len(b) // 2], "outside its"),
        (lambda b: b[:40], "not an ELF image"),
        (lambda b: b[:4] + b"\x01" + b[5:], "not a little-endian ELF64 image"),
        (lambda b: b[:0x12] + b"\x3e\x00" + b[0x14:], "EM_CUDA"),  # an x86-64 ELF
    ],
)
def test_damaged_cubins_are_refused_before_the_driver_sees_them(bundle, damage, message):
    cubin = bundle / entry_fields(manifest_lines(bundle))[2]
    cubin.write_bytes(damage(cubin.read_bytes()))
    with pytest.raises(RuntimeError, match=message):
        _C._testing.load_bundle(str(bundle))


def test_a_section_pointing_past_the_image_is_refused(bundle):
    cubin = bundle / entry_fields(manifest_lines(bundle))[2]
    image = bytearray(cubin.read_bytes())
    shoff, shentsize, shnum = _section_table(bytes(image))
    for i in range(1, shnum):
        sh = shoff + i * shentsize
        if struct.unpack_from("<I", image, sh + 4)[0] != 8:  # a section with contents
            struct.pack_into("<Q", image, sh + 0x20, len(image))  # its size: the whole image
            break
    cubin.write_bytes(bytes(image))
    with pytest.raises(RuntimeError, match=r"has section \d+ outside its"):
        _C._testing.load_bundle(str(bundle))


# -- the digest: what was exported is what loads ---------------------------------------------------


def test_the_core_sha256_is_fips_180_4s(bundle):
    import hashlib

    for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000, 1 << 20):
        data = bytes((i * 131 + n) & 0xFF for i in range(n))
        assert _C._testing.sha256(data) == hashlib.sha256(data).hexdigest(), n


@pytest.mark.parametrize(
    "mutate",
    [
        # A launch fact within its range: nothing but the digest can tell.
        lambda ls: _replace_entry_field(ls, 5, "64"),
        lambda ls: _replace_entry_field(ls, 6, "1024"),
        # A plan line duplicated and another dropped: the same count of parameters.
        lambda ls: ls.__setitem__(first(ls, "plan") + 1, ls[first(ls, "plan")]),
        # The constexprs the entry was compiled with.
        lambda ls: ls.__setitem__(first(ls, "constexprs"), "constexprs BLOCK=2048"),
    ],
    ids=["block_x", "shared_mem", "plan", "constexprs"],
)
def test_a_changed_entry_line_fails_its_digest(bundle, mutate):
    lines = manifest_lines(bundle)
    mutate(lines)
    rewrite(bundle, lines, redigest=False)
    with pytest.raises(RuntimeError, match="does not match its digest"):
        _C._testing.load_bundle(str(bundle))


def test_a_malformed_digest_line_is_refused(bundle):
    lines = manifest_lines(bundle)
    lines[first(lines, "digest")] = "digest 00"
    rewrite(bundle, lines, redigest=False)
    with pytest.raises(RuntimeError, match="malformed digest line"):
        _C._testing.load_bundle(str(bundle))


def test_a_flipped_cubin_byte_fails_the_digest(bundle):
    cubin = bundle / entry_fields(manifest_lines(bundle))[2]
    image = bytearray(cubin.read_bytes())
    image[len(image) // 2] ^= 0x01
    cubin.write_bytes(bytes(image))
    with pytest.raises(RuntimeError, match="does not match its digest"):
        _C._testing.load_bundle(str(bundle))


def test_swapped_cubins_fail_the_digest(bundle):
    """The two entries' cubins are both valid add_kernel images; swapped, the aligned entry
    would launch the unaligned binary (and the reverse) without the digest."""
    lines = manifest_lines(bundle)
    names = [line.split(" ")[2] for line in lines if line.startswith("entry ")]
    assert len(names) == 2
    a, b = (bundle / n for n in names)
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    with pytest.raises(RuntimeError, match="does not match its digest"):
        _C._testing.load_bundle(str(bundle))


def test_a_cluster_grid_past_the_driver_limit_is_refused_not_wrapped(bundle, stand_in):
    """With clusters the launch passes grid[0] * num_ctas to the driver: a product past
    2**31 - 1 is refused, where 32-bit arithmetic would wrap it to a few CTAs and launch."""
    lines = manifest_lines(bundle)
    rewrite(bundle, _replace_entry_field(lines, 7, "2"))  # num_ctas 2
    x = torch.randn(4096)
    launcher = _C.BenchBundle(
        str(bundle), "add_kernel", 0, [("pointer", x.data_ptr())] * 3 + [("int", 4096)]
    )
    stand_in.reset()
    launcher.run((2**30 - 1, 1, 1), 0x5EED5, 1)  # 2**31 - 2 CTAs: launched
    with pytest.raises(fastkernel.CudaError, match=r"grid\[0\] 2147483649 \* num_ctas 2 exceeds"):
        launcher.run((2**31 + 1, 1, 1), 0x5EED5, 1)
    ((launch),) = stand_in.launches()
    assert launch.grid == (2**31 - 2, 1, 1)


@pytest.mark.parametrize("param_count_api", [True, False], ids=["count", "probe"])
def test_a_record_packing_fewer_parameters_than_the_cubin_declares_is_not_launched(
    bundle, stand_in, param_count_api
):
    """Consistent lines, re-digested, that drop the kernel's last argument: the manifest holds
    together, but the cubin declares one parameter more than the record would pack, so the
    driver would read an unset parameter slot. Refused when the entry is loaded on a device,
    whether the driver answers cuFuncGetParamCount or only cuFuncGetParamInfo."""
    lines = manifest_lines(bundle)
    for tag in ("arg", "plan"):
        last = max(
            i for i, line in enumerate(lines[: first(lines, "end")]) if line.split(" ", 1)[0] == tag
        )
        lines.pop(last)
    rewrite(bundle, lines)
    x = torch.randn(4096)
    stand_in.reset()
    stand_in.set_param_count_api(param_count_api)
    launcher = _C.BenchBundle(str(bundle), "add_kernel", 0, [("pointer", x.data_ptr())] * 3)
    with pytest.raises(ValueError, match=r"declares more than the 5 parameters its launch record"):
        launcher.run((1, 1, 1), 0x5EED5, 1)
    assert stand_in.launches() == []


@pytest.mark.parametrize("param_count_api", [True, False], ids=["count", "probe"])
def test_a_sound_record_is_checked_without_a_failing_driver_call_where_the_driver_counts(
    bundle, stand_in, param_count_api
):
    """The parameter-count check of a sound entry asks cuFuncGetParamCount where the driver has
    it, so that a correct launch makes no failing driver call (compute-sanitizer reports each
    one as an API error); a driver without it is probed one index past the last parameter,
    which fails by design."""
    x = torch.randn(4096)
    stand_in.reset()
    stand_in.set_param_count_api(param_count_api)
    launcher = _C.BenchBundle(
        str(bundle), "add_kernel", 0, [("pointer", x.data_ptr())] * 3 + [("int", 4096)]
    )
    launcher.run((1, 1, 1), 0x5EED5, 1)
    assert len(stand_in.launches()) == 1
    assert stand_in.param_info_failures() == (0 if param_count_api else 1)


def test_check_bundle_runs_the_loaders_checks_from_python(bundle):
    """fastkernel.check_bundle is Bundle::load's verdict: the entries the C++ loader describes
    for a good bundle (str or path), its error as a BundleError (a ValueError) for a damaged
    one."""
    described = _C._testing.load_bundle(str(bundle))
    assert fastkernel.check_bundle(bundle) == described
    assert fastkernel.check_bundle(str(bundle)) == described
    assert len(described) == 2
    assert described[0].startswith("add_kernel[*fp32 %16, *fp32 %16, *fp32 %16, i32 %16]")
    cubin = bundle / entry_fields(manifest_lines(bundle))[2]
    image = bytearray(cubin.read_bytes())
    image[-1] ^= 1
    cubin.write_bytes(bytes(image))
    with pytest.raises(fastkernel.BundleError, match="does not match its digest") as refused:
        fastkernel.check_bundle(bundle)
    assert isinstance(refused.value, ValueError)
    with pytest.raises(RuntimeError) as loader:
        _C._testing.load_bundle(str(bundle))
    assert str(refused.value) == str(loader.value)


def test_check_bundle_checks_its_argument_kind_then_the_directory(tmp_path):
    with pytest.raises(TypeError, match="check_bundle\\(\\): argument 'path' must be a str or"):
        fastkernel.check_bundle(5)
    with pytest.raises(FileNotFoundError, match="is not a bundle directory"):
        fastkernel.check_bundle(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="is not a bundle directory"):
        fastkernel.check_bundle(tmp_path / "file")
    with pytest.raises(fastkernel.BundleError, match="manifest.txt"):
        fastkernel.check_bundle(tmp_path)  # a directory with no manifest


def test_the_bundle_command_needs_no_driver_and_fails_on_a_refused_bundle(bundle):
    """``python -m fastkernel bundle DIR`` in a process with no CUDA driver to open: the
    entries and exit 0 for the bundle, the loader's message and exit 1 once a plan line is
    changed."""
    env = {**os.environ, "FASTKERNEL_CUDA_DRIVER": str(bundle / "no-such-libcuda.so")}

    def command():
        return subprocess.run(
            [sys.executable, "-m", "fastkernel", "bundle", str(bundle)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    ok = command()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0] == f"{bundle}: 2 entries, each checked as Bundle::load checks it"
    assert [line.strip() for line in lines[1:]] == _C._testing.load_bundle(str(bundle))
    lines = manifest_lines(bundle)
    plan = first(lines, "plan")
    rewrite(bundle, lines[:plan] + lines[plan + 1 :])  # an entry that packs one parameter less
    refused = command()
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("fastkernel: bundle refused: "), refused.stderr


# Rewrites a bundle directory over and over, alternating between two exports of it, with the
# writer fastkernel.export uses (argv: the directory, a JSON list of the two versions, each a
# {"manifest": path, "cubins": {name: path}}, the number of rewrites).
_REEXPORT_WRITER = """
import json, pathlib, sys
from fastkernel import _bundle_files
root = pathlib.Path(sys.argv[1])
versions = [
    (pathlib.Path(v["manifest"]).read_bytes(),
     {n: pathlib.Path(p).read_bytes() for n, p in v["cubins"].items()})
    for v in json.loads(sys.argv[2])
]
print("ready", flush=True)
for i in range(int(sys.argv[3])):
    _bundle_files.write(root, *versions[i % 2])
"""


def test_a_bundle_loaded_while_it_is_re_exported_loads_one_whole_export(stand_in, tmp_path):
    """A program loading a bundle while another process re-exports it into the same directory
    loads the export it read the manifest of, or the next one: the export removes the cubins
    of the manifest it replaced, and Bundle::load then reads the new manifest and loads that.
    Never refused, never a mix."""
    import json

    import triton

    x = torch.randn(64)
    versions, described = [], []
    for block in (64, 128):
        k = fk(triton.jit(kernels.add_kernel.fn))
        k[(1,)](x, x, x, 64, BLOCK=block)
        out = tmp_path / f"export-{block}"
        cubins = {p.name: str(p) for p in fastkernel.export(k, out)}
        versions.append({"manifest": str(out / "manifest.txt"), "cubins": cubins})
        described.append(fastkernel.check_bundle(out))
    assert described[0] != described[1]
    target = tmp_path / "bundle"
    target.mkdir()
    from fastkernel import _bundle_files

    _bundle_files.write(
        target,
        pathlib.Path(versions[0]["manifest"]).read_bytes(),
        {n: pathlib.Path(p).read_bytes() for n, p in versions[0]["cubins"].items()},
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", _REEXPORT_WRITER, str(target), json.dumps(versions), "3000"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline().strip() == "ready"
    loads, refusals, others = 0, [], []
    while writer.poll() is None:
        try:
            entries = fastkernel.check_bundle(target)
        except fastkernel.BundleError as e:
            refusals.append(str(e))
            continue
        loads += 1
        if entries not in described:
            others.append(entries)
    assert writer.wait(timeout=300) == 0
    writer.stdout.close()
    assert loads > 100, "too few loads overlapped the rewrites to test anything"
    assert refusals == [], f"{len(refusals)} of {loads + len(refusals)}: {refusals[0]}"
    assert others == []
