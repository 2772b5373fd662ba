"""Where the time to obtain one built graph went: ``BuiltGraph.phase_seconds``.

One record per built graph, filled as the build goes (plans/__init__.py, build.py, and
the op for the first execution), with the phases in the order they run:

  * ``scope``: entering the device's build scope (build_scope.py: the thread's pooled
    handle there, on torch's current stream; a thread's first use creates it);
  * ``describe``: the builder run on a fresh description, validated (shape inference;
    on a GPU also the frontend's lowering and the backend's check);
  * ``key``: the plan store's key of the description (a fingerprint); only with the
    store on;
  * ``load``: the plan store's read, check and deserialize (a ``plan_store`` route), or
    the check and deserialize of a plan a build process built (for a build off the caller's
    path, the read and check there and the deserialize in the call that takes it);
  * ``build_process``: a background build's wait for a build process (Note [The build
    process], plans/build_process.py), which ran cuDNN's four build steps below;
  * ``operation_graph``, ``heuristics``, ``support``, ``plan``: cuDNN's build, step by
    step (``graph.build()`` is exactly these four): the backend's operation graph, the
    heuristics' ranked plan list, the support check, and building the first plan that
    builds (where a runtime-compiled engine compiles its kernels);
  * ``tune``: a tuned build's candidate timing (plan_tuning/), after the first three;
  * ``inspect``: the built graph read back (workspace size, engine name, the layout
    it writes);
  * ``serialize``: ``graph.serialize()``, once per graph (the store and the native
    hand-over share it); only with the store on, or with the hand-over at the build;
  * ``store``: the plan store's write;
  * ``native``: the native hand-over at the build (the default): the serialized plan decoded and registered with the
    extension, which deserializes it on the pooled handle (``_C.native_register``);
  * ``first_execution``: host seconds of the graph's first launch (recorded by the op,
    after the build; cuDNN loads a plan's kernels and may wait for the device there);
  * ``native_hand_over``: the native hand-over at the graph's second call (with
    ``hand_over="second_call"``): serialize (unless the store gave the blob), decode, register. No part of
    the first call; a graph used once never has it.

``build_seconds`` is the sum of every phase but ``AFTER_BUILD_PHASES``: the time a
call spent obtaining the graph. Of those, ``OBTAIN_PHASES`` are cuDNN's own work to
get a plan (a build or a load), which the plan store exists to cut; the rest
(``LIBRARY_PHASES``) are the library's own share around it.
"""

from __future__ import annotations

import time
from typing import Dict

__all__ = ["PHASES", "OBTAIN_PHASES", "LIBRARY_PHASES", "AFTER_BUILD_PHASES", "PhaseClock"]

PHASES = (
    "scope", "describe", "key", "load", "build_process", "operation_graph", "heuristics", "support", "plan", "tune", "inspect", "serialize", "store",
    "native", "first_execution", "native_hand_over",
)
OBTAIN_PHASES = ("load", "build_process", "operation_graph", "heuristics", "support", "plan", "tune")
LIBRARY_PHASES = ("scope", "describe", "key", "inspect", "serialize", "store", "native")
AFTER_BUILD_PHASES = ("first_execution", "native_hand_over")  # recorded by later calls, not in build_seconds


class PhaseClock:
    """Seconds per phase of one build: ``lap(phase)`` charges the time since the last
    lap (or since the clock started) to ``phase``. One thread's at a time (a fetched plan's
    clock passes from the build thread to the call that loads it: ``resume``)."""

    def __init__(self):
        self.seconds: Dict[str, float] = {}
        self._last = time.perf_counter()

    def resume(self) -> None:
        """The next lap starts now: the time since the last one was no phase's (a fetched plan waiting for its call)."""
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"PhaseClock: unknown phase {phase!r}; one of {PHASES}")
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now
