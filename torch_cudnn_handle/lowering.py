"""``backend()``: a torch.compile backend that lowers an unmodified model's attention, RMSNorm and linear + activation onto cuDNN graphs.

``torch.compile(model, backend=lowering.backend())`` takes the graph dynamo traced from the
model as it is written (``F.scaled_dot_product_attention``, ``nn.RMSNorm`` / ``F.rms_norm``,
``nn.LayerNorm`` / ``F.layer_norm``, ``nn.Linear`` followed by ``F.gelu`` or ``F.relu``), replaces each match the library serves
with a call of ``torch.ops.cudnn_fe.execute`` on the graph the ``nn`` modules use (the
same graphs, their backward included, so autograd and dynamic shapes work as they do for
the modules), and hands the rest to the inner backend (inductor by default). Tested on the
CPU so far; not yet run on a GPU, nor timed against inductor.
The parameters stay the model's own: they are the traced graph's inputs.

A match is lowered only where the library's graph computes what torch's op computes and
takes these inputs: fp16 or bf16, a head dim that is a multiple of 8, no attention mask,
no dropout, the default scale, as many key/value heads as query heads; an RMSNorm or a
LayerNorm over the last dim with a weight (and a bias); a linear with a bias whose one
user is the activation (exact gelu or relu). Anything else stays torch's, and ``reports()`` says why, node by node. A
CPU model is lowered too: the op runs each graph through its reference interpreter, so the
lowering is tested without a GPU.

Not yet: SiLU and SwiGLU (no library graph for them), grouped-query attention.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import threading
from typing import Callable, List, Optional, Union

import torch
import torch.fx
import torch.nn.functional as F

__all__ = ["backend", "lower", "reports", "Lowered"]

_HALF = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class Lowered:
    """One match in a traced graph: which pattern, which node, whether it was lowered, and why (not)."""

    pattern: str  # "attention" | "rms_norm" | "layer_norm" | "linear_activation" | "not_yet"
    node: str
    lowered: bool
    reason: str


_lock = threading.Lock()
_reports: List[List[Lowered]] = []  # one list per graph lowered by backend(), for the process (most recent last)


def reports() -> List[List[Lowered]]:
    """What each graph ``backend()`` compiled lowered and kept, one list per graph, oldest first."""
    with _lock:
        return [list(entries) for entries in _reports]


def backend(inner: Union[str, Callable] = "inductor", mode: Optional[str] = None) -> Callable:
    """A torch.compile backend: the traced graph lowered (``lower``), then compiled by ``inner``
    (a backend's name, e.g. "inductor" or "aot_eager", or a backend itself). ``mode``: inductor's
    (``"reduce-overhead"``, ``"max-autotune-no-cudagraphs"``, ...), which ``torch.compile`` takes
    only without a backend of its own."""
    if mode is not None and inner != "inductor":
        raise ValueError(f"lowering.backend: mode={mode!r} is inductor's; pass inner='inductor' with it, or no mode")

    def compile_lowered(gm: torch.fx.GraphModule, example_inputs):
        entries = lower(gm)
        with _lock:
            _reports.append(entries)
        if mode is not None:  # inside a compile: inductor is loaded already
            from torch._inductor import list_mode_options
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs, config_patches=list_mode_options(mode))
        compile_with = inner
        if isinstance(inner, str):
            from torch._dynamo.backends.registry import lookup_backend

            compile_with = lookup_backend(inner)
        return compile_with(gm, example_inputs)

    return compile_lowered


def lower(gm: torch.fx.GraphModule) -> List[Lowered]:
    """Rewrite ``gm`` (a graph dynamo traced) in place: every match the library serves becomes a
    call of ``torch.ops.cudnn_fe.execute``; returns what was lowered and kept, and why."""
    entries = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        for pattern, match in _PATTERNS:
            if node.target in match.targets:
                why = match.refusal(node)
                if why is None:
                    match.replace(gm.graph, node)
                entries.append(Lowered(pattern, node.name, why is None, why or "lowered onto the library's graph"))
                break
    if any(entry.lowered for entry in entries):
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return entries


# -- what a node's traced value says ---------------------------------------------


def _value(arg) -> Optional[torch.Tensor]:
    """The fake tensor dynamo recorded for a node argument, or None."""
    return arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else None


def _static(size) -> Optional[int]:
    """A size that does not vary: an int, or a symbolic one the trace's guards fixed (a hidden
    dim a weight's shape pins down); None for one that varies (dynamic shapes)."""
    if isinstance(size, torch.SymInt):
        return size.node.maybe_as_int()
    return size if isinstance(size, int) else None


def _argument(node, index: int, name: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _execute(graph: torch.fx.Graph, before, graph_id: int, inputs: list, output: int = 0) -> torch.fx.Node:
    """``torch.ops.cudnn_fe.execute(graph_id, inputs)[output]`` inserted before ``before``, whose
    traced value it takes over (a later match reads it)."""
    with graph.inserting_before(before):
        call = graph.call_function(torch.ops.cudnn_fe.execute.default, (graph_id, inputs))
        result = graph.call_function(operator.getitem, (call, output))
    result.meta["example_value"] = before.meta.get("example_value")
    return result


def _contiguous(graph: torch.fx.Graph, before, value: torch.fx.Node) -> torch.fx.Node:
    """``value.contiguous()``: the graphs take natural operands in row-major layout (a no-op when they are)."""
    with graph.inserting_before(before):
        result = graph.call_method("contiguous", (value,))
    result.meta["example_value"] = value.meta.get("example_value")
    return result


# -- the patterns ---------------------------------------------------------------


class _Attention:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=...)`` -> nn.sdpa's graph."""

    targets = (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)

    @staticmethod
    def refusal(node) -> Optional[str]:
        q, k, v = (_value(_argument(node, i, name)) for i, name in enumerate(("query", "key", "value")))
        if q is None or k is None or v is None:
            return "q, k or v has no traced value"
        if _argument(node, 3, "attn_mask") is not None:
            return "an attention mask (the library's graph takes causal masking alone)"
        if _argument(node, 4, "dropout_p", 0.0) != 0.0:
            return "dropout (the library's graph has none)"
        if any(t.dim() != 4 for t in (q, k, v)):
            return "q, k and v are not all [B, H, S, D]"
        if len({q.dtype, k.dtype, v.dtype}) > 1 or q.dtype not in _HALF:
            return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}: cuDNN attention takes float16 or bfloat16, one for all three"
        head = _static(q.shape[-1])
        if head is None or head % 8 or any(_static(t.shape[-1]) != head for t in (k, v)):
            return "the head dim is not one multiple of 8 for q, k and v"
        scale = _argument(node, 6, "scale")
        if scale is not None and not math.isclose(scale, head ** -0.5):
            return f"scale {scale}, not the default 1/sqrt({head}) the graph uses"
        if _static(q.shape[1]) is None or _static(q.shape[1]) != _static(k.shape[1]) or _static(k.shape[1]) != _static(v.shape[1]):
            return "k/v heads differ from q's (grouped-query attention is not lowered yet)"
        if q.device != k.device or q.device != v.device:
            return "q, k and v on more than one device"
        return None

    @staticmethod
    def replace(graph, node) -> None:
        from .nn.attention import SDPA_GRAPHS, SDPA_INFERENCE_GRAPHS

        q, k, v = (_argument(node, i, name) for i, name in enumerate(("query", "key", "value")))
        training = any(_value(t).requires_grad for t in (q, k, v))
        causal = bool(_argument(node, 5, "is_causal", False))
        node.replace_all_uses_with(_execute(graph, node, (SDPA_GRAPHS if training else SDPA_INFERENCE_GRAPHS)[causal], [q, k, v]))
        graph.erase_node(node)


