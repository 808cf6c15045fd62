"""The type stub of the native module describes what the module has: every public name of
``fastkernel._C`` (less the testing build's additions) is in ``_C.pyi``, and nothing else."""

import ast
import pathlib

import fastkernel
from fastkernel import _C

# What a build configured with -DFASTKERNEL_TESTING=ON adds; the stub leaves them out.
TESTING_ADDITIONS = {"BenchBundle", "BenchFloor", "bench_call_loop", "bench_floor"}


def _stub_names() -> set[str]:
    stub = pathlib.Path(fastkernel.__file__).with_name("_C.pyi")
    names = set()
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_the_stub_names_every_public_name_of_the_native_module():
    public = {n for n in dir(_C) if not n.startswith("_")} - TESTING_ADDITIONS
    assert _stub_names() == public


def test_the_package_is_marked_typed():
    assert pathlib.Path(fastkernel.__file__).with_name("py.typed").is_file()
