"""The bounded in-memory launch table: least recently launched specializations are evicted,
release what they hold, and come back from the disk cache on their next use."""

from __future__ import annotations

import gc
import random
import weakref

import kernels
import pytest
import torch

from fastkernel import cache as fk_cache
from fastkernel import fastkernel


def test_least_recently_launched_specialization_is_evicted_and_comes_back_from_disk(
    stand_in, monkeypatch
):
    monkeypatch.setenv("FASTKERNEL_MAX_SPECIALIZATIONS", "2")
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(128)

    def call(block):
        k[(1,)](x, x, x, 128, BLOCK=block)

    call(16)
    first = weakref.ref(k._compiled[0])
    call(32)
    call(16)  # 16 is now more recent than 32
    call(64)  # at capacity: 32 is evicted
    stats = k.stats()
    assert stats["specializations"] == 2 and stats["evictions"] == 1
    gc.collect()
    assert first() is not None  # 16 is still registered: its record holds it
    loads = stand_in.module_loads()
    call(16)
    assert k.stats()["hits"] == 2 and stand_in.module_loads() == loads  # still registered
    call(32)  # evicted: a miss, re-registered from the disk cache
    assert k.stats()["misses"] == 4 and stand_in.module_loads() == loads + 1
    assert isinstance(k._compiled[-1], fk_cache.CachedKernel)
    assert k.stats()["evictions"] == 2  # 64 was the least recently launched
    blocks = [launch.block for launch in stand_in.launches()]
    assert len(blocks) == 6


def test_evicted_records_release_their_compiled_kernels(stand_in, monkeypatch):
    monkeypatch.setenv("FASTKERNEL_MAX_SPECIALIZATIONS", "1")
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(128)
    k[(1,)](x, x, x, 128, BLOCK=16)
    first = weakref.ref(k._compiled[0])
    k[(1,)](x, x, x, 128, BLOCK=32)  # evicts the first; the deque keeps only the newest
    gc.collect()
    assert first() is None
    assert k.stats()["specializations"] == 1


def test_many_specializations_through_a_small_table(stand_in, monkeypatch):
    """Interleaved hits, misses and evictions keep the table consistent (tombstones included)."""
    monkeypatch.setenv("FASTKERNEL_MAX_SPECIALIZATIONS", "3")
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(256)
    sizes = [16 * i for i in range(1, 9)] + [16 * i + 1 for i in range(1, 5)]  # D and "" classes
    rng = random.Random(0)
    calls = [rng.choice([(1, 64), (2, 64), (1, 128)]) for _ in range(300)]
    for grid_x, block in calls:
        n = rng.choice(sizes[:3])
        k[(grid_x,)](x, x, x, n, BLOCK=block)
    stats = k.stats()
    assert stats["specializations"] <= 3
    assert stats["hits"] + stats["misses"] == 300 and stats["fallbacks"] == 0
    assert stand_in.launch_count() == 300
    for launch, (grid_x, _block) in zip(stand_in.launches(), calls):
        assert launch.grid == (grid_x, 1, 1)


def test_every_call_launches_its_own_binary_whatever_slot_was_used_last(stand_in):
    """Repeated and alternating specializations, through table growth, capacity evictions and a
    clear: each launch runs its own call's binary (num_warps tells them apart in the block)."""
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(128)
    specs = [(block, warps) for warps in (1, 2, 4, 8) for block in (16, 32, 64)]
    rng = random.Random(2)
    calls = specs + [rng.choice(specs) for _ in range(60)]  # 12 inserts grow the table
    calls += [specs[0]] * 3 + [specs[1], specs[0]] * 3  # repeats, then alternation
    for at, (block, warps) in enumerate(calls):
        if at == 70:
            assert k.stats()["misses"] == len(specs)  # one per specialization, nothing shared
            k._set_capacity(2)  # evicts all but the two most recent
        if at == 75:
            k._clear_records()  # every slot a tombstone, the last one used included
            misses = k.stats()["misses"]
        k[(1,)](x, x, x, 128, BLOCK=block, num_warps=warps)
        if at == 75:
            assert k.stats()["misses"] == misses + 1
    assert [launch.block[0] for launch in stand_in.launches()] == [32 * w for _, w in calls]
    stats = k.stats()
    assert stats["hits"] + stats["misses"] == len(calls) and stats["fallbacks"] == 0
    assert stats["evictions"] >= 10 and stats["specializations"] <= 2


def test_max_specializations_must_be_a_count(monkeypatch):
    monkeypatch.setenv("FASTKERNEL_MAX_SPECIALIZATIONS", "lots")
    with pytest.raises(ValueError, match="FASTKERNEL_MAX_SPECIALIZATIONS"):
        fastkernel(kernels.add_kernel)


