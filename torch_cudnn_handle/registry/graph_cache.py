"""``GraphCache``: the built graphs of this process, by key; the one LRU; in-flight builds.

  * Keys: a built graph per (id, device, the inputs' torch shapes/strides/dtypes, whether
    torch.use_deterministic_algorithms is on); a packed (ragged) input's token count is
    no part of it (ragged.py). A registered built graph is pinned: never in the LRU.
  * A key's route is decided at its first lookup (routes.py, Note [One route per call]),
    and by a call that meets it still building, and kept on the built graph; the cache
    follows it. Each key is built once: the first caller builds, outside the lock, behind
    a ``concurrent.futures.Future`` that concurrent first callers wait on and get its
    result or error from. A failed build is not kept: the next call tries again. A
    route that refuses a build (a capture) is an error with the fix (warm up first).
  * The native hand-over is the graph's ``NativeBinding`` (Note [The native hand-over]): this
    cache tells it when it is built (build.py), reused (a hit that reached Python) and evicted.
  * Recency: CLOCK_MONOTONIC ns, stamped by the Python path per hit and by the extension per native run.
  * Note [Builds off the caller's path]: where the route names a stand-in, a layout's first
    build runs on one of two build threads (cuDNN's part in a build process where the route
    allows: Note [The build process]), and the stand-in serves the calls the route says (Note
    [A new layout's first calls], first_calls.py); a call whose route has none (deterministic,
    a capture) waits for a build in flight. A plan it fetched stays in flight until the call that
    takes it loads it (Note [A fetched plan is loaded by the call that takes it], build.py). A
    failed background build is not retried there: the next call builds in its own path and raises.
  * Exit: the exit hook waits (at most ``EXIT_WAIT_SECONDS``) for builds in flight (a daemon thread
    in a cuDNN build while Python finalizes can crash it: SIGSEGV, H200). Built graphs live until
    evicted or dropped at exit; a running call and a capture (``_C.keep_alive_while_captured``) hold theirs.
  * Thread safety: one lock guards every table and the counts; no build, description or user code runs under it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import threading
import time
from typing import Dict, List, Optional, Sequence

import torch

from .. import settings
from .._extension import _C
from ..native import capturing as _capturing, last_used_ns  # _capturing: a seam the CPU tests replace
from .build import BuiltGraph, Fetched, build
from .cache_counts import CacheCounts
from .definition import Definition, Definitions, check_arity
from .first_calls import FirstCalls
from .pinned import PinnedGraphs
from .plans import build_process
from .routes import Facts, Resolved, Route, decide
from .specs import TensorSpec

__all__ = ["GraphCache", "EXIT_WAIT_SECONDS"]

EXIT_WAIT_SECONDS = 30.0  # the longest the exit hook waits for builds in flight (a fused linear builds in ~1.5 s)


class _Entry:
    __slots__ = ("built", "used_ns")

    def __init__(self, built: BuiltGraph):
        self.built, self.used_ns = built, time.monotonic_ns()


_MISS = object()  # _hit's answer for a key not built


class GraphCache:
    def __init__(self, definitions: Definitions, pinned: Optional[PinnedGraphs] = None):
        self.definitions = definitions
        self.pinned = pinned if pinned is not None else PinnedGraphs()  # registered built graphs (pinned.py)
        self._lock = threading.Lock()
        self._entries: Dict[tuple, _Entry] = {}
        self._in_flight: Dict[tuple, concurrent.futures.Future] = {}
        self._first_calls = FirstCalls()  # the build threads; the stand-in's calls per layout and site (first_calls.py)
        self._counts = CacheCounts()  # under the lock

    # -- lookups -------------------------------------------------------------------

    def lookup(self, graph_id: int, device: int, inputs: Sequence[torch.Tensor], key_specs: tuple, deterministic: bool = False,
               *, call: bool = True, stand_in: str = "") -> Optional[BuiltGraph]:
        """The graph ``graph_id`` built for ``device`` and these inputs; built on first use.
        ``key_specs``: the inputs' (shape, stride, dtype, is_cpu), the hot key. ``call``: the
        op runs it now (a pending binding is handed over first); else only its layout is
        wanted. ``stand_in``: what the caller can serve the call with while its plan builds
        ("interpreter", "torch_attention"); None while it does (the route's choice)."""
        key = (graph_id, device, key_specs, deterministic)
        built = self._hit(key)
        if built is not _MISS:
            return self._reused(built) if call and built is not None else built
        definition = self.definitions.get(graph_id)
        if definition.is_built:
            return self.pinned.for_call(definition, device, inputs)
        specs = tuple(TensorSpec.of(t) for t in inputs)
        check_arity(definition, len(specs))
        if definition.ragged is not None:  # one build serves every token count: keyed without them (the key
            specs = definition.call_specs(specs)  # above is never stored, so every such call here checks its inputs)
            key = (graph_id, device, specs, deterministic)
        facts = Facts("cuda", deterministic, _capturing(device), stand_in=stand_in, with_cuda=_C.with_cuda,
                      background_failed=self._first_calls.failed_before(key))
        return self._build_once(key, definition, device, specs, call, decide(definition, Resolved.now(), facts))

    def kept(self, graph_id: int, device: int, inputs: Sequence[torch.Tensor], key_specs: tuple, deterministic: bool):
        """The graph built for this call's key, or None (not built yet); counts nothing, builds nothing."""
        definition = self.definitions.get(graph_id)  # an unknown id: the registry's error
        if definition.is_built:
            return self.pinned.get(graph_id)
        specs = key_specs if definition.ragged is None else definition.call_specs(tuple(map(TensorSpec.of, inputs)))
        entry = self._entries.get((graph_id, device, specs, deterministic))  # one dict read: atomic under the GIL
        return None if entry is None else entry.built

    def _hit(self, key):
        """The built graph of ``key``, None for a call its stand-in still serves, or _MISS."""
        with self._lock:
            entry = self._entries.get(key)
            return _MISS if entry is None else self._served(key, entry)

    def _served(self, key, entry: "_Entry") -> Optional[BuiltGraph]:
        """A found entry's answer to a call (under the lock): its graph, or None while its stand-in serves this call's site."""
        entry.used_ns = time.monotonic_ns()
        self._counts.counters["hits"] += 1
        route = entry.built.route
        if route.stand_in_calls <= 0 or _capturing(entry.built.device) or not self._first_calls.stands_in(key, route):
            return entry.built  # a captured call: the plan, never a stand-in
        self._counts.stood_in(route.label)
        return None

    def _build_once(self, key, definition: Definition, device: int, specs, call: bool, route: Route) -> Optional[BuiltGraph]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                served = self._served(key, entry)
            else:
                self._counts.counters["misses"] += 1
                future = self._in_flight.get(key)
                owner = future is None
                if owner:
                    future = self._in_flight[key] = concurrent.futures.Future()
                background = owner and route.build_on == "build_thread"
                if background:
                    self._first_calls.first(key, route)
                stand_in = route.stand_in and not owner and self._first_calls.stands_in(key, route, future)
        if entry is not None:  # built by an earlier call (a packed graph's, or one that raced this call's first look)
            return self._reused(served) if call and served is not None else served
        if not owner:  # a concurrent first call: the stand-in, or its build's result (or error), run as a first call
            if stand_in:
                return self._stood_in(route)
            result = future.result()
            return self._taken(key, future, result) if isinstance(result, Fetched) else result
        if route.build_on == "refused":
            error = RuntimeError(
                f"cudnn_fe.execute: graph {definition.name!r} has not been built for cuda:{device} and inputs "
                f"{', '.join(s.describe() for s in specs)}, and the current stream is capturing a CUDA graph, "
                "which a build cannot be part of. Warm up before capture: run the same call once outside it.")
            self._fail(key, future, error)
            raise error
        if background:  # Note [Builds off the caller's path]: the stand-in serves this call
            self._first_calls.submit(self._run_build, key, definition, device, specs, future, route, True)
            return self._stood_in(route, started_a_build=True)
        if route.runs_on == "cudnn" and not route.tuned:  # Note [A call's build on a thread of its own] (first_calls.py)
            return self._first_calls.build_for_caller(self._run_build, key, definition, device, specs, future, route)
        return self._run_build(key, definition, device, specs, future, route)

    def _stood_in(self, route: Route, started_a_build: bool = False) -> None:
        """A call its route's stand-in serves while its plan builds: counted, and None for the caller."""
        with self._lock:
            self._counts.stood_in(route.label, started_a_build)

    def _run_build(self, key, definition: Definition, device: int, specs, future, route: Route, background: bool = False):
        try:
            if _C.with_cuda:
                _C.release_dropped()  # what destroyed CUDA graphs kept alive, freed outside any capture
            built = build(definition, device, specs, route, fetch_only=background)
        except BaseException as error:
            self._fail(key, future, error, background)
            raise
        if not isinstance(built, Fetched):  # a fetched plan stays in flight until a call takes it (_taken)
            self._keep(key, future, built)
        future.set_result(built)
        return built

    def _taken(self, key, future, fetched: Fetched) -> BuiltGraph:
        """A fetched plan, loaded on a call-build thread once for every taker (Note [A fetched plan is loaded by the call that takes it])."""
        try:
            built = self._first_calls.build_for_caller(fetched.load)
        except BaseException as error:
            self._fail(key, future, error)
            raise
        self._keep(key, future, built)
        return built

    def _keep(self, key, future, built: BuiltGraph) -> None:
        """``built`` becomes ``key``'s entry (once: ``future`` still the key's in flight), counted."""
        with self._lock:
            if self._in_flight.get(key) is not future:
                return
            self._counts.kept(built)
            self._entries[key] = _Entry(built)
            del self._in_flight[key]
        self.evict_over_capacity()

    def _fail(self, key, future, error: BaseException, background: bool = False) -> None:
        """A build (or a fetched plan's load) that raised is not kept: the next call builds again (in
        its own path after a failed background build)."""
        with self._lock:
            if self._in_flight.get(key) is future:
                del self._in_flight[key]
                self._first_calls.forget(key, failed_off_path=background)
        if not future.done():
            future.set_exception(error)

    def _reused(self, built: BuiltGraph) -> BuiltGraph:
        """``built``, found built for a call: its binding may hand it over now (its second call)."""
        seconds = built.binding.on_reuse(built.device)
        if seconds is not None:
            with self._lock:
                self._counts.counters["hand_overs"] += 1
                self._counts.phase(built, "native_hand_over", seconds)
        return built

    def count_call(self, label: str) -> None:
        """A call the Python path or the CPU kernel served, on route ``label`` (the extension counts native ones)."""
        with self._lock:
            self._counts.calls[label] += 1

    def wait_for_builds(self, timeout: float, take: bool = True) -> int:
        """Wait, at most ``timeout`` s, until no build is in flight (later ones too); how many still
        are (0: none). ``take``: then load the plans they fetched here (Fetched), as a call would."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                in_flight = list(self._in_flight.items())
            pending = [future for _, future in in_flight if not future.done()]
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                break
            concurrent.futures.wait(pending, timeout=left)
        for key, future in in_flight if take and not pending else ():
            with contextlib.suppress(Exception):  # a build's error, or a failed load: the key's next call builds and raises
                if isinstance(future.result(), Fetched):
                    self._taken(key, future, future.result())
        return len(pending)

    def record_first_execution(self, built: BuiltGraph, seconds: float) -> None:
        """The op's first launch of ``built`` took ``seconds`` (``phase_seconds["first_execution"]``; the first record stands)."""
        if built.phase_seconds is None:  # a registered built graph: no build to time
            return
        with self._lock:
            if "first_execution" not in built.phase_seconds:
                self._counts.phase(built, "first_execution", seconds)

    # -- the LRU -------------------------------------------------------------------

    def evict_over_capacity(self) -> None:
        """Drop the least recently used built graphs beyond the ``graph_cache_capacity`` setting."""
        capacity = settings.get("graph_cache_capacity")
        with self._lock:
            if len(self._entries) <= capacity:
                return
            native_used = last_used_ns([entry.built.binding for entry in self._entries.values()])
            oldest = heapq.nsmallest(len(self._entries) - capacity, self._entries.items(),  # one pass
                                     key=lambda item: max(item[1].used_ns, native_used.get(item[1].built.native_serial, 0)))
            keys = [key for key, _ in oldest]
        self._evict(keys)

    def evict_where(self, predicate) -> int:
        """Evict every built graph ``predicate(graph_id, built)`` holds for (its native
        plan forgotten, as an LRU eviction does); returns how many."""
        with self._lock:
            keys = [key for key, entry in self._entries.items() if predicate(key[0], entry.built)]
        return self._evict(keys)

    def _evict(self, keys) -> int:
        """Drop these entries; their native calls stay counted, their native plans are forgotten
        outside the lock (forgetting a plan waits for the handles using it)."""
        native_calls = _C.native_calls() if _C.with_cuda and keys else {}
        with self._lock:
            evicted = [entry.built for entry in (self._entries.pop(key, None) for key in keys) if entry is not None]
            for key in keys:  # a layout built again starts its counts again
                self._first_calls.forget(key)
            self._counts.evicted(evicted, native_calls)
        for built in evicted:
            built.binding.on_evict()
        return len(evicted)

    def entries(self, graph_id: Optional[int] = None) -> List[BuiltGraph]:
        """The cached BuiltGraphs (of ``graph_id``: one per device and input layout), in the order they were built."""
        with self._lock:
            return [entry.built for (gid, *_), entry in self._entries.items() if graph_id is None or gid == graph_id]

    def drop_built(self) -> None:
        """Forget every built graph, registered ones too (ids stay; native plans are the extension's): at exit."""
        with self._lock:
            self._entries.clear()
        self.pinned.clear()

    def stats(self) -> dict:
        native_calls = _C.native_calls() if _C.with_cuda else {}
        with self._lock:
            return self._counts.report([entry.built for entry in self._entries.values()], native_calls,
                                       capacity=settings.get("graph_cache_capacity"), definitions=len(self.definitions))
