"""Where a plan comes from: loaded from the plan store, or built (with a kernel cache, or
statically, tuned or not); which one served a graph is the ``plan_source`` of its ``BuiltGraph``.

  * ``"plan_store"``: the plan stored by an earlier build (this process or another),
    deserialized and checked (stored_graphs.py, store.py); no build;
  * ``"kernel_cache"``: described with dynamic shapes and built with the kernel cache of
    its graph structure (kernel_caches.py), so kernels compiled for another layout are
    reused;
  * ``"build_process"``: a background build, built by a build process (the backend's JSON,
    or the graph's recipe where a Python engine family may claim it) (build_process.py, Note [The build process]) and
    deserialized here, checked as a stored plan is;
  * ``"static"``: described and built as always.

A build with a kernel cache that fails is built again statically, and the slot
remembers why (``plan_source_reason``): every later graph of that structure then builds
statically, without trying the cache again. A built backend plan is stored for the
next process (when the plan store is on).

The package: ``store.py`` (bytes by key in a directory), ``stored_graphs.py`` (what a
stored plan is, and its key), ``kernel_caches.py``, ``tuning/`` (timing the candidates),
``build_process.py`` (with ``build_worker.py``, the helper's program); here ``obtain``,
which the registry's build calls.

Runs inside the caller's ``build_scope(device)``, on its thread, with its handle. What to
try is the call's route (routes.py); nothing here reads a setting.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import cudnn

from .. import describe as describing
from ..broadcasts import materialized_specs
from ..build_timing import PhaseClock
from ..routes import Route
from ..specs import GraphLayout, TensorSpec, layout_lists
from . import build_process, kernel_caches, store as plan_store, stored_graphs, tuning as plan_tuning

__all__ = ["Obtained", "obtain", "load_fetched", "engine_of", "DESERIALIZED_SOURCES"]


@dataclasses.dataclass
class Obtained:
    graph: Any  # cudnn.pygraph, built (or deserialized)
    outputs: list  # the description's output tensors
    layout: GraphLayout
    uids: Tuple[int, ...]
    choice: plan_tuning.PlanChoice
    source: str  # "static" | "kernel_cache" | "plan_store" | "build_process": where the plan came from
    source_reason: str
    engine: Optional[str] = None  # what serves it (engine_of); a disk entry's recorded one (a deserialized graph cannot name it)
    serialized: Optional[bytes] = None  # graph.serialize(as_bytes=True), when the plan store read or wrote it
    key: Optional[str] = None  # its plan store key (None: not stored)

    @property
    def fetched(self) -> bool:
        """A serialized plan not deserialized yet (``obtain(fetch_only=True)``): ``graph`` is None."""
        return self.graph is None and self.serialized is not None


DESERIALIZED_SOURCES = ("plan_store", "build_process")  # a plan deserialized here: it writes what its description declares


def obtain(definition, device: int, specs: Tuple[TensorSpec, ...], handle, route: Route, clock: PhaseClock,
           fetch_only: bool = False) -> Obtained:
    """The graph for ``specs``, loaded or built where ``route.plan_from`` says, in that order
    (Note [One route per call]); ``clock`` gets each phase's seconds (build_timing.py). Inputs
    the description materializes (``layout.materialized``) are keyed and timed at their full shape.
    ``fetch_only``: a plan from the store or a build process comes back checked and stored but
    not deserialized (``Obtained.fetched``; Note [A fetched plan is loaded by the call that takes it])."""
    deterministic, tuned = route.deterministic, route.tuned
    call_specs = specs  # as the call gave them (a build process describes from these)
    dynamic = "kernel_cache" in route.plan_from
    slot = kernel_caches.slot_for(definition.graph_id, device, specs, deterministic) if dynamic else None
    options = dict(kernel_cache=slot.cache, is_dynamic_shape_enabled=True) if slot is not None and not slot.refused else {}

    def describe(graph_options):
        described = describing.describe(definition, specs, handle, **graph_options)
        if deterministic:
            described.graph.deselect_numeric_notes([cudnn.numerical_note.NONDETERMINISTIC])
        return described

    graph, inputs, outputs, layout = describe(options)
    # What the graph reads (Note [Pointwise broadcasts]): the closure above describes these
    # from now on, at full shape, so a later description says nothing of the plan: kept here.
    materialized = layout.materialized
    specs = materialized_specs(specs, materialized)
    uids = tuple(t.uid for t in inputs + outputs)
    clock.lap("describe")
    key = None
    if "plan_store" in route.plan_from:  # the key (a fingerprint of the description) only serves the store
        operands = [(s.shape, s.stride, s.dtype) for s in (*specs, *layout.outputs)]
        key = stored_graphs.key_of(definition, device, graph, operands, deterministic, dynamic, tuned)
        clock.lap("key")

    if key is not None:
        found = stored_graphs.fetch_blob(key, uids)  # read and checked, not deserialized
        stored = None
        if found is not None:
            blob, metadata = found
            choice = plan_tuning.PlanChoice(plan=metadata.get("plan"), index=metadata.get("index"), source="plan_store", reason="from the plan store")
            stored = Obtained(None, outputs, layout, uids, choice, "plan_store", "loaded from the plan store", metadata.get("engine"), blob, key)
            stored = stored if fetch_only else load_fetched(stored, definition.name, handle)
        clock.lap("load")
        if stored is not None:
            return stored

    if "build_process" in route.plan_from and layout.all_declared():  # a helper builds what it can (build_process.offer)
        elsewhere = build_process.offer(graph, device, recipe=lambda: build_process.recipe_of(definition, call_specs))
        clock.lap("build_process")
        if elsewhere is not None:
            blob, engine = elsewhere
            why = stored_graphs.check_blob(blob, uids, backend_version=cudnn.backend_version(), frontend_version=cudnn.__version__)
            if why is not None:
                build_process.rejected(why)
            else:
                if key is not None:
                    stored_graphs.store_blob(key, blob, dict(plan=None, index=None, engine=engine, route="build_process"))
                    clock.lap("store")
                choice = plan_tuning.PlanChoice(plan=None, index=None, source="heuristic", reason="tuning off")
                sent = Obtained(None, outputs, layout, uids, choice, "build_process", "built by a build process", engine, blob, key)
                sent = sent if fetch_only else load_fetched(sent, definition.name, handle)
                clock.lap("load")
                if sent is not None:
                    return sent

    source, reason, choice, cache_error = "static", (slot.refused if slot is not None else "dynamic shapes off"), None, None
    if options:
        try:
            with slot.lock:  # one build at a time per kernel cache (kernel_caches.py)
                choice = _build_described(definition, tuned, device, specs, layout, uids, graph, handle, lambda: describe(options).graph, clock)
            source, reason = "kernel_cache", "dynamic shapes, the kernel cache of its structure"
        except Exception as error:  # noqa: BLE001 -- built statically instead (below)
            cache_error = error
            graph, inputs, outputs, layout = describe({})  # the dynamic description is spent
            layout = dataclasses.replace(layout, materialized=materialized)
            uids = tuple(t.uid for t in inputs + outputs)
            clock.lap("describe")
    if choice is None:
        # A static build that fails too is not the kernel cache's fault: it raises, and
        # the slot stays usable.
        choice = _build_described(definition, tuned, device, specs, layout, uids, graph, handle, lambda: describe({}).graph, clock)
        if cache_error is not None:
            slot.refused = reason = (
                f"the build with a kernel cache failed, so graphs of this structure build statically "
                f"({type(cache_error).__name__}: {cache_error})"
            )
    engine = engine_of(graph)
    clock.lap("inspect")

    serialized = None
    if key is not None:
        serialized = stored_graphs.serialized_plan(graph)
        clock.lap("serialize")
        if serialized is not None:
            stored_graphs.store_blob(key, serialized, dict(plan=choice.plan, index=choice.index, engine=engine, route=source))  # "route": the field's name on disk
            clock.lap("store")
    return Obtained(graph, outputs, layout, uids, choice, source, reason, engine, serialized, key if serialized is not None else None)


def load_fetched(obtained: Obtained, name: str, handle) -> Optional[Obtained]:
    """A fetched plan (``Obtained.fetched``) with its graph, deserialized on ``handle``; or None,
    the plan rejected (warned, dropped from the store) so the caller builds it."""
    graph, why = stored_graphs.deserialized(obtained.serialized, name, handle)
    if graph is not None:
        return dataclasses.replace(obtained, graph=graph)
    if obtained.key is not None and plan_store.store() is not None:
        plan_store.store().reject(obtained.key, why)
    if obtained.source == "build_process":
        build_process.rejected(why)
    return None


def engine_of(graph) -> str:
    """What serves the graph's selected plan: a frost (Python) engine's name, or the backend plan's."""
    engine = getattr(graph, "selected_engine", None)
    if engine is not None:
        return f"frost:{engine.name}"
    try:
        return f"backend:{graph.get_plan_name_at_index(graph._plan_index)}"
    except Exception:  # noqa: BLE001 -- a name is a report, never a reason to fail a build
        return "backend"


def _build_described(definition, tuned, device, specs, layout, uids, graph, handle, fresh_graph, clock: PhaseClock) -> plan_tuning.PlanChoice:
    return plan_tuning.build_graph(  # untuned: exactly graph.build([A, FALLBACK]), step by step
        graph,
        tune=tuned,
        device=device,
        handle=handle,
        input_specs=layout_lists(specs),
        output_specs=layout_lists(layout.outputs),  # timing's outputs: same extent whatever the build picks
        uids=uids,
        name=definition.name,
        fresh_graph=fresh_graph,
        lap=clock.lap,
    )
