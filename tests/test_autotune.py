"""fastkernel.autotune on CPU: the recording stand-in driver, and a fake timer that hands out
times in config order. Kernels whose ``launch_metadata`` callback plays them on CPU tensors
(tests/kernels.py) show what every launch saw, benchmark repetitions included."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import subprocess
import sys
import textwrap

import kernels
import pytest
import torch
import triton
from conftest import STAND_IN_PATH, TEST_STREAM
from triton import knobs
from triton_reference import TritonReference, assert_same_launch

import fastkernel
from fastkernel import _triton_abi as abi
from fastkernel import fastkernel as fk


class FakeTimer:
    """``do_bench`` stand-in: runs the kernel call once and returns the next time (ms) of
    ``times``, cycling; ``calls`` counts benchmarks."""

    def __init__(self, times):
        self.times = list(times)
        self.calls = 0

    def __call__(self, kernel_call, quantiles):
        kernel_call()
        t = self.times[self.calls % len(self.times)]
        self.calls += 1
        return [t, t, t]


CONFIGS = [
    triton.Config({"BLOCK": 64}, num_warps=2),
    triton.Config({"BLOCK": 128}, num_warps=4),
    triton.Config({"BLOCK": 256}, num_warps=8),
]


def grid_1d(meta):
    return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def tuned_add(timer, key=("n",), configs=CONFIGS, **kw):
    return fastkernel.autotune(configs=configs, key=list(key), do_bench=timer, **kw)(
        fk(kernels.add_kernel)
    )


@pytest.fixture(autouse=True)
def _compile_here(monkeypatch):
    # Worker processes are tested on their own (test_configs_compile_in_worker_processes).
    monkeypatch.setenv("FASTKERNEL_COMPILE_WORKERS", "0")


@pytest.fixture
def play_launches():
    """Sets a launch hook that materializes the launch metadata, which plays the kernel."""

    def enter(metadata):
        metadata.get()

    knobs.runtime.launch_enter_hook.add(enter)
    try:
        yield
    finally:
        knobs.runtime.launch_enter_hook.remove(enter)


def test_the_fastest_config_launches_and_the_next_call_is_a_native_hit(stand_in):
    timer = FakeTimer([3.0, 1.0, 2.0])  # BLOCK=128 wins
    k = tuned_add(timer)
    x, y, out = torch.randn(1000), torch.randn(1000), torch.empty(1000)
    k[grid_1d](x, y, out, 1000)
    launches = stand_in.launches()
    assert [l.block[0] for l in launches] == [64, 128, 256, 128]  # 3 benchmarks, then the winner
    assert launches[-1].grid == (8, 1, 1)  # the callable grid saw BLOCK=128 from the config
    assert timer.calls == 3
    assert k.best_config is CONFIGS[1]
    k[grid_1d](x, y, out, 1000)
    assert timer.calls == 3
    assert stand_in.launches()[-1].block[0] == 128
    assert stand_in.launches()[-1].params == launches[-1].params
    s = k.stats()
    assert (s["hits"], s["misses"], s["specializations"]) == (1, 1, 1)


def test_a_new_value_of_a_key_argument_retunes_and_other_arguments_do_not(stand_in):
    timer = FakeTimer([1.0, 2.0, 3.0])
    k = tuned_add(timer)
    x, y, out = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    k[grid_1d](x, y, out, 1000)
    assert timer.calls == 3
    k[grid_1d](x, y, out, 2000)  # n is in the key: tuned again
    assert timer.calls == 6
    k[grid_1d](x, y, out, 1000)  # tuned before
    assert timer.calls == 6
    # Not in the key: another alignment is a new specialization, not a new tuning.
    k[grid_1d](x[1:], y, out, 1000)
    assert timer.calls == 6
    assert k.stats()["specializations"] == 3


def test_float_and_bool_values_in_the_key_are_keyed_exactly_and_hit_natively(stand_in):
    # A float's and a runtime bool's own key words hold only their kind; named in the autotune
    # key, their values (a float's bits, a bool's value) are keyed as Triton's tuning key holds
    # them.
    configs = [triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})]
    x, out = torch.randn(256), torch.empty(256)
    for kernel, name, first, second in (
        (kernels.scaled_kernel, "scale", 2.0, 3.0),
        (kernels.flag_add_kernel, "flag", True, False),
    ):
        timer = FakeTimer([1.0, 2.0])
        k = fastkernel.autotune(configs=configs, key=[name], do_bench=timer)(fk(kernel))
        for value, tunings in ((first, 2), (first, 2), (second, 4), (first, 4), (second, 4)):
            k[grid_1d](x, out, 256, value)
            assert timer.calls == tunings, (name, value)
        s = k.stats()
        assert (s["hits"], s["misses"]) == (3, 2), name


def test_keyword_order_does_not_change_the_key(stand_in):
    timer = FakeTimer([1.0, 2.0, 3.0])
    k = tuned_add(timer)
    x, y, out = torch.randn(256), torch.randn(256), torch.empty(256)
    k[grid_1d](x, y, out_ptr=out, n=256)
    k[grid_1d](x, y, n=256, out_ptr=out)
    k[grid_1d](x_ptr=x, n=256, out_ptr=out, y_ptr=y)
    assert timer.calls == 3
    s = k.stats()
    assert (s["hits"], s["misses"]) == (2, 1)


def test_stride_classes_and_named_tensor_sizes_are_in_the_key(stand_in):
    timer = FakeTimer([1.0, 2.0])
    configs = [
        triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}),
        triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}),
    ]
    k = fastkernel.autotune(configs=configs, key=["M", "N"], do_bench=timer)(
        fk(kernels.copy2d_kernel)
    )

    def run(x):
        out = torch.empty(x.shape[0] * x.shape[1])
        k[lambda m: (triton.cdiv(m["M"], m["BLOCK_M"]), triton.cdiv(m["N"], m["BLOCK_N"]))](
            x, out, x.shape[0], x.shape[1], x.stride(0), x.stride(1)
        )

    base = torch.randn(64, 64)
    run(base)
    assert timer.calls == 2
    run(torch.randn(64, 64))  # same sizes and strides: tuned
    assert timer.calls == 2
    run(base.t())  # strides (64, 1) -> (1, 64): classes (other, 1) -> (1, other)
    assert timer.calls == 4
    run(torch.randn(64, 1).expand(64, 64))  # a broadcast: stride 0
    assert timer.calls == 6
    # A named tensor's sizes are keyed: re-tune when they change even if ints do not say so.
    timer2 = FakeTimer([1.0, 2.0])
    k2 = fastkernel.autotune(configs=configs, key=["x_ptr"], do_bench=timer2)(
        fk(kernels.copy2d_kernel)
    )
    out = torch.empty(64 * 64)
    grid = (4, 4)
    k2[grid](torch.randn(64, 64), out, 64, 64, 64, 1)
    k2[grid](torch.randn(64, 64), out, 64, 64, 64, 1)
    assert timer2.calls == 2
    k2[grid](torch.randn(32, 128), out, 64, 64, 64, 1)
    assert timer2.calls == 4


def test_the_python_tuning_key_matches_the_native_key_parts(stand_in):
    k = tuned_add(FakeTimer([1.0]), key=("n", "x_ptr"))
    x = torch.randn(8, 4)
    key = k.tuning_key({"x_ptr": x, "y_ptr": x.t(), "out_ptr": x[:, :1].expand(8, 3), "n": 5})
    assert key == (
        5,
        (8, 4),
        ("torch.float32", (2, 1)),
        ("torch.float32", (1, 2)),
        ("torch.float32", (2, 0)),
    )


def test_reset_to_zero_gives_an_accumulating_kernel_one_clean_run(stand_in, play_launches):
    timer = FakeTimer([2.0, 1.0, 3.0])
    k = fastkernel.autotune(configs=CONFIGS, key=["n"], reset_to_zero=["out_ptr"], do_bench=timer)(
        fk(kernels.accumulate_kernel)
    )
    x = torch.randn(512)
    out = torch.zeros(512)
    k[grid_1d](x, out, 512)  # tunes (3 benchmark launches), then the real launch
    assert len(stand_in.launches()) == 4
    torch.testing.assert_close(out, x, rtol=0, atol=0)
    out2 = torch.zeros(512)
    k[grid_1d](x, out2, 512)  # a hit: one launch, nothing zeroed behind the caller's back
    assert len(stand_in.launches()) == 5 and timer.calls == 3
    torch.testing.assert_close(out2, x, rtol=0, atol=0)


def test_without_reset_to_zero_the_benchmark_runs_accumulate(stand_in, play_launches):
    # The control for the test above: the simulated kernel does accumulate across launches.
    k = fastkernel.autotune(configs=CONFIGS, key=["n"], do_bench=FakeTimer([1.0]))(
        fk(kernels.accumulate_kernel)
    )
    x, out = torch.randn(512), torch.zeros(512)
    k[grid_1d](x, out, 512)
    torch.testing.assert_close(out, 4 * x)


def test_restore_value_gives_an_in_place_kernel_one_clean_run(stand_in, play_launches):
    timer = FakeTimer([2.0, 1.0, 3.0])
    seen = []
    k = fastkernel.autotune(
        configs=CONFIGS,
        key=["n"],
        restore_value=["x_ptr"],
        do_bench=timer,
        pre_hook=lambda args: seen.append(args["x_ptr"].clone()),
    )(fk(kernels.scale_in_place_kernel))
    x0 = torch.randn(300)
    x = x0.clone()
    k[grid_1d](x, 300)
    torch.testing.assert_close(x, 2 * x0 + 1)
    # Every benchmark repetition started from the original values.
    assert len(seen) == 3 and all(torch.equal(s, x0) for s in seen)
    k[grid_1d](x, 300)  # a hit: applied once more to the current values
    torch.testing.assert_close(x, 2 * (2 * x0 + 1) + 1)
    assert timer.calls == 3


def test_passing_a_tuned_parameter_is_triton_s_conflict_error(stand_in):
    k = tuned_add(FakeTimer([1.0]))
    x = torch.randn(64)
    with pytest.raises(ValueError, match="Conflicting meta-parameters: BLOCK"):
        k[(1,)](x, x, x, 64, BLOCK=64)
    with pytest.raises(ValueError, match="Conflicting meta-parameters: num_warps"):
        k[(1,)](x, x, x, 64, num_warps=4)
    assert stand_in.launches() == []


def test_a_config_that_fails_to_compile_is_skipped_with_a_log_line(stand_in, caplog):
    timer = FakeTimer([1.0, 2.0])
    configs = [triton.Config({"BLOCK": 48}), triton.Config({"BLOCK": 64})]
    k = fastkernel.autotune(configs=configs, key=[], do_bench=timer)(fk(kernels.needs_pow2_kernel))
    out = torch.empty(64)
    with caplog.at_level(logging.INFO, logger="fastkernel"):
        k[(1,)](out)
    assert "skipping config BLOCK=48" in caplog.text
    assert k.best_config is configs[1]
    assert stand_in.launches()[-1].name == "needs_pow2_kernel"


def test_when_every_config_fails_the_error_lists_each_failure(stand_in):
    configs = [triton.Config({"BLOCK": 48}), triton.Config({"BLOCK": 96})]
    k = fastkernel.autotune(configs=configs, key=[], do_bench=FakeTimer([1.0]))(
        fk(kernels.needs_pow2_kernel)
    )
    with pytest.raises(fastkernel.AutotuneError) as info:
        k[(1,)](torch.empty(128))
    assert "BLOCK=48" in str(info.value) and "BLOCK=96" in str(info.value)
    assert stand_in.launches() == []


def test_prune_configs_by_early_prune_perf_model_and_top_k(stand_in):
    timer = FakeTimer([1.0])
    seen = {}

    def early(configs, named_args, **kwargs):
        assert "n" not in named_args
        seen["n"] = kwargs["n"]
        return [c for c in configs if c.kwargs["BLOCK"] != 256]

    def perf_model(**args):
        return -args["BLOCK"]  # bigger is "faster"

    k = tuned_add(
        timer, prune_configs_by={"early_config_prune": early, "perf_model": perf_model, "top_k": 1}
    )
    x = torch.randn(1000)
    k[grid_1d](x, x, x, n=1000)  # a keyword: named_args and kwargs stay apart, as in Triton
    assert seen["n"] == 1000
    assert timer.calls == 0  # one config left: nothing to benchmark
    assert k.best_config is CONFIGS[1]
    assert stand_in.launches()[-1].block[0] == 128


def test_a_config_pre_hook_runs_before_every_launch_and_the_call_is_a_native_hit(stand_in):
    calls = []
    configs = [
        triton.Config(
            {"BLOCK": 64}, pre_hook=lambda args: calls.append(sorted(args.items(), key=str))
        )
    ]
    k = fastkernel.autotune(configs=configs, key=["n"])(fk(kernels.add_kernel))
    x = torch.randn(64)
    k[grid_1d](x, x, x, 64)
    k[grid_1d](x, x, x, 64)
    k[grid_1d](x, x, out_ptr=x, n=64)
    # The call's arguments by name and the config's values and options, on every call.
    assert (
        calls
        == [
            sorted(
                {"x_ptr": x, "y_ptr": x, "out_ptr": x, "n": 64, **configs[0].all_kwargs()}.items(),
                key=str,
            )
        ]
        * 3
    )
    assert len(stand_in.launches()) == 3
    stats = k.stats()
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0)
    assert k.best_config is configs[0]


def test_a_config_pre_hook_key_loads_nothing_of_its_own_and_indexes_nothing(stand_in):
    """The hooked key's record has no binary: only the launch underneath loads one (for the
    arguments as the hook left them), and the warm index gets nothing another autotuner
    of the kernel could find for arguments the hook did not change (here an fp32 output,
    where the hook swaps in an fp16 one)."""
    x = torch.randn(1024)

    def to_half(args):
        args["out_ptr"].data = torch.empty(1024, dtype=torch.float16)

    hooked = fastkernel.autotune(
        configs=[triton.Config({"BLOCK": 256}, pre_hook=to_half)], key=["n"]
    )(fk(kernels.add_kernel))
    for _ in range(2):
        hooked[(4,)](x, x, torch.empty(1024), 1024)
    assert stand_in.module_loads() == 1
    plain = fastkernel.autotune(configs=[triton.Config({"BLOCK": 256})], key=["n"])(
        fk(kernels.add_kernel)
    )
    out = torch.empty(1024)
    for _ in range(2):
        plain[(4,)](x, x, out, 1024)
    ours = stand_in.launches()[-2:]
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(kernels.add_kernel, (4,), x, x, out, 1024, BLOCK=256)
    for mine in ours:
        assert_same_launch(mine, theirs)


def test_a_config_pre_hook_changing_the_specialization_launches_the_binary_it_leaves(stand_in):
    """The hook moves some outputs to an unaligned offset: the launch below keys the arguments
    as the hook left them, so one autotune key launches either binary."""
    x = torch.randn(1024)
    outs = [torch.empty(1024) for _ in range(3)]

    def unalign(args):
        if args["out_ptr"] is not outs[1]:
            args["out_ptr"].set_(args["out_ptr"].untyped_storage(), 1, (1023,), (1,))

    configs = [triton.Config({"BLOCK": 256}, pre_hook=unalign)]
    k = fastkernel.autotune(configs=configs, key=["n"])(fk(kernels.add_kernel))
    for out in outs:
        k[(4,)](x, x, out, 1023)
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = [
            reference.launch(kernels.add_kernel, (4,), x, x, out, 1023, BLOCK=256) for out in outs
        ]
    ours = stand_in.launches()[:3]
    for mine, triton_launch in zip(ours, theirs):
        assert_same_launch(mine, triton_launch)
    assert ours[0].image == ours[2].image != ours[1].image
    assert (k.stats()["misses"], k.stats()["hits"]) == (1, 2)


def test_tuning_results_persist_on_disk_and_are_reused(stand_in):
    timer = FakeTimer([3.0, 1.0, 2.0])
    x = torch.randn(1000)
    tuned_add(timer)[grid_1d](x, x, x, 1000)
    assert timer.calls == 3
    records = list(fastkernel._autotune.tuning_dir().glob("*/*.json"))
    assert len(records) == 1
    assert json.loads(records[0].read_text())["config_index"] == 1
    # A new kernel object (a new process reads the same record): no benchmark.
    timer2 = FakeTimer([1.0])
    k2 = tuned_add(timer2)
    k2[grid_1d](x, x, x, 1000)
    assert timer2.calls == 0 and k2.best_config is CONFIGS[1]
    assert stand_in.launches()[-1].block[0] == 128
    # Other configs, or no disk results: tuned again.
    timer3 = FakeTimer([1.0])
    tuned_add(timer3, configs=CONFIGS[:2])[grid_1d](x, x, x, 1000)
    assert timer3.calls == 2
    timer4 = FakeTimer([1.0])
    tuned_add(timer4, cache_results=False)[grid_1d](x, x, x, 1000)
    assert timer4.calls == 3


def test_a_tuning_lock_that_cannot_be_taken_is_logged_not_raised(stand_in, monkeypatch, caplog):
    # A read-only or full cache: the lock file cannot be created. Tuning goes on (as compiling
    # does when an entry's lock cannot be taken), and the launch happens.
    import filelock

    class Unwritable(filelock.FileLock):
        def acquire(self, *args, **kwargs):
            raise PermissionError(13, "Permission denied", self.lock_file)

    monkeypatch.setattr(filelock, "FileLock", Unwritable)
    x = torch.randn(1000)
    timer = FakeTimer([3.0, 1.0, 2.0])
    with caplog.at_level(logging.WARNING, logger="fastkernel"):
        tuned_add(timer)[grid_1d](x, x, x, 1000)
    assert timer.calls == 3 and stand_in.launches()[-1].block[0] == 128
    assert "cannot take a lock under" in caplog.text and "tuning add_kernel" in caplog.text


def test_a_damaged_tuning_record_is_ignored_and_rewritten(stand_in, caplog):
    x = torch.randn(100)
    tuned_add(FakeTimer([3.0, 1.0, 2.0]))[grid_1d](x, x, x, 100)
    (record,) = fastkernel._autotune.tuning_dir().glob("*/*.json")
    record.write_text('{"config_index": 7')
    timer = FakeTimer([1.0, 2.0, 3.0])
    with caplog.at_level(logging.WARNING, logger="fastkernel"):
        tuned_add(timer)[grid_1d](x, x, x, 100)
    assert timer.calls == 3 and "ignoring the tuning record" in caplog.text
    assert json.loads(record.read_text())["config_index"] == 0


def test_the_tuning_record_key_covers_source_configs_key_target_and_env(stand_in, monkeypatch):
    k = tuned_add(FakeTimer([1.0]))
    target = abi.cuda_target(9, 0)
    base = k._record_path((1000,), target)
    assert base is not None
    assert k._record_path((1001,), target) != base
    assert k._record_path((1000,), abi.cuda_target(8, 0)) != base
    assert tuned_add(FakeTimer([1.0]), configs=CONFIGS[::-1])._record_path((1000,), target) != base
    monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")  # one of Triton's cache-invalidating vars
    assert k._record_path((1000,), target) != base
    monkeypatch.delenv("TRITON_F32_DEFAULT")
    k3 = fastkernel.autotune(configs=CONFIGS, key=["n"])(fk(kernels.accumulate_kernel))
    assert k3._record_path((1000,), target) != base  # another kernel's source
    monkeypatch.setenv("FASTKERNEL_CACHE", "0")
    assert k._record_path((1000,), target) is None


def test_a_new_process_reuses_the_tuned_config_without_benchmarking(stand_in, tmp_path):
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import torch, triton
        import fastkernel
        from fastkernel import _C, fastkernel as fk
        import kernels
        from stand_in_driver.recording import RecordingDriver
        calls = []
        def timer(fn, quantiles):
            fn()
            calls.append(1)
            return [[3.0, 1.0, 2.0][len(calls) - 1]] * 3
        k = fastkernel.autotune(configs=[triton.Config({{"BLOCK": b}}) for b in (64, 128, 256)],
                                key=["n"], do_bench=timer)(fk(kernels.add_kernel))
        driver = RecordingDriver({str(STAND_IN_PATH)!r})
        driver.reset()
        _C._testing.set_host_testing(True, 0, 7)
        x = torch.randn(1000)
        k[lambda m: (triton.cdiv(m["n"], m["BLOCK"]),)](x, x, x, 1000)
        print(len(calls), driver.launches()[-1].grid[0])
    """)
    env = dict(os.environ, FASTKERNEL_CUDA_DRIVER=str(STAND_IN_PATH))
    first = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    second = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert first.stdout.split() == ["3", "8"]  # benchmarked; BLOCK=128 -> 8 programs
    assert second.stdout.split() == ["0", "8"]  # read from disk