class _Norm:
    """``F.rms_norm(x, (C,), weight, eps)`` or ``F.layer_norm(x, (C,), weight, bias, eps)`` -> the
    RMSNorm or LayerNorm module's graph (nn/norm.py)."""

    def __init__(self, targets, inputs: tuple, eps_index: int, graph: str):
        self.targets, self._inputs, self._eps_index, self._graph = targets, inputs, eps_index, graph

    def _operands(self, node) -> list:
        return [_argument(node, index, name) for index, name in self._inputs]

    def refusal(self, node) -> Optional[str]:
        x, *affine = (_value(operand) for operand in self._operands(node))
        shape = tuple(_argument(node, 1, "normalized_shape"))
        if x is None:
            return "the input has no traced value"
        if any(t is None for t in affine):
            return "no weight or bias (the library's graph scales and shifts)"
        if len(shape) != 1 or _static(x.shape[-1]) != shape[0]:
            return f"normalized_shape {shape}: the graph normalizes over the last dim alone"
        if x.dtype not in _HALF or any(t.dtype != x.dtype for t in affine):
            return f"dtypes {x.dtype} and {[t.dtype for t in affine]}: the graph takes float16 or bfloat16, one for all"
        if isinstance(_argument(node, self._eps_index, "eps"), torch.fx.Node):
            return ("eps is an input of the traced graph, not a constant (torch.compile(dynamic=True) lifts a module's float "
                    "attributes): the graph bakes eps in")
        return None

    def replace(self, graph, node) -> None:
        from .nn import norm

        x, *affine = self._operands(node)
        eps = _argument(node, self._eps_index, "eps")
        eps = torch.finfo(_value(x).dtype).eps if eps is None else float(eps)  # torch's default for eps=None (rms_norm)
        graph_id = getattr(norm, self._graph)(eps)
        node.replace_all_uses_with(_execute(graph, node, graph_id, [_contiguous(graph, node, x), *affine]))
        graph.erase_node(node)


