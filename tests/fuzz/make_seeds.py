"""Seed corpora for the fuzz targets, made from real artifacts: bundles exported from kernels
launched on the recording stand-in driver, the cache entries and warm index records those
launches wrote. ``python tests/fuzz/make_seeds.py DIR`` writes DIR/manifest, DIR/cubins (the
cubins the manifest target serves), DIR/cubin, DIR/cache_entry and DIR/index_record."""

import os
import pathlib
import shutil
import struct
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main(out: pathlib.Path) -> int:
    from stand_in_driver.recording import build_recording_driver

    os.environ["FASTKERNEL_CUDA_DRIVER"] = str(build_recording_driver())
    cache_dir = pathlib.Path(tempfile.mkdtemp(prefix="fastkernel-seeds-"))
    os.environ["FASTKERNEL_CACHE_DIR"] = str(cache_dir)
    import kernels
    import torch

    import fastkernel
    from fastkernel import _C, cache
    from fastkernel import fastkernel as fk

    _C._testing.set_host_testing(True, 0, 0x5EED5)
    for sub in ("manifest", "cubins", "cubin", "cache_entry", "index_record"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    x, out16 = torch.randn(80), torch.empty(16)
    calls = {
        "add_kernel": lambda k: [
            k[(1,)](x, x, x, 64, BLOCK=64),
            k[(1,)](x, x, x[1:], 63, BLOCK=64),
        ],
        "scalars_kernel": lambda k: [
            k[(1,)](out16, 5, 2**40, 2**63 + 5, 1.25, 0.3, -2.7, 3.1, True, None, 1, BLOCK=16),
            k[(1,)](out16, 16, 2**40, 2**63 + 5, 1.25, 0.3, -2.7, 3.1, False, out16, 7, BLOCK=16),
        ],
        "no_spec_kernel": lambda k: [k[(1,)](x, x, 64, BLOCK=64)],
    }
    for name, call in calls.items():
        k = fk(getattr(kernels, name))
        call(k)
        bundle = pathlib.Path(tempfile.mkdtemp(prefix="fastkernel-seed-bundle-"))
        fastkernel.export(k, bundle)
        shutil.copyfile(bundle / "manifest.txt", out / "manifest" / f"{name}.txt")
        # The same manifest naming the harness's minimal ELF image ("a.cubin") for every
        # entry: SHA-256 over a 128-byte image instead of a real cubin keeps executions fast.
        lines = [
            " ".join(line.split(" ")[:2] + ["a.cubin"] + line.split(" ")[3:])
            if line.startswith("entry ")
            else line
            for line in (bundle / "manifest.txt").read_text().splitlines()
        ]
        (out / "manifest" / f"{name}-minimal.txt").write_text("\n".join(lines) + "\n")
        for cubin in bundle.glob("*.cubin"):
            shutil.copyfile(cubin, out / "cubins" / cubin.name)
            shutil.copyfile(cubin, out / "cubin" / cubin.name)
        shutil.rmtree(bundle)
    for i, path in enumerate(sorted((cache_dir / "entries").rglob("*.fkc"))):
        entry = cache.read_entry(path)
        header = cache.entry.canonical(dict(entry.header))
        (out / "cache_entry" / f"entry-{i}").write_bytes(
            struct.pack("<I", len(header)) + header + entry.cubin
        )
    for i, path in enumerate(sorted((cache_dir / "index").rglob("*.json"))):
        shutil.copyfile(path, out / "index_record" / f"record-{i}.json")
    _C._testing.set_host_testing(False, 0, 0)
    shutil.rmtree(cache_dir)
    print(
        f"seeds in {out}: "
        + ", ".join(f"{d.name} {len(list(d.iterdir()))}" for d in sorted(out.iterdir()))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
