"""The graph registry: graph builders (or built graphs) in, int ids out.

``torch.ops.cudnn_fe.execute`` takes a graph as an int id, so it works with opcheck,
torch.compile, export and CUDA graphs on every torch version. An id names a
*definition*: a builder plus its parameters (or one graph already built). The
registry turns a definition and the inputs of a call into a built graph:

  * per (id, device, input shapes/strides/dtypes) the graph is built once, on first
    use, inside ``build_scope(device)``, and kept in a bounded LRU cache; concurrent
    first callers of one key wait for the one build instead of building twice;
  * a graph built for one device is only ever executed on that device (the device is
    part of the key; a registered built graph refuses inputs on another device);
  * the fake kernel (torch.compile, meta/fake tensors, no GPU needed) asks for the
    *layout* of the outputs only: the same builder run on a graph description, never
    built, so its shapes, strides and dtypes are by construction the real ones.

Ownership: the registry owns definitions for the life of the process and built graphs
until the LRU evicts them (a call that is executing one keeps it alive through its own
reference). Every method is thread-safe.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import inspect
import itertools
import os
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import cudnn
import torch
from cudnn.datatypes import torch_to_cudnn_data_type

from . import _C, plan_tuning
from .build_scope import build_scope
from .native import backend_plan_of

__all__ = [
    "TensorSpec",
    "GraphLayout",
    "BuiltGraph",
    "register_graph",
    "register_built_graph",
    "graph_name",
    "registry_stats",
    "set_cache_capacity",
    "set_native_path",
    "built_graphs",
]

# The dtypes a graph's tensors may have, and their cudnn.data_type (the frontend's own table).
_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool)
_TORCH_OF_CUDNN = {torch_to_cudnn_data_type(dt): dt for dt in _TORCH_DTYPES}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape, stride (in elements) and dtype of one graph operand."""

    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "TensorSpec":
        # int() specializes a symbolic size under torch.compile(dynamic=True): a cuDNN
        # graph is built for exact shapes and strides, so that is the truth.
        return cls(tuple(int(n) for n in tensor.shape), tuple(int(n) for n in tensor.stride()), tensor.dtype)

    def describe(self) -> str:
        return f"{str(self.dtype).replace('torch.', '')}{list(self.shape)} stride {list(self.stride)}"


@dataclasses.dataclass(frozen=True)
class GraphLayout:
    """What a call's outputs look like: their specs, and for each output the position
    (in the builder's returned sequence) it came from; a builder may return None for
    a slot (a backward builder does, for a forward input with no gradient)."""

    outputs: Tuple[TensorSpec, ...]
    output_positions: Tuple[int, ...]


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


@dataclasses.dataclass
class _Definition:
    graph_id: int
    name: str
    builder: Optional[Callable[..., Any]]
    params: Dict[str, Any]
    num_inputs: Optional[int]  # None: the builder takes *inputs
    backward_id: Optional[int] = None  # the paired backward graph, if any
    backward_operands: Optional[Callable[..., Sequence[torch.Tensor]]] = None
    backward_fn: Optional[Callable[..., Sequence[Optional[torch.Tensor]]]] = None  # or a torch-level backward
    built: Optional[BuiltGraph] = None  # a registered built graph: the only one this id runs
    tune: Optional[bool] = None  # time the candidate plans (plan_tuning.py); None: the process-wide setting


# ---------------------------------------------------------------------------------
# Describing and building one graph


