"""Which route a call takes, asked without running it: ``route_of`` (what nn.sdpa follows) and ``explain``.

A call's route is decided by ``registry/routes.py`` alone (Note [One route per call]) from
the graph's definition, the settings and the call's facts; here those facts are read off
the call's inputs (its device by the op's one device rule, checks.py; deterministic mode;
a capture on that device; a trace) and handed to the registry, which answers with the
route kept on the built graph where the layout is built, else decides it now. Nothing is
built or run.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .. import registry
from .._extension import _C
from ..native import capturing
from ..registry import Facts, Route
from .checks import call_device, key_specs

__all__ = ["route_of", "explain"]


def route_of(graph_id: int, inputs: Sequence[torch.Tensor], *, stand_in: str = "interpreter", uniform_lengths: bool = False) -> Route:
    """The route of a call of ``graph_id`` with ``inputs`` whose caller can serve it with
    ``stand_in`` while its plan builds (the op's Python path: the interpreter)."""
    device = call_device(graph_id, inputs)
    fake = device.type == "meta" or any(isinstance(t, torch._subclasses.FakeTensor) for t in inputs)
    kind = "shapes" if fake else device.type
    facts = Facts(kind, torch.are_deterministic_algorithms_enabled(), kind == "cuda" and capturing(device.index),
                  torch.compiler.is_compiling(), stand_in, uniform_lengths, _C.with_cuda)
    return registry.route_for(graph_id, device.index if kind == "cuda" else None, inputs, key_specs(inputs), facts)


def explain(target, inputs: Sequence[torch.Tensor], **options) -> Route:
    """The route a call takes, and why: each choice with the setting or fact that made it
    (``print(tch.explain(graph, inputs))``). ``target``: a graph id, or a function of the
    library that has routes of its own (``torch_cudnn_handle.nn.sdpa``, with its keyword
    ``causal=``); nothing is built or run."""
    if isinstance(target, int) and not isinstance(target, bool):
        return route_of(target, inputs)
    route_function = getattr(target, "route_of", None)
    if route_function is None:
        raise TypeError(f"explain: pass a graph id (register_graph's) or torch_cudnn_handle.nn.sdpa, got {target!r}")
    return route_function(*inputs, **options)
