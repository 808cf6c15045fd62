"""atheris target: the disk cache's entry decoder (fastkernel.cache.decode_entry) and what a
decoded entry becomes (its launch metadata and the CachedKernel a launch returns).

An input is a header length (4 bytes, little-endian), the header bytes and the cubin; the
harness wraps them in an entry file with a valid checksum, as a writer would, so that the
header's parsing and schema checks are what is fuzzed. Every input must be refused with
CorruptEntry or decode into an entry whose artifact builds; any other exception is a finding.

    python tests/fuzz/fuzz_cache_entry.py [libFuzzer flags] [corpus dirs]
"""

import hashlib
import struct
import sys

import atheris

from fastkernel import cache

for _fn in (
    cache.decode_entry,
    cache.entry._check_header,
    cache.entry._valid_tensordesc_meta,
    cache.entry._in_launch_range,
    cache.CachedKernel.from_entry,
):
    atheris.instrument_func(_fn)


def entry_bytes(header: bytes, cubin: bytes) -> bytes:
    fixed = struct.pack("<8sIIQ", b"FKCACHE\0", cache.FORMAT_VERSION, len(header), len(cubin))
    return fixed + hashlib.sha256(fixed + header + cubin).digest() + header + cubin


def test_one_input(data: bytes) -> None:
    if len(data) < 4:
        return
    (n,) = struct.unpack_from("<I", data)
    header, cubin = data[4 : 4 + n], data[4 + n :]
    try:
        entry = cache.decode_entry(entry_bytes(header, cubin))
    except cache.CorruptEntry:
        return
    entry.launch_metadata()
    cache.CachedKernel.from_entry(entry)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