def _io_dtype(definition: "_Definition", specs: Sequence[TensorSpec]) -> torch.dtype:
    """The graph's io type: its first floating-point input's dtype. Refuses what a cuDNN
    graph cannot take, so a trace fails where the GPU build would."""
    for i, spec in enumerate(specs):
        if spec.dtype not in _TORCH_DTYPES:
            raise ValueError(
                f"cudnn_fe.execute: input {i} of graph {definition.name!r} is {spec.dtype}, which a cuDNN graph cannot "
                f"take; use one of {', '.join(str(d).replace('torch.', '') for d in _TORCH_DTYPES)}"
            )
    floating = next((s.dtype for s in specs if s.dtype.is_floating_point), None)
    if floating is None:
        raise ValueError(
            f"cudnn_fe.execute: graph {definition.name!r} got no floating-point input "
            f"({', '.join(str(s.dtype).replace('torch.', '') for s in specs)}); its compute type follows the first "
            "floating-point input, so pass fp16, bf16 or fp32 tensors"
        )
    return floating


def _validate_description(graph) -> None:
    """Run the frontend's validate(): shape/stride inference over the description,
    then the backend's own check. The backend check needs the CUDA driver; on a machine
    without one, inference has already run when it fails, and that is all a layout
    needs (a real build, which needs the GPU anyway, validates fully)."""
    try:
        graph.validate()
    except (ValueError, TypeError):
        raise
    except Exception:
        if torch.cuda.is_available():
            raise


