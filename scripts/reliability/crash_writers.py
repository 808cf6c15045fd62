"""Crash consistency: writers of the kernel cache and of exported bundles, killed with SIGKILL at
random points, never leave a file that loads as something it is not.

The parent makes real artifacts on CPU (Triton compiles, launches go to the recording stand-in
driver): two versions of a cache entry for one key (the same cubin, different creation times),
two versions of a warm index record and of a tuning record, and two bundle exports of one kernel
with different specializations. A writer process then rewrites them in a loop, each time with a
version picked at random, through the code fastkernel writes each of them with: the cache's
files with ``fastkernel.cache.files.write_file`` (a private temporary file, fsync, rename), the
bundle with ``fastkernel._bundle_files.write``, which ``fastkernel.export`` calls (the cubins
under names made from their content, then the manifest, then the cubins no manifest names any
more removed). The parent kills it with SIGKILL after a random delay and, after every kill,
reads everything back:

- the cache entry must load and verify (``fastkernel.cache.read_entry``) and hold the key's
  cubin: a torn or foreign entry would be a failure;
- the index and tuning records must be whole JSON of one of their versions (the index record's
  checksum must hold);
- the bundle must load (``Bundle::load``) as exactly one of its versions: refused, or loaded
  as a mix of the two, would be a failure.

At the end, ``fastkernel.cache.prune`` must remove every temporary file the killed writers left
in the cache, and everything must still read back as above.

    python scripts/reliability/crash_writers.py [--kills 1000] [--seed 0] [--max-delay-ms 40]

Exit status 0 when nothing failed. Needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"

# The writer imports nothing but the standard library, fastkernel's file module and its bundle
# writer: `fastkernel` and `fastkernel.cache` are made bare packages (their __init__, which
# imports torch and the extension, is not run), so that it starts in tens of milliseconds.
WRITER = textwrap.dedent("""
    import json, pathlib, random, sys, types
    package = pathlib.Path(sys.argv[1])
    for name, path in (("fastkernel", package), ("fastkernel.cache", package / "cache")):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    from fastkernel import _bundle_files
    from fastkernel.cache import files
    plan = json.loads(pathlib.Path(sys.argv[2]).read_text())
    rng = random.Random(int(sys.argv[3]))
    read = lambda path: pathlib.Path(path).read_bytes()
    print("ready", flush=True)
    while True:
        for group in plan:
            version = rng.choice(group["versions"])
            if group["kind"] == "bundle":
                cubins = {name: read(path) for name, path in version["cubins"].items()}
                _bundle_files.write(pathlib.Path(group["root"]), read(version["manifest"]), cubins)
            else:
                files.write_file(pathlib.Path(group["target"]), read(version), 0o600)
