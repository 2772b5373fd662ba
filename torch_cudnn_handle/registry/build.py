"""Building one graph for one device: ``_build`` and its result, ``BuiltGraph``.

``_build`` runs on the calling thread (cache.py makes sure one thread per key does),
inside ``build_scope(device)``, with that thread's pooled handle for the device:

  * the graph is obtained by routes.py: loaded from the plan store, or described and
    built with plan_tuning.build_graph (untuned: exactly ``graph.build([A, FALLBACK])``),
    with a kernel cache under dynamic shapes; under torch.use_deterministic_algorithms(True),
    among the engines cuDNN does not mark NONDETERMINISTIC only; ``route`` and
    ``build_seconds`` say how, and how long it took, ``phase_seconds`` where that time
    went, phase by phase (build_timing.py);
  * an output whose layout the builder declared must be written in that layout (a
    contract); an undeclared one is allocated as the build lays it out, which the
    description predicted for the fake kernel (output_strides.py; a miss warns, with
    the fix: declare it); a plan loaded from the store writes what its build wrote,
    which the store checked against the description;
  * a graph the native path may serve (native path on, no bool operand, a backend plan
    rather than a frost engine) is handed to it by the build (``hand_over_at_build``, the
    default), so its first call already runs on the plan every later call runs on; with
    ``set_native_path(True, hand_over="second_call")`` it is marked ``native_pending``
    instead: this call, its first, runs it on the Python path, and the registry hands it
    over at its second call (``hand_over``; cache.py), so a layout used once never pays
    the serialize and the deserialize. Either way, if the
    hand-over fails the graph stays on the Python path, which runs every plan, and
    ``path_reason`` says why.

A ``BuiltGraph`` belongs to its device: the device is part of the cache key, and a
registered built graph refuses inputs on another device.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Optional, Tuple

from .. import _C, bool_operands, plan_tuning
from ..build_scope import build_scope
from ..native import backend_plan_of
from .description import _Definition
from .build_timing import PhaseClock
from .plan_disk import serialized_plan
from .ragged import packed_of
from .routes import engine_of, obtain
from .operand_views import described_specs, natural_outputs
from .specs import GraphLayout, TensorSpec, layout_lists, torch_dtype_of


@dataclasses.dataclass(eq=False)
class BuiltGraph:
    """A graph built for one device and one set of input specs.

    Fixed once built, but for the native hand-over's fields (``native``,
    ``native_pending``, ``path_reason``, ``native_serial``), which the registry changes
    once, under its lock, when it hands a pending graph over (cache.py), and
    ``phase_seconds``, which gains ``first_execution`` and ``native_hand_over``."""

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
    native_pending: bool = False  # handed to the native path at its next call that reaches Python (its second)
    plan: Optional[str] = None  # the selected plan's name when plan tuning applied (None: untuned, the heuristics' choice)
    tuning: Optional[plan_tuning.PlanChoice] = None  # what plan_tuning.build_graph selected, and why
    deterministic: bool = False  # built among deterministic engines (torch.use_deterministic_algorithms)
    route: str = "static"  # how it was obtained: "static" | "kernel_cache" | "disk_cache" (routes.py)
    route_reason: str = ""  # why that route
    build_seconds: float = 0.0  # wall time to obtain it: the sum of phase_seconds but first_execution
    phase_seconds: Optional[dict] = None  # seconds by phase (build_timing.py), first_execution added by the op's first launch
    # Per operand (inputs then outputs), the (shape, stride) the graph has for it, for a
    # graph with OperandViews (None: the op's own). The Python path hands the frontend
    # those views (a Python engine may read a buffer's shape); the native path binds addresses only.
    graph_views: Optional[Tuple[Tuple[Tuple[int, ...], Tuple[int, ...]], ...]] = None
    # What a pending hand-over registers the native plan with, kept from the build: the
    # definition and the plan store's blob when it read or wrote one (so the hand-over
    # does not serialize again); dropped once handed over.
    hand_over_from: Optional["_HandOverSource"] = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass(frozen=True)
class _HandOverSource:
    definition: _Definition
    serialized: Optional[bytes]  # graph.serialize(as_bytes=True), from the plan store; None: serialize at the hand-over


NATIVE_PENDING_REASON = "a backend plan, run from C++ from its second call on (its first ran on the Python path)"


def _build(
    definition: _Definition, device: int, specs: Tuple[TensorSpec, ...], native_enabled: bool, *, deterministic: bool = False,
    hand_over_at_build: bool = False,
) -> BuiltGraph:
    clock = PhaseClock()
    with build_scope(device) as handle:
        clock.lap("scope")
        try:
            obtained = obtain(definition, device, specs, handle, deterministic, clock)
        except Exception:
            if not deterministic:
                raise
            # Was it the filter? Built without it, the graph has only non-deterministic
            # plans: torch's rule for such an op (an error, or a warning with warn_only).
            obtained = obtain(definition, device, specs, handle, False, clock)
            _C.alert_not_deterministic(f"cudnn_fe.execute (graph {definition.name!r}, {', '.join(s.describe() for s in specs)})")
            deterministic = False
        graph, outputs, uids, choice = obtained.graph, obtained.outputs, obtained.uids, obtained.choice
        layout = obtained.layout if obtained.route == "disk_cache" else _built_layout(definition, specs, outputs, obtained.layout)
        workspace = int(graph.get_workspace_size())
        engine = obtained.engine or engine_of(graph)
        clock.lap("inspect")
    graph_views = None
    if definition.views is not None:
        graph_views = tuple((s.shape, s.stride) for s in described_specs(definition.name, definition.views, specs))
        graph_views += tuple((tuple(t.dim), tuple(t.stride)) for t in outputs)
    built = BuiltGraph(
        graph, device, specs, layout, uids, workspace, False, "native path disabled", engine, plan=choice.plan, tuning=choice,
        graph_views=graph_views, deterministic=deterministic, route=obtained.route, route_reason=obtained.route_reason,
        phase_seconds=clock.seconds,
    )
    if native_enabled and bool_operands.has_bool(specs, layout.outputs):
        built.path_reason = bool_operands.NATIVE_REASON
    elif native_enabled and getattr(graph, "selected_engine", None) is not None:
        built.path_reason = backend_plan_of(graph, uids)[1]  # a frost engine's: said without serializing
    elif native_enabled:
        built.native_pending, built.path_reason = True, NATIVE_PENDING_REASON
        built.hand_over_from = _HandOverSource(definition, obtained.serialized)
        if hand_over_at_build:
            publish(built, *hand_over(built, clock, at_build=True))
    built.build_seconds = sum(clock.seconds.values())
    return built


def hand_over(built: BuiltGraph, clock: PhaseClock, *, at_build: bool = False) -> Tuple[bool, int, str]:
    """Hand a ``native_pending`` graph to the native path: serialize it (unless the plan
    store gave its blob), decode the backend plan and register it with the extension,
    which deserializes it on this thread's pooled handle for the device. Returns
    ``(native, serial, path_reason)`` for ``publish``; a failure means the Python path,
    with the reason. The caller makes sure one thread does it per graph (cache.py);
    ``clock`` gets ``serialize`` and ``native`` at the build, else all of it as
    ``native_hand_over`` (no part of the first call)."""
    source = built.hand_over_from
    definition, specs, layout, uids = source.definition, built.inputs, built.layout, built.uids
    serialized = source.serialized
    with build_scope(built.device):
        if serialized is None:
            serialized = serialized_plan(built.graph)  # None: backend_plan_of tries again and says why
            if at_build:
                clock.lap("serialize")
        spec, reason = backend_plan_of(built.graph, uids, serialized)
        native, serial = False, 0
        if spec is not None:
            try:  # deserialized on this thread's pooled handle for the device (the extension picks it)
                serial, _, graph_route = _C.native_register(
                    definition.graph_id, built.device, layout_lists(specs), layout_lists(layout.outputs), list(uids),
                    spec.plan_json.encode("utf-8"), by_value=list(spec.by_value), fe_workspace_size=spec.fe_workspace_size,
                    workspace_tensors=list(spec.workspace_tensors), replacements=list(spec.replacements),
                    output_positions=list(layout.output_positions), deterministic=built.deterministic,
                    cuda_graph=spec.cuda_graph, **_token_counts(definition, len(specs), layout),
                )
                native, reason = True, "backend plan, run from C++" + (
                    f" (launched as a CUDA graph {graph_route} when its addresses repeat)" if graph_route else ""
                ) + ("" if at_build else ", handed over at its second call")
            except Exception as error:  # noqa: BLE001 -- the Python path runs every plan; say why this one is there
                reason = f"native registration failed, so the Python path runs it ({type(error).__name__}: {error})"
    clock.lap("native" if at_build else "native_hand_over")
    return native, serial, reason


def publish(built: BuiltGraph, native: bool, serial: int, reason: str) -> None:
    """The hand-over's result on ``built`` (under the registry's lock once others can see it)."""
    built.native_serial, built.path_reason = serial, reason
    built.native_pending, built.hand_over_from = False, None
    built.native = native  # last: a reader that sees it finds the serial and the plan registered


def _token_counts(definition: _Definition, num_inputs: int, layout: GraphLayout) -> dict:
    """For a graph with packed (ragged) operands: per operand, inputs then outputs, the
    input whose first size (T) it has, whatever it is (-1: its sizes are exact). A packed
    input names the first packed input sharing its offsets (itself: any T), a packed
    output the input it is like, so one native plan serves every token count."""
    if definition.ragged is None:
        return {}
    packed = dict(definition.ragged.packed)
    inputs = [definition.ragged.tokens_group(i) if i in packed else -1 for i in range(num_inputs)]
    outputs = list(layout.tokens_like) or [-1] * len(layout.outputs)
    return dict(tokens_of=inputs + outputs)


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
        if described.tokens_like and described.tokens_like[i] >= 0:  # ragged: the op's packed [T, H, D]
            written = packed_of(written)
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
