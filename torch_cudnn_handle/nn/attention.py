"""Attention: the frontend's sdpa node forward, its sdpa_backward node backward.

The graphs are the frontend's own torch op's (``cudnn.sdpa.fwd.torch_op``, dense
BHSD path) with the options this module needs: ``attn_scale = 1/sqrt(D)`` (torch's
default), causal masking as a diagonal band with right bound 0 anchored TOP_LEFT
(``is_causal`` of ``F.scaled_dot_product_attention``), no padding, no dropout.

* forward (training): ``generate_stats=True`` writes the softmax statistics
  (``Stats``, ``[B, H, S_q, 1]`` float32, the row log-sum-exp) next to ``O``; the
  backward consumes them instead of recomputing the softmax normalizer;
* backward: one graph, ``dQ, dK, dV`` from ``Q, K, V, O, dO, Stats``.

Layouts, as there: ``O`` adopts ``Q``'s dimension order and ``dQ/dK/dV`` those of
``Q/K/V``, so a BSHD-strided ``[B, H, S, D]`` view (what a projection's
``[B, S, H*D]`` output transposed gives) comes back BSHD-strided and folds back
into ``[B, S, H*D]`` without a copy; ``dO`` is given ``O``'s strides (the frontend
op does the same; autograd hands over a contiguous one).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

import cudnn

from .. import trace_constants
from ..op import execute
from ..registry import Backward, BackwardOperand, register_graph
from ..registry.first_calls import at_site, new_site
from ._layout import declare, like_layout, merge_heads, row_major, split_heads
from .attention_buckets import _mask, _scale, bucketed_sdpa
from .attention_stand_ins import torch_sdpa_backward, torch_sdpa_forward, torch_sdpa_inference_forward
from .attention_routes import attention_route, exact_plan_took_over, layout_of, torch_attention, torch_stands_in
from .linear import FusedLinear

__all__ = ["sdpa", "Attention", "SDPA_GRAPHS", "SDPA_INFERENCE_GRAPHS", "SDPA_BIAS_GRAPH", "SDPA_BIAS_INFERENCE_GRAPH", "sdpa_inference_forward"]


def _attention(graph, q, k, v, *, stats: bool, options: dict):
    """``O`` (and with ``stats`` the softmax statistics) of the sdpa node, ``options`` its
    masking (the causal band, or an additive ``bias``): every forward graph here."""
    b, h, s_q, _ = q.dim
    o, lse = graph.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=stats, attn_scale=_scale(q), use_padding_mask=False, **options)
    o_dim = [b, h, s_q, v.dim[3]]
    o = declare(o, o_dim, like_layout(o_dim, q.stride), q.data_type)
    if not stats:
        return o
    stats_dim = [b, h, s_q, 1]
    return [o, declare(lse, stats_dim, row_major(stats_dim), cudnn.data_type.FLOAT)]


def _attention_backward(graph, q, k, v, o, d_o, stats, *, options: dict) -> list:
    """``dQ, dK, dV`` of the sdpa_backward node, ``options`` as the forward's."""
    dq, dk, dv = graph.sdpa_backward(
        name="sdpa_backward", q=q, k=k, v=v, o=o, dO=d_o, stats=stats, attn_scale=_scale(q), use_padding_mask=False,
        # The registry builds a separate graph under torch.use_deterministic_algorithms(True).
        use_deterministic_algorithm=torch.are_deterministic_algorithms_enabled(), **options,
    )
    return [declare(g, t.dim, like_layout(t.dim, t.stride), q.data_type) for g, t in ((dq, q), (dk, k), (dv, v))]


def sdpa_forward(graph, q, k, v, *, causal: bool):
    """``O = softmax(Q K^T / sqrt(D) [causal]) V`` and the softmax ``Stats``."""
    return _attention(graph, q, k, v, stats=True, options=_mask(causal))


