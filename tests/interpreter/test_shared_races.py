"""The interpreter's shared-memory race detector.

A thread may read a shared element only once the write that produced it is visible to
it: its own ``store_shared``; another thread's after a ``sync``; a ``copy_async`` after
``commit_group``, ``wait_group`` and ``sync``. It may not overwrite an element another
thread read since the last ``sync``. Each race below is paired with its correct version,
which must run clean and compute the right values.
"""

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm

RNG = np.random.default_rng(7)

#: a [32, 32] tile over 4 warps, two ways: thread t holds row t // 4 (8 columns) vs
#: column t // 4 (8 rows): the same element lives in different threads
ROWS = vm.spatial(32, 4).local(1, 8)
COLS = vm.column_spatial(4, 32).column_local(8, 1)


def test_the_two_layouts_put_elements_in_different_threads():
    assert ROWS.shape == COLS.shape == (32, 32)
    assert ROWS.num_threads == COLS.num_threads == 128
    assert ROWS.owners((0, 31)) != COLS.owners((0, 31))
    assert ROWS.owners((0, 0)) == COLS.owners((0, 0)) == [(0, 0)]


@vm.program(warps=4)
def raw_race(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32], with_sync: bool = True,
             read_layout=COLS):
    """y = x through shared memory: stored by rows, read by columns."""
    vm.set_grid(1)
    s = vm.shared_tensor(vm.float32, [32, 32])
    vm.store_shared(s, vm.load_global(vm.global_view(x, [32, 32]), [0, 0], [32, 32], ROWS))
    if with_sync:
        vm.sync()
    t = vm.load_shared(s, read_layout)  # <- raw read
    vm.store_global(vm.global_view(y, [32, 32]), t)


def _xy():
    return RNG.standard_normal((32, 32)).astype(np.float32), np.zeros((32, 32), np.float32)


def test_read_after_write_by_another_thread_without_sync_raises():
    x, y = _xy()
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(raw_race, x, y, with_sync=False)
    message = str(e.value)
    assert "test_shared_races.py:" in message and "raw read" in message
    assert "without a sync" in message and "vm.sync()" in message
    assert "load_shared" in message


def test_read_after_write_with_sync_is_clean():
    x, y = _xy()
    lowvm.interpret(raw_race, x, y, with_sync=True)
    np.testing.assert_array_equal(y, x)


def test_reading_own_writes_needs_no_sync():
    x, y = _xy()
    lowvm.interpret(raw_race, x, y, with_sync=False, read_layout=ROWS)
    np.testing.assert_array_equal(y, x)


@vm.program(warps=4)
def async_race(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32], commit: bool = True,
               wait: bool = True, sync: bool = True):
    """y = 2 x through shared memory, filled by copy_async."""
    vm.set_grid(1)
    s = vm.shared_tensor(vm.float32, [32, 32])
    vm.copy_async(s, vm.global_view(x, [32, 32]), [0, 0])
    if commit:
        vm.commit_group()
    if wait:
        vm.wait_group(0)
    if sync:
        vm.sync()
    t = vm.load_shared(s, ROWS)  # <- async read
    vm.store_global(vm.global_view(y, [32, 32]), t * 2.0)


@pytest.mark.parametrize("commit, wait, sync, problem", [
    (True, False, True, "not yet completed"),  # no wait_group
    (False, True, True, "not yet completed"),  # wait_group does not wait for uncommitted
    (False, False, False, "not yet completed"),
    (True, True, False, "after wait_group but before a sync"),  # no sync
])
def test_reading_copy_async_data_too_early_raises(commit, wait, sync, problem):
    x, y = _xy()
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(async_race, x, y, commit=commit, wait=wait, sync=sync)
    assert problem in str(e.value)
    assert "async read" in str(e.value)  # the line of the load_shared
    assert np.all(y == 0)


