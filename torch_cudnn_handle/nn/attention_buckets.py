"""Attention at any sequence length from one plan per length bucket: no cuDNN build per length.

Note [Length buckets]: a dense sdpa graph is built for one sequence length, so every new
length is a build inside the call (about 0.17 s for a forward and backward on the H200).
A token-major ``[B, S, H, D]`` buffer -- what ``Attention``'s projections give, seen as
``[B, H, S, D]`` through ``split_heads`` -- is also the packed ``[T, H, D]`` buffer of B
sequences of S tokens, which cuDNN takes as a ragged tensor: ragged offsets ``b * S * H * D``,
sequence lengths S, and a descriptor of ``max_seq_len`` tokens per sequence. Its graph
depends on ``max_seq_len`` and B, not on S (registry/ragged.py: T is in no key; B is the
offsets' length), so one graph per ``(causal, bucket)``, one build and native plan per
batch size, serves every length S up to the bucket, with no copy and no padded position
computed: the sequence lengths mask the rest. Inputs in another dimension order are
copied into token-major order first.

The buckets are powers of two from ``MIN_BUCKET`` (``bucket_of``), chosen by measurement
(H200, causal fwd+bwd bf16, B=2 H=8 D=64, 200 new lengths in [64, 4096]): with them a
bucketed call's steady time was 1.16x the dense plan's at the same length (the median
over 16 lengths) and the first calls of all 200 took 0.82 s (six bucket builds, then
0.59 ms a call); one bucket of 4096 for every length made it one build but 3.0x at steady
state (0.78 against 0.14 ms at 321 tokens: a ragged plan does not skip all of its bucket's
padding) and its build took 1.6 s. Results for a given length are bitwise repeatable (the
same plan); they differ from the dense graph's within the engines' numerics (another
engine serves a ragged graph). The offsets and lengths are small device tensors that cuDNN
only reads (``lengths_and_offsets``: three small kernels, four when training), written once
per (device, batch, length, heads, head size) and kept for the process (``_kept``), so a
steady call launches none of them.
Whether buckets serve ``nn.sdpa`` is the ``attention_buckets`` setting (its route's ``buckets``).
Which way a call goes (these buckets, its exact plan, torch's attention while one builds)
is attention_routes.py's.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import cudnn
import torch

from .. import trace_constants
from ..op import execute
from ..registry import Backward, BackwardOperand, Ragged, Route, register_graph
from .attention_routes import torch_attention, torch_stands_in

__all__ = ["MIN_BUCKET", "bucket_of", "bucketed_sdpa", "lengths_and_offsets"]

MIN_BUCKET = 128  # the smallest bucket, which every shorter length shares (Note [Length buckets]: why powers of two)


def bucket_of(length) -> int:
    """The max_seq_len a sequence of ``length`` tokens is served at: the next power of two, at
    least MIN_BUCKET. Found by comparisons, so under torch.compile(dynamic=True) a symbolic
    length guards only on its bucket's range: one compiled frame per bucket, not per length."""
    bucket = MIN_BUCKET
    while length > bucket:
        bucket *= 2
    return bucket


def _mask(causal: bool) -> dict:
    """sdpa's causal mask arguments (nn/attention.py's dense graphs use them too)."""
    return dict(
        diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT,
        diagonal_band_right_bound=0 if causal else None,  # None: no band (a None kwarg is not passed on)
    )


def _scale(q) -> float:
    return float(q.dim[-1]) ** -0.5


def _ragged_sdpa(graph, q, k, v, seq_len_q, seq_len_kv, q_off, kv_off, stats_off, *, causal: bool, stats: bool):
    """O (and the row log-sum-exp ``Stats``), packed like q; scale 1/sqrt(D)."""
    o, lse = graph.sdpa(
        name="sdpa", q=q, k=k, v=v, generate_stats=stats, attn_scale=_scale(q), use_padding_mask=True,
        seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, **_mask(causal),
    )
    o.set_dim(list(q.dim)).set_stride(list(q.stride)).set_data_type(q.data_type).set_ragged_offset(q_off)
    if not stats:
        return o
    b, h, s, _ = q.dim
    lse.set_data_type(cudnn.data_type.FLOAT).set_dim([b, h, s, 1]).set_stride([s * h, 1, h, 1]).set_ragged_offset(stats_off)
    return o, lse


def ragged_sdpa_forward(graph, q, k, v, seq_len_q, seq_len_kv, q_off, kv_off, stats_off, *, causal: bool):
    return _ragged_sdpa(graph, q, k, v, seq_len_q, seq_len_kv, q_off, kv_off, stats_off, causal=causal, stats=True)


def ragged_sdpa_inference(graph, q, k, v, seq_len_q, seq_len_kv, q_off, kv_off, *, causal: bool):
    return _ragged_sdpa(graph, q, k, v, seq_len_q, seq_len_kv, q_off, kv_off, None, causal=causal, stats=False)


def ragged_sdpa_backward(graph, d_o, q, k, v, o, stats, seq_len_q, seq_len_kv, q_off, kv_off, stats_off, *, causal: bool):
    """dQ, dK, dV, packed like their inputs (None for the other forward inputs)."""
    dq, dk, dv = graph.sdpa_backward(
        name="sdpa_backward", q=q, k=k, v=v, o=o, dO=d_o, stats=stats, attn_scale=_scale(q),
        use_padding_mask=True, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
        use_deterministic_algorithm=torch.are_deterministic_algorithms_enabled(), **_mask(causal),
    )
    for grad, like, offset in ((dq, q, q_off), (dk, k, kv_off), (dv, v, kv_off)):
        grad.set_dim(list(like.dim)).set_stride(list(like.stride)).set_data_type(like.data_type).set_ragged_offset(offset)
    return [dq, dk, dv, None, None, None, None, None]


