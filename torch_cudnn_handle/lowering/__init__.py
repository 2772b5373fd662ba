"""``backend()``: a torch.compile backend that lowers an unmodified model's attention, norms,
linear epilogues and SwiGLU gates onto cuDNN graphs; ``reports()`` says what it lowered and kept.

``torch.compile(model, backend=lowering.backend())`` takes the graph dynamo traced from the
model as it is written and replaces each match the library serves with a call of
``torch.ops.cudnn_fe.execute`` on the graph the ``nn`` modules use (the same graphs, their
backward included, so autograd and dynamic shapes work as they do for the modules); the
rest goes to the inner backend (inductor by default). The parameters stay the model's own:
they are the traced graph's inputs. The patterns, one module each:

* attention.py: ``F.scaled_dot_product_attention``, causal or not, grouped-query heads with
  ``enable_gqa=True``, a mask (boolean or of q's dtype) as an additive bias; fp16/bf16, a head
  dim that is a multiple of 8, no dropout, the default scale;
* norms.py: ``F.rms_norm`` / ``nn.RMSNorm``, RMSNorm written by hand (Llama's and OLMo 2's
  orders of the weight and the cast), and ``F.layer_norm`` / ``nn.LayerNorm``: over the last
  dim, with a weight (and a bias), a constant eps;
* linears.py (activations.py reads the activation): a linear (bias or none), or an addmm viewed
  back (GPT-2's ``Conv1D``), whose output goes through exact or tanh gelu (torch's, or written
  out as GPT-2 writes it), relu or silu alone; and SwiGLU's gate ``silu(linear(x, W_gate)) * linear(x, W_up)``.

Anything else stays torch's, and ``reports()`` says why, node by node (``explain()`` says it
before compiling; ``backend(patterns=...)`` lowers only the families named). A CPU model is
lowered too: the op runs each graph through its reference interpreter, so the lowering is
tested without a GPU.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Iterable, List, Optional, Union

import torch.fx

from ..registry.first_calls import frame_runner, new_site
from .attention import Attention
from .linears import LinearActivation
from .norms import LAYER_NORM, RMS_NORM, WrittenRMSNorm

__all__ = ["backend", "explain", "lower", "reports", "Explanation", "Lowered", "PATTERNS"]

PATTERNS = ("attention", "rms_norm", "layer_norm", "linear_activation")  # what backend(patterns=...) names


@dataclasses.dataclass(frozen=True)
class Lowered:
    """One match in a traced graph: which pattern, which node, whether it was lowered, and why (not)."""

    pattern: str  # "attention" | "rms_norm" | "layer_norm" | "linear_activation"
    node: str
    lowered: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What ``backend()`` would do to a model: the graphs dynamo traces from it, why it broke
    between them, and every match with its decision (``explain``)."""

    graphs: int
    graph_breaks: List[str]
    entries: List[Lowered]

    def __str__(self) -> str:
        lines = [f"{self.graphs} graph(s), {len(self.graph_breaks)} graph break(s)", *[f"  break: {b}" for b in self.graph_breaks]]
        lines += [f"  {e.pattern:18} {e.node:24} {'lowered' if e.lowered else 'kept'}: {e.reason}" for e in self.entries]
        return "\n".join(lines)


_lock = threading.Lock()
_reports: List[List[Lowered]] = []  # one list per graph lowered by backend(), for the process (most recent last)


def reports() -> List[List[Lowered]]:
    """What each graph ``backend()`` compiled lowered and kept, one list per graph, oldest first."""
    with _lock:
        return [list(entries) for entries in _reports]


def explain(model: Callable, *args, patterns: Optional[Iterable[str]] = None, **kwargs) -> Explanation:
    """What ``torch.compile(model, backend=backend(patterns=patterns))`` would lower and keep,
    and why, for a call ``model(*args, **kwargs)``, compiling nothing: ``torch._dynamo.explain``
    traces the call (running it eagerly, unlowered) and each graph it traced is lowered for the
    report only. Like ``torch._dynamo.explain``, it shows the graph breaks too."""
    import torch._dynamo

    chosen = _chosen(patterns)
    traced = torch._dynamo.explain(model)(*args, **kwargs)
    entries = [entry for gm in traced.graphs for entry in lower(gm, chosen)]  # explain's own graphs: never run
    return Explanation(len(traced.graphs), [str(reason.reason) for reason in traced.break_reasons], entries)


def backend(inner: Union[str, Callable] = "inductor", mode: Optional[str] = None, patterns: Optional[Iterable[str]] = None) -> Callable:
    """A torch.compile backend: the traced graph lowered (``lower``), then compiled by ``inner``
    (a backend's name, e.g. "inductor" or "aot_eager", or a backend itself). ``mode``: inductor's
    (``"reduce-overhead"``, ``"max-autotune-no-cudagraphs"``, ...), which ``torch.compile`` takes
    only without a backend of its own. ``patterns``: which of ``PATTERNS`` to lower (all by
    default); the others' matches are kept, and reported so."""
    if mode is not None and inner != "inductor":
        raise ValueError(f"lowering.backend: mode={mode!r} is inductor's; pass inner='inductor' with it, or no mode")
    chosen = _chosen(patterns)

    def compile_lowered(gm: torch.fx.GraphModule, example_inputs):
        entries = lower(gm, chosen)
        with _lock:
            _reports.append(entries)
        if mode is not None:  # inside a compile: inductor is loaded already
            from torch._inductor import list_mode_options
            from torch._inductor.compile_fx import compile_fx

            compiled = compile_fx(gm, example_inputs, config_patches=list_mode_options(mode))
        else:
            compile_with = inner
            if isinstance(inner, str):
                from torch._dynamo.backends.registry import lookup_backend

                compile_with = lookup_backend(inner)
            compiled = compile_with(gm, example_inputs)
        # A frame is its calls' site, each layout's k-th call in a run a site of its own (Note [A new layout's first calls])
        return frame_runner(new_site(), compiled)

    return compile_lowered


def _chosen(patterns: Optional[Iterable[str]]) -> frozenset:
    if patterns is None:
        return frozenset(PATTERNS)
    chosen = frozenset([patterns] if isinstance(patterns, str) else patterns)
    unknown = sorted(chosen - set(PATTERNS))
    if unknown:
        raise ValueError(f"lowering: unknown patterns {unknown}; choose among {list(PATTERNS)}")
    return chosen


def lower(gm: torch.fx.GraphModule, patterns: Optional[Iterable[str]] = None) -> List[Lowered]:
    """Rewrite ``gm`` (a graph dynamo traced) in place: every match of ``patterns`` (all of
    ``PATTERNS`` by default) the library serves becomes a call of ``torch.ops.cudnn_fe.execute``;
    returns what was lowered and kept, and why."""
    chosen = _chosen(patterns)
    entries = []
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method") or getattr(node, "_erased", False):  # erased: part of an earlier match
            continue
        for pattern, match in _PATTERNS:
            if node.target in match.targets and (node.op == "call_function") != isinstance(node.target, str):
                why = match.refusal(node) if pattern in chosen else "not among the patterns asked for (backend(patterns=...))"
                if why is None:
                    why = match.replace(gm.graph, node)  # what it was lowered onto
                    entries.append(Lowered(pattern, node.name, True, why))
                else:
                    entries.append(Lowered(pattern, node.name, False, why))
                break
    if any(entry.lowered for entry in entries):
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return entries


_PATTERNS = (("attention", Attention), ("rms_norm", RMS_NORM), ("rms_norm", WrittenRMSNorm), ("layer_norm", LAYER_NORM),
             ("linear_activation", LinearActivation))
