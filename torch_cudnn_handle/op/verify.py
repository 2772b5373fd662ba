"""Verify mode: each built graph's first execution checked against the reference interpreter.

With the ``verify`` setting on (``TORCH_CUDNN_HANDLE_VERIFY=1``, ``settings.set_verify``;
off by default), the op's first launch of every built graph (one per plan: per graph,
device, input layout and determinism; the native path's first call goes through the
Python path too) is followed by the interpreter's run of the same call on the same
device (op/reference.py ``execute_reference``), and the two are compared by the rule of
tolerance.py. A mismatch raises ``VerifyMismatch`` naming the graph, the layout
(``TensorSpec.describe`` of each input), the engine (``BuiltGraph.engine``), and per
output the max abs and max rel errors and the tolerance; every check counts in
``stats.verify()``.

  * The reference computes in float64 where that is cheap (no attention node, and at
    most ``FLOAT64_ELEMENTS`` input and output elements), else float32.
  * What a graph leaves undefined is not compared: a launch of ``execute`` or
    ``execute_`` writes into outputs pre-filled with NaN, and in a graph with a padding
    mask or a ragged output an element still NaN is unwritten (counted, not compared);
    rows past a padded attention's sequence lengths are undefined too. ``execute.out``
    into such a graph's outputs (the caller's memory, not filled) is skipped, counted.
  * Never during a CUDA-graph capture (a capture would record the check): skipped,
    counted; a graph the interpreter does not know is skipped, counted, with one warning.
  * Costs: verify mode synchronizes (the comparison reads the errors on the host), runs
    the interpreter once per built graph, and copies an in-place graph's written inputs
    before its first launch. Off, nothing runs: the setting is read only in the first
    launch's branch (python_path.py), never per call.
"""

from __future__ import annotations

import collections
import threading
import time
import warnings
from typing import List, Optional, Sequence

import torch

from .. import registry, settings
from ..interpreter.description import node_kind
from ..registry import TensorSpec
from .reference import description_for, execute_reference
from .tolerance import OutputCheck, check_output, rules_for

__all__ = ["VerifyMismatch", "FirstExecution", "first_execution", "compare", "stats", "FLOAT64_ELEMENTS"]

FLOAT64_ELEMENTS = 1 << 24
_PREFILLED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_lock = threading.Lock()
_counts = collections.Counter()
_skipped = collections.Counter()
_seconds = [0.0]
_warned = set()


class VerifyMismatch(RuntimeError):
    """A built graph's first execution disagreed with the reference interpreter."""


def stats() -> dict:
    """``checked`` (first executions compared), ``mismatches``, ``skipped`` (by reason),
    ``seconds`` (spent checking), ``enabled`` (the setting now)."""
    with _lock:
        return dict(checked=_counts["checked"], mismatches=_counts["mismatches"], skipped=dict(_skipped), seconds=_seconds[0],
                    enabled=bool(settings.get("verify")))


def _skip(reason: str) -> None:
    with _lock:
        _skipped[reason] += 1


def _padded_attention(graph) -> list:
    return [n for n in graph.nodes if node_kind(n) in ("SDPA", "SDPA_BWD") and n.params.get("use_padding_mask")]


def may_leave_unwritten(described) -> bool:
    """Whether a graph may leave output elements unwritten: a padding mask, a ragged output."""
    return bool(_padded_attention(described.graph)) or any(t.ragged_offset is not None for t in described.outputs)


_ROWS_OF = {"O": "seq_len_q", "Stats": "seq_len_q", "dQ": "seq_len_q", "dK": "seq_len_kv", "dV": "seq_len_kv"}


def defined(described, inputs: Sequence[torch.Tensor], index: int, value: torch.Tensor) -> Optional[torch.Tensor]:
    """Which elements of output ``index`` (not packed) the graph defines: a padded
    attention's rows up to each batch element's sequence length; None: all of them."""
    uid = described.outputs[index].uid
    position = {t.uid: i for i, t in enumerate(described.inputs)}
    for node in _padded_attention(described.graph):
        port = next((p for p, t in node.outputs.items() if t is not None and t.uid == uid), None)
        lengths = node.inputs.get(_ROWS_OF.get(port, ""))
        if lengths is None or lengths.uid not in position or value.dim() != 4:
            continue
        per_batch = inputs[position[lengths.uid]].reshape(-1).to(value.device)
        rows = torch.arange(value.shape[2], device=value.device).view(1, 1, -1, 1)
        return rows < per_batch.view(-1, 1, 1, 1)
    return None


