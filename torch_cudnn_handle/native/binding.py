"""``NativeBinding``: one built graph's place on the native path, as one state machine.

Note [The native hand-over]: a built graph whose selected plan the cuDNN backend serves
is handed to the native path: serialized (unless the plan store gave its blob), read
(eligibility.py) and registered with the extension, which deserializes the plan on this
thread's pooled handle for the device (``_C.native_register``); from then on the CUDA
kernel of ``cudnn_fe.execute`` runs its calls with no Python. When, by the
``native_hand_over`` setting: at the build (the default), so the first call already runs
on the plan every later call runs on, and only it may wait for the device (cuDNN waits
on a plan's first execution); or at the graph's second call that reaches Python, so a
layout used once never pays the hand-over (about 5-7 ms for an SDPA forward and
backward), at the price of a second such wait then (measured on the H200). A hand-over
that fails leaves the Python path, which runs every plan, and ``reason`` says why.

States, each change made once under the binding's lock:

    python  --------------------------------------------  (not eligible; reason)
    pending --on_build("build") / on_reuse()--> native    (one thread hands over; the
            \\-- a failed registration ---------> python    others run on the Python path)
    native  --on_evict()--> python (the plan forgotten)

A binding evicted while a thread hands it over forgets the plan that hand-over made.
Never during a CUDA-graph capture: the graph stays pending and the captured call runs on
the Python path. Lifetime: the BuiltGraph owns its binding; the extension owns the
registered plan until ``on_evict`` forgets it (process exit leaves it, as the pool leaves
its handles: Note [Leaked on purpose] in csrc/pool/device_thread_handle_pool.h).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .. import settings
from .._extension import _C
from ..build_scope import build_scope
from .eligibility import backend_plan_of

__all__ = ["NativeBinding", "HandOverSource"]

BOOL_REASON = "a torch.bool operand, packed to cuDNN's bits per call on the Python path (Note [Bit-packed booleans])"
PENDING_REASON = "a backend plan, run from C++ from its second call on (its first ran on the Python path)"
DISABLED_REASON = "native path disabled"


@dataclasses.dataclass(frozen=True)
class HandOverSource:
    """What a hand-over registers the plan with, kept from the build until then."""

    graph: Any  # the built cudnn.pygraph
    graph_id: int
    device: int
    inputs: Sequence[Tuple]  # (shape, stride, dtype, host) per input (specs.layout_lists)
    outputs: Sequence[Tuple]
    output_positions: Sequence[int]
    uids: Sequence[int]
    deterministic: bool
    tokens_of: Optional[List[int]] = None  # ragged: per operand, the input whose token count it has (-1: exact)
    serialized: Optional[bytes] = None  # the plan store's blob; None: serialize at the hand-over


class NativeBinding:
    """See the module docstring. Thread-safe."""

    def __init__(self, state: str, reason: str, source: Optional[HandOverSource] = None):
        self._lock = threading.Lock()
        self._graph_id = source.graph_id if source is not None else 0
        self.state = state  # "python" | "pending" | "native"
        self.reason = reason  # why it runs where it runs
        self.serial = 0  # the native plan's id in the extension (0: none)
        self._source = source  # kept while pending
        self._handing_over = False
        self._evicted = False

    @classmethod
    def on_build(cls, source: HandOverSource, *, when: str, has_bool: bool, lap=None) -> "NativeBinding":
        """The binding of a graph just built, handed over ``when`` its route says ("at_build",
        "second_call", "never": registry/routes.py); ``lap(phase)`` ends the ``serialize`` and
        ``native`` phases of a hand-over at the build (registry/build_timing.py)."""
        if when == "never":
            return cls("python", DISABLED_REASON)
        if has_bool:
            return cls("python", BOOL_REASON)
        if getattr(source.graph, "selected_engine", None) is not None:
            return cls("python", backend_plan_of(source.graph, tuple(source.uids))[1])  # a frost engine's: said without serializing
        binding = cls("pending", PENDING_REASON, source)
        if when == "at_build":
            binding.claim()
            binding.finish(*binding._register(at_build=True, lap=lap or (lambda phase: None)))
        return binding

    @property
    def native(self) -> bool:
        return self.state == "native"

    @property
    def pending(self) -> bool:
        return self.state == "pending"

    def on_reuse(self, device: int) -> Optional[float]:
        """A later call found the graph built: a pending one is handed over by the one
        thread that claims it. Returns the hand-over's seconds, or None when none ran."""
        if self.state != "pending" or capturing(device) or not self.claim():
            return None
        started = time.perf_counter()
        try:
            result = self._register(at_build=False, lap=lambda phase: None)
        except BaseException:  # _register reports registration failures; anything else leaves it pending
            with self._lock:
                self._handing_over = False
            raise
        self.finish(*result)
        return time.perf_counter() - started

    def on_evict(self) -> None:
        """The graph cache dropped the graph: its native plan is forgotten."""
        with self._lock:
            self._evicted = True
            serial, was_native = self.serial, self.state == "native"
            if not self._handing_over:
                self.state, self._source = "python", None
                if was_native:
                    self.reason = "evicted from the graph cache"
        if was_native:
            _C.native_forget(self._graph_id, serial)

    def run(self, inputs) -> Optional[List[torch.Tensor]]:
        """The call's outputs from the native plan, or None (not native, or no plan fits these inputs)."""
        return _C.run_native(self._graph_id, inputs) if self.state == "native" else None

    def run_out(self, inputs, out) -> bool:
        return self.state == "native" and bool(_C.run_native_out(self._graph_id, inputs, out))

    def run_in_place(self, inputs) -> Optional[List[torch.Tensor]]:
        return _C.run_native_in_place(self._graph_id, inputs) if self.state == "native" else None

    # -- the hand-over: claim() by one thread, then finish() with its result ----------

    def claim(self) -> bool:
        """Whether this thread hands the pending graph over (one thread, until ``finish``)."""
        with self._lock:
            if self.state != "pending" or self._handing_over:
                return False
            self._handing_over = True
            return True

    def _register(self, *, at_build: bool, lap) -> Tuple[bool, int, str]:
        """``(native, serial, reason)``: the plan registered with the extension, or why not."""
        source = self._source
        with build_scope(source.device):
            serialized = source.serialized
            if serialized is None:
                serialized = _serialized(source.graph)  # None: backend_plan_of tries again and says why
                lap("serialize")
            result = self._registered(source, serialized, at_build)
        lap("native")
        return result

    @staticmethod
    def _registered(source: HandOverSource, serialized, at_build: bool) -> Tuple[bool, int, str]:
        spec, reason = backend_plan_of(source.graph, tuple(source.uids), serialized)
        if spec is None:
            return False, 0, reason
        # The C++ CUDA-graph switch, from the setting's value now: its variable is read here,
        # where the native path is first used, not at import (set() reaches it at once: native/__init__.py).
        _C.set_native_cuda_graphs(bool(settings.get("native_cuda_graphs")))
        try:  # deserialized on this thread's pooled handle for the device (the extension picks it)
            serial, _, graph_route = _C.native_register(
                source.graph_id, source.device, list(source.inputs), list(source.outputs), list(source.uids),
                spec.plan_json.encode("utf-8"), by_value=list(spec.by_value), fe_workspace_size=spec.fe_workspace_size,
                workspace_tensors=list(spec.workspace_tensors), replacements=list(spec.replacements),
                output_positions=list(source.output_positions), deterministic=source.deterministic, cuda_graph=spec.cuda_graph,
                **({} if source.tokens_of is None else dict(tokens_of=list(source.tokens_of))),
            )
        except Exception as error:  # noqa: BLE001 -- the Python path runs every plan; say why this one is there
            return False, 0, f"native registration failed, so the Python path runs it ({type(error).__name__}: {error})"
        launched = f" (launched as a CUDA graph {graph_route} when its addresses repeat)" if graph_route else ""
        return True, serial, "backend plan, run from C++" + launched + ("" if at_build else ", handed over at its second call")

    def finish(self, native: bool, serial: int, reason: str) -> None:
        """Publish a claimed hand-over's result; an eviction meanwhile wins (the plan is forgotten)."""
        with self._lock:
            self._handing_over, self._source = False, None
            evicted = self._evicted
            if evicted:
                self.state, self.reason = "python", "evicted from the graph cache while it was handed to the native path; the Python path runs it"
            else:
                self.serial, self.reason = serial, reason
                self.state = "native" if native else "python"  # last: a reader that sees it finds the plan registered
        if evicted and native:
            _C.native_forget(self._graph_id, serial)


def _serialized(graph) -> Optional[bytes]:
    try:
        return graph.serialize(as_bytes=True)
    except Exception:  # noqa: BLE001 -- not serializable: backend_plan_of says why
        return None


def capturing(device: int) -> bool:
    """Whether the current stream of ``device`` is capturing a CUDA graph (registry/graph_cache.py asks too)."""
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def last_used_ns(bindings: Sequence[NativeBinding]) -> Dict[int, int]:
    """serial -> when its native plan last ran (the extension's record, CLOCK_MONOTONIC ns, the
    clock ``time.monotonic_ns`` reads); {} when none of ``bindings`` is native."""
    return _C.native_last_used() if any(b.native for b in bindings) else {}
