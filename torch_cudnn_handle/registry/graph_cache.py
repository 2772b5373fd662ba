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
  * Recency: one clock, CLOCK_MONOTONIC ns: the Python path stamps each hit; eviction also
    reads a native plan's last run from the extension, stamped on the same clock.
  * Note [Builds off the caller's path]: with the ``background_builds`` setting (or a
    graph's ``background_builds=True``), a call the op can serve without cuDNN (the torch
    interpreter on the inputs' device) does not wait for its layout's first build: one of
    two build threads builds it (cuDNN's part in a build process where it can: Note [The
    build process], plans/build_process.py), and calls at that layout run on the stand-in
    until it is done. Never under deterministic algorithms (the calls wait: no two
    implementations in one deterministic run) nor while capturing (a build in flight is
    waited for; none can start: warm up first). A failed background build is not retried
    there: the next call builds in its own path and raises the error. The stand-in's
    results agree with the plan's within the engines' numerics, not bitwise.
  * Exit: the exit hook waits (at most ``EXIT_WAIT_SECONDS``) for the builds in flight: a
    daemon thread inside a cuDNN build while Python finalizes can crash it (SIGSEGV, H200).
  * Lifetimes: built graphs live until evicted (or dropped at exit); a call running one
    holds a reference, and a capture keeps what it needs (``_C.keep_alive_while_captured``).
  * Thread safety: one lock guards every table; no build, description or user code runs
    under it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import heapq
import threading
import time
from typing import Dict, List, Optional, Sequence

import torch

from .. import _C, settings
from ..native import capturing as _capturing, last_used_ns  # _capturing: a seam the CPU tests replace
from .build import REFERENCE_ROUTE, BuiltGraph, build
from .definition import Definition, Definitions, check_arity
from .pinned import PinnedGraphs
from .plans import build_process
from .specs import TensorSpec

__all__ = ["GraphCache", "EXIT_WAIT_SECONDS"]

EXIT_WAIT_SECONDS = 30.0  # the longest the exit hook waits for builds in flight (a fused linear builds in ~1.5 s)


def _relaxed_build_thread() -> None:
    """A build thread is part of no CUDA-graph capture: cuDNN's allocations there must not
    end a capture another thread makes in global mode (one that waits for this build)."""
    if _C.with_cuda:
        _C.relax_capture_mode_for_this_thread()


class _Entry:
    __slots__ = ("built", "used_ns")

    def __init__(self, built: BuiltGraph):
        self.built, self.used_ns = built, time.monotonic_ns()