def test_configs_compile_in_worker_processes(stand_in, monkeypatch):
    monkeypatch.setenv("FASTKERNEL_COMPILE_WORKERS", "2")
    compiled_here = []
    real = abi.compile_specialization
    monkeypatch.setattr(
        abi, "compile_specialization", lambda *a: compiled_here.append(1) or real(*a)
    )
    timer = FakeTimer([1.0, 2.0, 3.0])
    k = tuned_add(timer)
    x = torch.randn(1000)
    k[grid_1d](x, x, x, 1000)
    assert timer.calls == 3
    assert compiled_here == []  # every config was compiled by a worker and loaded from disk
    assert len(stand_in.launches()) == 4


def test_compile_workers_do_not_patch_under_the_runner(stand_in, monkeypatch):
    # `python -m fastkernel run` sets FASTKERNEL_PATCH=1 for the whole process tree; a compile
    # worker only fills the disk cache and must not pay for the patch.
    monkeypatch.setenv("FASTKERNEL_PATCH", "1")
    monkeypatch.setenv("FASTKERNEL_COMPILE_WORKERS", "2")
    worker_envs = []
    real_run = subprocess.run

    def recording_run(cmd, *args, **kwargs):
        if cmd[1:] == ["-m", "fastkernel._compile_worker"]:
            worker_envs.append(kwargs.get("env"))
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", recording_run)
    k = tuned_add(FakeTimer([1.0, 2.0, 3.0]))
    x = torch.randn(1000)
    k[grid_1d](x, x, x, 1000)
    monkeypatch.setattr(subprocess, "run", real_run)
    assert len(worker_envs) == 2
    for env in worker_envs:
        probe = real_run(
            [sys.executable, "-c", "import fastkernel; print(fastkernel.is_patched())"],
            env=env,  # None: the parent's, FASTKERNEL_PATCH=1 included
            capture_output=True,
            text=True,
            check=True,
        )
        assert probe.stdout.split() == ["False"]