def _describe(definition: _Definition, specs: Sequence[TensorSpec], handle=None):
    """Run the definition's builder on a fresh graph description for ``specs``."""
    graph = cudnn.pygraph(
        name=definition.name,
        io_data_type=torch_to_cudnn_data_type(_io_dtype(definition, specs)),
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    inputs = [
        graph.tensor(name=f"input{i}", dim=list(s.shape), stride=list(s.stride), data_type=torch_to_cudnn_data_type(s.dtype))
        for i, s in enumerate(specs)
    ]
    result = definition.builder(graph, *inputs, **definition.params)
    returned = [result] if isinstance(result, cudnn.Tensor) else list(result)
    outputs, positions = [], []
    for position, tensor in enumerate(returned):
        if tensor is not None:
            tensor.set_output(True)
            outputs.append(tensor)
            positions.append(position)
    if not outputs:
        raise ValueError(f"graph {definition.name!r}: the builder returned no output tensor")
    _validate_description(graph)
    out_specs = []
    for i, tensor in enumerate(outputs):
        if not tensor.dim or not tensor.stride:
            raise ValueError(
                f"graph {definition.name!r}: could not infer the shape of output {i}; give it one in the builder "
                "(tensor.set_dim(...).set_stride(...))"
            )
        dtype = _TORCH_OF_CUDNN.get(tensor.data_type)
        if dtype is None:
            raise ValueError(f"graph {definition.name!r}: output {i} has data type {tensor.data_type}, which torch cannot hold; set_data_type() it")
        out_specs.append(TensorSpec(tuple(tensor.dim), tuple(tensor.stride), dtype))
    layout = GraphLayout(tuple(out_specs), tuple(positions))
    return graph, inputs, outputs, layout


def _build(definition: _Definition, device: int, specs: Tuple[TensorSpec, ...], native_enabled: bool) -> BuiltGraph:
    with build_scope(device) as handle:
        graph, inputs, outputs, layout = _describe(definition, specs, handle)
        uids = tuple(t.uid for t in inputs + outputs)
        choice = plan_tuning.build_graph(  # untuned: exactly graph.build([A, FALLBACK])
            graph,
            tune=definition.tune,
            device=device,
            handle=handle,
            input_specs=_layouts(specs),
            output_specs=_layouts(layout.outputs),
            uids=uids,
            name=definition.name,
            fresh_graph=lambda: _describe(definition, specs, handle)[0],
        )
        _check_built_layout(definition, outputs, layout)
        workspace = int(graph.get_workspace_size())
        engine = _engine_of(graph)
        native, serial, reason = False, 0, "native path disabled"
        if native_enabled:
            spec, reason = backend_plan_of(graph, uids)
            if spec is not None:
                try:  # deserialized here, inside the build scope, with this thread's handle for the device
                    serial, _ = _C.native_register(
                        definition.graph_id, device, _layouts(specs), _layouts(layout.outputs), list(uids), spec.plan_json.encode("utf-8"),
                        by_value=list(spec.by_value), fe_workspace_size=spec.fe_workspace_size,
                        workspace_tensors=list(spec.workspace_tensors), replacements=list(spec.replacements),
                    )
                    native, reason = True, "backend plan, run from C++"
                except Exception as error:  # noqa: BLE001 -- the Python path runs every plan; say why this one is there
                    reason = f"native registration failed, so the Python path runs it ({type(error).__name__}: {error})"
    return BuiltGraph(graph, device, specs, layout, uids, workspace, native, reason, engine, serial, plan=choice.plan, tuning=choice)


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
    return [(list(s.shape), list(s.stride), s.dtype) for s in specs]


# ---------------------------------------------------------------------------------
# The registry


class _InFlightBuild:
    def __init__(self):
        self.done = threading.Event()
        self.result: Optional[BuiltGraph] = None
        self.error: Optional[BaseException] = None


class GraphRegistry:
    """Definitions by id, and an LRU cache of built graphs (see the module docstring)."""

    def __init__(self, capacity: int = 1024, layout_capacity: int = 4096):
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._definitions: Dict[int, _Definition] = {}
        self._built: "collections.OrderedDict[tuple, BuiltGraph]" = collections.OrderedDict()
        self._used_ns: Dict[tuple, int] = {}  # when the Python side last served each key
        self._in_flight: Dict[tuple, _InFlightBuild] = {}
        self._layouts: "collections.OrderedDict[tuple, GraphLayout]" = collections.OrderedDict()
        self.capacity = capacity
        self.layout_capacity = layout_capacity
        # Backend plans run from C++ on CUDA builds; TORCH_CUDNN_HANDLE_NATIVE=0 (or
        # set_native_path(False)) keeps every later build on the Python path.
        self.native_enabled = _C.with_cuda and os.environ.get("TORCH_CUDNN_HANDLE_NATIVE", "1") != "0"
        self.counters = dict(hits=0, misses=0, builds=0, evictions=0)

    # -- definitions -------------------------------------------------------------

    def _add(self, definition_args: dict) -> int:
        with self._lock:
            graph_id = next(self._ids)
            self._definitions[graph_id] = _Definition(graph_id=graph_id, **definition_args)
            return graph_id

    def register(self, builder, *, name=None, backward=None, backward_operands=None, backward_fn=None, tune=None, **params) -> int:
        if builder is None:
            raise TypeError("register_graph: expected a builder callable, got None")
        for what, fn in (("builder", builder), ("backward", backward), ("backward_operands", backward_operands), ("backward_fn", backward_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"register_graph: {what} must be callable, got {type(fn).__name__}")
        if backward_operands is not None and backward is None:
            raise TypeError("register_graph: backward_operands needs a backward builder")
        if backward is not None and backward_fn is not None:
            raise TypeError("register_graph: give backward (the builder of one backward graph) or backward_fn, not both")
        name = name or getattr(builder, "__name__", "graph")
        backward_id = None
        if backward is not None:
            backward_id = self._add(dict(name=f"{name}_backward", builder=backward, params=dict(params), num_inputs=_positional_arity(backward), tune=tune))
        return self._add(
            dict(
                name=name,
                builder=builder,
                params=dict(params),
                num_inputs=_positional_arity(builder),
                backward_id=backward_id,
                backward_operands=backward_operands or _default_backward_operands,
                backward_fn=backward_fn,
                tune=tune,
            )
        )

    def register_built(self, graph, inputs, outputs, *, device, name=None) -> int:
        ordinal = torch.device("cuda", device).index if isinstance(device, int) else torch.device(device).index
        if ordinal is None:
            raise ValueError("register_built_graph: name the device the graph was built for, e.g. device='cuda:0'")
        in_specs = tuple(_spec_of_cudnn_tensor(t, f"input {i}") for i, t in enumerate(inputs))
        out_specs = tuple(_spec_of_cudnn_tensor(t, f"output {i}") for i, t in enumerate(outputs))
        built = BuiltGraph(
            graph=graph,
            device=ordinal,
            inputs=in_specs,
            layout=GraphLayout(out_specs, tuple(range(len(out_specs)))),
            uids=tuple(t.uid for t in list(inputs) + list(outputs)),
            workspace_size=int(graph.get_workspace_size()),
        )
        return self._add(dict(name=name or "built_graph", builder=None, params={}, num_inputs=len(in_specs), built=built))

    def definition(self, graph_id: int) -> _Definition:
        definition = self._definitions.get(graph_id)
        if definition is None:
            raise ValueError(
                f"cudnn_fe.execute: unknown graph id {graph_id}; ids come from torch_cudnn_handle.register_graph() "
                "(or register_built_graph()) in this process"
            )
        return definition

    def differentiable(self, forward_id: int) -> _Definition:
        """The definition of ``forward_id``, which must have a backward."""
        forward = self.definition(forward_id)
        if forward.backward_id is None and forward.backward_fn is None:
            raise RuntimeError(
                f"graph {forward.name!r} (id {forward_id}) has no backward, so it cannot be differentiated; register it "
                "with register_graph(builder, backward=backward_builder) or register_graph(builder, backward_fn=fn)"
            )
        return forward

    # -- layouts and builds ------------------------------------------------------

    def layout(self, graph_id: int, specs: Tuple[TensorSpec, ...]) -> GraphLayout:
        definition = self.definition(graph_id)
        if definition.built is not None:
            _check_built_graph_specs(definition, specs)
            return definition.built.layout
        _check_arity(definition, len(specs))
        key = (graph_id, specs)
        with self._lock:
            layout = self._layouts.get(key)
            if layout is not None:
                self._layouts.move_to_end(key)
                return layout
        layout = _describe(definition, specs)[3]
        with self._lock:
            self._layouts[key] = layout
            while len(self._layouts) > self.layout_capacity:
                self._layouts.popitem(last=False)
        return layout

    def built_graph(self, graph_id: int, device: int, inputs: Sequence[torch.Tensor], key_specs: tuple) -> BuiltGraph:
        """The graph ``graph_id`` built for ``device`` and these inputs; built on first
        use. ``key_specs`` is ``tuple((t.shape, t.stride(), t.dtype) for t in inputs)``."""
        key = (graph_id, device, key_specs)
        with self._lock:
            built = self._built.get(key)
            if built is not None:
                self._used_ns[key] = time.monotonic_ns()
                self.counters["hits"] += 1
                return built
        definition = self.definition(graph_id)
        if definition.built is not None:
            return _check_built_graph_inputs(definition, device, inputs)
        return self._build_once(key, definition, device, tuple(TensorSpec.of(t) for t in inputs))

    def _build_once(self, key, definition: _Definition, device: int, specs) -> BuiltGraph:
        _check_arity(definition, len(specs))
        with self._lock:
            built = self._built.get(key)
            if built is not None:
                self.counters["hits"] += 1
                return built
            self.counters["misses"] += 1
            flight = self._in_flight.get(key)
            owner = flight is None
            if owner:
                flight = self._in_flight[key] = _InFlightBuild()
        if not owner:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.result
        try:
            if _capturing(device):
                raise RuntimeError(
                    f"cudnn_fe.execute: graph {definition.name!r} has not been built for cuda:{device} and inputs "
                    f"{', '.join(s.describe() for s in specs)}, and the current stream is capturing a CUDA graph, "
                    "which a build cannot be part of. Warm up before capture: run the same call once outside it."
                )
            if _C.with_cuda:
                _C.release_dropped()  # what destroyed CUDA graphs kept alive, freed outside any capture
            built = _build(definition, device, specs, self.native_enabled)
        except BaseException as error:
            flight.error = error
            with self._lock:
                del self._in_flight[key]
            flight.done.set()
            raise
        with self._lock:
            self.counters["builds"] += 1
            self._built[key] = built
            self._used_ns[key] = time.monotonic_ns()
            self._evict_over_capacity()
            del self._in_flight[key]
        flight.result = built
        flight.done.set()
        return built

    def _evict_over_capacity(self) -> None:
        """Drop the least recently used built graphs beyond capacity (lock held). A native
        call never comes through here, so its plan's use is read from the extension (same
        monotonic clock). A CUDA graph that captured a call keeps what it needs alive on
        its own (_C.keep_alive_while_captured), so eviction never breaks a replay."""
        if len(self._built) <= self.capacity:
            return
        native_used = _C.native_last_used() if any(built.native for built in self._built.values()) else {}

        def last_use(item):
            key, built = item
            return max(self._used_ns[key], native_used.get(built.native_serial, 0))

        while len(self._built) > self.capacity:
            key, evicted = min(self._built.items(), key=last_use)
            del self._built[key], self._used_ns[key]
            self.counters["evictions"] += 1
            if evicted.native:
                _C.native_forget(key[0], evicted.native_serial)

    def stats(self) -> dict:
        with self._lock:
            native = sum(1 for built in self._built.values() if built.native)
            return dict(
                self.counters,
                cached=len(self._built),
                native=native,
                python_path=len(self._built) - native,
                engines=dict(collections.Counter(built.engine for built in self._built.values())),
                capacity=self.capacity,
                definitions=len(self._definitions),
            )


def _capturing(device: int) -> bool:
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _default_backward_operands(grad_outputs, inputs, outputs):
    return [*grad_outputs, *inputs, *outputs]


def _positional_arity(builder) -> Optional[int]:
    """How many inputs a builder ``f(graph, *inputs, **params)`` takes, or None for *args."""
    try:
        parameters = list(inspect.signature(builder).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return None
    return sum(1 for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)


def _check_arity(definition: _Definition, count: int) -> None:
    if definition.num_inputs is not None and count != definition.num_inputs:
        raise ValueError(f"cudnn_fe.execute: graph {definition.name!r} takes {definition.num_inputs} input tensors, got {count}")


def _spec_of_cudnn_tensor(tensor, what: str) -> TensorSpec:
    dtype = _TORCH_OF_CUDNN.get(tensor.data_type)
    if dtype is None or not tensor.dim:
        raise ValueError(f"register_built_graph: {what} needs dims, strides and a torch-representable data type")
    return TensorSpec(tuple(tensor.dim), tuple(tensor.stride), dtype)


def _check_built_graph_inputs(definition: _Definition, device: int, inputs: Sequence[torch.Tensor]) -> BuiltGraph:
    """A registered built graph runs only on its device and only for the inputs it was built for."""
    built = definition.built
    if device != built.device:
        raise ValueError(
            f"cudnn_fe.execute: graph {definition.name!r} was built for cuda:{built.device} but the inputs are on "
            f"cuda:{device}; a built graph never runs on another device. Move the inputs, or register a builder "
            "(register_graph) so the graph is built per device."
        )
    _check_built_graph_specs(definition, [TensorSpec.of(t) for t in inputs])
    return built


def _check_built_graph_specs(definition: _Definition, specs: Sequence[TensorSpec]) -> None:
    _check_arity(definition, len(specs))
    for i, (got, expected) in enumerate(zip(specs, definition.built.inputs)):
        if got != expected:
            raise ValueError(
                f"cudnn_fe.execute: input {i} of graph {definition.name!r} is {got.describe()}, but the graph was built "
                f"for {expected.describe()}. Pass a tensor of that layout (e.g. .contiguous() / .to(dtype)), or register "
                "a builder (register_graph) so a graph is built for each layout."
            )


_registry = GraphRegistry()


@atexit.register
def _drop_built_graphs() -> None:
    """Release the cached graphs while CUDA is still up (atexit runs before interpreter
    teardown), instead of leaving them to the frontend's bindings to report as leaked.
    Native plans are left to the process's end, like the pool's handles. A child forked
    after handles existed has no CUDA state to release them into: it leaves them."""
    if _C.with_cuda and _C.forked_after_handles():
        return
    with _registry._lock:
        _registry._built.clear()
        _registry._used_ns.clear()
        _registry._layouts.clear()
        for definition in _registry._definitions.values():
            definition.built = None


def register_graph(
    builder: Callable[..., Any],
    *,
    name: Optional[str] = None,
    backward: Optional[Callable[..., Any]] = None,
    backward_operands: Optional[Callable[..., Sequence[torch.Tensor]]] = None,
    backward_fn: Optional[Callable[..., Sequence[Optional[torch.Tensor]]]] = None,
    tune: Optional[bool] = None,
    **params,
) -> int:
    """Register a graph builder; returns the id ``torch.ops.cudnn_fe.execute`` takes.

    ``builder(graph, *inputs, **params)`` adds nodes to ``graph`` (a ``cudnn.pygraph``
    whose io type is the first floating input's dtype and whose intermediate and
    compute types are float32) for ``inputs`` (one ``cudnn`` tensor per op input, with
    the call's shapes, strides and dtypes) and returns its output tensor or a sequence
    of them; the registry marks them as outputs. ``params`` are passed to every call of
    the builder and are part of the definition: the same builder with other
    parameters is another id.

    A backward makes ``torch.ops.cudnn_fe.execute(id, ...)`` differentiable; give one of:

    * ``backward``: the builder of one backward graph, ``backward(graph, *operands,
      **params)``, returning one gradient tensor (or None) per forward input. Its
      operands are the torch tensors ``backward_operands(grad_outputs, inputs,
      outputs)`` returns (by default all of them, in that order); return views there
      (``w.mT``) where the backward graph wants another layout of a saved tensor.
    * ``backward_fn(grad_outputs, inputs, outputs)``: torch-level code returning one
      gradient (or None) per forward input, for a backward that takes several graphs
      (cuDNN fuses one matmul per graph); it typically calls
      ``torch.ops.cudnn_fe.execute`` on other registered graphs.

    Either runs on the thread autograd picks, on the forward's device and stream.
    """
    return _registry.register(builder, name=name, backward=backward, backward_operands=backward_operands, backward_fn=backward_fn, tune=tune, **params)


def register_built_graph(graph, inputs: Sequence[Any], outputs: Sequence[Any], *, device, name: Optional[str] = None) -> int:
    """Register a ``cudnn.pygraph`` that is already built, with its input and output
    tensors in the op's order. It runs only on ``device`` and only for inputs of
    exactly the shapes, strides and dtypes it was built for."""
    return _registry.register_built(graph, inputs, outputs, device=device, name=name)


def graph_name(graph_id: int) -> str:
    return _registry.definition(graph_id).name


def registry_stats() -> dict:
    """Counters of the built-graph cache: hits, misses, builds, evictions, cached, capacity,
    and how many cached graphs run natively (from C++) or on the Python path."""
    return _registry.stats()


def set_native_path(enabled: bool) -> None:
    """Whether graphs built from now on may run natively (from C++). Graphs already
    built keep their path. Off by default on builds without CUDA."""
    _registry.native_enabled = bool(enabled) and _C.with_cuda


def built_graphs(graph_id: int) -> list:
    """The cached BuiltGraph objects of ``graph_id`` (one per device and input layout)."""
    with _registry._lock:
        return [built for (gid, _, _), built in _registry._built.items() if gid == graph_id]


def set_cache_capacity(capacity: int) -> None:
    """Bound the number of built graphs kept (least recently used are evicted first)."""
    if capacity < 1:
        raise ValueError("the built-graph cache needs a capacity of at least 1")
    with _registry._lock:
        _registry.capacity = capacity
        _registry._evict_over_capacity()
