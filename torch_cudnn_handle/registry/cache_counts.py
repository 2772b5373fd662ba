"""``CacheCounts``: what the graph cache counts (hits, builds, calls by route, where plans came
from and the time they took), and the report ``stats.graphs()`` reads.

One per ``GraphCache``, guarded by that cache's lock: every method is called under it, so a
count and the table change it describes are one step.
"""

from __future__ import annotations

import collections

from .build import REFERENCE_SOURCE, BuiltGraph

__all__ = ["CacheCounts"]


class CacheCounts:
    def __init__(self):
        self.counters = dict(hits=0, misses=0, builds=0, evictions=0, hand_overs=0, background_builds=0, stand_in_calls=0)
        self.calls: "collections.Counter[str]" = collections.Counter()  # calls that reached Python, by route label (routes.py)
        self.plan_sources: "collections.Counter[str]" = collections.Counter()  # graphs obtained per plan source (plans/)
        self.plan_seconds = 0.0  # time spent obtaining them (BuiltGraph.build_seconds)
        self.phase_seconds: "collections.Counter[str]" = collections.Counter()  # the same by phase (build_timing.py)

    def stood_in(self, label: str, started_a_build: bool = False) -> None:
        """A call a stand-in served on route ``label``."""
        self.counters["background_builds"] += started_a_build
        self.counters["stand_in_calls"] += 1
        self.calls[label] += 1

    def kept(self, built: BuiltGraph) -> None:
        """``built`` became an entry: a build, unless a load or the interpreter's entry."""
        self.counters["builds"] += built.plan_source not in ("plan_store", REFERENCE_SOURCE)
        self.plan_sources[built.plan_source] += 1
        self.plan_seconds += built.build_seconds
        self.phase_seconds.update(built.phase_seconds or {})

    def phase(self, built: BuiltGraph, phase: str, seconds: float) -> None:
        """A phase after the build (build_timing.AFTER_BUILD_PHASES) took ``seconds`` more."""
        built.phase_seconds[phase] = built.phase_seconds.get(phase, 0.0) + seconds
        self.phase_seconds[phase] += seconds

    def evicted(self, evicted, native_calls: dict) -> None:
        """These built graphs left the cache; their native calls stay counted."""
        self.counters["evictions"] += len(evicted)
        for built in evicted:
            self.calls[built.route.label] += native_calls.get(built.native_serial, 0)

    def report(self, kept, native_calls: dict, **more) -> dict:
        """The counts with the ``kept`` built graphs' (their native calls included), and ``more``."""
        bindings = [built.binding for built in kept]
        calls = collections.Counter(self.calls)
        for built in kept:  # an evicted plan's were added to calls then
            calls[built.route.label] += native_calls.get(built.native_serial, 0)
        return dict(
            self.counters, cached=len(bindings), native=sum(b.native for b in bindings), native_pending=sum(b.pending for b in bindings),
            python_path=sum(not b.native for b in bindings), engines=dict(collections.Counter(built.engine for built in kept)),
            plan_sources=dict(self.plan_sources), routes=dict(calls), plan_seconds=self.plan_seconds, phase_seconds=dict(self.phase_seconds), **more,
        )
