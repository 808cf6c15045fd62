"""The launch contexts beyond a plain call, on a real GPU: CUDA graphs (capture on a side stream, replay with new
inputs, scratch kept alive), torch.profiler, several GPUs and many threads. The CPU halves of
these tests run against the stand-in (test_launch_bytes, test_hooks_and_knobs, test_safety);
these need a CUDA device and are skipped without one."""

from __future__ import annotations

import gc
import threading

import kernels
import pytest
import torch
import triton

from fastkernel import fastkernel

pytestmark = pytest.mark.gpu


def _add_inputs(n: int, device="cuda"):
    x = torch.randn(n, device=device)
    y = torch.randn(n, device=device)
    return x, y, torch.empty_like(x)


def test_a_captured_launch_replays_with_new_inputs_on_the_capture_stream():
    k = fastkernel(kernels.add_kernel)
    x, y, out = _add_inputs(4096)
    k[(4,)](x, y, out, 4096, BLOCK=1024)  # compile and register outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=side):
        k[(4,)](x, y, out, 4096, BLOCK=1024)
    hits = k.stats()["hits"]
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        y.copy_(torch.randn_like(y))
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, x + y)
    assert k.stats()["hits"] == hits  # replays do not call the kernel object


def test_scratch_of_a_captured_launch_lives_as_long_as_the_graph():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("device-side descriptors need global scratch on compute capability 9.0+")
    from triton.runtime import _allocation

    token = _allocation._allocator.set(_allocation._allocator.get())
    triton.set_allocator(
        lambda size, alignment, stream: torch.empty(
            size + alignment, dtype=torch.int8, device="cuda"
        )
    )
    try:
        k = fastkernel(kernels.device_descriptor_kernel)
        src = torch.randn(64, 32, device="cuda")
        dst = torch.empty(64, 32, device="cuda")
        k[(4,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            k[(4,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)
        gc.collect()
        # Allocations after the capture must not reuse the captured launch's scratch.
        noise = [torch.full((1 << 16,), 7, dtype=torch.int8, device="cuda") for _ in range(8)]
        for _ in range(3):
            src.copy_(torch.randn_like(src))
            dst.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(dst, src)
        del noise
    finally:
        _allocation._allocator.reset(token)


# torch's profiler warns, once per process, that it keeps only the current cycle's events.
@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events at the end of each cycle")
def test_the_profiler_sees_the_kernel_and_the_fastkernel_range():
    k = fastkernel(kernels.add_kernel)
    x, y, out = _add_inputs(4096)
    k[(4,)](x, y, out, 4096, BLOCK=1024)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        k[(4,)](x, y, out, 4096, BLOCK=1024)
        torch.cuda.synchronize()
    names = [event.name for event in prof.events()]
    assert "fastkernel::add_kernel" in names
    assert any(name.startswith("add_kernel") for name in names), names  # the GPU kernel
    assert torch.equal(out, x + y)


def test_every_device_launches_its_own_module():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    k = fastkernel(kernels.add_kernel)
    for device in (0, 1, 0, 1):
        with torch.cuda.device(device):
            x, y, out = _add_inputs(4096, device=f"cuda:{device}")
            k[(4,)](x, y, out, 4096, BLOCK=1024)
            torch.cuda.synchronize(device)
            assert torch.equal(out, x + y)
    assert k.stats()["specializations"] == 2  # one record per device


def test_tensors_on_another_device_than_the_current_one_behave_as_in_triton():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")

    def outcome(launch):
        x, y, out = _add_inputs(4096, device="cuda:1")
        try:
            with torch.cuda.device(0):
                launch(x, y, out)
            torch.cuda.synchronize(1)
            return "launched", torch.equal(out, x + y)
        except Exception as exc:  # the same kind of error as Triton's is what counts
            return "raised", type(exc).__name__

    k = fastkernel(kernels.add_kernel)
    assert outcome(lambda x, y, out: k[(4,)](x, y, out, 4096, BLOCK=1024)) == outcome(
        lambda x, y, out: kernels.add_kernel[(4,)](x, y, out, 4096, BLOCK=1024)
    )


def test_eight_threads_of_mixed_shapes_and_alignments_give_correct_results():
    k = fastkernel(kernels.add_kernel)
    base_x, base_y = torch.randn(8192 + 16, device="cuda"), torch.randn(8192 + 16, device="cuda")
    errors: list = []

    def worker(seed: int) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for i in range(300):
                    n = (1024, 3000, 8192)[(i + seed) % 3]
                    offset = (0, 1, 4)[(i * 7 + seed) % 3]  # aligned and unaligned pointers
                    x = base_x[offset : offset + n]
                    y = base_y[offset : offset + n]
                    out = torch.empty(n, device="cuda")
                    k[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
                    stream.synchronize()
                    if not torch.equal(out, x + y):
                        errors.append((seed, i, n, offset))
                        return
        except Exception as exc:  # reported below with the thread's seed
            errors.append((seed, repr(exc)))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stats = k.stats()
    assert stats["fallbacks"] == 0 and stats["hits"] + stats["misses"] == 8 * 300