_GOOD_AUTOTUNE = {"configs": CONFIGS, "key": ["n"]}


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ({"configs": 5}, TypeError, "'configs' must be a list of triton.Config, not int"),
        ({"configs": triton.Config({"BLOCK": 64})}, TypeError, "'configs' must be a list"),
        ({"key": None}, TypeError, "'key' must be a list of argument names, not NoneType"),
        ({"key": [1]}, TypeError, r"'key' must hold argument names \(str\), not int"),
        ({"prune_configs_by": 5}, TypeError, "'prune_configs_by' must be a dict or None"),
        (
            {"prune_configs_by": {"early_config_prune": 5}},
            TypeError,
            r"prune_configs_by\['early_config_prune'\]' must be callable or None",
        ),
        ({"prune_configs_by": {"top_k": "2"}}, TypeError, r"\['top_k'\]' must be an int or a"),
        ({"prune_configs_by": {"bad": 1}}, ValueError, "'prune_configs_by' has 'bad'"),
        ({"prune_configs_by": {"top_k": 2.0}}, ValueError, r"float <= 1.0 .*not 2.0"),
        ({"reset_to_zero": 5}, TypeError, "'reset_to_zero' must be a list of argument names"),
        ({"restore_value": [None]}, TypeError, "'restore_value' must hold argument names"),
        ({"pre_hook": 5}, TypeError, "'pre_hook' must be callable or None, not int"),
        ({"post_hook": "f"}, TypeError, "'post_hook' must be callable or None, not str"),
        ({"warmup": "x"}, TypeError, "'warmup' must be a number of milliseconds, not str"),
        ({"rep": None}, TypeError, "'rep' must be a number of milliseconds, not NoneType"),
        ({"rep": True}, TypeError, "'rep' must be a number of milliseconds, not bool"),
        ({"warmup": -1}, ValueError, "'warmup' must be finite and >= 0 ms, not -1"),
        ({"rep": float("inf")}, ValueError, "'rep' must be finite and >= 0 ms, not inf"),
        ({"rep": 10**400}, ValueError, "'rep' must be finite and >= 0 ms"),  # no float holds it
        ({"do_bench": 5}, TypeError, "'do_bench' must be callable or None, not int"),
        ({"cache_results": "no"}, TypeError, "'cache_results' must be a bool, not str"),
        # Kinds before values, whatever the parameter order.
        ({"warmup": -1, "cache_results": "no"}, TypeError, "'cache_results' must be a bool"),
    ],
)
def test_autotune_refuses_a_bad_argument_when_the_decorator_is_made(bad, error, match):
    with pytest.raises(error, match=match):
        fastkernel.autotune(**{**_GOOD_AUTOTUNE, **bad})


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: fastkernel.heuristics(5), "'values' must be a dict of parameter name to"),
        (lambda: fastkernel.heuristics([("BLOCK", max)]), "'values' must be a dict"),
        (lambda: fastkernel.heuristics({1: max}), r"map parameter names \(str\), not int"),
        (lambda: fastkernel.heuristics({"BLOCK": 64}), "'BLOCK' must be callable, not int"),
        (lambda: fastkernel.heuristics({"BLOCK": max}, key=5), "'key' must be a list"),
        (lambda: fastkernel.heuristics({"BLOCK": max}, key=[1]), "'key' must hold argument"),
        (lambda: fastkernel.heuristics(fk(kernels.add_kernel)), "takes arguments"),
        (lambda: fastkernel.heuristics({"BLOCK": max}, key=["n"])(5), "wraps a @fastkernel"),
        (lambda: fastkernel.heuristics({"BLOCK": max})(5), "wraps a @fastkernel kernel, got int"),
    ],
)
def test_heuristics_refuses_a_bad_argument_with_a_type_error_naming_it(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def _tuned_and_heuristics():
    tuned = tuned_add(None)
    heuristics = fastkernel.heuristics({"BLOCK": lambda a: 64}, key=["n"])(fk(kernels.add_kernel))
    return tuned, heuristics


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda t, h: t.tuning_key(["n"]), "tuning_key(): argument 'named' must be a mapping"),
        (lambda t, h: t.prune(None, {}), "prune(): argument 'named' must be a mapping"),
        (lambda t, h: t.prune({}, [("num_warps", 4)]), "prune(): argument 'kwargs' must be a"),
        (
            lambda t, h: t.record_document(["n"], abi.cuda_target(9, 0)),
            "record_document(): argument 'tuning_key' must be a tuple, not list",
        ),
        (
            lambda t, h: t.record_document((64,), "sm_90"),
            "record_document(): argument 'target' must be a triton.backends.compiler.GPUTarget",
        ),
        (
            lambda t, h: t.record_document((64,), abi.cuda_target(9, 0), [{"BLOCK": 64}]),
            "record_document(): argument 'configs' must be a sequence of triton.Config or None",
        ),
        (lambda t, h: h.check_conflicts(5), "check_conflicts(): argument 'kwargs' must be a"),
        (lambda t, h: h.values_for(None), "values_for(): argument 'named' must be a mapping"),
    ],
)
def test_tuning_methods_name_an_argument_of_the_wrong_kind(call, match):
    """The public methods of an autotuned or heuristics kernel refuse an argument of the wrong
    kind with a TypeError naming it, not an AttributeError from its first use."""
    with pytest.raises(TypeError, match=re.escape(match)):
        call(*_tuned_and_heuristics())


