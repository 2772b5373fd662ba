"""The graph registry: graph builders (or built graphs) in, int ids out.

``torch.ops.cudnn_fe.execute`` takes a graph as an int id, so it works with opcheck,
torch.compile, export and CUDA graphs on every torch version. An id names a
``Definition``; the registry turns a definition and a call's inputs into a built graph.
One line of dependencies, each module importing only those before it:

  specs -> data_types, operand_views, ragged, in_place, output_strides, build_timing, broadcasts, buckets
  -> backward_operands -> backward -> definition -> routes -> describe -> symbolic
  -> plans/ (store, stored_graphs, kernel_caches, tuning/) -> build -> pinned -> graph_cache -> here
(routes.py decides each call's route: Note [One route per call].)

Here: the public functions on the one process-wide table of definitions and cache of
built graphs, and the package-public ones the op (``torch_cudnn_handle.op``) and the
stats read. Every function here is thread-safe.
"""

from __future__ import annotations

import atexit
import threading
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from .. import settings
from .._extension import _C
from . import describe as describing
from .backward import OLD_KEYWORDS, Backward, from_keywords
from .backward_operands import BackwardOperand, BackwardStep
from .broadcasts import materialize
from .buckets import Buckets, narrowed, padded
from .build import BuiltGraph
from .data_types import GraphDataTypes
from .definition import Definition, Definitions, check_arity
from . import pinned
from .graph_cache import EXIT_WAIT_SECONDS, GraphCache
from .operand_views import OperandViews
from .plans import kernel_caches
from .ragged import Ragged
from .routes import TAKE_OVER_CALLS, Facts, Resolved, Route, decide
from .specs import GraphLayout, TensorSpec, is_host_scalar, torch_dtype_of
from .symbolic import hint_specs, is_symbolic, output_layouts, shaped_outputs
from .in_place import check_layouts

__all__ = [
    "Backward", "BackwardOperand", "BackwardStep", "Buckets", "OperandViews", "Ragged", "TensorSpec", "GraphLayout", "BuiltGraph",
    "Route", "Facts", "Resolved", "TAKE_OVER_CALLS",
    "Definition", "register_graph", "register_built_graph", "graph_name", "built_graphs",
    # package-public: the op, the stats and the tests read these
    "definition", "find_definition", "definitions", "differentiable", "built_for", "route_for", "kept_graph", "layout", "description", "wait_for_builds", "record_first_execution", "count_call",
    "graph_stats", "BUCKETED", "BUCKET_RULES",
    # the op's helpers from the registry's modules (the op imports the registry's face only)
    "materialize", "padded", "narrowed", "is_host_scalar", "torch_dtype_of", "hint_specs", "is_symbolic", "output_layouts",
    "shaped_outputs", "check_layouts",
]

_definitions = Definitions()
# Graphs registered with buckets=, for the op's entries (op/eager.py): BUCKETED maps an id to
# (name, Buckets.rule), one lookup per eager call; BUCKET_RULES holds the same as a tuple,
# replaced (never mutated) at each such registration, which a compiled frame reads as a
# constant (a registration after a compile recompiles it). Both live for the process.
BUCKETED: dict = {}
BUCKET_RULES: tuple = ()
_bucket_lock = threading.Lock()
_pinned = pinned.PinnedGraphs()
_graph_cache = GraphCache(_definitions, _pinned)
settings.watch("graph_cache_capacity", lambda _capacity: _graph_cache.evict_over_capacity())  # a smaller one evicts now


def _follow_reference_path(on) -> None:
    """The reference_path setting applies at once: switched on, every graph cuDNN built is
    dropped (its native plan with it), switched off, every interpreter entry, but those
    of graphs registered with ``reference=`` True or False, which the setting does not
    move; each is then obtained again as the setting now says. (The environment variable
    is read when a graph is built for a layout, as ``native_path`` is.)"""

    def moves(graph_id: int, built: BuiltGraph) -> bool:
        found = _definitions.find(graph_id)
        return found is not None and found.reference is None and (built.route.runs_on == "interpreter") != bool(on)

    _graph_cache.evict_where(moves)


settings.watch("reference_path", _follow_reference_path)


@atexit.register
def _drop_built_graphs() -> None:
    """Release the cached graphs while CUDA is still up (atexit runs before interpreter
    teardown), instead of leaving them to the frontend's bindings to report as leaked.
    Native plans are left to the process's end (Note [Leaked on purpose] in
    csrc/pool/device_thread_handle_pool.h). Builds in flight on other threads are waited
    for first, a bounded time. A child forked after handles existed has no CUDA state to
    release them into: it leaves them."""
    if _C.with_cuda and _C.forked_after_handles():
        return
    still_building = _graph_cache.wait_for_builds(EXIT_WAIT_SECONDS, take=False)  # see graph_cache.py's "Exit"
    if still_building:
        warnings.warn(f"torch_cudnn_handle: exiting with {still_building} cuDNN build(s) still in flight after {EXIT_WAIT_SECONDS:g} s")
        return  # their threads still use the cache: leave it to the process's end
    _graph_cache.drop_built()
    describing.described_layout.cache_clear()
    describing.described.cache_clear()
    kernel_caches.clear()