def sdpa_inference_forward(graph, q, k, v, *, causal: bool):
    """``O`` alone, no softmax statistics: what a call that needs no gradient runs. With
    head dim 512 on sm90 a frost engine (``sdpa_fwd_prefill_sm90``) serves it."""
    return _attention(graph, q, k, v, stats=False, options=_mask(causal))


def sdpa_backward(graph, q, k, v, o, d_o, stats, *, causal: bool):
    """``dQ, dK, dV``."""
    return _attention_backward(graph, q, k, v, o, d_o, stats, options=_mask(causal))


# dQ, dK, dV from Q, K, V, O, dO (given O's strides), Stats; declared, so the autograd
# node assembles them and runs the backward natively, without Python.
BACKWARD_OPERANDS = (
    BackwardOperand.input(0),
    BackwardOperand.input(1),
    BackwardOperand.input(2),
    BackwardOperand.output(0),
    BackwardOperand.grad(0, strides_of_output=0),
    BackwardOperand.output(1),
)


# Each with its stand-in for the op's first calls at a new length (attention_stand_ins.py).
SDPA_GRAPHS = {
    causal: register_graph(
        sdpa_forward,
        name=f"nn_sdpa_{'causal' if causal else 'full'}",
        backward=Backward.graph(sdpa_backward, operands=BACKWARD_OPERANDS, stand_in=functools.partial(torch_sdpa_backward, causal=causal)),
        params=dict(causal=causal),
        stand_in=functools.partial(torch_sdpa_forward, causal=causal),
    )
    for causal in (False, True)
}


SDPA_INFERENCE_GRAPHS = {
    causal: register_graph(sdpa_inference_forward, name=f"nn_sdpa_{'causal' if causal else 'full'}_inference", params=dict(causal=causal),
                           stand_in=functools.partial(torch_sdpa_inference_forward, causal=causal))
    for causal in (False, True)
}


# Attention with an additive bias ``[B or 1, H or 1, S_q, S_kv]`` of q's dtype added to the
# scaled scores: a mask given as a bias (0 where kept, -inf where not), what the lowering
# puts in place of ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)``. The bias
# takes no gradient (a mask has none).


def sdpa_bias_forward(graph, q, k, v, bias):
    return _attention(graph, q, k, v, stats=True, options=dict(bias=bias))


def sdpa_bias_inference_forward(graph, q, k, v, bias):
    return _attention(graph, q, k, v, stats=False, options=dict(bias=bias))


def sdpa_bias_backward(graph, q, k, v, bias, o, d_o, stats):
    """``dQ, dK, dV``; none for the bias."""
    return _attention_backward(graph, q, k, v, o, d_o, stats, options=dict(bias=bias)) + [None]