def test_copy_async_commit_wait_sync_is_clean():
    x, y = _xy()
    lowvm.interpret(async_race, x, y)
    np.testing.assert_array_equal(y, 2 * x)


@vm.program(warps=4)
def war_race(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32], second_sync: bool = True):
    """y = 3 x through one shared buffer used twice: x, then 2 x, read by columns."""
    vm.set_grid(1)
    gx = vm.global_view(x, [32, 32])
    t = vm.load_global(gx, [0, 0], [32, 32], ROWS)
    s = vm.shared_tensor(vm.float32, [32, 32])
    vm.store_shared(s, t)
    vm.sync()
    first = vm.load_shared(s, COLS)
    if second_sync:
        vm.sync()
    vm.store_shared(s, t * 2.0)  # <- war write
    vm.sync()
    second = vm.load_shared(s, COLS)
    vm.store_global(vm.global_view(y, [32, 32]), first + second)


def test_write_after_read_by_another_thread_without_sync_raises():
    x, y = _xy()
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(war_race, x, y, second_sync=False)
    assert "write-after-read" in str(e.value) and "war write" in str(e.value)


def test_write_after_read_with_sync_is_clean():
    x, y = _xy()
    lowvm.interpret(war_race, x, y, second_sync=True)
    np.testing.assert_array_equal(y, 3 * x)


TILE = 128  # elements per k-step


@vm.program(warps=1)
def double_buffered(n: vm.int32, x: vm.ptr[vm.float32], y: vm.ptr[vm.float32],
                    trailing_sync: bool = True):
    """y = the sum of the n tiles of x [n, TILE]: copy_async into two buffers, the next
    tile in flight while the current one is summed. The reads of a buffer must be
    separated by a sync from the copy that refills it."""
    vm.set_grid(1)
    gx = vm.global_view(x, [n * TILE])
    lay = vm.local(4).spatial(32)  # thread t holds t, t + 32, t + 64, t + 96
    bufs = [vm.shared_tensor(vm.float32, [TILE]) for _ in range(2)]
    acc = vm.register_tensor(vm.float32, [TILE], lay, 0.0)
    vm.copy_async(bufs[0], gx, [0])
    vm.commit_group()
    for k in vm.range(0, n, 2):
        for j in range(2):  # unrolled: buffer j holds tile k + j
            vm.copy_async(bufs[1 - j], gx, [(k + j + 1) * TILE])  # <- refill
            vm.commit_group()
            vm.wait_group(1)
            vm.sync()
            vm.add(acc, vm.load_shared(bufs[j], lay), out=acc)
            if trailing_sync:
                vm.sync()
    vm.store_global(vm.global_view(y, [TILE]), acc)


def test_double_buffered_loop_without_trailing_sync_raises():
    x = RNG.standard_normal((4, TILE)).astype(np.float32)
    y = np.zeros(TILE, np.float32)
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(double_buffered, 4, x, y, trailing_sync=False)
    message = str(e.value)
    assert "write-after-read" in message and "refill" in message and "copy_async" in message


@pytest.mark.parametrize("n", [2, 4, 6])
def test_double_buffered_loop_with_sync_is_clean(n):
    x = (RNG.integers(-64, 64, (n, TILE)) / 4).astype(np.float32)  # exact sums
    y = np.zeros(TILE, np.float32)
    lowvm.interpret(double_buffered, n, x, y, trailing_sync=True)
    np.testing.assert_array_equal(y, x.sum(0))


@vm.program(warps=1)
def uninitialised(x: vm.ptr[vm.float32], write_half: bool = False):
    """Read a shared tile nobody (or only half of it) wrote."""
    vm.set_grid(1)
    s = vm.shared_tensor(vm.float32, [64])
    if write_half:
        vm.store_shared(s, vm.register_tensor(vm.float32, [32], vm.spatial(32), 1.0))
    vm.sync()
    t = vm.load_shared(s, vm.spatial(32).local(2))  # <- uninit read
    vm.store_global(vm.global_view(x, [64]), t)


