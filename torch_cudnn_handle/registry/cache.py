"""``GraphRegistry``: definitions by id, the bounded LRU of built graphs, and layouts.

  * Keys: a built graph per (id, device, the inputs' torch shapes/strides/dtypes,
    whether torch.use_deterministic_algorithms is on), a
    layout per (id, input TensorSpecs); a packed (ragged) input's token count is in
    neither (ragged.py). A registered built graph is never in the LRU:
    its definition holds it.
  * Each key is built once. The first caller builds, outside the lock; concurrent first
    callers of that key wait for its ``_InFlightBuild`` and get its result or its
    error. A failed build is not kept: the next call tries again.
  * No build while the device's current stream captures a CUDA graph: the call is
    refused, with the fix (warm up before capture).
  * The native hand-over (build.py ``hand_over``) happens at the build (the default), or,
    with ``native_hand_over == "second_call"``, for a ``native_pending`` graph at its
    second call: a call that finds the graph already built (a hit, not a wait
    for its in-flight build) and reaches Python, because no native plan served it. One
    thread claims it (``_handing_over``) and runs natively when done; a call meanwhile
    runs on the Python path, as the first did. Never during a capture (the graph stays
    pending: the captured call runs on the Python path). ``native_hand_over`` says when:
    ``"build"`` (the default: each build hands over) or ``"second_call"``.
  * Recency covers both paths. A native call never reaches Python, so eviction reads
    its last use from the extension (``_C.native_last_used``, same monotonic clock) and
    has the extension forget an evicted native plan.
  * Lifetimes: definitions live for the process, built graphs until evicted. A call
    executing one holds its own reference, and a CUDA graph that captured one keeps
    what it needs alive (``_C.keep_alive_while_captured``), so eviction never breaks a
    call or a replay.
  * Thread safety: one lock guards every table, and no build, description or user code
    runs under it.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
import time
from typing import Dict, Optional, Sequence, Tuple

import cudnn
import torch

from .. import _C
from .build import BuiltGraph, _build, hand_over, publish
from .build_timing import PhaseClock
from .description import (
    _check_arity,
    _check_built_graph_inputs,
    _check_built_graph_specs,
    _default_backward_operands,
    _Definition,
    _describe,
    _positional_arity,
    describing_handle,
    refuse_low_rank,
)
from . import autograd_record, plan_store
from .in_place import declared_writes
from .ragged import RaggedOperands
from .operand_views import OperandViews
from .specs import GraphLayout, TensorSpec, _spec_of_cudnn_tensor


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
        self.native_hand_over = hand_over_when(os.environ.get("TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER", "build"))
        self._handing_over: set = set()  # keys whose native hand-over a thread has claimed
        self.counters = dict(hits=0, misses=0, builds=0, evictions=0, hand_overs=0)
        self.routes: "collections.Counter[str]" = collections.Counter()  # builds per route (routes.py), cumulative
        self.plan_seconds = 0.0  # time spent obtaining built graphs (BuiltGraph.build_seconds), cumulative
        self.phase_seconds: "collections.Counter[str]" = collections.Counter()  # the same by phase (build_timing.py), cumulative

    # -- definitions -------------------------------------------------------------

    def _add(self, definition_args: dict) -> int:
        with self._lock:
            graph_id = next(self._ids)
            self._definitions[graph_id] = _Definition(graph_id=graph_id, **definition_args)
            return graph_id

    def register(
        self, builder, *, name=None, backward=None, backward_operands=None, backward_fn=None, backward_reads=None,
        differentiable_outputs=None, materialize_grads=True, tune=None, output_shapes=None, data_types=None,
        dynamic_shapes=None, ragged=None, backward_ragged=None, views=None, backward_views=None, backward_steps=None,
        backward_grads=None, in_place=None, **params,
    ) -> int:
        if builder is None:
            raise TypeError("register_graph: expected a builder callable, got None")
        declared = autograd_record.declared_operands(backward_operands)
        for what, fn in (("builder", builder), ("output_shapes", output_shapes), ("backward", backward), ("backward_operands", None if declared else backward_operands), ("backward_fn", backward_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"register_graph: {what} must be callable, got {type(fn).__name__}")
        for what, value in (("views", views), ("backward_views", backward_views)):
            if value is not None and not isinstance(value, OperandViews):
                raise TypeError(f"register_graph: {what} must be an OperandViews, got {type(value).__name__}")
        if backward_views is not None and backward is None:
            raise TypeError("register_graph: backward_views needs a backward builder (backward=...)")
        if backward_operands is not None and backward is None:
            raise TypeError("register_graph: backward_operands needs a backward builder")
        if backward_steps is not None and (backward is not None or backward_fn is not None):
            raise TypeError("register_graph: give backward_steps (a declared backward of several graphs), backward or backward_fn, one of them")
        for step in backward_steps or ():
            self.definition(getattr(step, "graph", None))  # an unknown step graph fails here, not in a backward
        if backward_grads is not None and backward_steps is None:
            raise TypeError("register_graph: backward_grads needs backward_steps")
        if backward is not None and backward_fn is not None:
            raise TypeError("register_graph: give backward (the builder of one backward graph) or backward_fn, not both")
        name = name or getattr(builder, "__name__", "graph")
        num_inputs = _positional_arity(builder)
        packed = RaggedOperands.declared(name, ragged, num_inputs)
        if packed is not None:
            if tune:
                raise ValueError(
                    f"register_graph({name!r}): a graph with ragged operands cannot be tuned (tuning runs the candidates on "
                    "random data, which are no valid offsets); drop tune=True"
                )
            tune = False
        if backward_ragged is not None and backward is None:
            raise TypeError(f"register_graph({name!r}): backward_ragged declares the packed operands of a backward graph; give backward")
        backward_packed = RaggedOperands.declared(f"{name}_backward", backward_ragged, _positional_arity(backward)) if backward_ragged is not None else None
        if declared is not None:
            autograd_record.check_declared_operands(name, declared, num_inputs, _positional_arity(backward))
        writes = declared_writes(name, in_place, num_inputs)
        if writes and (views is not None or packed is not None):
            raise ValueError(
                f"register_graph({name!r}): in_place writes into the op's own input buffers, and a graph whose operands "
                "are views (views=) or packed (ragged=) sees them otherwise; write those outputs as new tensors (drop "
                "in_place)"
            )
        backward_id = None
        if backward is not None:
            backward_id = self._add(
                dict(
                    name=f"{name}_backward", builder=backward, params=dict(params), num_inputs=_positional_arity(backward),
                    tune=False if backward_packed is not None else tune, dynamic_shapes=dynamic_shapes, ragged=backward_packed, views=backward_views,
                )
            )
        graph_id = self._add(
            dict(
                name=name,
                builder=builder,
                params=dict(params),
                num_inputs=num_inputs,
                backward_id=backward_id,
                backward_operands=None if declared else (backward_operands or _default_backward_operands),
                backward_fn=backward_fn,
                tune=tune,
                output_shapes=output_shapes,
                **({} if data_types is None else dict(data_types=data_types)),  # the forward graph's; a backward graph keeps the default types
                dynamic_shapes=dynamic_shapes,
                ragged=packed,
                views=views,
            )
        )
        autograd_record.declare(
            graph_id, name, num_inputs=num_inputs, backward_id=backward_id, declared=declared,
            has_backward=backward is not None or backward_fn is not None, backward_reads=backward_reads,
            differentiable_outputs=differentiable_outputs, materialize_grads=materialize_grads,
            steps=backward_steps, grads=backward_grads, in_place=writes,
        )
        return graph_id

    def register_built(self, graph, inputs, outputs, *, device, name=None) -> int:
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
        in_specs = tuple(_spec_of_cudnn_tensor(t, f"input {i}") for i, t in enumerate(inputs))
        out_specs = tuple(_spec_of_cudnn_tensor(t, f"output {i}") for i, t in enumerate(outputs))
        refuse_low_rank(name or "register_built_graph", in_specs)  # Note [Tensors of fewer than 3 dims]
        built = BuiltGraph(
            graph=graph,
            device=ordinal,
            inputs=in_specs,
            layout=GraphLayout(out_specs, tuple(range(len(out_specs)))),
            uids=tuple(t.uid for t in list(inputs) + list(outputs)),
            workspace_size=workspace_size,
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

    def ragged_of(self, graph_id: int):
        """The packed inputs of ``graph_id`` (a ``RaggedOperands``), or None: none, or no such id."""
        definition = self._definitions.get(graph_id)
        return None if definition is None else definition.ragged

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

    def layout(self, graph_id: int, specs: Tuple[TensorSpec, ...], device: Optional[int] = None) -> GraphLayout:
        """The output layout of ``graph_id`` for inputs ``specs``, from its description
        (lowered with ``device``'s pooled handle where there is a GPU)."""
        definition = self.definition(graph_id)
        if definition.built is not None:
            _check_built_graph_specs(definition, specs)
            return definition.built.layout
        _check_arity(definition, len(specs))
        specs = definition.call_specs(specs)  # a packed input's token count is no part of the key
        key = (graph_id, specs)
        with self._lock:
            layout = self._layouts.get(key)
            if layout is not None:
                self._layouts.move_to_end(key)
                return layout
        layout = _describe(definition, specs, describing_handle(device))[3]
        with self._lock:
            self._layouts[key] = layout
            while len(self._layouts) > self.layout_capacity:
                self._layouts.popitem(last=False)
        return layout

    def built_graph(
        self, graph_id: int, device: int, inputs: Sequence[torch.Tensor], key_specs: tuple, deterministic: bool = False,
        *, call: bool = True,
    ) -> BuiltGraph:
        """The graph ``graph_id`` built for ``device`` and these inputs; built on first
        use. ``key_specs`` is ``tuple((t.shape, t.stride(), t.dtype) for t in inputs)``;
        ``deterministic``: built among deterministic engines only (build.py). ``call``:
        the op is about to run it, so a pending graph built by an earlier call is handed
        to the native path first (False: only its layout is wanted)."""
        key = (graph_id, device, key_specs, deterministic)
        with self._lock:
            built = self._built.get(key)
            if built is not None:
                self._used_ns[key] = time.monotonic_ns()
                self.counters["hits"] += 1
        if built is not None:
            return self._reused(key, built) if call else built
        definition = self.definition(graph_id)
        if definition.built is not None:
            return _check_built_graph_inputs(definition, device, inputs)
        specs = tuple(TensorSpec.of(t) for t in inputs)
        if definition.ragged is not None:
            # One build serves every token count: keyed without them. The key with them
            # (above) is never stored, so every such call on this path checks its inputs.
            _check_arity(definition, len(specs))
            specs = definition.call_specs(specs)
            key = (graph_id, device, specs, deterministic)
        return self._build_once(key, definition, device, specs, call)

    def _build_once(self, key, definition: _Definition, device: int, specs, call: bool = True) -> BuiltGraph:
        _check_arity(definition, len(specs))
        with self._lock:
            built = self._built.get(key)
            if built is not None:
                self._used_ns[key] = time.monotonic_ns()
                self.counters["hits"] += 1
            else:
                self.counters["misses"] += 1
                flight = self._in_flight.get(key)
                owner = flight is None
                if owner:
                    flight = self._in_flight[key] = _InFlightBuild()
        if built is not None:  # built by an earlier call (a packed graph's, or one that raced this call's first look)
            return self._reused(key, built) if call else built
        if not owner:  # a concurrent first call: its build's result, run as a first call
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
            built = _build(
                definition, device, specs, self.native_enabled, deterministic=key[3], hand_over_at_build=self.native_hand_over == "build"
            )
        except BaseException as error:
            flight.error = error
            with self._lock:
                del self._in_flight[key]
            flight.done.set()
            raise
        with self._lock:
            self.counters["builds"] += built.route != "disk_cache"  # a load from the plan store is no build
            self.routes[built.route] += 1
            self.plan_seconds += built.build_seconds
            self.phase_seconds.update(built.phase_seconds or {})
            self._built[key] = built
            self._used_ns[key] = time.monotonic_ns()
            self._evict_over_capacity()
            del self._in_flight[key]
        flight.result = built
        flight.done.set()
        return built

    def _reused(self, key, built: BuiltGraph) -> BuiltGraph:
        """``built``, found built for a call: a pending one is handed to the native path
        first, by the one thread that claims it (see the module docstring)."""
        if not built.native_pending or _capturing(built.device) or not self.claim_hand_over(key, built):
            return built  # nothing to hand over, or another thread does: this call runs on the Python path
        clock = PhaseClock()
        try:
            result = hand_over(built, clock)
        except BaseException:  # hand_over reports registration failures; anything else leaves it pending
            with self._lock:
                self._handing_over.discard(key)
            raise
        self.finish_hand_over(key, built, result, clock.seconds)
        return built

    def claim_hand_over(self, key, built: BuiltGraph) -> bool:
        """Whether this thread hands the pending ``built`` (cached under ``key``) over: one
        thread per graph, until ``finish_hand_over``."""
        with self._lock:
            if not built.native_pending or key in self._handing_over:
                return False
            self._handing_over.add(key)
            return True

    def finish_hand_over(self, key, built: BuiltGraph, result: Tuple[bool, int, str], seconds: Dict[str, float]) -> None:
        """Publish a claimed hand-over's ``result`` (``(native, serial, path_reason)``) and
        its ``seconds`` by phase. A graph evicted (or dropped) meanwhile stays on the
        Python path, and its native plan is forgotten: nothing would forget it later."""
        native, serial, reason = result
        with self._lock:
            self._handing_over.discard(key)
            self.counters["hand_overs"] += 1
            for phase, spent in seconds.items():
                built.phase_seconds[phase] = built.phase_seconds.get(phase, 0.0) + spent
            self.phase_seconds.update(seconds)
            evicted = self._built.get(key) is not built
            if evicted:
                publish(built, False, 0, "evicted from the cache while it was handed to the native path; the Python path runs it")
            else:
                publish(built, native, serial, reason)
        if evicted and native:
            _C.native_forget(key[0], serial)

    def record_first_execution(self, built: BuiltGraph, seconds: float) -> None:
        """The op's first launch of ``built`` took ``seconds`` on the host: its
        ``phase_seconds["first_execution"]`` (build_timing.py). Only the first record stands."""
        if built.phase_seconds is None:  # a registered built graph: no build to time
            return
        with self._lock:
            if "first_execution" not in built.phase_seconds:
                built.phase_seconds["first_execution"] = seconds
                self.phase_seconds["first_execution"] += seconds

    # -- the LRU -----------------------------------------------------------------

    def _evict_over_capacity(self) -> None:
        """Drop the least recently used built graphs beyond capacity (lock held). A native
        call never comes through here, so its plan's use is read from the extension (same
        monotonic clock)."""
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

    def set_capacity(self, capacity: int) -> None:
        with self._lock:
            self.capacity = capacity
            self._evict_over_capacity()

    def built_of(self, graph_id: int) -> list:
        """The cached BuiltGraph objects of ``graph_id``, one per device and input layout."""
        with self._lock:
            return [built for (gid, *_), built in self._built.items() if gid == graph_id]

    def drop_built(self) -> None:
        """Forget every built graph and layout, registered built graphs included (the ids stay)."""
        with self._lock:
            self._built.clear()
            self._used_ns.clear()
            self._layouts.clear()
            for definition in self._definitions.values():
                definition.built = None

    def stats(self) -> dict:
        with self._lock:
            native = sum(1 for built in self._built.values() if built.native)
            return dict(
                self.counters,
                cached=len(self._built),
                native=native,
                native_pending=sum(1 for built in self._built.values() if built.native_pending),
                python_path=len(self._built) - native,
                engines=dict(collections.Counter(built.engine for built in self._built.values())),
                capacity=self.capacity,
                definitions=len(self._definitions),
                routes=dict(self.routes),
                plan_seconds=self.plan_seconds,
                phase_seconds=dict(self.phase_seconds),
                **plan_store.stats(),
            )


HAND_OVER_WHEN = ("second_call", "build")


def hand_over_when(when: str) -> str:
    """``when`` checked: one of ``HAND_OVER_WHEN``."""
    if when not in HAND_OVER_WHEN:
        raise ValueError(
            f"the native hand-over happens at the graph's 'build' (the default) or at its 'second_call', got {when!r}; "
            "set TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER or set_native_path(True, hand_over=...) to one of them"
        )
    return when


def _capturing(device: int) -> bool:
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()
