"""The pool's reservation rules, on the real DeviceThreadHandlePool template.

The seam instantiates the same C++ template the cuDNN pool uses with a handle that
needs no GPU, so these run on CI. Each test uses its own device ordinals: the seam's
pool is process-wide, like the real one.
"""

import os
import threading
import time

import pytest

from conftest import outcome_in_forked_child
from torch_cudnn_handle import _C


def counts(device):
    created, free = _C._seam_counts().get(device, (0, 0))
    return created, free


def wait_until_free(device, expected_free, timeout=10.0):
    # A thread's window is returned by the C++ runtime as the OS thread exits, which
    # can be a moment after Thread.join() returns.
    deadline = time.monotonic() + timeout
    while counts(device)[1] != expected_free:
        assert time.monotonic() < deadline, f"device {device}: free={counts(device)[1]}, expected {expected_free}"
        time.sleep(0.001)


def hold_concurrently(n, device):
    """n threads that each reserve a handle and hold it until all have one."""
    barrier = threading.Barrier(n)
    ids = [None] * n

    def work(i):
        ids[i] = _C._seam_reserve(device)
        barrier.wait()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ids


def test_same_thread_same_device_gets_the_same_handle():
    first = _C._seam_reserve(100)
    assert _C._seam_reserve(100) == first
    assert _C._seam_reserve(101) != first  # one handle per device
    assert counts(100) == (1, 0) and counts(101) == (1, 0)


def test_n_concurrent_threads_get_n_distinct_handles():
    ids = hold_concurrently(8, device=110)
    assert len(set(ids)) == 8
    wait_until_free(110, 8)
    assert counts(110) == (8, 8)


def test_a_finished_threads_handle_is_reused():
    first = hold_concurrently(1, device=120)[0]
    wait_until_free(120, 1)
    second = hold_concurrently(1, device=120)[0]
    assert second == first
    wait_until_free(120, 1)
    assert counts(120) == (1, 1)


def test_thread_churn_creates_no_more_than_peak_concurrency():
    seen = set()
    for _ in range(50):
        seen.update(hold_concurrently(4, device=130))
        wait_until_free(130, counts(130)[0])
    assert counts(130)[0] == 4
    assert len(seen) == 4


def test_a_bigger_wave_grows_the_pool_only_to_its_peak():
    hold_concurrently(3, device=140)
    wait_until_free(140, 3)
    hold_concurrently(6, device=140)
    wait_until_free(140, 6)
    assert counts(140) == (6, 6)


def test_handles_are_created_outside_the_pool_mutex():
    _C._seam_set_create_delay_us(20_000)
    try:
        hold_concurrently(8, device=150)
    finally:
        _C._seam_set_create_delay_us(0)
    # Serialised creation (under the lock) would never overlap two creations.
    assert _C._seam_max_concurrent_creates() > 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_forked_after_handles_exist_is_refused():
    _C._seam_reserve(160)  # the parent has handles
    message = outcome_in_forked_child(lambda: _C._seam_reserve(160))
    assert "forked" in message and "spawn" in message, message
    assert _C._seam_reserve(160)  # the parent is unaffected