def test_decoration_errors_name_the_problem():
    with pytest.raises(ValueError, match="'m'.*not arguments? of add_kernel"):
        fastkernel.autotune(configs=CONFIGS, key=["m"])(fk(kernels.add_kernel))
    with pytest.raises(ValueError, match="reset_to_zero names 'out'"):
        fastkernel.autotune(configs=CONFIGS, key=["n"], reset_to_zero=["out"])(
            fk(kernels.add_kernel)
        )
    with pytest.raises(TypeError, match="'n', which is not a tl.constexpr"):
        fastkernel.autotune(configs=[triton.Config({"n": 4})], key=[])(fk(kernels.add_kernel))
    with pytest.raises(ValueError, match="a config sets 'BLOCKK'"):
        fastkernel.autotune(configs=[triton.Config({"BLOCKK": 4})], key=[])(fk(kernels.add_kernel))
    with pytest.raises(TypeError, match="goes above @fastkernel"):
        fastkernel.autotune(configs=CONFIGS, key=["n"])(kernels.add_kernel)
    with pytest.raises(TypeError, match="list of argument names"):
        fastkernel.autotune(configs=CONFIGS, key="n")(fk(kernels.add_kernel))
    # from fastkernel import fastkernel: the decorator carries autotune too.
    assert fk.autotune is fastkernel.autotune