def register_graph(
    builder: Callable[..., Any],
    *,
    name: Optional[str] = None,
    params: Optional[Mapping[str, Any]] = None,
    backward: Optional[Backward] = None,
    in_place: Optional[Mapping[int, int]] = None,
    views: Optional[OperandViews] = None,
    ragged: Optional[Mapping[int, Ragged]] = None,
    tune: Optional[bool] = None,
    dynamic_shapes: Optional[bool] = None,
    output_shapes: Optional[Callable[..., Sequence[Sequence[Any]]]] = None,
    io_data_type: Any = None,
    intermediate_data_type: Any = None,
    compute_data_type: Any = None,
    reference: Optional[bool] = None,
    serving_mode: Optional[bool] = None,
    buckets: Optional[Buckets] = None,
    stand_in_calls: Optional[int] = None,
    stand_in: Optional[Callable[..., Any]] = None,
    **deprecated: Any,
) -> int:
    """Register a graph builder; returns the id ``torch.ops.cudnn_fe.execute`` takes (the same
    in every process that registers the same definition: Note [Graph ids] in definition.py).

    ``builder(graph, *inputs, **params)`` adds nodes to ``graph`` (a ``cudnn.pygraph``) for
    ``inputs`` (one ``cudnn`` tensor per op input, with the call's shapes, strides and
    dtypes) and returns its output tensor or a sequence of them. ``params`` are passed to
    every call of the builder and are part of the definition: other parameters, another id.

    * Inputs: CUDA tensors on one device, and host scalars (a one-element CPU tensor,
      ``torch.tensor(1e-5)``: a pass-by-value operand, read when the plan runs). All on
      the CPU, the call runs on the reference interpreter (op/reference.py).
    * ``backward``: a ``Backward`` (``Backward.graph``, ``.steps`` or ``.function``) makes
      the op differentiable (registry/backward.py).
    * ``io_data_type`` / ``intermediate_data_type`` / ``compute_data_type``: torch dtypes or
      ``cudnn.data_type``; by default io is the first floating-point input's dtype,
      intermediate and compute float32 (registry/data_types.py).
    * ``views``: natural operands (``OperandViews``, registry/operand_views.py); ``ragged``:
      packed ``[T, H, D]`` inputs with ragged offsets (``Ragged``, registry/ragged.py);
      ``in_place={output: input}``: outputs written into inputs, run with ``execute_``.
    * ``tune``, ``dynamic_shapes``, ``stand_in_calls``, ``serving_mode``: over the
      settings of those names (Note [A new layout's first calls] for the last two), whose
      calls ``stand_in(*inputs)`` serves (torch ops returning the outputs) or the interpreter;
      ``buckets``: a ``Buckets`` naming input dims that take any size, zero-padded to a
      bucket so a plan per bucket serves every size (Note [Size buckets], buckets.py);
      ``output_shapes(*input_shapes)``: output shapes under ``torch.compile(dynamic=True)``
      when they do not simply follow input dims (registry/symbolic.py).
    * ``reference=True``: CUDA calls run on the torch interpreter (``torch_cudnn_handle.
      interpreter``) instead of cuDNN, never built, never native (debugging; its declared
      backward graph too); ``False`` keeps cuDNN whatever the ``reference_path`` setting
      says; None follows it. CPU calls always run on the interpreter.

    The guide (docs/registering-graphs.md) has each with an example. The forms of earlier
    releases (``register_graph(f, eps=1e-5)``, ``backward_fn=``) warn, naming the new one.
    """
    name = name or getattr(builder, "__name__", "graph")
    old = {key: deprecated.pop(key) for key in list(deprecated) if key in OLD_KEYWORDS}
    if deprecated:
        if params is not None:
            raise TypeError(f"register_graph({name!r}): unknown options {sorted(deprecated)}; builder parameters go in params={{...}}")
        warnings.warn(
            f"register_graph({name!r}): builder parameters as keywords ({', '.join(sorted(deprecated))}) are deprecated; pass "
            f"params={{{', '.join(repr(k) + ': ...' for k in sorted(deprecated))}}}",
            DeprecationWarning, stacklevel=2,
        )
        params = deprecated
    graph_id = _definitions.define(
        builder, name=name, params={} if params is None else params, backward=from_keywords(name, backward, old), tune=tune,
        output_shapes=output_shapes,
        data_types=GraphDataTypes.chosen(io=io_data_type, intermediate=intermediate_data_type, compute=compute_data_type),
        dynamic_shapes=dynamic_shapes, ragged=ragged, views=views, in_place=in_place, reference=reference,
        serving_mode=serving_mode, buckets=buckets, stand_in_calls=stand_in_calls, stand_in=stand_in,
    )
    if buckets is not None:
        global BUCKET_RULES
        with _bucket_lock:
            BUCKETED[graph_id] = (name, buckets.rule)
            BUCKET_RULES = BUCKET_RULES + ((graph_id, name, buckets.rule),)
    return graph_id


