"""Which way an ``nn.sdpa`` call goes: its exact plan, its length's bucket, or torch's attention while a plan builds.

Note [Attention off the caller's path]: with the ``serving_mode`` setting on as well,
no sdpa call waits for a build. A call whose plan (its bucket's, or a dense one) is not
built yet is served by torch's own attention (``torch_attention``) while the plan
builds off the caller's path (a dense plan in a build process, from its recipe; a
bucket's ragged plan on the build thread itself, where cuDNN's build holds the GIL, so
the caller's Python waits meanwhile), and a length's ``TAKE_OVER_CALLS``-th bucketed call
starts the exact (dense) plan's build for it, which serves that length once built, so a
length used often runs at an exact plan's steady cost. Never under deterministic
algorithms (one plan, built in the call: bitwise across calls), never while compiling or
capturing (what is built serves). These are cases of the call's route (registry/routes.py,
Note [One route per call]): ``attention_route`` asks for it, with torch's attention as the
stand-in, and keeps it per layout; whether the plan is ready is asked per call, until it is. A length's results can change within the
engines' numerics at two points: torch's attention to its bucket's plan, and that to its
exact plan.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import registry, settings, trace_constants
from ..op import plan_ready, route_of
from ..registry import TAKE_OVER_CALLS, Facts, Route
from ..registry.first_calls import call_site

__all__ = ["TAKE_OVER_CALLS", "attention_route", "exact_plan_took_over", "layout_of", "torch_attention", "torch_stands_in",
           "traced_length_buckets"]

_KEPT_LIMIT = 4096  # the most layouts each table below keeps, for the process (later ones are decided per call)


# Routes kept per call layout (exact graph, tensor type, device, q/k/v shapes and strides,
# dtype, deterministic mode): a route is decided once per layout (Note [One route per call]);
# what changes call by call is whether the plan is ready, which _ready and the graph cache
# answer (a captured call's own lookup never gets a stand-in). Cleared when a setting a route
# reads changes; for the process, at most _KEPT_LIMIT layouts.
_routes: Dict[tuple, Route] = {}


def layout_of(exact_graph: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    """An eager call's layout, the key of the tables here: exact graph, tensor type, device,
    q/k/v shapes and strides, dtype, deterministic mode. Made once per call."""
    return (exact_graph, type(q), q.device, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype,
            torch.are_deterministic_algorithms_enabled())


def attention_route(exact_graph: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, uniform: bool, layout: Optional[tuple] = None) -> Route:
    """nn.sdpa's route for this eager call (registry/routes.py decides, torch's attention the
    stand-in); a later call at the layout (``layout_of``) finds it kept, with one dict lookup."""
    key = layout or layout_of(exact_graph, q, k, v)
    route = _routes.get(key)
    if route is None:
        route = route_of(exact_graph, [q, k, v], stand_in="torch_attention", uniform_lengths=uniform)
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()  # a capture's route has no stand-in
        if len(_routes) < _KEPT_LIMIT and not capturing:
            _routes[key] = route
    return route


for _field in dataclasses.fields(registry.Resolved):  # a setting a route reads changes: decide again
    settings.watch(_field.name, lambda _value: _routes.clear())


@trace_constants.constant("sdpa_length_buckets")
def traced_length_buckets(exact_graph: int) -> bool:
    """Whether length buckets serve a traced self-attention call of ``exact_graph`` (its
    route's ``buckets``): read once per trace, a constant of the compiled frame (called as
    ``trace_constants.sdpa_length_buckets``, which marks it so without loading dynamo here)."""
    facts = Facts("shapes", compiling=True, uniform_lengths=True)
    return registry.route_for(exact_graph, None, (), (), facts).buckets == "length"


# torch's attention backends a stand-in may use: not torch's cuDNN backend, which builds a plan per length too.
_STAND_IN_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The stand-in: ``F.scaled_dot_product_attention`` (scale 1/sqrt(D), causal top-left, as the graphs)."""
    with sdpa_kernel(_STAND_IN_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


# (layout, call site) whose plan was found built: a steady call asks the registry no more (a plan
# evicted later is rebuilt by the op, its stand-in serving). Per call site: a site whose first
# calls torch's attention still serves asks the registry (Note [A new layout's first calls]),
# though another site's calls already take the plan. For the process, at most _KEPT_LIMIT keys.
_ready: set = set()


def torch_stands_in(graph_id: int, operands: list, route: Route, layout: Optional[tuple] = None) -> bool:
    """Whether torch's attention serves this call: the route has it stand in, and
    ``graph_id``'s plan for ``operands`` (``layout``: ``layout_of`` them) is building off the caller's
    path (started here if it was not)."""
    if route.stand_in != "torch_attention":
        return False
    key = (layout or layout_of(graph_id, *operands[:3]), call_site(asking=False))
    if key in _ready:
        return False
    if not plan_ready(graph_id, operands, route.stand_in):
        return True
    if len(_ready) < _KEPT_LIMIT:
        _ready.add(key)
    return False


# Calls a length's bucket served, per layout (``layout_of``), up to the
# route's take_over_after; _TOOK_OVER once its exact plan serves it. For the process, at
# most _KEPT_LIMIT keys (later ones stay bucketed).
_TOOK_OVER = -1
_bucketed_calls: Dict[tuple, int] = {}


def exact_plan_took_over(exact_graph: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, route: Route,
                         layout: Optional[tuple] = None) -> bool:
    """Whether ``exact_graph`` (a dense sdpa graph) serves this call rather than its bucket:
    its plan for these inputs was built off the caller's path after the route's
    ``take_over_after`` calls (Note [Attention off the caller's path]). Counts this call."""
    if not route.take_over_after:
        return False
    key = layout or layout_of(exact_graph, q, k, v)
    calls = _bucketed_calls.get(key, 0)
    if calls == _TOOK_OVER:
        return True
    if calls + 1 >= route.take_over_after and plan_ready(exact_graph, [q, k, v], route.stand_in):
        _bucketed_calls[key] = _TOOK_OVER
        return True
    if key in _bucketed_calls or len(_bucketed_calls) < _KEPT_LIMIT:
        _bucketed_calls[key] = calls + 1
    return False
