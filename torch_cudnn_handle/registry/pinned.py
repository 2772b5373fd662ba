"""Registered built graphs (``register_built_graph``): a ``cudnn.pygraph`` its author built,
pinned by id. It runs only on its device and only for the inputs it was built for; it is
never in the LRU and never evicted (the registry's exit hook drops it with the rest).
Thread-safe: one lock for the table.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Sequence

import cudnn
import torch

from . import describe as describing
from .build import BuiltGraph
from .definition import Definition, check_arity
from .specs import GraphLayout, TensorSpec, spec_of_cudnn_tensor

__all__ = ["PinnedGraphs", "built_graph_of"]


def built_graph_of(graph, inputs: Sequence[Any], outputs: Sequence[Any], *, device, name: Optional[str]) -> BuiltGraph:
    """The BuiltGraph of an author's built ``graph``, its tensors in the op's order; refuses what cannot run."""
    if not isinstance(graph, cudnn.pygraph):
        raise TypeError(
            f"register_built_graph: graph must be a cudnn.pygraph built with graph.build(...), got "
            f"{type(graph).__name__}; to hand over a builder function, use register_graph(builder)"
        )
    try:
        workspace_size = int(graph.get_workspace_size())
    except RuntimeError as error:  # the frontend's "Call build() first"
        raise ValueError(
            f"register_built_graph: the cudnn.pygraph is not built ({error}); call graph.build([cudnn.heur_mode.A]) "
            "first, or register_graph(builder) so the registry builds it per device"
        ) from None
    ordinal = torch.device("cuda", device).index if isinstance(device, int) else torch.device(device).index
    if ordinal is None:
        raise ValueError("register_built_graph: name the device the graph was built for, e.g. device='cuda:0'")
    in_specs = tuple(spec_of_cudnn_tensor(t, f"input {i}") for i, t in enumerate(inputs))
    out_specs = tuple(spec_of_cudnn_tensor(t, f"output {i}") for i, t in enumerate(outputs))
    describing.refuse_low_rank(name or "register_built_graph", in_specs)  # Note [Tensors of fewer than 3 dims]
    built = BuiltGraph(
        graph=graph, device=ordinal, inputs=in_specs, layout=GraphLayout(out_specs, tuple(range(len(out_specs)))),
        uids=tuple(t.uid for t in list(inputs) + list(outputs)), workspace_size=workspace_size,
    )
    return built


class PinnedGraphs:
    """graph id -> its registered built graph."""

    def __init__(self):
        self._lock = threading.Lock()
        self._table: Dict[int, BuiltGraph] = {}

    def pin(self, graph_id: int, built: BuiltGraph) -> None:
        with self._lock:
            self._table[graph_id] = built

    def get(self, graph_id: int) -> Optional[BuiltGraph]:
        return self._table.get(graph_id)

    def clear(self) -> None:
        with self._lock:
            self._table.clear()

    def checked(self, definition: Definition, specs: Sequence[TensorSpec]) -> BuiltGraph:
        """The graph of ``definition``, which must have been built for exactly ``specs``."""
        built = self._table[definition.graph_id]
        check_arity(definition, len(specs))
        for i, (got, expected) in enumerate(zip(specs, built.inputs)):
            if got != expected:
                raise ValueError(
                    f"cudnn_fe.execute: input {i} of graph {definition.name!r} is {got.describe()}, but the graph was built "
                    f"for {expected.describe()}. Pass a tensor of that layout (e.g. .contiguous() / .to(dtype)), or register "
                    "a builder (register_graph) so a graph is built for each layout."
                )
        return built

    def for_call(self, definition: Definition, device: int, inputs: Sequence[torch.Tensor]) -> BuiltGraph:
        """A call's graph: on its device only, for the inputs it was built for only."""
        built = self._table[definition.graph_id]
        if device != built.device:
            raise ValueError(
                f"cudnn_fe.execute: graph {definition.name!r} was built for cuda:{built.device} but the inputs are on "
                f"cuda:{device}; a built graph never runs on another device. Move the inputs, or register a builder "
                "(register_graph) so the graph is built per device."
            )
        return self.checked(definition, [TensorSpec.of(t) for t in inputs])
