"""A new layout's first calls on a stand-in, a fixed count of them (registry/graph_cache.py, Note
[A new layout's first calls]): with ``stand_in_calls=N`` the stand-in serves exactly a layout's
first N calls, whether its plan is built by then or not, and call N+1 gets the plan, waiting for
its build when it is not done: which implementation serves each call depends on the sequence of
calls alone, never on how long the build took. Without a GPU the build is a stand-in that takes
its time (a CPU seam: the cache's build function, as test_serving_mode.py)."""

import time

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle import settings
from conftest import run_concurrently
from support.timed_builds import define_relu, timed_cache

X = torch.empty(2, 3, 4)
KEY = ((2, 3, 4),)


@pytest.fixture
def cache(monkeypatch):
    made = timed_cache(monkeypatch)  # support/timed_builds.py
    with settings.override(stand_in_calls=3):
        yield made


def served(cache, calls: int, **lookup) -> list:
    """Who served each of ``calls`` calls: "stand-in" or "plan"."""
    return ["stand-in" if cache.lookup(cache.graph, 0, [X], KEY, stand_in="torch", **lookup) is None else "plan" for _ in range(calls)]


@pytest.mark.parametrize("build_seconds", [0.0, 0.3])
def test_the_stand_in_serves_exactly_the_first_n_calls_however_long_the_build(cache, build_seconds):
    cache.build_seconds = build_seconds
    if not build_seconds:  # a build done before the second call: the stand-in still serves the first three
        assert served(cache, 1) == ["stand-in"] and cache.wait_for_builds(5) == 0
        assert served(cache, 5) == ["stand-in"] * 2 + ["plan"] * 3
    else:  # a slow build: the fourth call waits for it
        started = time.perf_counter()
        assert served(cache, 3) == ["stand-in"] * 3 and time.perf_counter() - started < build_seconds / 2
        assert served(cache, 3) == ["plan"] * 3 and time.perf_counter() - started >= build_seconds * 0.9
    (route,) = cache.routes
    assert route.stand_in_calls == 3 and route.native == ("second_call" if tch.with_cuda else "never")  # native after the stand-in's
    stats = cache.stats()
    assert (stats["stand_in_calls"], stats["background_builds"], stats["builds"]) == (3, 1, 1)
    assert stats["routes"] == {route.label: 3} and "stand_in=torchx3" in route.label


def test_concurrent_first_calls_share_the_count(cache):
    cache.build_seconds = 0.2
    answers = run_concurrently(lambda i: served(cache, 1)[0], 6)
    assert sorted(answers) == ["plan"] * 3 + ["stand-in"] * 3


def test_deterministic_calls_and_the_serving_mode(cache):
    """Under deterministic algorithms the call builds and waits (one implementation per run);
    the serving mode (serving_mode) serves until the plan is ready, whatever the count."""
    cache.build_seconds = 0.0
    assert served(cache, 2, deterministic=True) == ["plan", "plan"]
    with settings.override(serving_mode=True):
        other = ((3, 3, 4),)
        assert cache.lookup(cache.graph, 0, [torch.empty(3, 3, 4)], other, stand_in="torch") is None
        assert cache.wait_for_builds(5) == 0
        assert cache.lookup(cache.graph, 0, [torch.empty(3, 3, 4)], other, stand_in="torch") is not None  # ready: the plan
    assert cache.routes[-1].stand_in_calls == -1


def test_no_stand_in_without_a_count_or_for_a_caller_without_one(cache):
    assert cache.lookup(cache.graph, 0, [X], KEY) is not None  # the caller has no stand-in: it builds and waits
    with settings.override(stand_in_calls=0):
        assert cache.lookup(cache.graph, 0, [torch.empty(5, 3, 4)], ((5, 3, 4),), stand_in="torch") is not None
    # The interpreter (a graph with no torch stand-in) serves only a graph that asks, with its own count.
    assert cache.lookup(cache.graph, 0, [torch.empty(6, 3, 4)], ((6, 3, 4),), stand_in="interpreter") is not None
    asked = define_relu(cache.definitions, "asked", stand_in_calls=1)
    assert cache.lookup(asked, 0, [X], KEY, stand_in="interpreter") is None
    assert cache.routes[-1].stand_in == "interpreter" and cache.routes[-1].stand_in_calls == 1


def test_a_registered_graph_opts_in_on_the_cpu_kernel_nothing_changes():
    """register_graph(stand_in_calls=N) is a CUDA route: a CPU call runs the interpreter anyway,
    and its route says so."""
    graph = tch.register_graph(lambda g, x: g.relu(x), name="counted", stand_in_calls=2)
    x = torch.randn(2, 3, 4)
    assert tch.explain(graph, [x]).runs_on == "interpreter"
    assert torch.equal(tch.execute(graph, [x])[0], torch.relu(x))
    with pytest.raises(TypeError, match="stand_in_calls must be a whole number"):
        tch.register_graph(lambda g, x: g.relu(x), name="bad_count", stand_in_calls=-1)