def test_it_is_a_triton_autotuner_for_torch_compile_and_triton_heuristics(stand_in):
    from triton.runtime.autotuner import Autotuner

    k = tuned_add(FakeTimer([1.0]))
    assert isinstance(k, Autotuner)
    assert k.configs == CONFIGS and k.keys == ["n"] and isinstance(k.fn, fastkernel.FastKernel)
    # triton.heuristics above: its value is passed by keyword to the tuned kernel.
    h = triton.heuristics({"BLOCK": lambda args: 64})(
        fastkernel.autotune(
            configs=[triton.Config({}, num_warps=2), triton.Config({}, num_warps=4)],
            key=["n"],
            do_bench=FakeTimer([2.0, 1.0]),
        )(fk(kernels.add_kernel))
    )
    x = torch.randn(64)
    h[(1,)](x, x, x, 64)
    assert stand_in.launches()[-1].block[0] == 128  # num_warps=4 won


def test_stats_count_tuned_hits(stand_in):
    k = tuned_add(FakeTimer([1.0]))
    x = torch.randn(64)
    for _ in range(5):
        k[grid_1d](x, x, x, 64)
    assert fastkernel.stats()["kernels.add_kernel"]["hits"] >= 4
    assert k.stats()["hits"] == 4


def test_progress_bar_only_on_a_terminal(monkeypatch):
    from fastkernel import _autotune

    items = [1, 2, 3]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert _autotune._progress(items, "x") is items
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = _autotune._progress(items, "autotuning k")
    assert bar is not items and list(bar) == items  # tqdm wraps the configs


