"""Bounded memory under churn: many native hits with changing pointers, over more
specializations than a kernel's table holds, with resident memory sampled as it goes.

One kernel (``add_kernel``) is called in 32 specializations (8 BLOCK values, ``n`` divisible by
16 or not, the output aligned or not) under ``FASTKERNEL_MAX_SPECIALIZATIONS=--capacity``, so
the table evicts
(unloading modules) and re-registers from the disk cache as the calls cycle; every batch of
calls passes tensors at another offset of a large buffer (new pointers, the same alignment
class, so hits). A second kernel is refused registration on every new key (its cubin is made
unloadable; ``no_spec_kernel``), so its refused-key set is exercised past its bound too. Calls are made from a
native loop (``_C.bench_call_loop``) in batches; launches go to the recording stand-in driver.

Reports resident memory after the warm-up and at the end (less what the stand-in driver keeps
for unloaded modules, by design), what one warm miss leaves on malloc's heap, the table's size,
evictions and the refused-key set's size; exits 1 when resident memory grew by more than
``--max-growth-mib``, a warm miss left more than ``--max-bytes-per-miss``, or a bound was
exceeded.

    python scripts/reliability/churn_memory.py [--hits 10000000] [--capacity 12]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import pathlib
import random
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_mib() -> float:
    """Bytes in use in malloc's heap (glibc mallinfo2: uordblks plus mmapped blocks), MiB."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hits", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=2000, help="calls per native loop")
    parser.add_argument(
        "--capacity",
        type=int,
        default=12,
        help="FASTKERNEL_MAX_SPECIALIZATIONS (there are 32 specializations)",
    )
    parser.add_argument(
        "--max-growth-mib",
        type=float,
        default=16.0,
        help="resident memory growth allowed (allocator fragmentation included)",
    )
    parser.add_argument(
        "--max-bytes-per-miss",
        type=float,
        default=200.0,
        help="malloc heap one warm miss may leave, less the stand-in's records",
    )
    opts = parser.parse_args(argv)
    os.environ["FASTKERNEL_MAX_SPECIALIZATIONS"] = str(opts.capacity)
    os.environ.setdefault("FASTKERNEL_CACHE_DIR", tempfile.mkdtemp(prefix="fastkernel-churn-"))
    sys.path.insert(0, str(TESTS))
    from stand_in_driver.recording import RecordingDriver, build_recording_driver

    path = build_recording_driver()
    os.environ.setdefault("FASTKERNEL_CUDA_DRIVER", str(path))
    import kernels
    import torch
    from triton_reference import TritonReference

    from fastkernel import _C, fastkernel
    from fastkernel import _triton_abi as abi

    driver = RecordingDriver(path)
    _C._testing.set_host_testing(True, 0, 0x5EED5)
    # The refused kernel's calls go to Triton's own launcher, run on the stand-in too.
    reference = TritonReference(driver, 0x5EED5)
    reference.__enter__()
    add = fastkernel(kernels.add_kernel)
    refused = fastkernel(kernels.no_spec_kernel)
    real_metadata = abi.launch_metadata

    def unloadable(compiled):  # the refused kernel's cubins: an ELF header with nothing in it
        meta = real_metadata(compiled)
        if compiled.src.fn is refused.jit_function:
            meta.cubin = b"\x7fELF" + b"\0" * 60
        return meta

    abi.launch_metadata = unloadable
    buffer = torch.randn(1 << 20)
    # Distinct specializations: BLOCK (a power of two) x n divisible by 16 or not x the output
    # pointer 16-byte aligned or not.
    specs = [
        (block, n, shift)
        for block in (16, 32, 64, 128, 256, 512, 1024, 2048)
        for n in (4096, 4095)
        for shift in (0, 1)
    ]
    rng = random.Random(0)

    def batch(kernel, spec, calls: int) -> None:
        block, n, shift = spec
        offset = 4 * rng.randrange(0, (buffer.numel() - 8192) // 4)  # 16-byte aligned
        x = buffer[offset : offset + 4096]
        out = buffer[offset + shift : offset + shift + 4096]
        args = (x, x, out, n, block) if kernel is add else (x, out, n, block)
        _C.bench_call_loop(kernel, (1,), args, calls)
        driver.reset()

    # Warm-up: every specialization registered (compiled into the disk cache) and evicted a few
    # times over, so that the process's own caches have filled; the refused kernel's first keys
    # refused.
    for _ in range(8):
        for spec in specs:
            batch(add, spec, 1)
    for spec in specs:
        batch(refused, spec, 1)
    gc.collect()
    start_rss, start = rss_mib() - driver.retained_bytes() / 2**20, time.perf_counter()
    samples = [start_rss]
    done = 0
    batches = 0
    while done < opts.hits:
        batch(add, rng.choice(specs), opts.batch)
        done += opts.batch
        batches += 1
        if batches % 50 == 0:  # churn the refused set with new keys too
            batch(refused, rng.choice(specs), 1)
        if batches % 500 == 0:
            samples.append(rss_mib() - driver.retained_bytes() / 2**20)
    gc.collect()
    end_rss = rss_mib() - driver.retained_bytes() / 2**20
    retained = driver.retained_bytes() / 2**20
    growth = end_rss - start_rss
    stats = add.stats()
    # What one miss leaves behind once the process's caches are warm: rounds of misses that
    # each evict another specialization (one call per batch), measured on malloc's heap less the
    # stand-in's own records; the last round is reported.
    per_miss = []
    for _ in range(3):
        gc.collect()
        heap0, retained0, misses0 = heap_mib(), driver.retained_bytes(), add.stats()["misses"]
        for i in range(600):
            batch(add, specs[i % len(specs)], 1)
        gc.collect()
        misses = add.stats()["misses"] - misses0
        per_miss.append(
            ((heap_mib() - heap0) * 2**20 - (driver.retained_bytes() - retained0)) / max(misses, 1)
        )
    seconds = time.perf_counter() - start
    print(
        f"{done} calls in batches of {opts.batch} over {len(specs)} specializations, "
        f"table capacity {opts.capacity} ({seconds:.0f} s):"
    )
    print(
        f"  resident memory after warm-up / at the end   {start_rss:.1f} / {end_rss:.1f} MiB "
        f"(growth {growth:+.1f} MiB; min/max sampled {min(samples):.1f}/{max(samples):.1f}), "
        f"not counting the {retained:.1f} MiB the stand-in driver keeps for unloaded modules"
    )
    print(
        f"  malloc heap per miss, warm, less the stand-in's records: "
        f"{', '.join(f'{b:.0f}' for b in per_miss)} bytes in three rounds of 600 (the "
        f"stand-in's four allocations per module carry about 100 bytes of malloc headers)"
    )
    print(
        f"  table: {stats['specializations']} registered, {stats['evictions']} evictions, "
        f"{stats['misses']} misses, {stats['hits']} hits, {stats['fallbacks']} fallbacks"
    )
    print(
        f"  refused kernel: {len(refused._refused_keys)} refused keys kept "
        f"(bound {opts.capacity}), {refused.stats()['fallbacks']} fallbacks"
    )
    reference.__exit__(None, None, None)
    _C._testing.set_host_testing(False, 0, 0)
    ok = (
        growth <= opts.max_growth_mib
        and per_miss[-1] <= opts.max_bytes_per_miss
        and stats["specializations"] <= opts.capacity
        and len(refused._refused_keys) <= opts.capacity
        and stats["fallbacks"] == 0
    )
    print("  bounded" if ok else "  NOT BOUNDED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
