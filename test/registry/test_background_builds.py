"""Builds off the caller's path (registry/graph_cache.py, Note [Builds off the caller's
path]): with a stand-in allowed, a new layout's first lookup returns at once and its build
runs on a build thread; later lookups get the built graph; deterministic calls wait; a
failed background build is raised by the next call's own build. Without a GPU the build
is a stand-in that takes its time (a CPU seam: the cache's build function)."""

import threading
import time

import pytest
import torch

from torch_cudnn_handle import settings
from support.timed_builds import timed_cache
from torch_cudnn_handle.registry import graph_cache

X = torch.empty(2, 3, 4)
KEY = ((2, 3, 4),)


@pytest.fixture
def cache(monkeypatch):
    """A GraphCache whose builds sleep ``cache.build_seconds`` and fail while ``cache.failures`` > 0 (support/timed_builds.py)."""
    made = timed_cache(monkeypatch, 0.2)
    with settings.override(serving_mode=True):  # the cache reads it on a miss
        yield made


def test_a_first_use_returns_at_once_and_builds_on_a_build_thread(cache):
    started = time.perf_counter()
    assert cache.lookup(cache.graph, 0, [X], KEY, stand_in="interpreter") is None
    assert cache.lookup(cache.graph, 0, [X], KEY, stand_in="interpreter") is None  # still building: the stand-in again
    assert time.perf_counter() - started < cache.build_seconds / 2
    assert cache.wait_for_builds(5) == 0
    built = cache.lookup(cache.graph, 0, [X], KEY, stand_in="interpreter")
    assert built is not None and cache.lookup(cache.graph, 0, [X], KEY) is built
    assert cache.build_threads == ["torch_cudnn_handle-build_0"]
    assert ["build_process" in route.plan_from for route in cache.routes] == [True]  # a build process may serve it (Note [The build process])
    stats = cache.stats()
    assert (stats["background_builds"], stats["builds"]) == (1, 1)


CALL_BUILD = "torch_cudnn_handle-call-build"  # Note [A call's build on a thread of its own]: the call waits for it


def test_without_a_stand_in_or_under_determinism_the_call_waits_for_its_build(cache):
    started = time.perf_counter()
    assert cache.lookup(cache.graph, 0, [X], KEY) is not None  # the op's default: build in the call
    assert cache.lookup(cache.graph, 0, [X], KEY, deterministic=True, stand_in="interpreter") is not None  # deterministic: never a stand-in
    assert time.perf_counter() - started >= 2 * cache.build_seconds  # each call waited for its build
    assert cache.stats()["background_builds"] == 0 and all(name.startswith(CALL_BUILD) for name in cache.build_threads), cache.build_threads


def test_a_call_waiting_for_a_background_build_under_determinism_gets_its_result(cache):
    cache.build_seconds = 0.3
    assert cache.lookup(cache.graph, 0, [X], KEY, stand_in="interpreter") is None
    assert cache.lookup(cache.graph, 0, [X], KEY) is not None  # no stand-in: waits for the build in flight
    assert cache.stats()["builds"] == 1


def test_a_failed_background_build_is_raised_by_the_next_calls_own_build(cache):
    cache.failures = 2
    assert cache.lookup(cache.graph, 0, [X], KEY, stand_in="interpreter") is None
    assert cache.wait_for_builds(5) == 0
    with pytest.raises(RuntimeError, match="cuDNN: no engine"):
        cache.lookup(cache.graph, 0, [X], KEY, stand_in="interpreter")  # in this call's path now, not the background's
    assert cache.lookup(cache.graph, 0, [X], KEY, stand_in="interpreter") is not None  # and once it builds, it is kept
    assert cache.build_threads[0].startswith("torch_cudnn_handle-build_") and all(t.startswith(CALL_BUILD) for t in cache.build_threads[1:])


def test_no_build_starts_while_capturing(cache, monkeypatch):
    monkeypatch.setattr(graph_cache, "_capturing", lambda device: True)
    with pytest.raises(RuntimeError, match="capturing a CUDA graph.*Warm up before capture"):
        cache.lookup(cache.graph, 0, [X], KEY, stand_in="interpreter")
    assert cache.stats()["background_builds"] == 0