def test_a_record_in_use_is_not_evicted_by_a_nested_launch(stand_in, monkeypatch):
    """A callable grid (Python) that launches the same kernel with a new specialization at
    capacity must not evict the record the outer call is about to launch."""
    monkeypatch.setenv("FASTKERNEL_MAX_SPECIALIZATIONS", "1")
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(128)
    k[(1,)](x, x, x, 128, BLOCK=16)  # registered: the outer call below is a hit

    def grid(meta):
        k[(1,)](x, x, x, 128, BLOCK=32)  # a miss at capacity, while the outer record is in use
        return (2,)

    k[grid](x, x, x, 128, BLOCK=16)
    outer, inner = stand_in.launches()[-1], stand_in.launches()[-2]
    assert inner.grid == (1, 1, 1) and inner.block == (128, 1, 1)
    assert outer.grid == (2, 1, 1)
    k[(1,)](x, x, x, 128, BLOCK=64)  # capacity is enforced again once nothing is in use
    assert k.stats()["specializations"] == 1


def test_the_table_reports_the_bytes_it_holds_per_specialization(stand_in):
    """table_bytes counts the slot array and, per specialization, its key and launch record; it
    grows by the same amount for each add-kernel specialization (at most 1 KiB) and drops back
    when the records are cleared."""
    from fastkernel import _C

    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    k[(1,)](x, x, x, 64, BLOCK=64)  # one real registration, for its cubin and launch facts
    base_one = k.stats()["table_bytes"]
    _target, spec, meta = k._registrations[next(iter(k._registrations))]
    facts = _C.LaunchFacts(
        kernel_name=meta.name, device=0, block_x=meta.block_x, plan=list(spec.plan)
    )
    sizes = [base_one]
    for i in range(6):  # keys no call builds: registering them changes no call
        k._insert(bytes([i + 1]) * 16, _C.LaunchRecord(facts, meta.cubin, None))
        sizes.append(k.stats()["table_bytes"])
    steps = {b - a for a, b in zip(sizes, sizes[1:])}
    assert len(steps) == 1, sizes  # 7 records: the slot array (16 slots) did not grow
    (per_specialization,) = steps
    assert 0 < per_specialization <= 1024
    k._clear_records()
    assert k.stats()["table_bytes"] < base_one and k.stats()["specializations"] == 0


# -- the record a miss returns ---------------------------------------------------------------------


def _one_record(stand_in, k):
    """A second launch record of ``k``'s one registered specialization, loaded and uninserted,
    with the launch facts it was built from."""
    from fastkernel import _C

    _target, spec, meta = k._registrations[next(iter(k._registrations))]
    facts = _C.LaunchFacts(
        kernel_name=meta.name, device=0, block_x=meta.block_x, plan=list(spec.plan)
    )
    return _C.LaunchRecord(facts, meta.cubin, None), facts, meta


def test_a_miss_launches_the_record_its_handler_returns(stand_in):
    """The compile-on-miss handler returns one loaded launch record; the native entry inserts it
    under the call's key and launches it, and the next call with that key is a hit."""
    from fastkernel import _C
    from fastkernel.kernel import FastKernel

    returned = []

    class Watched(FastKernel):
        def _on_miss(self, *args):
            result = super()._on_miss(*args)
            returned.append(result)
            return result

    k = Watched(kernels.add_kernel)
    x = torch.randn(64)
    k[(1,)](x, x, x, 64, BLOCK=64)
    assert len(returned) == 1 and isinstance(returned[0], _C.LaunchRecord)
    assert returned[0].inserted and returned[0].device == 0
    assert stand_in.launch_count() == 1
    assert stand_in.last_launch().name == returned[0].kernel_name
    k[(1,)](x, x, x, 64, BLOCK=64)
    stats = k.stats()
    assert (stats["misses"], stats["hits"], stats["specializations"]) == (1, 1, 1)
    assert len(returned) == 1 and stand_in.launch_count() == 2


def test_a_record_is_inserted_once_and_unloaded_when_dropped_uninserted(stand_in):
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    k[(1,)](x, x, x, 64, BLOCK=64)
    record, _facts, meta = _one_record(stand_in, k)
    assert not record.inserted and record.kernel_name == meta.name
    k._insert(b"\x05" * 16, record)  # a key no call builds
    assert record.inserted and k.stats()["specializations"] == 2
    with pytest.raises(ValueError, match="has been inserted"):
        k._insert(b"\x06" * 16, record)
    assert k.stats()["specializations"] == 2

    record, _facts, _meta = _one_record(stand_in, k)
    loads, retained = stand_in.module_loads(), stand_in.retained_bytes()
    del record
    gc.collect()
    assert stand_in.module_loads() == loads
    assert stand_in.retained_bytes() > retained  # the stand-in keeps what an unload released


def test_a_record_with_tuned_args_of_another_length_is_refused(stand_in):
    from fastkernel import _C

    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    k[(1,)](x, x, x, 64, BLOCK=64)
    _record, facts, meta = _one_record(stand_in, k)
    record = _C.LaunchRecord(facts, meta.cubin, None, tuned_args=(None,))
    with pytest.raises(ValueError, match="one item per parameter"):
        k._insert(b"\x05" * 16, record)
    assert not record.inserted and k.stats()["specializations"] == 1
    with pytest.raises(TypeError, match="tuned_args must be a tuple"):
        _C.LaunchRecord(facts, meta.cubin, None, tuned_args=[None] * 5)
    with pytest.raises(TypeError, match="global checks are"):
        _C.LaunchRecord(facts, meta.cubin, None, global_checks=(("g", 1),))