def register_built_graph(graph, inputs: Sequence[Any], outputs: Sequence[Any], *, device, name: Optional[str] = None) -> int:
    """Register a ``cudnn.pygraph`` that is already built, with its input and output
    tensors in the op's order. It runs only on ``device`` and only for inputs of
    exactly the shapes, strides and dtypes it was built for."""
    built = pinned.built_graph_of(graph, inputs, outputs, device=device, name=name)
    graph_id = _definitions.add_built(name or "built_graph", len(built.inputs))
    _pinned.pin(graph_id, built)
    return graph_id


def graph_name(graph_id: int) -> str:
    """The name a graph was registered under (its builder's name unless ``name=`` was given)."""
    return _definitions.get(graph_id).name


def built_graphs(graph_id: int) -> list:
    """The cached BuiltGraph objects of ``graph_id`` (one per device and input layout; a
    registered built graph's one); an unknown id raises."""
    definition = _definitions.get(graph_id)  # an unknown id is an error, not "nothing built yet"
    if definition.is_built:
        built = _pinned.get(graph_id)
        return [] if built is None else [built]
    return _graph_cache.entries(graph_id)


# -- package-public: the op, the stats and the tests ---------------------------------


def definition(graph_id: int) -> Definition:
    """The definition ``graph_id`` names; an unknown id is a ValueError with the fix."""
    return _definitions.get(graph_id)


def find_definition(graph_id: int) -> Optional[Definition]:
    """The definition of ``graph_id``, or None for an unknown id."""
    return _definitions.find(graph_id)


def definitions() -> list:
    """Every definition registered in this process, in id order."""
    return _definitions.all()


def differentiable(graph_id: int) -> Definition:
    """The definition of ``graph_id``, which must have a backward."""
    return _definitions.differentiable(graph_id)


def built_for(graph_id: int, device: int, inputs: Sequence[torch.Tensor], key_specs: tuple, deterministic: bool, *, call: bool = True,
              stand_in: str = "") -> Optional[BuiltGraph]:
    """The graph built for a call's inputs (graph_cache.py ``GraphCache.lookup``); None while
    its plan builds off the call's path and ``stand_in`` (the caller's: "interpreter",
    "torch_attention") serves, where the call's route says so (routes.py)."""
    return _graph_cache.lookup(graph_id, device, inputs, key_specs, deterministic, call=call, stand_in=stand_in)


def route_for(graph_id: int, device: Optional[int], inputs: Sequence[torch.Tensor], key_specs: tuple, facts: Facts) -> Route:
    """The route of a call with these inputs and ``facts``: the one kept on its built graph
    where this layout of a CUDA call is built, else decided now (Note [One route per call]); builds nothing."""
    kept = kept_graph(graph_id, device, inputs, key_specs, facts.deterministic) if facts.device == "cuda" else None
    return kept.route if kept is not None else decide(_definitions.get(graph_id), Resolved.now(), facts)


def kept_graph(graph_id: int, device: int, inputs: Sequence[torch.Tensor], key_specs: tuple, deterministic: bool) -> Optional[BuiltGraph]:
    return _graph_cache.kept(graph_id, device, inputs, key_specs, deterministic)  # nothing built, counted or handed over


def layout(graph_id: int, specs: Sequence[TensorSpec], device: Optional[int] = None) -> GraphLayout:
    """The output layout of ``graph_id`` for inputs ``specs``, from its description
    (lowered with ``device``'s pooled handle where there is a GPU)."""
    found = _definitions.get(graph_id)
    if found.is_built:
        return _pinned.checked(found, specs).layout
    check_arity(found, len(specs))
    return describing.described_layout(found, found.call_specs(specs), device)


def description(graph_id: int, specs: Sequence[TensorSpec], device: Optional[int] = None) -> describing.Description:
    """The description of a call of ``graph_id`` with inputs ``specs`` (kept per definition
    and specs: describe.py ``described``), what the reference interpreter runs. A
    registered built graph has none: its builder is not the registry's."""
    found = _definitions.get(graph_id)
    if found.is_built:
        raise ValueError(
            f"cudnn_fe.execute: graph {found.name!r} is a registered built graph (register_built_graph): it has no builder "
            "to describe, so only cuDNN runs it, on the device it was built for; register its builder (register_graph) to run "
            "it on the reference interpreter (CPU tensors, or the reference_path setting)"
        )
    check_arity(found, len(specs))
    return describing.described(found, found.call_specs(specs), device)


def wait_for_builds(timeout: float) -> int:
    """Wait, at most ``timeout`` seconds, until no build is in flight (the build threads' included),
    and load the plans they fetched here, as the call taking each would; how many still are."""
    return _graph_cache.wait_for_builds(timeout)


def count_call(label: str) -> None:
    """A call served on the route ``label`` names, for ``stats.graphs()["routes"]``."""
    _graph_cache.count_call(label)


def record_first_execution(built: BuiltGraph, seconds: float) -> None:
    _graph_cache.record_first_execution(built, seconds)


def graph_stats() -> dict:
    """The graph cache's counters (stats.graphs() reads them)."""
    return _graph_cache.stats()
