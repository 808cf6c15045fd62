"""atheris target: the warm index record decoder (fastkernel.cache.decode_index_record).

An input is a record's JSON; when it is a JSON object, the harness sets its index and native
key fields to the values expected and encodes it with its checksum, as a writer would, so that
the specialization's decoding is what is fuzzed. Every input must decode or raise ValueError; any
other exception is a finding.

    python tests/fuzz/fuzz_index_record.py [libFuzzer flags] [corpus dirs]
"""

import json
import sys

import atheris

from fastkernel import _triton_abi as abi
from fastkernel import cache

TARGET = abi.cuda_target(9, 0)
INDEX, NATIVE_KEY = "0" * 64, "00"

for _fn in (cache.decode_index_record, cache.index._decode_spec, cache.index._dec):
    atheris.instrument_func(_fn)


def test_one_input(data: bytes) -> None:
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        record = None
    if isinstance(record, dict):
        record.update(index=INDEX, native_key=NATIVE_KEY)
        try:
            data = cache.index.encode_index_record(record)
        except (ValueError, RecursionError):  # circular or too deep to re-encode: as given
            pass
    try:
        cache.decode_index_record(data, INDEX, NATIVE_KEY, TARGET)
    except ValueError:
        return


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
