"""Building one graph for one device: ``_build`` and its result, ``BuiltGraph``.

``_build`` runs on the calling thread (cache.py makes sure one thread per key does),
inside ``build_scope(device)``, with that thread's pooled handle for the device:

  * the graph is obtained by routes.py: loaded from the plan store, or described and
    built with plan_tuning.build_graph (untuned: exactly ``graph.build([A, FALLBACK])``),
    with a kernel cache under dynamic shapes; under torch.use_deterministic_algorithms(True),
    among the engines cuDNN does not mark NONDETERMINISTIC only; ``route`` and
    ``build_seconds`` say how, and how long it took;
  * the build must write every output in the layout its description reported (the op
    allocates outputs, and the fake kernel reports them, from the description);
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
from typing import Any, Optional, Sequence, Tuple

from .. import _C, plan_tuning
from ..build_scope import build_scope
from ..native import backend_plan_of
from .description import _Definition
from .routes import obtain
from .specs import _TORCH_OF_CUDNN, GraphLayout, TensorSpec


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
        graph, outputs, layout, uids, choice = obtained.graph, obtained.outputs, obtained.layout, obtained.uids, obtained.choice
        _check_built_layout(definition, outputs, layout)
        workspace = int(graph.get_workspace_size())
        engine = obtained.engine or _engine_of(graph)
        native, serial, reason = False, 0, "native path disabled"
        native_started = time.perf_counter()
        if native_enabled:
            spec, reason = backend_plan_of(graph, uids)
            if spec is not None:
                try:  # deserialized here, inside the build scope, with this thread's handle for the device
                    serial, _ = _C.native_register(
                        definition.graph_id, device, _layouts(specs), _layouts(layout.outputs), list(uids),
                        spec.plan_json.encode("utf-8"), by_value=list(spec.by_value), fe_workspace_size=spec.fe_workspace_size,
                        workspace_tensors=list(spec.workspace_tensors), replacements=list(spec.replacements),
                        output_positions=list(layout.output_positions), deterministic=deterministic,
                    )
                    native, reason = True, "backend plan, run from C++"
                except Exception as error:  # noqa: BLE001 -- the Python path runs every plan; say why this one is there
                    reason = f"native registration failed, so the Python path runs it ({type(error).__name__}: {error})"
    return BuiltGraph(
        graph, device, specs, layout, uids, workspace, native, reason, engine, serial, plan=choice.plan, tuning=choice,
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


def _check_built_layout(definition: _Definition, outputs, layout: GraphLayout) -> None:
    """The op allocates outputs from the description (and the fake kernel reports it);
    the build must write exactly that, or results would land in the wrong layout."""
    for i, (tensor, expected) in enumerate(zip(outputs, layout.outputs)):
        written = (tuple(tensor.dim), tuple(tensor.stride), _TORCH_OF_CUDNN.get(tensor.data_type))
        if written != (expected.shape, expected.stride, expected.dtype):
            raise ValueError(
                f"graph {definition.name!r}: the build writes output {i} as {written[2]}{list(written[0])} stride "
                f"{list(written[1])}, but its description said {expected.describe()}; declare the output's layout "
                "in the builder (tensor.set_dim(...).set_stride(...).set_data_type(...))"
            )


def _layouts(specs: Sequence[TensorSpec]) -> list:
    """Specs as the (shape, stride, dtype) lists plan_tuning and the extension take."""
    return [(list(s.shape), list(s.stride), s.dtype) for s in specs]