class GraphCache:
    """See the module docstring."""

    def __init__(self, definitions: Definitions, pinned: Optional[PinnedGraphs] = None):
        self.definitions = definitions
        self.pinned = pinned if pinned is not None else PinnedGraphs()  # registered built graphs (pinned.py)
        self._lock = threading.Lock()
        self._entries: Dict[tuple, _Entry] = {}
        self._in_flight: Dict[tuple, concurrent.futures.Future] = {}
        self._foreground_only: set = set()  # keys whose background build failed: built in the caller's path
        self._builder: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._counters = dict(hits=0, misses=0, builds=0, evictions=0, hand_overs=0, background_builds=0, stand_in_calls=0)
        self._routes: "collections.Counter[str]" = collections.Counter()  # graphs obtained per route (plans/)
        self._plan_seconds = 0.0  # time spent obtaining them (BuiltGraph.build_seconds)
        self._phase_seconds: "collections.Counter[str]" = collections.Counter()  # the same by phase (build_timing.py)

    # -- lookups -------------------------------------------------------------------

    def lookup(self, graph_id: int, device: int, inputs: Sequence[torch.Tensor], key_specs: tuple, deterministic: bool = False,
               *, call: bool = True, stand_in: bool = False) -> Optional[BuiltGraph]:
        """The graph ``graph_id`` built for ``device`` and these inputs; built on first use.
        ``key_specs``: the inputs' (shape, stride, dtype, is_cpu), the hot key. ``call``:
        the op runs it now (a pending binding is handed over first); else only its layout
        is wanted. ``stand_in``: the caller can serve the call without cuDNN, so with the
        ``background_builds`` setting on (read here, on a miss only) a first use builds in the
        background and returns None (Note [Builds off the caller's path])."""
        key = (graph_id, device, key_specs, deterministic)
        built = self._hit(key)
        if built is not None:
            return self._reused(built) if call else built
        definition = self.definitions.get(graph_id)
        if definition.is_built:
            return self.pinned.for_call(definition, device, inputs)
        specs = tuple(TensorSpec.of(t) for t in inputs)
        check_arity(definition, len(specs))
        if definition.ragged is not None:
            # One build serves every token count: keyed without them. The key with them
            # (above) is never stored, so every such call on this path checks its inputs.
            specs = definition.call_specs(specs)
            key = (graph_id, device, specs, deterministic)
        background = stand_in and not deterministic and bool(settings.resolve("background_builds", definition.background_builds))
        return self._build_once(key, definition, device, specs, call, background and not _capturing(device))

    def _hit(self, key) -> Optional[BuiltGraph]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            entry.used_ns = time.monotonic_ns()
            self._counters["hits"] += 1
            return entry.built

    def _build_once(self, key, definition: Definition, device: int, specs, call: bool, stand_in: bool = False) -> Optional[BuiltGraph]:
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
                background = owner and stand_in and key not in self._foreground_only
        if entry is not None:  # built by an earlier call (a packed graph's, or one that raced this call's first look)
            return self._reused(entry.built) if call else entry.built
        if not owner:  # a concurrent first call: its build's result (or error), run as a first call
            if stand_in and not future.done():
                with self._lock:
                    self._counters["stand_in_calls"] += 1
                return None
            return future.result()
        try:
            if _capturing(device):
                raise RuntimeError(
                    f"cudnn_fe.execute: graph {definition.name!r} has not been built for cuda:{device} and inputs "
                    f"{', '.join(s.describe() for s in specs)}, and the current stream is capturing a CUDA graph, "
                    "which a build cannot be part of. Warm up before capture: run the same call once outside it."
                )
        except BaseException as error:
            self._fail(key, future, error)
            raise
        if background:  # Note [Builds off the caller's path]: the stand-in serves this call
            self._background().submit(self._run_build, key, definition, device, specs, future, True)
            with self._lock:
                self._counters["background_builds"] += 1
                self._counters["stand_in_calls"] += 1
            return None
        return self._run_build(key, definition, device, specs, future)

    def _run_build(self, key, definition: Definition, device: int, specs, future, background: bool = False) -> BuiltGraph:
        try:
            if _C.with_cuda:
                _C.release_dropped()  # what destroyed CUDA graphs kept alive, freed outside any capture
            built = build(definition, device, specs, deterministic=key[3], off_path=background)
        except BaseException as error:
            self._fail(key, future, error, background)
            raise
        with self._lock:
            self._counters["builds"] += built.route not in ("plan_store", REFERENCE_ROUTE)  # a load, or the interpreter's entry: no build
            self._routes[built.route] += 1
            self._plan_seconds += built.build_seconds
            self._phase_seconds.update(built.phase_seconds or {})
            self._entries[key] = _Entry(built)
            del self._in_flight[key]
        self.evict_over_capacity()
        future.set_result(built)
        return built

    def _fail(self, key, future, error: BaseException, background: bool = False) -> None:
        """A build that raised is not kept (a failed background build's key builds in the caller's path next)."""
        with self._lock:
            del self._in_flight[key]
            if background:
                self._foreground_only.add(key)
        future.set_exception(error)

    def _background(self) -> concurrent.futures.ThreadPoolExecutor:
        """The build threads, one per build process (each waits on one), made on first use (the
        exit hook waits for their builds)."""
        with self._lock:
            if self._builder is None:
                self._builder = concurrent.futures.ThreadPoolExecutor(max_workers=build_process.HELPERS, thread_name_prefix="torch_cudnn_handle-build",
                                                                      initializer=_relaxed_build_thread)
            return self._builder

    def _reused(self, built: BuiltGraph) -> BuiltGraph:
        """``built``, found built for a call: its binding may hand it over now (its second call)."""
        seconds = built.binding.on_reuse(built.device)
        if seconds is not None:
            with self._lock:
                self._counters["hand_overs"] += 1
                built.phase_seconds["native_hand_over"] = built.phase_seconds.get("native_hand_over", 0.0) + seconds
                self._phase_seconds["native_hand_over"] += seconds
        return built

    def wait_for_builds(self, timeout: float) -> int:
        """Wait until no build is in flight, at most ``timeout`` seconds (builds that start
        meanwhile are waited for too); the number still in flight then (0: none)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                pending = list(self._in_flight.values())
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                return len(pending)
            concurrent.futures.wait(pending, timeout=left)

    def record_first_execution(self, built: BuiltGraph, seconds: float) -> None:
        """The op's first launch of ``built`` took ``seconds`` (``phase_seconds["first_execution"]``; the first record stands)."""
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
            for key, entry in heapq.nsmallest(len(self._entries) - capacity, self._entries.items(), key=last_use):  # one pass
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
        """The cached BuiltGraphs (of ``graph_id``: one per device and input layout), in the order they were built."""
        with self._lock:
            return [entry.built for (gid, *_), entry in self._entries.items() if graph_id is None or gid == graph_id]

    def drop_built(self) -> None:
        """Forget every built graph, registered ones included (the ids stay). Native plans
        are left to the extension: this runs at exit (registry/__init__.py)."""
        with self._lock:
            self._entries.clear()
        self.pinned.clear()

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
