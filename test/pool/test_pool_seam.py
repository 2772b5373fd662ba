"""The pool's reservation rules, on the real DeviceThreadHandlePool template.

The seam (test/support/csrc/pool_seam.cpp, built by the ``pool_seam`` fixture in conftest.py;
not part of the shipped _C) instantiates the same C++ template the cuDNN pool uses
with a handle that needs no GPU, so these run on CI. Each test uses its own device
ordinals: the seam's pool is process-wide, like the real one.
"""

import os
import threading
import time

import pytest

from conftest import outcome_in_forked_child


def counts(seam, device):
    created, free = seam.counts().get(device, (0, 0))
    return created, free


def wait_until_free(seam, device, expected_free, timeout=10.0):
    # A thread's window is returned by the C++ runtime as the OS thread exits, which
    # can be a moment after Thread.join() returns.
    deadline = time.monotonic() + timeout
    while counts(seam, device)[1] != expected_free:
        assert time.monotonic() < deadline, f"device {device}: free={counts(seam, device)[1]}, expected {expected_free}"
        time.sleep(0.001)


def hold_concurrently(seam, n, device):
    """n threads that each reserve a handle and hold it until all have one."""
    barrier = threading.Barrier(n)
    ids = [None] * n

    def work(i):
        ids[i] = seam.reserve(device)
        barrier.wait()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ids


def test_same_thread_same_device_gets_the_same_handle(pool_seam):
    first = pool_seam.reserve(100)
    assert pool_seam.reserve(100) == first
    assert pool_seam.reserve(101) != first  # one handle per device
    assert counts(pool_seam, 100) == (1, 0) and counts(pool_seam, 101) == (1, 0)


def test_n_concurrent_threads_get_n_distinct_handles(pool_seam):
    ids = hold_concurrently(pool_seam, 8, device=110)
    assert len(set(ids)) == 8
    wait_until_free(pool_seam, 110, 8)
    assert counts(pool_seam, 110) == (8, 8)


def test_a_finished_threads_handle_is_reused(pool_seam):
    first = hold_concurrently(pool_seam, 1, device=120)[0]
    wait_until_free(pool_seam, 120, 1)
    second = hold_concurrently(pool_seam, 1, device=120)[0]
    assert second == first
    wait_until_free(pool_seam, 120, 1)
    assert counts(pool_seam, 120) == (1, 1)


def test_thread_churn_creates_no_more_than_peak_concurrency(pool_seam):
    seen = set()
    for _ in range(50):
        seen.update(hold_concurrently(pool_seam, 4, device=130))
        wait_until_free(pool_seam, 130, counts(pool_seam, 130)[0])
    assert counts(pool_seam, 130)[0] == 4
    assert len(seen) == 4


def test_a_bigger_wave_grows_the_pool_only_to_its_peak(pool_seam):
    hold_concurrently(pool_seam, 3, device=140)
    wait_until_free(pool_seam, 140, 3)
    hold_concurrently(pool_seam, 6, device=140)
    wait_until_free(pool_seam, 140, 6)
    assert counts(pool_seam, 140) == (6, 6)


def test_handles_are_created_outside_the_pool_mutex(pool_seam):
    pool_seam.set_create_delay_us(20_000)
    try:
        hold_concurrently(pool_seam, 8, device=150)
    finally:
        pool_seam.set_create_delay_us(0)
    # Serialised creation (under the lock) would never overlap two creations.
    assert pool_seam.max_concurrent_creates() > 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_forked_after_handles_exist_is_refused(pool_seam):
    # The seam compiles its own copy of csrc/pool/fork_guard.cpp, so this is the seam's
    # guard (its own "handles exist" flag and atfork handler), not _C's: separate state,
    # and the right one here, since the test is of the pool template with the guard.
    pool_seam.reserve(160)  # the parent has handles
    message = outcome_in_forked_child(lambda: pool_seam.reserve(160))
    assert "forked" in message and "spawn" in message, message
    assert pool_seam.reserve(160)  # the parent is unaffected
