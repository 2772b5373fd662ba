"""Building one graph for one device: ``_build`` and its result, ``BuiltGraph``.

``_build`` runs on the calling thread (cache.py makes sure one thread per key does),
inside ``build_scope(device)``, with that thread's pooled handle for the device:

  * the graph is obtained by routes.py: loaded from the plan store, or described and
    built with plan_tuning.build_graph (untuned: exactly ``graph.build([A, FALLBACK])``),
    with a kernel cache under dynamic shapes; under torch.use_deterministic_algorithms(True),
    among the engines cuDNN does not mark NONDETERMINISTIC only; ``route`` and
    ``build_seconds`` say how, and how long it took;
  * an output whose layout the builder declared must be written in that layout (a
    contract); an undeclared one is allocated as the build lays it out, which the
    description predicted for the fake kernel (output_strides.py; a miss warns, with
    the fix: declare it); a plan loaded from the store writes what its build wrote,
    which the store checked against the description;
  * a backend-served plan is handed to the native path (``native.backend_plan_of``,
    ``_C.native_register``), deserialized here, in the build scope; if that fails for
    any reason the graph stays on the Python path, which runs every plan, and
    ``path_reason`` says why.

A ``BuiltGraph`` belongs to its device: the device is part of the cache key, and a
registered built graph refuses inputs on another device.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Optional, Tuple

from .. import _C, plan_tuning
from ..build_scope import build_scope
from ..native import backend_plan_of
from .description import _Definition
from .operand_views import described_specs, natural_outputs
from .routes import obtain
from .specs import GraphLayout, TensorSpec, layout_lists, torch_dtype_of


@dataclasses.dataclass(frozen=True)
class BuiltGraph:
    """A graph built for one device and one set of input specs."""

    graph: Any  # cudnn.pygraph, built
    device: int
    inputs: Tuple[TensorSpec, ...]
    layout: GraphLayout
    uids: Tuple[int, ...]  # operand uids, inputs then outputs: the op's buffer order
    workspace_size: int
    native: bool = False  # cudnn_fe.execute runs it from C++ (native.py)
    path_reason: str = ""  # why it runs where it runs
    engine: str = ""  # what serves it: a frost engine's name, or the backend plan's
    native_serial: int = 0  # the native plan's id in the extension (0: none)
    plan: Optional[str] = None  # the selected plan's name when plan tuning applied (None: untuned, the heuristics' choice)
    tuning: Optional[plan_tuning.PlanChoice] = None  # what plan_tuning.build_graph selected, and why
    deterministic: bool = False  # built among deterministic engines (torch.use_deterministic_algorithms)
    route: str = "static"  # how it was obtained: "static" | "kernel_cache" | "disk_cache" (routes.py)
    route_reason: str = ""  # why that route
    build_seconds: float = 0.0  # wall time to obtain it: describe, build or load, native registration
    phase_seconds: Optional[dict] = None  # build_seconds by phase: describe, load, build, store (routes.py), native
    # Per operand (inputs then outputs), the (shape, stride) the graph has for it, for a
    # graph with OperandViews (None: the op's own). The Python path hands the frontend
    # those views (a Python engine may read a buffer's shape); the native path binds addresses only.
    graph_views: Optional[Tuple[Tuple[Tuple[int, ...], Tuple[int, ...]], ...]] = None


def _build(
    definition: _Definition, device: int, specs: Tuple[TensorSpec, ...], native_enabled: bool, *, deterministic: bool = False
) -> BuiltGraph:
    started = time.perf_counter()
    with build_scope(device) as handle:
        try:
            obtained = obtain(definition, device, specs, handle, deterministic)
        except Exception:
            if not deterministic:
                raise
            # Was it the filter? Built without it, the graph has only non-deterministic
            # plans: torch's rule for such an op (an error, or a warning with warn_only).
            obtained = obtain(definition, device, specs, handle, False)
            _C.alert_not_deterministic(f"cudnn_fe.execute (graph {definition.name!r}, {', '.join(s.describe() for s in specs)})")
            deterministic = False
        graph, outputs, uids, choice = obtained.graph, obtained.outputs, obtained.uids, obtained.choice
        layout = obtained.layout if obtained.route == "disk_cache" else _built_layout(definition, specs, outputs, obtained.layout)
        workspace = int(graph.get_workspace_size())
        engine = obtained.engine or _engine_of(graph)
        native, serial, reason = False, 0, "native path disabled"
        native_started = time.perf_counter()
        if native_enabled:
            spec, reason = backend_plan_of(graph, uids, obtained.serialized)
            if spec is not None:
                try:  # deserialized here, inside the build scope, with this thread's handle for the device
                    serial, _ = _C.native_register(
                        definition.graph_id, device, layout_lists(specs), layout_lists(layout.outputs), list(uids),
                        spec.plan_json.encode("utf-8"), by_value=list(spec.by_value), fe_workspace_size=spec.fe_workspace_size,
                        workspace_tensors=list(spec.workspace_tensors), replacements=list(spec.replacements),
                        output_positions=list(layout.output_positions), deterministic=deterministic,
                    )
                    native, reason = True, "backend plan, run from C++"
                except Exception as error:  # noqa: BLE001 -- the Python path runs every plan; say why this one is there
                    reason = f"native registration failed, so the Python path runs it ({type(error).__name__}: {error})"
    graph_views = None
    if definition.views is not None:
        graph_views = tuple((s.shape, s.stride) for s in described_specs(definition.name, definition.views, specs))
        graph_views += tuple((tuple(t.dim), tuple(t.stride)) for t in outputs)
    return BuiltGraph(
        graph, device, specs, layout, uids, workspace, native, reason, engine, serial, plan=choice.plan, tuning=choice,
        graph_views=graph_views,
        deterministic=deterministic, route=obtained.route, route_reason=obtained.route_reason,
        build_seconds=time.perf_counter() - started, phase_seconds=dict(obtained.seconds, native=time.perf_counter() - native_started),
    )


def _engine_of(graph) -> str:
    """What serves the graph's selected plan: a frost (Python) engine's name, or the backend plan's."""
    engine = getattr(graph, "selected_engine", None)
    if engine is not None:
        return f"frost:{engine.name}"
    try:
        return f"backend:{graph.get_plan_name_at_index(graph._plan_index)}"
    except Exception:  # noqa: BLE001 -- a name is a report, never a reason to fail a build
        return "backend"