SDPA_BIAS_GRAPH = register_graph(
    sdpa_bias_forward,
    name="nn_sdpa_bias",
    backward=Backward.graph(sdpa_bias_backward, operands=BACKWARD_OPERANDS[:3] + (BackwardOperand.input(3),) + BACKWARD_OPERANDS[3:]),
)
SDPA_BIAS_INFERENCE_GRAPH = register_graph(sdpa_bias_inference_forward, name="nn_sdpa_bias_inference")


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=causal)`` on cuDNN.

    ``q, k, v``: ``[B, H, S, D]`` fp16 or bf16 (any dimension order in memory, the
    head dimension innermost), ``D`` a multiple of 8; scale ``1/sqrt(D)``.
    Differentiable (the backward is the sdpa_backward graph); a call that needs no
    gradient runs the inference graph, which writes no softmax statistics. Which way a
    call goes is its route (``sdpa.route_of(q, k, v, causal)``, ``tch.explain(sdpa, [q, k, v])``):
    with the ``attention_buckets`` setting on, a self-attention call (q, k and v of one
    shape) is served by its length's bucket instead, with no build per length (Note [Length
    buckets]); with ``serving_mode`` on, no call waits for a build (Note [Attention off
    the caller's path] in attention_buckets.py).
    """
    _check_sdpa_inputs(q, k, v)
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    exact = (SDPA_GRAPHS if training else SDPA_INFERENCE_GRAPHS)[bool(causal)]
    uniform = q.shape == k.shape == v.shape
    if torch.compiler.is_compiling():  # traced: what is built serves; buckets per the route's setting, a constant of the frame
        if uniform and trace_constants.sdpa_length_buckets(exact):
            return bucketed_sdpa(q, k, v, bool(causal), training)
        return execute(exact, [q, k, v])[0]
    layout = layout_of(exact, q, k, v)
    route = attention_route(exact, q, k, v, uniform, layout)
    if route.buckets == "length":
        if not exact_plan_took_over(exact, q, k, v, route, layout):
            return bucketed_sdpa(q, k, v, bool(causal), training, route)
        # else the exact plan took over, found built then: no second look
    elif torch_stands_in(exact, [q, k, v], route, layout):
        return torch_attention(q, k, v, causal)
    return execute(exact, [q, k, v])[0]


def _route_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """The route ``sdpa(q, k, v, causal)`` takes now, and why (``tch.explain(sdpa, [q, k, v])``); runs nothing."""
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    exact = (SDPA_GRAPHS if training else SDPA_INFERENCE_GRAPHS)[bool(causal)]
    return attention_route(exact, q, k, v, q.shape == k.shape == v.shape)


sdpa.route_of = _route_of


_SDPA_DTYPES = (torch.float16, torch.bfloat16)


def _check_sdpa_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """What cuDNN's sdpa takes, checked in Python so a trace (fake tensors) fails here too."""
    if (q.dim() == k.dim() == v.dim() == 4 and q.dtype == k.dtype == v.dtype and q.dtype in _SDPA_DTYPES
            and not (q.shape[-1] % 8 or k.shape[-1] % 8 or v.shape[-1] % 8)):
        return  # every call but a refused one: no message built
    named = {"q": q, "k": k, "v": v}
    for name, t in named.items():
        if t.dim() != 4:
            raise ValueError(f"sdpa: {name} is {list(t.shape)}; q, k and v are [B, H, S, D] (4-D)")
    dtypes = {name: str(t.dtype).replace("torch.", "") for name, t in named.items()}
    if len(set(dtypes.values())) > 1:
        raise TypeError(
            f"sdpa: q, k and v must have one dtype, got {', '.join(f'{n} {d}' for n, d in dtypes.items())}; cast them to "
            "one of float16, bfloat16"
        )
    if q.dtype not in _SDPA_DTYPES:
        raise TypeError(f"sdpa: q, k and v are {dtypes['q']}; cuDNN attention takes float16 or bfloat16: cast them, e.g. q.to(torch.bfloat16)")
    for name, t in named.items():
        if t.shape[-1] % 8:
            raise ValueError(
                f"sdpa: the head dim D of {name} is {t.shape[-1]} ({name}.shape[-1]), not a multiple of 8, which cuDNN "
                "attention needs; pad it, or pick heads so that dim / heads is a multiple of 8"
            )


class Attention(nn.Module):
    """Multi-head self-attention: q/k/v/out projections (``FusedLinear``, no
    activation) around ``sdpa``. ``x``: ``[B, S, dim]``; ``dim = heads * head_dim``."""

    def __init__(self, dim: int, heads: int, causal: bool = True, *, device=None, dtype=None):
        super().__init__()
        if dim % heads:
            raise ValueError(f"Attention: dim {dim} is not a multiple of heads {heads}")
        self.dim, self.heads, self.causal = dim, heads, causal
        self.q, self.k, self.v, self.out = (FusedLinear(dim, dim, activation=None, device=device, dtype=dtype) for _ in range(4))
        self._site = new_site()  # its attention's site (Note [A new layout's first calls])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(projection(x), self.heads) for projection in (self.q, self.k, self.v))
        return self.out(merge_heads(at_site(self._site, sdpa, q, k, v, self.causal)))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, causal={self.causal}"
