"""``GraphCache``: the built graphs of this process, by key; the one LRU; in-flight builds.

  * Keys: a built graph per (id, device, the inputs' torch shapes/strides/dtypes, whether
    torch.use_deterministic_algorithms is on); a packed (ragged) input's token count is
    no part of it (ragged.py). A registered built graph is pinned: never in the LRU,
    never evicted.
  * Each key is built once. The first caller builds, outside the lock, behind a
    ``concurrent.futures.Future`` that concurrent first callers of the key wait on and
    get its result or its error from. A failed build is not kept: the next call tries again.
  * No build while the device's current stream captures a CUDA graph: the call is
    refused, with the fix (warm up before capture).
  * The native hand-over is the graph's ``NativeBinding`` (Note [The native hand-over]):
    this cache tells it when it is built (build.py), reused (a hit that reached Python)
    and evicted.
  * Recency: one clock, CLOCK_MONOTONIC in nanoseconds. The Python path stamps an entry
    at each hit (``time.monotonic_ns``); a native call never reaches Python, so eviction
    also reads its plan's last run from the extension, which stamps it on the same clock.
  * Lifetimes: built graphs live until evicted (or dropped at exit). A call executing
    one holds its own reference, and a CUDA graph that captured one keeps what it needs
    alive (``_C.keep_alive_while_captured``), so eviction never breaks a call or a replay.
  * Thread safety: one lock guards every table; no build, description or user code runs
    under it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from typing import Dict, List, Optional, Sequence

import torch

from .. import _C, settings
from ..native import last_used_ns
from .build import BuiltGraph, build
from .definition import Definition, Definitions, check_arity
from .specs import TensorSpec

__all__ = ["GraphCache"]


class _Entry:
    __slots__ = ("built", "used_ns")

    def __init__(self, built: BuiltGraph):
        self.built, self.used_ns = built, time.monotonic_ns()


class GraphCache:
    """See the module docstring."""

    def __init__(self, definitions: Definitions):
        self.definitions = definitions
        self._lock = threading.Lock()
        self._entries: "collections.OrderedDict[tuple, _Entry]" = collections.OrderedDict()
        self._pinned: Dict[int, BuiltGraph] = {}  # graph id -> its registered built graph
        self._in_flight: Dict[tuple, concurrent.futures.Future] = {}
        self._counters = dict(hits=0, misses=0, builds=0, evictions=0, hand_overs=0)
        self._routes: "collections.Counter[str]" = collections.Counter()  # graphs obtained per route (plans/)
        self._plan_seconds = 0.0  # time spent obtaining them (BuiltGraph.build_seconds)
        self._phase_seconds: "collections.Counter[str]" = collections.Counter()  # the same by phase (build_timing.py)

    # -- lookups -------------------------------------------------------------------

    def pin(self, graph_id: int, built: BuiltGraph) -> None:
        with self._lock:
            self._pinned[graph_id] = built

    def pinned(self, graph_id: int) -> Optional[BuiltGraph]:
        return self._pinned.get(graph_id)

    def lookup(self, graph_id: int, device: int, inputs: Sequence[torch.Tensor], key_specs: tuple, deterministic: bool = False,
               *, call: bool = True) -> BuiltGraph:
        """The graph ``graph_id`` built for ``device`` and these inputs; built on first use.
        ``key_specs``: the inputs' (shape, stride, dtype, is_cpu), the hot key. ``call``:
        the op runs it now (a pending binding is handed over first); else only its layout
        is wanted."""
        key = (graph_id, device, key_specs, deterministic)
        built = self._hit(key)
        if built is not None:
            return self._reused(built) if call else built
        definition = self.definitions.get(graph_id)
        if definition.is_built:
            return self._pinned_for(definition, device, inputs)
        specs = tuple(TensorSpec.of(t) for t in inputs)
        check_arity(definition, len(specs))
        if definition.ragged is not None:
            # One build serves every token count: keyed without them. The key with them
            # (above) is never stored, so every such call on this path checks its inputs.
            specs = definition.call_specs(specs)
            key = (graph_id, device, specs, deterministic)
        return self._build_once(key, definition, device, specs, call)

    def _hit(self, key) -> Optional[BuiltGraph]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            entry.used_ns = time.monotonic_ns()
            self._counters["hits"] += 1
            return entry.built

    def _build_once(self, key, definition: Definition, device: int, specs, call: bool) -> BuiltGraph:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.used_ns = time.monotonic_ns()
                self._counters["hits"] += 1
            else:
                self._counters["misses"] += 1
                future = self._in_flight.get(key)
                owner = future is None
                if owner:
                    future = self._in_flight[key] = concurrent.futures.Future()
        if entry is not None:  # built by an earlier call (a packed graph's, or one that raced this call's first look)
            return self._reused(entry.built) if call else entry.built
        if not owner:  # a concurrent first call: its build's result (or error), run as a first call
            return future.result()
        try:
            if _capturing(device):
                raise RuntimeError(
                    f"cudnn_fe.execute: graph {definition.name!r} has not been built for cuda:{device} and inputs "
                    f"{', '.join(s.describe() for s in specs)}, and the current stream is capturing a CUDA graph, "
                    "which a build cannot be part of. Warm up before capture: run the same call once outside it."
                )
            if _C.with_cuda:
                _C.release_dropped()  # what destroyed CUDA graphs kept alive, freed outside any capture
            built = build(definition, device, specs, deterministic=key[3])
        except BaseException as error:
            with self._lock:
                del self._in_flight[key]
            future.set_exception(error)
            raise
        with self._lock:
            self._counters["builds"] += built.route not in ("plan_store", "reference")  # a load, or the interpreter's entry: no build
            self._routes[built.route] += 1
            self._plan_seconds += built.build_seconds
            self._phase_seconds.update(built.phase_seconds or {})
            self._entries[key] = _Entry(built)
            del self._in_flight[key]
        self.evict_over_capacity()
        future.set_result(built)
        return built

    def _reused(self, built: BuiltGraph) -> BuiltGraph:
        """``built``, found built for a call: its binding may hand it over now (its second call)."""
        seconds = built.binding.on_reuse(built.device)
        if seconds is not None:
            with self._lock:
                self._counters["hand_overs"] += 1
                built.phase_seconds["native_hand_over"] = built.phase_seconds.get("native_hand_over", 0.0) + seconds
                self._phase_seconds["native_hand_over"] += seconds
        return built

    def _pinned_for(self, definition: Definition, device: int, inputs: Sequence[torch.Tensor]) -> BuiltGraph:
        """A registered built graph runs only on its device and only for the inputs it was built for."""
        built = self._pinned[definition.graph_id]
        if device != built.device:
            raise ValueError(
                f"cudnn_fe.execute: graph {definition.name!r} was built for cuda:{built.device} but the inputs are on "
                f"cuda:{device}; a built graph never runs on another device. Move the inputs, or register a builder "
                "(register_graph) so the graph is built per device."
            )
        check_pinned_specs(definition, built, [TensorSpec.of(t) for t in inputs])
        return built

    def record_first_execution(self, built: BuiltGraph, seconds: float) -> None:
        """The op's first launch of ``built`` took ``seconds`` on the host: its
        ``phase_seconds["first_execution"]`` (build_timing.py). Only the first record stands."""
        if built.phase_seconds is None:  # a registered built graph: no build to time
            return
        with self._lock:
            if "first_execution" not in built.phase_seconds:
                built.phase_seconds["first_execution"] = seconds
                self._phase_seconds["first_execution"] += seconds

    # -- the LRU -------------------------------------------------------------------

    def evict_over_capacity(self) -> None:
        """Drop the least recently used built graphs beyond the ``graph_cache_capacity`` setting."""
        capacity = settings.get("graph_cache_capacity")
        with self._lock:
            if len(self._entries) <= capacity:
                return
            native_used = last_used_ns([entry.built.binding for entry in self._entries.values()])

            def last_use(item):
                _, entry = item
                return max(entry.used_ns, native_used.get(entry.built.native_serial, 0))

            evicted = []
            while len(self._entries) > capacity:
                key, entry = min(self._entries.items(), key=last_use)
                del self._entries[key]
                self._counters["evictions"] += 1
                evicted.append(entry.built)
        for built in evicted:  # outside the lock: forgetting a plan waits for the handles using it
            built.binding.on_evict()

    def evict_where(self, predicate) -> int:
        """Evict every built graph ``predicate(graph_id, built)`` holds for (its native
        plan forgotten, as an LRU eviction does); returns how many."""
        with self._lock:
            keys = [key for key, entry in self._entries.items() if predicate(key[0], entry.built)]
            evicted = [self._entries.pop(key).built for key in keys]
            self._counters["evictions"] += len(evicted)
        for built in evicted:  # outside the lock, as in evict_over_capacity
            built.binding.on_evict()
        return len(evicted)

    def entries(self, graph_id: Optional[int] = None) -> List[BuiltGraph]:
        """The cached BuiltGraphs (of ``graph_id``: one per device and input layout), least recently stamped first."""
        with self._lock:
            return [entry.built for (gid, *_), entry in self._entries.items() if graph_id is None or gid == graph_id]

    def drop_built(self) -> None:
        """Forget every built graph, registered ones included (the ids stay). Native plans
        are left to the extension: this runs at exit (registry/__init__.py)."""
        with self._lock:
            self._entries.clear()
            self._pinned.clear()

    def stats(self) -> dict:
        with self._lock:
            bindings = [entry.built.binding for entry in self._entries.values()]
            return dict(
                self._counters,
                cached=len(bindings),
                native=sum(b.native for b in bindings),
                native_pending=sum(b.pending for b in bindings),
                python_path=sum(not b.native for b in bindings),
                engines=dict(collections.Counter(entry.built.engine for entry in self._entries.values())),
                capacity=settings.get("graph_cache_capacity"),
                definitions=len(self.definitions),
                routes=dict(self._routes),
                plan_seconds=self._plan_seconds,
                phase_seconds=dict(self._phase_seconds),
            )


def check_pinned_specs(definition: Definition, built: BuiltGraph, specs: Sequence[TensorSpec]) -> None:
    check_arity(definition, len(specs))
    for i, (got, expected) in enumerate(zip(specs, built.inputs)):
        if got != expected:
            raise ValueError(
                f"cudnn_fe.execute: input {i} of graph {definition.name!r} is {got.describe()}, but the graph was built "
                f"for {expected.describe()}. Pass a tensor of that layout (e.g. .contiguous() / .to(dtype)), or register "
                "a builder (register_graph) so a graph is built for each layout."
            )


def _capturing(device: int) -> bool:
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()