def _built_layout(definition: _Definition, specs, outputs, described: GraphLayout) -> GraphLayout:
    """The outputs as the build writes them. A declared layout is a contract: the build
    must write exactly it. An undeclared one is what the build chose (the frontend
    reflects the backend's layout inference into the built graph's tensors); when that
    differs from what the description predicted, a trace made earlier described other
    strides, so say so, with the fix."""
    built = [TensorSpec(tuple(t.dim), tuple(t.stride), torch_dtype_of(t.data_type)) for t in outputs]
    written_specs = natural_outputs(definition.name, definition.views, specs, built)  # as the op allocates them
    layouts = []
    for i, (written, expected) in enumerate(zip(written_specs, described.outputs)):
        if described.is_declared(i) and written != expected:
            raise ValueError(
                f"graph {definition.name!r}: the build writes output {i} as {written.describe()}, but the builder "
                f"declared {expected.describe()}; declare the layout the graph writes, or leave the strides undeclared "
                "(the op then allocates what the build writes)"
            )
        if not described.is_declared(i) and _differs_in_memory(written, expected):
            warnings.warn(
                f"graph {definition.name!r}: the build writes output {i} as {written.describe()}, but its description "
                f"(what torch.compile traces) predicted {expected.describe()}; the op returns what the build writes. "
                "Declare the output's layout in the builder (tensor.set_dim(...).set_stride(...)) so both agree.",
                stacklevel=2,
            )
        layouts.append(written)
    return dataclasses.replace(described, outputs=tuple(layouts))


def _differs_in_memory(a: TensorSpec, b: TensorSpec) -> bool:
    """Another shape or dtype, or another stride for a dim of more than one element
    (torch, and inductor's stride asserts, ignore the stride of a dim of size 1)."""
    if (a.shape, a.dtype) != (b.shape, b.dtype):
        return True
    return any(n > 1 and x != y for n, x, y in zip(a.shape, a.stride, b.stride))