# -- fastkernel.heuristics ------------------------------------------------------------------------


def test_keyed_heuristics_are_computed_once_per_key_and_hit_natively(stand_in):
    def block(args):
        return triton.next_power_of_2(args["n"])

    k = fastkernel.heuristics({"BLOCK": block}, key=["n"])(fk(kernels.add_kernel))
    x = torch.randn(1024)
    k[grid_1d](x, x, x, 100)
    k[grid_1d](x, x, x, 100)
    k[grid_1d](x, x, x, 300)
    first, second, third = stand_in.launches()
    assert first.grid == (1, 1, 1) and third.grid == (1, 1, 1)  # cdiv(n, next_pow2(n))
    assert first.raw == second.raw
    s = k.stats()
    assert (s["hits"], s["misses"]) == (1, 2)
    assert isinstance(k, triton.runtime.autotuner.Heuristics)


def test_a_keyed_heuristic_reading_outside_its_key_is_an_error(stand_in):
    k = fastkernel.heuristics(
        {"BLOCK": lambda args: 64 if args["x_ptr"].numel() > 8 else 16}, key=["n"]
    )(fk(kernels.add_kernel))
    x = torch.randn(64)
    with pytest.raises(KeyError, match="read argument 'x_ptr', which is not in its key"):
        k[(1,)](x, x, x, 64)
    with pytest.raises(ValueError, match="BLOCK computed by fastkernel.heuristics"):
        k[(1,)](x, x, x, 64, BLOCK=64)
    with pytest.raises(TypeError, match="'n' is not a tl.constexpr"):
        fastkernel.heuristics({"n": lambda a: 1}, key=[])(fk(kernels.add_kernel))
    assert stand_in.launches() == []


def test_heuristics_without_a_key_are_triton_s(stand_in):
    k = fastkernel.heuristics({"BLOCK": lambda args: 128})(fk(kernels.add_kernel))
    assert type(k) is triton.runtime.autotuner.Heuristics
    x = torch.randn(256)
    k[(2,)](x, x, x, 256)
    assert stand_in.launches()[-1].name == "add_kernel"


def test_autotune_over_keyed_heuristics(stand_in):
    timer = FakeTimer([2.0, 1.0])

    def block(args):  # the tuned config's num_warps is visible to it
        return 64 * args["num_warps"]

    k = fastkernel.autotune(
        configs=[triton.Config({}, num_warps=2), triton.Config({}, num_warps=4)],
        key=["n"],
        do_bench=timer,
    )(fastkernel.heuristics({"BLOCK": block}, key=["n"])(fk(kernels.add_kernel)))
    x = torch.randn(4096)
    k[grid_1d](x, x, x, 1000)
    k[grid_1d](x, x, x, 1000)
    launches = stand_in.launches()
    # Two benchmark launches (BLOCK 128 and 256), the tuned launch, then a hit.
    assert [(l.block[0], l.grid[0]) for l in launches] == [(64, 8), (128, 4), (128, 4), (128, 4)]
    assert k.stats()["hits"] == 1


def test_kill_switch_gives_tritons_autotuner_over_tritons_kernel(monkeypatch):
    monkeypatch.setenv("FASTKERNEL_DISABLE", "1")
    k = fastkernel.autotune(configs=CONFIGS, key=["n"])(fk(kernels.add_kernel))
    assert type(k) is triton.runtime.autotuner.Autotuner and k.fn is kernels.add_kernel
    h = fastkernel.heuristics({"BLOCK": lambda a: 64}, key=["n"])(fk(kernels.add_kernel))
    assert type(h) is triton.runtime.autotuner.Heuristics and h.fn is kernels.add_kernel