_RMS_NORM = _Norm((torch.rms_norm, F.rms_norm), ((0, "input"), (2, "weight")), 3, "rmsnorm_graph")
_LAYER_NORM = _Norm((torch.layer_norm, F.layer_norm), ((0, "input"), (2, "weight"), (3, "bias")), 4, "layernorm_graph")


_ACTIVATIONS = {torch.relu: "relu", F.relu: "relu", torch._C._nn.gelu: "gelu", F.gelu: "gelu"}


class _LinearActivation:
    """``act(F.linear(x, w, b))`` (exact gelu or relu) -> FusedLinear's graph, the activation in its epilogue."""

    targets = (torch._C._nn.linear, F.linear)

    @staticmethod
    def _activation(node):
        users = list(node.users)
        if len(users) != 1 or users[0].op != "call_function" or users[0].target not in _ACTIVATIONS:
            return None
        user = users[0]
        if _ACTIVATIONS[user.target] == "gelu" and user.kwargs.get("approximate", "none") != "none":
            return None
        if user.args[1:] or any(key != "approximate" for key in user.kwargs):  # relu(x, inplace=...): left alone
            return None
        return user

    @classmethod
    def refusal(cls, node) -> Optional[str]:
        x, weight, bias = (_value(_argument(node, i, name)) for i, name in enumerate(("input", "weight", "bias")))
        if cls._activation(node) is None:
            return "no exact gelu or relu as the linear's one user (the fusion's gain is the epilogue; a plain linear stays cuBLAS's)"
        if x is None or weight is None or bias is None:
            return "no bias (the graph adds one in the epilogue)" if x is not None and weight is not None else "no traced value"
        if x.dtype not in _HALF or weight.dtype != x.dtype or bias.dtype != x.dtype:
            return f"dtypes {x.dtype}, {weight.dtype}, {bias.dtype}: the graph takes float16 or bfloat16, one for all"
        if x.dim() < 2:
            return "a 1-D input"
        return None

    @classmethod
    def replace(cls, graph, node) -> None:
        from .nn.linear import LINEAR_GRAPHS

        user = cls._activation(node)
        x, weight, bias = (_argument(node, i, name) for i, name in enumerate(("input", "weight", "bias")))
        lowered = _execute(graph, user, LINEAR_GRAPHS[_ACTIVATIONS[user.target]], [_contiguous(graph, user, x), weight, bias])
        user.replace_all_uses_with(lowered)
        graph.erase_node(user)
        graph.erase_node(node)


class _NotYet:
    """What the library has no graph for yet: kept, and said so."""

    targets = (F.silu, torch._C._nn.silu)

    @staticmethod
    def refusal(node) -> Optional[str]:
        return "no library graph for SiLU / SwiGLU yet"


_PATTERNS = (("attention", _Attention), ("rms_norm", _RMS_NORM), ("layer_norm", _LAYER_NORM), ("linear_activation", _LinearActivation),
             ("not_yet", _NotYet))
