"""Building one graph for one device: ``build`` and its result, ``BuiltGraph``.

``build`` runs on the calling thread (graph_cache.py makes sure one thread per key does),
inside ``build_scope(device)``, with that thread's pooled handle for the device:

  * the graph is obtained by plans/: loaded from the plan store, or described and
    built with plans/tuning's build_graph (untuned: exactly ``graph.build([A, FALLBACK])``),
    with a kernel cache under dynamic shapes; under torch.use_deterministic_algorithms(True),
    among the engines cuDNN does not mark NONDETERMINISTIC only; ``route`` and
    ``build_seconds`` say how, and how long it took, ``phase_seconds`` where that time
    went, phase by phase (build_timing.py);
  * an output whose layout the builder declared must be written in that layout (a
    contract); an undeclared one is allocated as the build lays it out, which the
    description predicted for the fake kernel (output_strides.py; a miss warns, with
    the fix: declare it); a plan loaded from the store writes what its build wrote,
    which the store checked against the description;
  * its ``NativeBinding`` (native/binding.py) hands the plan to the native path when the
    route says (at the build, or at its second call), where the native path can run it
    (Note [The native hand-over]).

A ``BuiltGraph`` belongs to its device: the device is part of the cache key, and a
registered built graph refuses inputs on another device.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import warnings
from typing import Any, Optional, Tuple

from .._extension import _C
from ..build_scope import build_scope
from ..native import HandOverSource, NativeBinding
from . import describe as describing
from .broadcasts import materialized_specs
from .build_timing import PhaseClock
from .data_types import integer_default
from .definition import Definition
from .operand_views import described_specs, natural_outputs
from .plans import DESERIALIZED_SOURCES, engine_of, load_fetched, obtain
from .plans.tuning import PlanChoice
from .ragged import packed_of
from .routes import Route
from .specs import GraphLayout, TensorSpec, has_bool, layout_lists, torch_dtype_of

__all__ = ["BuiltGraph", "Fetched", "build", "REFERENCE_SOURCE", "REGISTERED_ROUTE"]


REGISTERED_ROUTE = Route("cudnn", ("registered",), why=(("plan from", "register_built_graph: the graph registered, built"),))


@dataclasses.dataclass(eq=False)
class BuiltGraph:
    """A graph built for one device and one set of input specs. Fixed once built, but for
    its ``binding``'s state (native/binding.py) and ``phase_seconds``, which gains
    ``first_execution`` and ``native_hand_over`` (under the graph cache's lock). Owned by
    the graph cache until evicted; a call running it holds its own reference."""

    graph: Any  # cudnn.pygraph, built (None: the reference route, which the interpreter runs)
    device: int
    inputs: Tuple[TensorSpec, ...]  # what the graph reads (materialized inputs at their full shape)
    layout: GraphLayout
    uids: Tuple[int, ...]  # operand uids, inputs then outputs: the op's buffer order
    workspace_size: int
    binding: NativeBinding = dataclasses.field(default_factory=lambda: NativeBinding("python", "a registered built graph"))
    engine: str = ""  # what serves it: a frost engine's name, or the backend plan's
    plan: Optional[str] = None  # the selected plan's name when plan tuning applied (None: untuned, the heuristics' choice)
    tuning: Optional[PlanChoice] = None  # what plans/tuning's build_graph selected, and why
    deterministic: bool = False  # built among deterministic engines (torch.use_deterministic_algorithms)
    route: Route = REGISTERED_ROUTE  # how its calls are served, decided once (routes.py, Note [One route per call])
    plan_source: str = "registered"  # where its plan came from: "static" | "kernel_cache" | "plan_store" | "build_process" (plans/) | "reference" (none)
    plan_source_reason: str = ""  # why from there
    build_seconds: float = 0.0  # wall time to obtain it: the sum of phase_seconds but first_execution
    phase_seconds: Optional[dict] = None  # seconds by phase (build_timing.py), first_execution added by the op's first launch
    # Per operand (inputs then outputs), the (shape, stride) the graph has for it, for a
    # graph with OperandViews (None: the op's own). The Python path hands the frontend
    # those views (a Python engine may read a buffer's shape); the native path binds addresses only.
    graph_views: Optional[Tuple[Tuple[Tuple[int, ...], Tuple[int, ...]], ...]] = None

    # Read-only views of its native binding (native/binding.py), the one owner of that state.
    @property
    def native(self) -> bool:
        """Whether the native path (C++) runs its calls."""
        return self.binding.native

    @property
    def native_pending(self) -> bool:
        """Whether it is handed to the native path at its next call that reaches Python."""
        return self.binding.pending

    @property
    def native_serial(self) -> int:
        return self.binding.serial

    @functools.cached_property
    def has_bool(self) -> bool:
        """Whether an operand is torch.bool, so each launch bit-packs (Note [Bit-packed booleans])."""
        return has_bool(self.inputs, self.layout.outputs)

    @property
    def path_reason(self) -> str:
        """Why it runs where it runs."""
        return self.binding.reason


REFERENCE_SOURCE = "reference"  # the plan_source of a graph the interpreter runs


def build(definition: Definition, device: int, specs: Tuple[TensorSpec, ...], route: Route, fetch_only: bool = False):
    """``definition`` built for ``device`` and input ``specs`` as ``route`` says (where the
    plan comes from, the native path's binding); a graph the interpreter runs (``reference=True``,
    the ``reference_path`` setting) is not built. Inputs the op materializes (Note [Pointwise
    broadcasts]) are built for at their full shape: ``BuiltGraph.inputs`` are the specs the graph reads.
    ``fetch_only`` (a build off the caller's path): a plan the store or a build process has is
    returned as a ``Fetched``, which the call that takes it loads (Note [A fetched plan is loaded
    by the call that takes it])."""
    clock = PhaseClock()
    deterministic = route.deterministic
    with build_scope(device) as handle:
        clock.lap("scope")
        if route.runs_on == "interpreter":
            layout = describing.described(definition, specs, device).layout  # the description the interpreter then runs
            clock.lap("describe")
            return _reference_graph(definition, device, specs, layout, clock, route)
        try:
            obtained = obtain(definition, device, specs, handle, route, clock, fetch_only)
        except Exception as error:
            if not deterministic:
                _refuse_integer_default(definition, specs, error)
                raise
            # Was it the filter? Built without it, the graph has only non-deterministic
            # plans: torch's rule for such an op (an error, or a warning with warn_only).
            try:
                obtained = obtain(definition, device, specs, handle, dataclasses.replace(route, deterministic=False), clock)
            except Exception as retried:
                _refuse_integer_default(definition, specs, retried)
                raise
            _C.alert_not_deterministic(f"cudnn_fe.execute (graph {definition.name!r}, {', '.join(s.describe() for s in specs)})")
            deterministic = False
        if obtained.fetched:
            return Fetched(definition, device, specs, route, obtained, clock, deterministic)
        return _built(definition, device, specs, route, obtained, clock, deterministic)


class Fetched:
    """Note [A fetched plan is loaded by the call that takes it]: a build off the caller's path
    (a build thread) stops at the serialized plan when the plan store or a build process has
    one, read and checked: cuDNN's deserialize captures a CUDA graph of its own on a stream of
    its own, and while it does, other threads' CUDA work can break it and fail with it (torch's
    own cuDNN attention in the caller's thread failed so on an H100, as did the deserialize). So the call
    that takes the plan (the stand-in's count spent, or the serving mode's next call once it
    is ready), which waits anyway, loads it on a call-build thread while it waits, as does
    ``wait_for_builds``; no user work of that thread runs meanwhile. Loaded once (``load``); a
    plan cuDNN will not take back is rejected and built in that call. Held by the graph
    cache's in-flight table until loaded."""

    def __init__(self, definition, device, specs, route, obtained, clock, deterministic):
        self.route = route
        self._arguments = (definition, device, specs, route, obtained, clock, deterministic)
        self._lock = threading.Lock()  # one load; concurrent takers wait for it
        self._built: Optional[BuiltGraph] = None

    def load(self) -> BuiltGraph:
        """The plan deserialized on this thread's handle (once), or built here where cuDNN rejects it."""
        with self._lock:
            if self._built is None:
                self._built = self._loaded()
            return self._built

    def _loaded(self) -> BuiltGraph:
        definition, device, specs, route, obtained, clock, deterministic = self._arguments
        clock.resume()
        with build_scope(device) as handle:
            loaded = load_fetched(obtained, definition.name, handle)
            clock.lap("load")
            if loaded is not None:
                return _built(definition, device, specs, route, loaded, clock, deterministic)
        rebuilt = build(definition, device, specs, dataclasses.replace(route, plan_from=tuple(p for p in route.plan_from if p not in DESERIALIZED_SOURCES)))
        return dataclasses.replace(rebuilt, route=route)  # counted on its own route


def _built(definition: Definition, device: int, call_specs, route: Route, obtained, clock: PhaseClock, deterministic: bool) -> BuiltGraph:
    """The BuiltGraph of an obtained (built or deserialized) graph: its layout checked, its native binding made."""
    graph, outputs, uids, choice = obtained.graph, obtained.outputs, obtained.uids, obtained.choice
    specs = materialized_specs(call_specs, obtained.layout.materialized)  # what the graph reads
    layout = obtained.layout if obtained.source in DESERIALIZED_SOURCES else _built_layout(definition, specs, outputs, obtained.layout)
    workspace = int(graph.get_workspace_size())
    engine = obtained.engine or engine_of(graph)
    clock.lap("inspect")
    graph_views = None
    if definition.views is not None:
        graph_views = tuple((s.shape, s.stride) for s in described_specs(definition.name, definition.views, call_specs))
        graph_views += tuple((tuple(t.dim), tuple(t.stride)) for t in outputs)
    source = HandOverSource(
        graph, definition.graph_id, device, layout_lists(specs), layout_lists(layout.outputs), tuple(layout.output_positions), uids,
        deterministic, _token_counts(definition, len(specs), layout), obtained.serialized,
    )
    binding = NativeBinding.on_build(source, when=route.native, has_bool=has_bool(specs, layout.outputs), lap=clock.lap)
    built = BuiltGraph(
        graph, device, specs, layout, uids, workspace, binding, engine, plan=choice.plan, tuning=choice, graph_views=graph_views,
        deterministic=deterministic, route=route, plan_source=obtained.source, plan_source_reason=obtained.source_reason,
        phase_seconds=clock.seconds,
    )
    built.build_seconds = sum(clock.seconds.values())
    return built


def _refuse_integer_default(definition: Definition, specs, error: Exception) -> None:
    """An all-integer graph cuDNN would not build in its default integer compute type
    (data_types.py): refused with the two fixes, never computed in float32 behind the author's back."""
    compute = integer_default(definition.data_types, specs)
    if compute is not None:
        raise ValueError(
            f"cudnn_fe.execute: graph {definition.name!r} has integer inputs only, so it computes in {compute} by default "
            f"(float32 would round values above 2**24), and cuDNN built no plan for it that way ({type(error).__name__}: "
            f"{error}). Register it with compute_data_type=torch.float32 to compute in float32 (exact below 2**24; cuDNN 9.19 "
            "takes int32 tensors so, not int64), or call it with floating-point tensors"
        ) from error


REFERENCE_REASON = "the torch interpreter runs it, never cuDNN (op/reference.py)"


def _reference_graph(definition: Definition, device: int, specs, layout: GraphLayout, clock: PhaseClock, route: Route) -> BuiltGraph:
    """The graph cache's entry of a graph the interpreter runs on ``device``: no cuDNN
    graph, no plan, never native; its layout is the description's."""
    why = "reference=True" if definition.reference else "the reference_path setting"
    built = BuiltGraph(
        None, device, tuple(specs), layout, (), 0, NativeBinding("python", f"{REFERENCE_REASON}: {why}"), engine="reference",
        route=route, plan_source=REFERENCE_SOURCE, plan_source_reason=why, phase_seconds=clock.seconds,
    )
    built.build_seconds = sum(clock.seconds.values())
    return built


def _token_counts(definition: Definition, num_inputs: int, layout: GraphLayout) -> Optional[list]:
    """For a graph with packed (ragged) operands: per operand, inputs then outputs, the
    input whose first size (T) it has, whatever it is (-1: its sizes are exact). A packed
    input names the first packed input sharing its offsets (itself: any T), a packed
    output the input it is like, so one native plan serves every token count."""
    if definition.ragged is None:
        return None
    packed = dict(definition.ragged.packed)
    inputs = [definition.ragged.tokens_group(i) if i in packed else -1 for i in range(num_inputs)]
    outputs = list(layout.tokens_like) or [-1] * len(layout.outputs)
    return inputs + outputs


def _built_layout(definition: Definition, specs, outputs, described: GraphLayout) -> GraphLayout:
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
        if not described.is_declared(i) and differs_in_memory(written, expected):
            warnings.warn(
                f"graph {definition.name!r}: the build writes output {i} as {written.describe()}, but its description "
                f"(what torch.compile traces) predicted {expected.describe()}; the op returns what the build writes. "
                "Declare the output's layout in the builder (tensor.set_dim(...).set_stride(...)) so both agree.",
                stacklevel=2,
            )
        layouts.append(written)
    return dataclasses.replace(described, outputs=tuple(layouts))


def differs_in_memory(a: TensorSpec, b: TensorSpec) -> bool:
    """Another shape or dtype, or another stride for a dim of more than one element
    (torch, and inductor's stride asserts, ignore the stride of a dim of size 1)."""
    if (a.shape, a.dtype) != (b.shape, b.dtype):
        return True
    return any(n > 1 and x != y for n, x, y in zip(a.shape, a.stride, b.stride))