def test_a_warm_process_registers_a_tuned_config_without_tritons_binder(stand_in, monkeypatch):
    x = torch.randn(1000)
    tuned_add(FakeTimer([3.0, 1.0, 2.0]))[grid_1d](x, x, x, 1000)  # tunes, compiles, indexes
    first = stand_in.launches()[-1]
    binder = []
    real = abi.specialize
    monkeypatch.setattr(abi, "specialize", lambda *a: binder.append(1) or real(*a))
    timer = FakeTimer([1.0])
    warm = tuned_add(timer)  # a new object: its tuning record and specialization come from disk
    warm[grid_1d](x, x, x, 1000)
    assert timer.calls == 0 and binder == []
    assert stand_in.launches()[-1].raw == first.raw and stand_in.launches()[-1].grid == first.grid
    # Another config for the same native key (the record says BLOCK=256 now): not served the
    # BLOCK=128 binary.
    (record,) = fastkernel._autotune.tuning_dir().glob("*/*.json")
    doc = json.loads(record.read_text())
    doc["config_index"], doc["config"] = 2, fastkernel._autotune._config_doc(CONFIGS[2])
    record.write_text(json.dumps(doc))
    other = tuned_add(FakeTimer([1.0]))
    other[grid_1d](x, x, x, 1000)
    assert stand_in.launches()[-1].block[0] == 256 and stand_in.launches()[-1].grid[0] == 4
    assert len(binder) == 1


@pytest.mark.parametrize(
    "kernel, calls",
    [
        (
            kernels.flag_add_kernel,
            [lambda k, x: k[(1,)](x, x, 256, True), lambda k, x: k[(1,)](x, x, 256, False)],
        ),
        (
            kernels.tuple_kernel,
            [
                lambda k, x: k[(1,)](x, (x, 3), 256, (1.0, (2.0, x))),
                lambda k, x: k[(1,)](x, (x, 5), 256, (1.0, (2.0, x))),
            ],
        ),
    ],
    ids=["runtime-bool", "tuple"],
)
def test_a_key_argument_is_keyed_by_value_whatever_its_kind(stand_in, kernel, calls):
    """A runtime bool's own key word holds only its kind, and a tuple's elements only their
    classes (as Triton specializes them); named in the autotune key, their values are keyed
    too, so a new value tunes again instead of reusing another value's config."""
    timer = FakeTimer([1.0, 2.0, 3.0, 3.0, 2.0, 1.0])
    key = "flag" if kernel is kernels.flag_add_kernel else "pair"
    tuned = fastkernel.autotune(configs=CONFIGS, key=[key], do_bench=timer)(fk(kernel))
    x = torch.randn(256)
    for call in calls:
        call(tuned, x)
    assert timer.calls == 6
    assert sorted(c.kwargs["BLOCK"] for c in tuned.cache.values()) == [64, 256]
    for call in calls:  # each value hits its own record
        call(tuned, x)
    assert tuned.stats()["hits"] == 2 and timer.calls == 6


_SMALL = {"on": False}


def _counting_heuristic(args, seen=[]):  # noqa: B006 - the mutable default is the point
    seen.append(args["n"])
    return 64


@pytest.mark.parametrize(
    "fn, problem",
    [
        (lambda args: 32 if _SMALL["on"] else 64, "reads '_SMALL', which the key does not hold"),
        (lambda args: 32 if torch.is_grad_enabled() else 64, "reads 'torch.is_grad_enabled'"),
        (_counting_heuristic, "reads its default argument 'seen'"),
        (functools.partial(lambda args, b: b, b=64), "is a partial, whose code cannot be read"),
    ],
    ids=["global", "torch-state", "mutable-default", "partial"],
)
def test_a_keyed_heuristic_that_can_read_outside_its_arguments_is_refused(fn, problem):
    """With a key, each value is computed once per key: a function that can read a global,
    torch's state, a closure or a mutable default could leave it stale, so it is refused when
    decorated (TypeError naming what it reads)."""
    with pytest.raises(TypeError, match=f"the heuristic for 'BLOCK' {re.escape(problem)}"):
        fastkernel.heuristics({"BLOCK": fn}, key=["n"])(fk(kernels.add_kernel))
    # Without a key the functions run on every call (triton.heuristics): accepted.
    fastkernel.heuristics({"BLOCK": fn})(fk(kernels.add_kernel))


def test_a_keyed_heuristic_reading_a_keyed_tensors_layout_follows_its_strides(stand_in):
    # A keyed tensor is keyed by its sizes and exact strides: same sizes, another layout, a
    # new value.
    k = fastkernel.heuristics(
        {"BLOCK": lambda args: 64 if args["x_ptr"].is_contiguous() else 128}, key=["x_ptr", "n"]
    )(fk(kernels.add_kernel))
    x = torch.randn(16, 16)
    for tensor in (x, x.t(), x, x.t()):
        k[grid_1d](tensor, tensor, torch.empty(256), 256)
    assert [launch.grid[0] for launch in stand_in.launches()] == [4, 2, 4, 2]
    assert (k.stats()["misses"], k.stats()["hits"]) == (2, 2)


def test_a_keyed_heuristic_asking_about_an_argument_outside_its_key_is_an_error(stand_in):
    # Triton's mapping holds every argument passed; this one holds the key's, so asking
    # whether another parameter is there (or reading the mapping whole) cannot be answered.
    x = torch.randn(64)
    for fn, message in [
        (lambda args: 64 if "y_ptr" in args else 16, "read argument 'y_ptr', which is not in"),
        (lambda args: 64 if len(args) > 2 else 16, "reads its arguments as a whole"),
        (lambda args: 64 if "num_warps" in args else 16, None),  # not a parameter: answered
    ]:
        k = fastkernel.heuristics({"BLOCK": fn}, key=["n"])(fk(kernels.add_kernel))
        if message is None:
            k[(1,)](x, x, x, 64)
        else:
            with pytest.raises(KeyError, match=message):
                k[(1,)](x, x, x, 64)


