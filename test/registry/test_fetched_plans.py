"""A plan a build off the caller's path fetched (a build process's, or the plan store's) is loaded by
the call that takes it, never on the build thread (registry/build.py, Note [A fetched plan is loaded
by the call that takes it]): cuDNN's deserialize captures a CUDA graph of its own, which must not
overlap the caller's CUDA work. Without a GPU the fetched plan's load is a seam that takes its time
(support/timed_builds.py); what is checked is who loads it, when, and how often."""

import pytest
import torch

from torch_cudnn_handle import settings
from conftest import run_concurrently
from support.timed_builds import timed_cache

X = torch.empty(2, 3, 4)
KEY = ((2, 3, 4),)
BUILD, CALL_BUILD = "torch_cudnn_handle-build", "torch_cudnn_handle-call-build"


@pytest.fixture
def cache(monkeypatch):
    made = timed_cache(monkeypatch)
    made.fetch = True
    with settings.override(stand_in_calls=3):
        yield made


def served(cache, calls: int) -> list:
    return ["stand-in" if cache.lookup(cache.graph, 0, [X], KEY, stand_in="torch") is None else "plan" for _ in range(calls)]


def test_the_call_past_the_stand_ins_count_loads_it_on_a_call_build_thread(cache):
    assert served(cache, 1) == ["stand-in"]
    assert cache.wait_for_builds(5, take=False) == 0  # built and fetched (the exit hook's wait: nothing loaded)
    assert cache.entries() == [] and cache.load_threads == [] and cache.stats()["builds"] == 0
    assert served(cache, 4) == ["stand-in"] * 2 + ["plan"] * 2
    assert [name.rsplit("_", 1)[0] for name in cache.build_threads + cache.load_threads] == [BUILD, CALL_BUILD]
    assert len(cache.entries()) == 1 and cache.stats()["builds"] == 1 and cache.stats()["plan_sources"] == {"build_process": 1}


def test_concurrent_takers_share_one_load(cache):
    cache.load_seconds = 0.2
    assert served(cache, 3) == ["stand-in"] * 3
    answers = run_concurrently(lambda i: served(cache, 1)[0], 6)
    assert answers == ["plan"] * 6 and len(cache.load_threads) == 1 and len(cache.entries()) == 1


def test_wait_for_builds_loads_it_and_the_stand_ins_count_still_holds(cache):
    assert served(cache, 1) == ["stand-in"]
    assert cache.wait_for_builds(5) == 0
    assert len(cache.entries()) == 1 and [name.rsplit("_", 1)[0] for name in cache.load_threads] == [CALL_BUILD]
    assert served(cache, 4) == ["stand-in"] * 2 + ["plan"] * 2  # the same calls as without the wait: reproducible


def test_the_serving_mode_loads_it_at_the_first_call_after_it_is_ready(cache):
    with settings.override(serving_mode=True):
        assert served(cache, 1) == ["stand-in"]
        assert cache.wait_for_builds(5, take=False) == 0
        assert served(cache, 2) == ["plan", "plan"] and len(cache.load_threads) == 1


def test_a_failed_load_is_raised_by_its_call_and_not_kept(cache):
    cache.load_failures = 1
    with settings.override(stand_in_calls=1):
        assert served(cache, 1) == ["stand-in"]
        with pytest.raises(RuntimeError, match="rejected, and its build failed"):
            served(cache, 1)
        assert cache.entries() == []
        assert served(cache, 2) == ["stand-in", "plan"]  # a new first call: the stand-in, a build, then its plan
    assert len(cache.build_threads) == 2 and len(cache.load_threads) == 2