""")


def make_artifacts(work: pathlib.Path) -> dict:
    """The files the writer rewrites, two versions each, and what a reader may find."""
    sys.path.insert(0, str(TESTS))
    from stand_in_driver.recording import build_recording_driver

    os.environ["FASTKERNEL_CUDA_DRIVER"] = str(build_recording_driver())
    os.environ["FASTKERNEL_CACHE_DIR"] = str(work / "source-cache")
    import kernels
    import torch
    import triton

    import fastkernel
    from fastkernel import _C, cache
    from fastkernel import fastkernel as fk

    _C._testing.set_host_testing(True, 0, 0x5EED5)
    versions = work / "versions"
    versions.mkdir()

    # Two versions of one entry (same key and cubin, different creation time).
    x = torch.randn(80)
    fk(kernels.add_kernel)[(1,)](x, x, x, 64, BLOCK=64)
    (entry_file,) = sorted((work / "source-cache" / "entries").rglob("*.fkc"))
    entry = cache.read_entry(entry_file)
    entry_versions = []
    for i, created in enumerate((1.0, 2.0)):
        header = dict(json.loads(json.dumps(dict(entry.header))), created=created)
        path = versions / f"entry-{i}"
        path.write_bytes(cache.encode_entry(header, entry.cubin))
        entry_versions.append(path)
    (index_file,) = sorted((work / "source-cache" / "index").rglob("*.json"))
    index_record = json.loads(index_file.read_text())
    index_versions = []
    for i in range(2):
        record = dict(index_record, spec=dict(index_record["spec"], note=i))
        path = versions / f"index-{i}"
        path.write_bytes(cache.index.encode_index_record(record))
        index_versions.append(path)
    tuning_versions = []
    for i in range(2):
        path = versions / f"tuning-{i}"
        path.write_text(
            json.dumps(
                {
                    "kernel": "add_kernel",
                    "key": "(64,)",
                    "config_index": i,
                    "config": {"kwargs": {"BLOCK": 64 * (i + 1)}},
                    "timings_ms": [["BLOCK: 64", 1.0 + i]],
                },
                indent=1,
            )
        )
        tuning_versions.append(path)

    # Two bundle exports of add_kernel, rewritten by fastkernel's own bundle writer.
    bundle_versions: list[dict] = []
    bundle_cubins: list[dict[str, bytes]] = []
    for i, block in enumerate((64, 128)):
        k = fk(triton.jit(kernels.add_kernel.fn))
        k[(1,)](x, x, x, 64, BLOCK=block)
        k[(1,)](x, x, x[1:], 64, BLOCK=block)
        out = versions / f"bundle-{i}"
        names = sorted(p.name for p in fastkernel.export(k, out))
        bundle_versions.append(
            {"manifest": str(out / "manifest.txt"), "cubins": {n: str(out / n) for n in names}}
        )
        bundle_cubins.append({n: (out / n).read_bytes() for n in names})
    assert not set(bundle_cubins[0]) & set(bundle_cubins[1]), "the exports' cubins differ"

    target = work / "target"
    cache_root = target / "cache"
    entry_target = cache_root / "entries" / entry.key[:2] / entry_file.name
    index_target = cache_root / "index" / index_file.parent.name / index_file.name
    tuning_target = cache_root / "autotune" / "ab" / ("ab" + "0" * 62 + ".json")
    bundle_target = target / "bundle"
    for d in (entry_target.parent, index_target.parent, tuning_target.parent):
        d.mkdir(parents=True, mode=0o700, exist_ok=True)
    bundle_target.mkdir(parents=True)
    shutil.copyfile(bundle_versions[0]["manifest"], bundle_target / "manifest.txt")
    for name, path in bundle_versions[0]["cubins"].items():  # a whole version before any kill
        shutil.copyfile(path, bundle_target / name)
    for version, target_path in (
        (entry_versions[0], entry_target),
        (index_versions[0], index_target),
        (tuning_versions[0], tuning_target),
    ):
        shutil.copyfile(version, target_path)
    plan = [
        {"kind": "file", "target": str(entry_target), "versions": [str(v) for v in entry_versions]},
        {"kind": "file", "target": str(index_target), "versions": [str(v) for v in index_versions]},
        {
            "kind": "file",
            "target": str(tuning_target),
            "versions": [str(v) for v in tuning_versions],
        },
        {"kind": "bundle", "root": str(bundle_target), "versions": bundle_versions},
    ]
    (work / "plan.json").write_text(json.dumps(plan))
    return {
        "entry": entry_target,
        "entry_key": entry.key,
        "cubin": entry.cubin,
        "index": index_target,
        "index_texts": {p.read_text() for p in index_versions},
        "tuning": tuning_target,
        "tuning_texts": {p.read_text() for p in tuning_versions},
        "bundle": bundle_target,
        "bundle_cubins": bundle_cubins,
    }


def check(artifacts: dict, outcomes: dict[str, int]) -> list[str]:
    """Read everything back after a kill; returns the failures (empty when all is well)."""
    from fastkernel import _C, _bundle_files, cache

    failures = []
    try:
        entry = cache.read_entry(artifacts["entry"])
        if entry.key != artifacts["entry_key"] or entry.cubin != artifacts["cubin"]:
            failures.append("the entry holds another key's binary")
    except Exception as exc:  # noqa: BLE001 - any failure to load counts
        failures.append(f"the entry does not load: {exc!r}")
    for name in ("index", "tuning"):
        text = artifacts[name].read_text()
        if text not in artifacts[f"{name}_texts"]:
            failures.append(f"the {name} record is neither version")
    try:
        data = artifacts["index"].read_bytes()
        # Stored canonically with its checksum: encoding the decoded record gives the same bytes.
        if cache.index.encode_index_record(json.loads(data)) != data:
            failures.append("the index record's checksum does not hold")
    except ValueError as exc:
        failures.append(f"the index record is not JSON: {exc}")
    try:
        _C._testing.load_bundle(str(artifacts["bundle"]))
    except RuntimeError as exc:
        failures.append(f"the bundle was refused: {exc}")
    else:
        named = _bundle_files.named_cubins(artifacts["bundle"] / _bundle_files.MANIFEST)
        on_disk = {n: (artifacts["bundle"] / n).read_bytes() for n in named}
        if on_disk not in artifacts["bundle_cubins"]:
            failures.append("the bundle loaded with cubins of two versions")
        outcomes["bundle loaded whole"] += 1
    outcomes["entry loaded intact"] += not any("entry" in f for f in failures)
    return failures


def _state(artifacts: dict) -> tuple:
    """What the files hold now (raw bytes), to tell that the writers wrote."""
    return tuple(
        p.read_bytes()
        for p in (
            artifacts["entry"],
            artifacts["index"],
            artifacts["tuning"],
            artifacts["bundle"] / "manifest.txt",
        )
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-delay-ms", type=float, default=40.0)
    opts = parser.parse_args(argv)
    rng = random.Random(opts.seed)
    work = pathlib.Path(tempfile.mkdtemp(prefix="fastkernel-crash-"))
    try:
        artifacts = make_artifacts(work)
        import fastkernel

        outcomes = {
            "entry loaded intact": 0,
            "bundle loaded whole": 0,
        }
        failures: list[str] = []
        changed, last = 0, _state(artifacts)
        start = time.perf_counter()
        for kill in range(opts.kills):
            writer = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITER,
                    str(pathlib.Path(fastkernel.__file__).parent),
                    str(work / "plan.json"),
                    str(opts.seed * 100003 + kill),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            if writer.stdout.readline().strip() != "ready":  # the loop is about to start
                writer.wait()
                print("error: a writer failed to start", file=sys.stderr)
                return 2
            time.sleep(rng.uniform(0, opts.max_delay_ms) / 1e3)
            writer.send_signal(signal.SIGKILL)
            writer.wait()
            writer.stdout.close()
            found = check(artifacts, outcomes)
            failures += [f"after kill {kill}: {f}" for f in found]
            state = _state(artifacts)
            changed += state != last
            last = state
        temps = sorted((work / "target").rglob(".*.tmp"))
        cache_root = work / "target" / "cache"
        cache_temps = [p for p in temps if cache_root in p.parents]
        # Every writer is dead: `cache prune` (no age limit) takes all of the cache's
        # temporaries, and nothing else there: everything still reads back as before.
        from fastkernel import cache

        pruned = cache.prune(cache_root, older_than=0)
        left = sorted(cache_root.rglob(".*.tmp"))
        if pruned != len(cache_temps) or left:
            failures.append(
                f"prune removed {pruned} of the cache's {len(cache_temps)} temporary files "
                f"({len(left)} left)"
            )
        failures += [f"after prune: {f}" for f in check(artifacts, dict.fromkeys(outcomes, 0))]
        elapsed = time.perf_counter() - start
        print(
            f"{opts.kills} writers killed with SIGKILL at random points "
            f"(0-{opts.max_delay_ms:.0f} ms into their write loop), {elapsed:.0f} s:"
        )
        for name, count in outcomes.items():
            print(f"  {name:42} {count}")
        print(
            f"  {'temporary files left by killed writers':42} {len(temps)} "
            f"(never read: not entry names); {len(cache_temps)} in the cache, of which "
            f"`cache prune` removed {pruned}"
        )
        print(f"  {'kills after which the files had changed':42} {changed}")
        if changed == 0:
            failures.append("the writers never changed the files: nothing was tested")
        print(f"  {'failures':42} {len(failures)}")
        for failure in failures[:20]:
            print(f"    {failure}")
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
