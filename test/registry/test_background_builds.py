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
from torch_cudnn_handle.registry import build as build_module, graph_cache
from torch_cudnn_handle.registry.data_types import GraphDataTypes
from torch_cudnn_handle.registry.definition import Definitions

X = torch.empty(2, 3, 4)
KEY = ((2, 3, 4),)


@pytest.fixture
def cache(monkeypatch):
    """A GraphCache whose builds sleep ``cache.build_seconds`` and fail while ``cache.failures`` > 0."""
    definitions = Definitions()
    made = graph_cache.GraphCache(definitions)
    made.build_seconds, made.failures, made.build_threads, made.off_path = 0.2, 0, [], []

    def slow_build(definition, device, specs, route):
        made.build_threads.append(threading.current_thread().name)
        made.off_path.append("build_process" in route.plan_from)
        time.sleep(made.build_seconds)
        if made.failures:
            made.failures -= 1
            raise RuntimeError("cuDNN: no engine")
        return build_module.BuiltGraph(graph=None, device=device, inputs=specs, layout=build_module.GraphLayout((), ()), uids=(),
                                       workspace_size=0, phase_seconds={})

    monkeypatch.setattr(graph_cache, "build", slow_build)
    monkeypatch.setattr(graph_cache, "_capturing", lambda device: False)
    made.graph = definitions.define(lambda g, x: g.relu(x), name="relu", params={}, backward=None, tune=None, output_shapes=None,
                                    data_types=GraphDataTypes(), dynamic_shapes=None, ragged=None, views=None, in_place=None)
    with settings.override(background_builds=True):  # the cache reads it on a miss
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
    assert cache.off_path == [True]  # a build process may serve it (Note [The build process])
    stats = cache.stats()
    assert (stats["background_builds"], stats["builds"]) == (1, 1)


def test_without_a_stand_in_or_under_determinism_the_call_waits_for_its_build(cache):
    assert cache.lookup(cache.graph, 0, [X], KEY) is not None  # the op's default: build in the call
    assert cache.lookup(cache.graph, 0, [X], KEY, deterministic=True, stand_in="interpreter") is not None  # deterministic: never a stand-in
    assert cache.stats()["background_builds"] == 0 and cache.build_threads == ["MainThread"] * 2


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
    assert cache.build_threads[0].startswith("torch_cudnn_handle-build") and cache.build_threads[1:] == ["MainThread"] * 2


def test_no_build_starts_while_capturing(cache, monkeypatch):
    monkeypatch.setattr(graph_cache, "_capturing", lambda device: True)
    with pytest.raises(RuntimeError, match="capturing a CUDA graph.*Warm up before capture"):
        cache.lookup(cache.graph, 0, [X], KEY, stand_in="interpreter")
    assert cache.stats()["background_builds"] == 0
