"""Safety of the native path under threads and fork, and the kill switch (CPU, stand-in)."""

from __future__ import annotations

import importlib
import os
import struct
import subprocess
import sys
import textwrap
import threading

import kernels
import pytest
import torch
from conftest import TEST_STREAM
from triton_reference import TritonReference

from fastkernel import fastkernel

THREADS = 8
CALLS_PER_THREAD = 100_000


def test_concurrent_hits_and_misses_from_many_threads(stand_in):
    """8 threads x 100k calls with a changing mix of alignments, int classes and constexprs."""
    k = fastkernel(kernels.add_kernel)
    base = torch.randn(4096)
    pointers = [base, base[1:], base[4:]]  # aligned, unaligned, aligned again
    sizes = [1024, 1023, 1, 2048]  # D, other, == 1 (constexpr), D
    blocks = [64, 128]
    combos = [(p, n, b) for p in pointers for n in sizes for b in blocks]
    errors = []
    barrier = threading.Barrier(THREADS)

    def worker(seed: int):
        try:
            barrier.wait()
            for i in range(CALLS_PER_THREAD):
                p, n, b = combos[(i * 7 + seed) % len(combos)]
                k[(2,)](p, p, p, n, BLOCK=b)
        except Exception as exc:  # reported below; a thread must not swallow a failure
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    total = THREADS * CALLS_PER_THREAD
    stats = k.stats()
    # x and x[4:] share an alignment class, and 1024 and 2048 an int class ("divisible by 16"),
    # so they share binaries: 2 alignments x 3 int classes x 2 blocks.
    assert stats["specializations"] == 2 * 3 * len(blocks)
    assert stats["hits"] + stats["misses"] == total and stats["fallbacks"] == 0
    assert stand_in.launch_count() == total
    valid = {(p.data_ptr(), n) for p, n, _ in combos}
    for launch in stand_in.launches():
        ptr = struct.unpack("<Q", launch.params[0])[0]
        n = struct.unpack("<i", launch.params[3])[0] if len(launch.params) == 6 else 1
        assert (ptr, n) in valid


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=os.path.dirname(os.path.abspath(__file__)),
        timeout=300,
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_never_reuses_parent_cuda_handles(stand_in):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    k[(1,)](x, x, x, 64, BLOCK=64)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report what a launch does, then leave without running pytest's exit
        try:
            k[(1,)](x, x, x, 64, BLOCK=64)
            message = b"launched"
        except RuntimeError as exc:
            message = str(exc).encode()
        os.write(write_fd, message)
        os._exit(0)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    message = os.read(read_fd, 4096).decode()
    os.close(read_fd)
    assert status == 0
    assert "forked after CUDA was initialized" in message
    assert stand_in.launch_count() == 1  # the child launched nothing
    k[(1,)](x, x, x, 64, BLOCK=64)  # the parent is unaffected
    assert stand_in.launch_count() == 2