_op = BackwardOperand
# dO, q, k, v, o, stats, then the forward's lengths and offsets (inputs 3-7).
_BACKWARD_OPERANDS = (_op.grad(0), _op.input(0), _op.input(1), _op.input(2), _op.output(0), _op.output(1), *(_op.input(i) for i in range(3, 8)))

_lock = threading.Lock()
_graphs: Dict[Tuple[bool, int, bool], int] = {}  # (causal, bucket, training) -> graph id, for the process


@trace_constants.constant("sdpa_bucket_graph")
def _graph(causal: bool, bucket: int, training: bool) -> int:
    """The registered graph of a bucket (registered on first use; an id lives for the process);
    a constant of a compiled frame, not traced (it takes a lock). Called as
    ``trace_constants.sdpa_bucket_graph``, which marks it so without loading dynamo here."""
    key = (causal, bucket, training)
    with _lock:
        if key not in _graphs:
            packed = {0: Ragged(5, bucket), 1: Ragged(6, bucket), 2: Ragged(6, bucket)}
            name = f"nn_sdpa_{'causal' if causal else 'full'}_bucket{bucket}"
            if training:
                backward_packed = {0: Ragged(8, bucket), 1: Ragged(8, bucket), 2: Ragged(9, bucket), 3: Ragged(9, bucket),
                                   4: Ragged(8, bucket), 5: Ragged(10, bucket)}
                _graphs[key] = register_graph(
                    ragged_sdpa_forward, name=name, params=dict(causal=causal), ragged=packed,
                    backward=Backward.graph(ragged_sdpa_backward, operands=_BACKWARD_OPERANDS, ragged=backward_packed),
                )
            else:
                _graphs[key] = register_graph(ragged_sdpa_inference, name=f"{name}_inference", params=dict(causal=causal), ragged=packed)
        return _graphs[key]


def lengths_and_offsets(batch: int, length: int, heads: int, head_dim: int, device, training: bool) -> list:
    """The graph's inputs after q, k, v: seq_len q and kv ([B, 1, 1, 1] int32, all ``length``:
    one tensor), the offsets of q and of k/v ([B+1], in elements: one tensor) and, when
    ``training``, of the statistics (in units of H), on ``device``: small kernels on the
    current stream (capturable, traceable). Written on the host and copied instead, they
    made a bucketed call 2.4x a dense plan's at steady state on the H200, against 1.16x
    so: a copy from pageable memory waits for the stream's earlier work."""
    starts = torch.arange(batch + 1, device=device, dtype=torch.int64) * length
    lengths = torch.full((batch, 1, 1, 1), length, dtype=torch.int32, device=device)
    offsets = starts * (heads * head_dim)
    return [lengths, lengths, offsets, offsets] + ([starts * heads] if training else [])


# Lengths and offsets kept for the process (Note [Length buckets]): key -> (tensors, the
# stream that wrote them, an event after the writes). Never freed, so no stream can read a
# freed buffer; at most _KEPT_LIMIT keys (a few hundred bytes each), later ones made per call.
# Made fresh, never kept, while compiling (traced) or capturing (the graph's own pool).
_KEPT_LIMIT = 4096
_kept: Dict[tuple, Tuple[list, torch.cuda.Stream, torch.cuda.Event]] = {}


def _kept_lengths_and_offsets(batch: int, length: int, heads: int, head_dim: int, device, training: bool) -> list:
    """``lengths_and_offsets``, written on first use and reused; a stream other than the one
    that wrote them waits for the writes (an event, no host wait)."""
    if device.type != "cuda" or torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return lengths_and_offsets(batch, length, heads, head_dim, device, training)
    key = (device.index, batch, length, heads, head_dim, training)
    stream = torch.cuda.current_stream(device)
    found = _kept.get(key)
    if found is None:
        made = lengths_and_offsets(batch, length, heads, head_dim, device, training)
        if len(_kept) >= _KEPT_LIMIT:
            return made
        event = torch.cuda.Event()
        event.record(stream)
        found = _kept.setdefault(key, (made, stream, event))  # another thread's, if it won the race
    tensors, written_on, written = found
    if written_on != stream:
        stream.wait_event(written)
    return tensors


def _token_major(t: torch.Tensor) -> torch.Tensor:
    """``[B, H, S, D]`` as its packed ``[B*S, H, D]`` buffer: a view when token-major (BSHD), else a copy.
    (``contiguous`` first: with B = 1, ``reshape`` alone would give a head-major view, not a copy.)"""
    b, h, s, d = t.shape
    return t.transpose(1, 2).contiguous().view(b * s, h, d)


def bucketed_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, training: bool, route: Optional[Route] = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=causal)`` for ``[B, H, S, D]``
    inputs (one S for q and k/v), served by the graph of S's bucket; the output is ``[B, H, S, D]``
    in token-major (BSHD) memory. ``training``: the graph with statistics and a backward.
    While the bucket's plan builds off the caller's path (the ``route``'s stand-in), torch's attention serves the call."""
    b, h, s, d = q.shape
    if tuple(k.shape) != (b, h, s, d) or tuple(v.shape) != (b, h, s, d):
        raise ValueError(f"bucketed sdpa: q, k and v must have one shape, got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    operands = [_token_major(q), _token_major(k), _token_major(v), *_kept_lengths_and_offsets(b, s, h, d, q.device, training)]
    graph = trace_constants.sdpa_bucket_graph(bool(causal), bucket_of(s), training)
    if route is not None and torch_stands_in(graph, operands, route):
        return torch_attention(q, k, v, causal)
    o = execute(graph, operands)[0]
    return o.view(b, s, h, d).transpose(1, 2)