@pytest.mark.parametrize("write_half", [False, True])
def test_reading_never_written_shared_memory_raises(write_half):
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(uninitialised, np.zeros(64, np.float32), write_half=write_half)
    message = str(e.value)
    assert "never written" in message and "uninit read" in message


def test_written_then_synced_everywhere_is_clean():
    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        s = vm.shared_tensor(vm.float32, [64])
        vm.store_shared(s, vm.register_tensor(vm.float32, [64], vm.local(2).spatial(32), 1.5))
        vm.sync()
        vm.store_global(vm.global_view(x, [64]), vm.load_shared(s, vm.spatial(32).local(2)))

    x = np.zeros(64, np.float32)
    lowvm.interpret(prog, x)
    assert np.all(x == 1.5)


def test_overwriting_an_async_copy_in_flight_raises():
    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        s = vm.shared_tensor(vm.float32, [32])
        vm.copy_async(s, vm.global_view(x, [32]), [0])
        vm.commit_group()
        vm.store_shared(s, vm.register_tensor(vm.float32, [32], vm.spatial(32)))  # <- wip

    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(prog, np.zeros(32, np.float32))
    assert "copy_async is still writing" in str(e.value) and "wip" in str(e.value)


def test_each_block_has_its_own_shared_memory():
    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.int32]):
        vm.set_grid(3)
        s = vm.shared_tensor(vm.int32, [32])
        with vm.if_(vm.block_index() < 1):
            vm.store_shared(s, vm.thread_index())
        vm.sync()
        t = vm.load_shared(s, vm.spatial(32))  # <- other block
        vm.store_global(vm.global_view(x, [96]), t, [vm.block_index() * 32])

    x = np.zeros(96, np.int32)
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(prog, x)
    assert "block (1, 0, 0)" in str(e.value) and "never written" in str(e.value)
    np.testing.assert_array_equal(x[:32], np.arange(32))


@vm.program(warps=4)
def waw_race(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32], middle_sync: bool = True):
    """y = 2 x: x stored by rows, then overwritten with 2 x by columns."""
    vm.set_grid(1)
    gx = vm.global_view(x, [32, 32])
    s = vm.shared_tensor(vm.float32, [32, 32])
    vm.store_shared(s, vm.load_global(gx, [0, 0], [32, 32], ROWS))
    if middle_sync:
        vm.sync()
    vm.store_shared(s, vm.load_global(gx, [0, 0], [32, 32], COLS) * 2.0)  # <- waw write
    vm.sync()
    vm.store_global(vm.global_view(y, [32, 32]), vm.load_shared(s, ROWS))


def test_write_after_write_by_another_thread_without_sync_raises():
    x, y = _xy()
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(waw_race, x, y, middle_sync=False)
    assert "write-after-write" in str(e.value) and "waw write" in str(e.value)
    lowvm.interpret(waw_race, x, y, middle_sync=True)
    np.testing.assert_array_equal(y, 2 * x)


def test_replicated_store_then_same_threads_read_is_clean():
    # a reduced tile is held by several threads; they all store the same value
    lay = vm.spatial(8, 4).local(4, 1)  # [32, 4]
    col = lowvm.layouts.reduce(lay, [1])  # [32], each row held by 4 threads

    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        t = vm.load_global(vm.global_view(x, [32, 4]), [0, 0], [32, 4], lay)
        s = vm.shared_tensor(vm.float32, [32])
        r = vm.sum(t, 1)
        assert r.layout == col and col.replication == 4
        vm.store_shared(s, r)
        vm.sync()
        vm.store_global(vm.global_view(y, [32]), vm.load_shared(s, vm.spatial(32)))

    x = (RNG.integers(-8, 8, (32, 4)) / 2).astype(np.float32)
    y = np.zeros(32, np.float32)
    lowvm.interpret(prog, x, y)
    np.testing.assert_array_equal(y, x.sum(1))
