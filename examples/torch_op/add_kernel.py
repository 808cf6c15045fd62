"""Export the bundle the example op launches, then use the op from Python and torch.compile.

    python examples/torch_op/add_kernel.py BUILD_DIR   # BUILD_DIR holds the built library

Needs a CUDA GPU (exporting records the specializations a real launch used)."""

from __future__ import annotations

import argparse
import pathlib
import tempfile

import torch
import triton
import triton.language as tl

import fastkernel
from fastkernel import fastkernel as fk

BLOCK = 1024  # ops.cpp's kBlock


@fk
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


def export_bundle(directory: pathlib.Path) -> None:
    """Launch every specialization the op can meet once, then export them: float32 and bfloat16;
    inputs 16-byte aligned or not (a view at an odd offset); the element count divisible by 16,
    not, or 1 (Triton specializes each differently); the output always aligned (the op
    allocates it)."""
    for dtype in (torch.float32, torch.bfloat16):
        base = torch.randn(4097, device="cuda", dtype=dtype)
        out = torch.empty(4096, device="cuda", dtype=dtype)
        for offset in (0, 1):
            for n in (4096, 4095, 1):
                x = base[offset:offset + n]
                add_kernel[(triton.cdiv(n, BLOCK),)](x, x, out, n, BLOCK=BLOCK)
    fastkernel.export(add_kernel, directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir", type=pathlib.Path)
    args = parser.parse_args()
    library = next(args.build_dir.glob("libfastkernel_example_ops*.so"))
    torch.ops.load_library(str(library))
    with tempfile.TemporaryDirectory() as tmp:
        export_bundle(pathlib.Path(tmp) / "add")
        torch.ops.fastkernel_example.load_bundle(str(pathlib.Path(tmp) / "add"))
        x, y = torch.randn(100_000, device="cuda"), torch.randn(100_000, device="cuda")
        assert torch.equal(torch.ops.fastkernel_example.add(x, y), x + y)
        compiled = torch.compile(lambda a, b: torch.ops.fastkernel_example.add(a, b) * 2,
                                 fullgraph=True)
        torch.testing.assert_close(compiled(x, y), (x + y) * 2)
        print("torch.ops.fastkernel_example.add matches x + y, eager and under torch.compile")


if __name__ == "__main__":
    main()