def test_a_config_pre_hook_over_keyed_heuristics_runs_and_launches(stand_in):
    hooks = []
    configs = [
        triton.Config({}, num_warps=2, pre_hook=lambda nargs: hooks.append(2)),
        triton.Config({}, num_warps=4, pre_hook=lambda nargs: hooks.append(4)),
    ]
    k = fastkernel.autotune(configs=configs, key=["n"], do_bench=FakeTimer([1.0, 2.0]))(
        fastkernel.heuristics({"BLOCK": lambda args: 32 * args["num_warps"]}, key=["n"])(
            fk(kernels.add_kernel)
        )
    )
    x = torch.randn(1024)
    k[grid_1d](x, x, x, 1024)
    k[grid_1d](x, x, x, 1024)
    # Two benchmark launches, then the tuned config (2 warps, BLOCK 64) twice, hook each time.
    assert [(l.block[0], l.grid[0]) for l in stand_in.launches()][2:] == [(64, 16), (64, 16)]
    assert hooks[-2:] == [2, 2]


def test_a_tuning_record_holds_a_choice_among_the_configs_this_call_prunes_to(stand_in):
    # The record is found through the configs the call's pruning leaves, as Triton prunes
    # before it looks at its cache: pruning that now drops the recorded winner tunes again
    # among what it leaves, and a key pruned to one config needs (and writes) no record.
    x = torch.randn(1000)
    tuned_add(FakeTimer([3.0, 1.0, 2.0]))[grid_1d](x, x, x, 1000)  # CONFIGS[1] wins
    assert len(list(fastkernel._autotune.tuning_dir().glob("*/*.json"))) == 1

    def drop_the_winner(configs, named_args, **kwargs):
        return [c for c in configs if c is not CONFIGS[1]]

    timer = FakeTimer([2.0, 1.0])
    k = tuned_add(timer, prune_configs_by={"early_config_prune": drop_the_winner})
    k[grid_1d](x, x, x, 1000)
    assert timer.calls == 2 and k.best_config is CONFIGS[2]
    assert stand_in.launches()[-1].block[0] == 32 * 8

    def keep_one(configs, named_args, **kwargs):
        return [CONFIGS[0]]

    timer = FakeTimer([1.0])
    k = tuned_add(timer, prune_configs_by={"early_config_prune": keep_one})
    k[grid_1d](x, x, x, 1000)
    assert timer.calls == 0 and k.best_config is CONFIGS[0]
    assert len(list(fastkernel._autotune.tuning_dir().glob("*/*.json"))) == 2


def test_keys_tune_apart_and_a_key_tuned_inside_itself_raises(stand_in, tmp_path, monkeypatch):
    """One key tunes at a time, others meanwhile: a timer of one key waiting on another thread
    that tunes another key finishes. A launch made while tuning a key (here from a pre_hook)
    that needs the same key tuned raises RuntimeError (that config is skipped), never waits
    for itself."""
    import threading

    monkeypatch.setenv("FASTKERNEL_CACHE_DIR", str(tmp_path / "cache"))  # no tuning records yet
    x, y, out = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    started, other_finished = [], []

    def timer(kernel_call, quantiles):
        kernel_call()
        if not started:  # while key n=4096 tunes: key n=2048 from another thread
            started.append(True)
            worker = threading.Thread(target=lambda: k[grid_1d](x, y, out, 2048), daemon=True)
            worker.start()
            worker.join(timeout=60)
            other_finished.append(not worker.is_alive())
        return [1.0, 1.0, 1.0]

    k = tuned_add(timer)
    k[grid_1d](x, y, out, 4096)
    assert other_finished == [True]

    nested = []

    def pre_hook(nargs, **_):
        if not nested:
            try:
                tuned[grid_1d](x, y, out, 1024)
                nested.append(None)
            except RuntimeError as exc:
                nested.append(str(exc))

    tuned = tuned_add(FakeTimer([1.0]), pre_hook=pre_hook)
    # (n=1024: a key no tuning record on disk holds yet, so it is benchmarked.)
    outer = threading.Thread(target=lambda: tuned[grid_1d](x, y, out, 1024), daemon=True)
    outer.start()
    outer.join(timeout=120)
    assert not outer.is_alive()
    assert nested and "cannot be tuned inside itself" in nested[0]


def test_two_threads_tuning_keys_each_others_timer_needs_finish(stand_in, tmp_path, monkeypatch):
    """Each thread's timer launches the key the other thread is tuning: neither waits for the
    other (the nested key is tuned where it is needed, in memory)."""
    import threading

    monkeypatch.setenv("FASTKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    x, y, out = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    inside = {1024: threading.Event(), 2048: threading.Event()}
    other = {1024: 2048, 2048: 1024}

    def timer(kernel_call, quantiles):
        kernel_call()
        me = getattr(threading.current_thread(), "key_n", None)
        if me is not None and not inside[me].is_set():
            inside[me].set()
            inside[other[me]].wait(timeout=10)  # both threads are tuning now
            k[grid_1d](x, y, out, other[me])
        return [1.0, 1.0, 1.0]

    k = tuned_add(timer)
    threads = []
    for n in (1024, 2048):
        thread = threading.Thread(target=lambda n=n: k[grid_1d](x, y, out, n), daemon=True)
        thread.key_n = n
        threads.append(thread)
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [thread.is_alive() for thread in threads] == [False, False]
    assert {1024, 2048} <= {key[0] for key in k.cache}


def test_best_config_is_the_config_of_the_last_call_as_triton_sets_it(stand_in):
    """Triton's Autotuner.run sets best_config on every call (runtime/autotuner.py), a cached
    key's hit included; user code reading it after a call gets that call's config. It used to
    be the config tuned last: after keys A, B, A it named B's."""
    k = tuned_add(FakeTimer([1.0, 2.0, 3.0, 3.0, 3.0, 1.0]))  # 4096: BLOCK 64; 2048: 256
    x = torch.randn(4096)
    seen = []
    for n in (4096, 2048, 4096, 4096, 2048):
        k[grid_1d](x, x, x, n)
        seen.append(k.best_config)
        k.best_config = None  # user code may reset it; the next call sets it again
    which = [next((i for i, c in enumerate(CONFIGS) if c is config), None) for config in seen]
    assert which == [0, 2, 0, 0, 2]
    assert k.stats()["hits"] == 3