def compare(name: str, layout: str, engine: str, described, got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
            inputs: Sequence[torch.Tensor], *, intermediate=None, reference_dtype=torch.float32, unwritten_allowed: bool = False) -> List[OutputCheck]:
    """Compare a launch's outputs with the interpreter's (the op's order and layouts);
    raises ``VerifyMismatch`` with the report when one is outside its tolerance. The
    CPU-testable seam of verify mode: no launch, no settings."""
    rules = rules_for(described.graph, described.outputs, intermediate)
    checks = []
    packed = described.layout.tokens_like
    for i, (rule, g, e) in enumerate(zip(rules, got, expected)):
        mask = None if (packed and packed[i] >= 0) else defined(described, inputs, i, e)
        if unwritten_allowed and g.dtype in _PREFILLED:
            written = ~(g.isnan() & ~e.to(g.device).isnan())
            mask = written if mask is None else mask & written
        checks.append(check_output(i, rule, g, e, mask))
    wrong = [c for c in checks if not c.ok]
    if wrong:
        raise VerifyMismatch(
            f"verify: graph {name!r} computed wrong outputs at its first execution: cuDNN's results differ from the reference "
            f"interpreter's ({str(reference_dtype).replace('torch.', '')}) beyond the tolerance of their data types.\n"
            f"  layout: {layout}\n  engine: {engine}\n" + "\n".join(f"  {c.describe()}" for c in wrong) +
            "\n(verify mode: the verify setting, TORCH_CUDNN_HANDLE_VERIFY; op/tolerance.py has the rule)"
        )
    return checks


def _reference_dtype(described, inputs, outputs) -> torch.dtype:
    if any(node_kind(n) in ("SDPA", "SDPA_BWD") for n in described.graph.nodes):
        return torch.float32
    elements = sum(t.numel() for t in (*inputs, *outputs))
    return torch.float64 if elements <= FLOAT64_ELEMENTS else torch.float32


def _copy(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


class FirstExecution:
    """One built graph's first execution under verify mode: made before the launch (it
    keeps the inputs the launch writes as they were), finished after it."""

    def __init__(self, graph_id: int, built, inputs: Sequence[torch.Tensor], written: Sequence[int] = ()):
        self.graph_id, self.built = graph_id, built
        self.inputs = [(_copy(t) if i in written else t) for i, t in enumerate(inputs)]
        self.described = description_for(graph_id, inputs, torch.device("cuda", built.device))

    def prefilled(self, outputs: List[torch.Tensor]) -> List[torch.Tensor]:
        """Fresh outputs, the float16/bfloat16/float32/float64 ones filled with NaN (what the
        plan leaves unwritten stays NaN; fp8, integer and boolean outputs are left as they are)."""
        for t in outputs:
            if t.dtype in _PREFILLED:
                t.fill_(float("nan"))
        return outputs

    def finish(self, outputs: Sequence[torch.Tensor], *, prefilled: bool = True) -> Optional[List[OutputCheck]]:
        definition = registry.definition(self.graph_id)
        started = time.perf_counter()
        unwritten = may_leave_unwritten(self.described)
        if unwritten and not prefilled:
            _skip("execute.out into outputs the graph may leave partly unwritten")
            return None
        dtype = _reference_dtype(self.described, self.inputs, outputs)
        try:
            expected = execute_reference(self.graph_id, self.inputs, compute_dtype=dtype)
        except NotImplementedError as error:
            _skip("a node the interpreter does not know")
            if definition.name not in _warned:
                _warned.add(definition.name)
                warnings.warn(f"verify: graph {definition.name!r} is not checked: {error}", RuntimeWarning, stacklevel=4)
            return None
        specs = [TensorSpec.of(t) for t in self.inputs]
        intermediate = definition.data_types.for_call(definition.name, specs)[1]
        try:
            return compare(
                definition.name, ", ".join(s.describe() for s in specs), self.built.engine, self.described, outputs, expected,
                self.inputs, intermediate=intermediate, reference_dtype=dtype, unwritten_allowed=unwritten and prefilled,
            )
        except VerifyMismatch:
            with _lock:
                _counts["mismatches"] += 1
            raise
        finally:
            with _lock:
                _counts["checked"] += 1
                _seconds[0] += time.perf_counter() - started


def first_execution(graph_id: int, built, inputs: Sequence[torch.Tensor], written: Sequence[int] = ()) -> Optional[FirstExecution]:
    """The check of ``built``'s first execution where its route says (the verify setting,
    read when the route was decided: registry/routes.py), else None."""
    if not built.route.verify:
        return None
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        _skip("CUDA-graph capture")
        return None
    return FirstExecution(graph_id, built, inputs, written)