def _child_outcome(body) -> str:
    """Fork; the child runs ``body()`` (a string it returns is the outcome; a wait past 30 s ends
    it by SIGALRM) and reports the outcome to the parent."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child leaves without running pytest's exit
        import signal

        signal.alarm(30)
        try:
            message = body()
        except BaseException as exc:
            message = f"{type(exc).__name__}: {exc}"
        os.write(write_fd, message.encode())
        os._exit(0)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    message = os.read(read_fd, 4096).decode()
    os.close(read_fd)
    assert os.WIFEXITED(status), f"the child was ended by signal {os.WTERMSIG(status)}"
    return message


def _held_by_another_thread(lock):
    """A context holding ``lock`` in another thread for its extent, as a thread compiling,
    tuning or patching at the moment of a fork holds it."""
    import contextlib

    @contextlib.contextmanager
    def held():
        taken, done = threading.Event(), threading.Event()

        def hold():
            with lock:
                taken.set()
                done.wait()

        thread = threading.Thread(target=hold)
        thread.start()
        taken.wait()
        try:
            yield
        finally:
            done.set()
            thread.join()

    return held()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_childs_miss_is_refused_though_another_thread_held_the_kernels_lock(stand_in):
    """A thread of the parent in a miss (compiling under the kernel's lock) at the fork: the
    child's own miss gets the fork error instead of waiting for ever on that lock."""
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    k[(1,)](x, x, x, 64, BLOCK=64)

    def miss():
        k[(1,)](x, x, x, 64, BLOCK=128)  # a specialization the parent never compiled
        return "launched"

    with _held_by_another_thread(k._lock):
        outcome = _child_outcome(miss)
    assert "forked after CUDA was initialized" in outcome, outcome
    k[(1,)](x, x, x, 64, BLOCK=128)  # the parent is unaffected
    assert stand_in.launch_count() == 2


def _module_locks():
    module = importlib.import_module  # fastkernel.patch is also the name of a function
    return {
        "patch": module("fastkernel.patch")._lock,
        "triton kernel": module("fastkernel.cache.store")._TRITON_KERNEL_LOCK,
        "host helpers": module("fastkernel._host_helpers")._lock,
        "triton watch": module("fastkernel.kernel")._triton_watch_lock,
        "cache counters": module("fastkernel.cache.settings")._counts_lock,
    }


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("name", list(_module_locks()))
def test_a_forked_child_can_take_each_lock_another_thread_held(name):
    lock = _module_locks()[name]

    def take():
        return "taken" if lock.acquire(timeout=10) else "still held"

    with _held_by_another_thread(lock):
        assert _child_outcome(take) == "taken"
    with lock:  # the parent's lock is its own again
        pass


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_keeps_the_reentrant_lock_its_forking_thread_holds():
    """The forking thread holds the patch's lock: in the child it still does, and releases it as
    it leaves the block (a lock made free at the fork would raise on that release)."""
    patch = importlib.import_module("fastkernel.patch")

    def take_and_leave():
        with patch._lock:
            pass
        patch._lock.release()  # the outer hold, as the child leaves the parent's block
        return "taken again" if patch._lock.acquire(blocking=False) else "held"

    with patch._lock:
        outcome = _child_outcome(take_and_leave)
    assert outcome == "taken again"


def test_a_daemon_thread_inside_a_launch_at_exit_lets_the_process_exit(stand_in):
    """At exit CPython ends daemon threads with pthread_exit, whose forced unwind passes
    through whatever native frames the thread is in: a launch running its Python grid must let
    it pass (catching it aborts the process)."""
    result = _run(
        f"""
        import threading, time
        import torch, kernels
        from fastkernel import _C, fastkernel
        _C._testing.set_host_testing(True, 0, {TEST_STREAM})
        k = fastkernel(kernels.add_kernel)
        x = torch.randn(4096)

        def grid(meta):
            time.sleep(0.001)  # Python the launch runs, where the thread is when it is ended
            return (4,)

        def launch_forever():
            while True:
                k[grid](x, x, x, 4096, BLOCK=1024)

        k[grid](x, x, x, 4096, BLOCK=1024)
        threading.Thread(target=launch_forever, daemon=True).start()
        time.sleep(0.2)
        print("exiting")
    """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "exiting"


def test_launches_nested_without_bound_raise_recursion_error_at_any_recursion_limit(stand_in):
    """Each launch nested through a grid function holds several KiB of C stack: whatever
    sys.setrecursionlimit allows, the nesting ends in RecursionError, not a crash."""
    result = _run(
        f"""
        import sys
        import torch, kernels
        from fastkernel import _C, fastkernel
        _C._testing.set_host_testing(True, 0, {TEST_STREAM})
        k = fastkernel(kernels.add_kernel)
        x = torch.randn(64)
        depth = 0

        def grid(meta):
            global depth
            depth += 1
            k[grid](x, x, x, 64, BLOCK=64)
            return (1,)

        sys.setrecursionlimit(20000)
        try:
            k[grid](x, x, x, 64, BLOCK=64)
        except RecursionError as exc:
            print(depth, "nested more than" in str(exc))
        k[(1,)](x, x, x, 64, BLOCK=64)  # and launches go on
        print("launched")
    """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["200", "True", "launched"]


def test_kill_switch_returns_tritons_own_kernel():
    result = _run(
        """
        import fastkernel, kernels
        from triton.runtime.jit import JITFunction
        k = fastkernel.fastkernel(kernels.add_kernel)
        print(type(k).__name__, isinstance(k, JITFunction))
    """,
        FASTKERNEL_DISABLE="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "JITFunction True"


def test_a_cubin_the_driver_rejects_falls_back_to_triton_with_one_warning(
    stand_in, monkeypatch, caplog
):
    """A registration failure is Triton's to handle, never a crash or a wrong launch."""
    import fastkernel as fk
    from fastkernel import _triton_abi as abi

    k = fastkernel(kernels.add_kernel)
    real = abi.launch_metadata

    def corrupt(compiled):
        meta = real(compiled)
        meta.cubin = b"\x7fELF" + b"\0" * 60  # an ELF header with nothing in it
        return meta

    monkeypatch.setattr(abi, "launch_metadata", corrupt)
    monkeypatch.setenv("FASTKERNEL_CACHE", "0")
    x = torch.randn(64)
    with TritonReference(stand_in, TEST_STREAM):
        for _ in range(2):
            k[(1,)](x, x, x, 64, BLOCK=64)  # Triton's own launcher takes the call
    stats = k.stats()
    assert stats["fallbacks"] == 2 and stats["specializations"] == 0
    assert len(stand_in.launches()) == 2
    assert caplog.text.count("registering the cubin failed") == 1
    assert fk.stats()[f"{k.module}.{k.fn.__qualname__}"]["fallbacks"] >= 2


def test_refused_specializations_are_remembered_within_the_capacity(stand_in, monkeypatch):
    from fastkernel import _triton_abi as abi

    monkeypatch.setenv("FASTKERNEL_MAX_SPECIALIZATIONS", "2")
    monkeypatch.setenv("FASTKERNEL_CACHE", "0")
    k = fastkernel(kernels.add_kernel)
    real = abi.launch_metadata

    def corrupt(compiled):
        meta = real(compiled)
        meta.cubin = b"\x7fELF" + b"\0" * 60
        return meta

    monkeypatch.setattr(abi, "launch_metadata", corrupt)
    x = torch.randn(64)
    with TritonReference(stand_in, TEST_STREAM):
        for block in (16, 32, 64, 128):  # four refused specializations
            k[(1,)](x, x, x, 64, BLOCK=block)
    assert len(k._refused_keys) == 2  # the two most recent
    assert k.stats()["fallbacks"] == 4