def test_a_record_reading_argument_slots_the_call_did_not_bind_is_refused(stand_in):
    """A record inserted under the key of a call that binds fewer argument slots than its plan
    reads (here: slot 5, the first tuple leaf, for add_kernel's five parameters and no tuple)
    raises RuntimeError on the hit and launches nothing: its packing would read slots the call
    never filled."""
    from fastkernel import _C

    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    k[(1,)](x, x, x, 64, BLOCK=64)
    key = next(iter(k._registrations))
    _target, spec, meta = k._registrations[key]
    plan = list(spec.plan)
    assert plan[-1][0] == 3  # n
    plan[-1] = (5, plan[-1][1])
    facts = _C.LaunchFacts(kernel_name=meta.name, device=0, block_x=meta.block_x, plan=plan)
    k._clear_records()
    k._insert(key, _C.LaunchRecord(facts, meta.cubin, None))
    launches = stand_in.launch_count()
    with pytest.raises(RuntimeError, match="reads 6 argument slots but the call binds 5"):
        k[(1,)](x, x, x, 64, BLOCK=64)
    assert stand_in.launch_count() == launches


@pytest.mark.parametrize("drop", ["evict", "clear"])
def test_a_dropped_record_whose_release_launches_the_kernel_leaves_the_table_whole(
    stand_in, monkeypatch, drop
):
    """Dropping a record releases what a launch returns (the compiled kernel); when that was its
    last reference, its finalizer runs Python, here a launch of the same kernel, while the
    table is dropping the record. The nested launch registers and launches; the table stays
    consistent for the calls after it."""
    monkeypatch.setenv("FASTKERNEL_MAX_SPECIALIZATIONS", "1" if drop == "evict" else "8")
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)
    nested = []

    def launch_again():
        nested.append(k[(2,)](x, x, x, 64, BLOCK=64))

    weakref.finalize(k[(1,)](x, x, x, 64, BLOCK=16), launch_again)
    k._compiled.clear()  # the record holds the compiled kernel's last reference now
    if drop == "evict":
        k[(3,)](x, x, x, 64, BLOCK=32)  # a miss at capacity 1 evicts the BLOCK=16 record
    else:
        k._clear_records()
    gc.collect()
    assert len(nested) == 1
    k[(4,)](x, x, x, 64, BLOCK=64)
    k[(5,)](x, x, x, 64, BLOCK=32)
    grids = [launch.grid[0] for launch in stand_in.launches()]
    assert grids == ([1, 2, 3, 4, 5] if drop == "evict" else [1, 2, 4, 5])


def test_a_grid_whose_release_launches_the_kernel_does_not_change_the_callers_grid(stand_in):
    """`kernel[grid]` reuses one bound launch per kernel and swaps its grid; releasing the old
    grid can run Python (here a finalizer launching the kernel with a third grid). Each call
    launches with its own grid."""
    k = fastkernel(kernels.add_kernel)
    x = torch.randn(64)

    def first_grid(meta):
        return (1,)

    weakref.finalize(first_grid, lambda: k[(3,)](x, x, x, 64, BLOCK=64))
    k[first_grid](x, x, x, 64, BLOCK=64)
    del first_grid  # the cached bound launch holds the grid's last reference
    k[(2,)](x, x, x, 64, BLOCK=64)
    assert [launch.grid[0] for launch in stand_in.launches()] == [1, 3, 2]


def test_identity_keyed_constexprs_are_kept_only_while_a_record_can_hold_them(
    stand_in, monkeypatch
):
    """A dtype object is keyed by identity, so its kernel keeps it alive while a registered key
    may hold its address; with a new object per call and a small table, the kept set stays
    bounded and the objects no record holds are freed."""
    import triton.language as tl

    monkeypatch.setenv("FASTKERNEL_MAX_SPECIALIZATIONS", "2")
    k = fastkernel(kernels.cast_kernel)
    x, out = torch.randn(64), torch.empty(64)
    dtypes = []
    for _ in range(40):
        dtype = tl.dtype("fp32")  # equal to tl.float32, a new object each time
        dtypes.append(weakref.ref(dtype))
        k[(1,)](out, x, 64, dtype, kernels.times_two, BLOCK=64)
        del dtype
    gc.collect()
    stats = k.stats()
    assert stats["misses"] == 40 and stats["specializations"] <= 2
    alive = sum(ref() is not None for ref in dtypes)
    assert 1 <= alive <= 8  # at most 4 per specialization the table holds
    assert dtypes[-1]() is not None  # the newest key's object is held
    k[(1,)](out, x, 64, dtypes[-1](), kernels.times_two, BLOCK=64)
    assert k.stats()["hits"] == 1
