"""A new layout's first calls are counted per call site (registry/first_calls.py, Note [A new
layout's first calls]): each nn module is a site (``at_site``), its backward's calls find the site
on the forward's autograd node, a lowered compiled frame numbers each layout's calls in its run
(so does a backward node that is no module's), and any other call counts for the layout. So layers that
share a layout (q, k, v and o projections; a model's repeated blocks) each get their first N
calls on the stand-in. Without a GPU the build is a seam that takes its time (support/timed_builds.py)."""

import pytest
import torch

from torch_cudnn_handle import settings
from torch_cudnn_handle.registry.first_calls import at_site, call_site, frame_runner, new_site
from support.timed_builds import timed_cache

X = torch.empty(2, 3, 4)
KEY = ((2, 3, 4),)


@pytest.fixture
def cache(monkeypatch):
    made = timed_cache(monkeypatch)
    with settings.override(stand_in_calls=2):
        yield made


def served(cache, sites) -> list:
    """Who served one call from each of ``sites`` in turn (None: no module's)."""
    def lookup():
        return cache.lookup(cache.graph, 0, [X], KEY, stand_in="torch")

    return ["stand-in" if (lookup() if site is None else at_site(site, lookup)) is None else "plan" for site in sites]


@pytest.mark.parametrize("build_seconds", [0.0, 0.2])
def test_each_site_gets_its_first_n_calls_on_the_stand_in_however_long_the_build(cache, build_seconds):
    cache.build_seconds = build_seconds
    q, k, v, o = (new_site() for _ in range(4))  # four layers of one layout, called once a step
    steps = [served(cache, [q, k, v, o]) for _ in range(3)]
    assert steps == [["stand-in"] * 4, ["stand-in"] * 4, ["plan"] * 4]
    assert served(cache, [None, None, None]) == ["stand-in", "stand-in", "plan"]  # no module: the layout's own count
    assert cache.stats()["builds"] == 1 and cache.stats()["stand_in_calls"] == 10


def test_an_evicted_layout_counts_again(cache):
    site = new_site()
    assert served(cache, [site] * 3) == ["stand-in", "stand-in", "plan"]
    assert cache.evict_where(lambda graph_id, built: True) == 1
    assert served(cache, [site] * 3) == ["stand-in", "stand-in", "plan"]


class _Probe(torch.autograd.Function):
    """Reads the call site in its forward and backward, as a first call of the op does."""

    seen: list = []

    @staticmethod
    def forward(ctx, x):
        call_site()
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        _Probe.seen.append(call_site())
        return grad * 2


def test_a_backward_finds_the_site_of_its_forward():
    site, _Probe.seen = new_site(), []
    x = torch.ones(3, requires_grad=True)
    at_site(site, _Probe.apply, x).sum().backward()
    _Probe.apply(x).sum().backward()  # no module: no site
    assert _Probe.seen == [site, None] and call_site() is None
    untouched = at_site(site, torch.mul, x, 2)  # no first call read the site: its node is left as it is
    assert "torch_cudnn_handle.call_site" not in untouched.grad_fn.metadata


def _who_served(cache) -> str:
    return "stand-in" if cache.lookup(cache.graph, 0, [X], KEY, stand_in="torch") is None else "plan"


def test_a_lowered_frame_numbers_a_layouts_calls_in_each_run(cache):
    def frame():  # five norms of one layout in one compiled frame, as a lowered decoder calls them
        return [_who_served(cache) for _ in range(5)]

    def boxed(arguments):
        return frame()

    boxed._boxed_call = True
    run, run_boxed = frame_runner(new_site(), frame), frame_runner(new_site(), boxed)
    assert [run() for _ in range(3)] == [["stand-in"] * 5, ["stand-in"] * 5, ["plan"] * 5]
    assert run_boxed._boxed_call and not hasattr(run, "_boxed_call")
    assert run_boxed([]) == ["stand-in"] * 5  # another frame: sites of its own
    assert call_site() is None  # a run leaves no frame behind


class _ThreeCalls(torch.autograd.Function):
    """A compiled frame's backward node, as far as sites go: no module's, three calls of one layout."""

    cache = None
    served: list = []

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        _ThreeCalls.served.append([_who_served(_ThreeCalls.cache) for _ in range(3)])
        return grad * 2


def test_a_backward_node_of_no_module_numbers_its_calls_in_each_run(cache):
    _ThreeCalls.cache, _ThreeCalls.served = cache, []
    for _ in range(3):
        _ThreeCalls.apply(torch.ones(3, requires_grad=True)).sum().backward()
    assert _ThreeCalls.served == [["stand-in"] * 3, ["stand-in"] * 3, ["plan"] * 3]
