"""Ragged (packed, THD) operands: ``[T, H, D]`` token buffers with ragged offsets.

A graph registered with ``ragged={input: Ragged(offsets=j, max_seq_len=S)}`` takes
that input packed: ``[T, H, D]``, the live tokens of every batch element one after
the other, with op input ``j`` its ragged offsets (``B + 1`` integers: where each
batch element starts, in elements, i.e. cumulative token counts times ``H*D`` for a
contiguous buffer). cuDNN describes such a tensor as the 4-D ``[B, H, S, D]`` of the
longest sequence it may hold, with strides ``(S*ts, hs, ts, ds)`` for the buffer's
strides ``(ts, hs, ds)``; the offsets tell where each batch element starts. So the
builder gets that 4-D tensor, its ragged offset already set, and the graph never
depends on ``T``:

  * ``T`` is no part of any cache key (the built graph's, the layout's, the plan
    store's, the native plan's): one build serves every token count. Here a packed
    operand's spec has ``TOKENS`` (-1) as its first size;
  * a ragged output (one the builder gives a ragged offset) is returned packed,
    ``[T, H, D]`` with the strides of its 4-D descriptor's ``(S, H, D)`` dims, and the
    ``T`` of the packed input whose offsets it shares: ``o.set_ragged_offset(q_off)``
    makes ``o`` as long as ``q``. With offsets of its own (another op input, as
    upstream's ``o_off``, or an sdpa's statistics with offsets in units of ``H``), the
    ``T`` of the first packed input (in input order) that cuDNN describes with the same
    ``B``, ``H`` and ``S``: ``q``'s, for an sdpa's O declared like ``q`` and its
    ``[B, H, S, 1]`` statistics. Packed inputs that share one offsets input must have
    the same ``T``; under torch.compile they have one symbol (``tie_tokens``).

What cannot be checked without reading device memory (a host sync the op never
does): that the offsets fit the buffers (``offsets[-1] <= T*H*D``) and that no
sequence is longer than ``max_seq_len``. Offsets that say otherwise make cuDNN read
or write past the buffers.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch

from .specs import TOKENS, TensorSpec


@dataclasses.dataclass(frozen=True)
class Ragged:
    """How one op input is packed: ``offsets``, the index of the op input that holds
    its ragged offsets (``B + 1`` int64 or int32 elements, on the inputs' GPU);
    ``max_seq_len``, the longest sequence any batch element may have (the ``S`` of
    cuDNN's 4-D descriptor; a graph is built for it)."""

    offsets: int
    max_seq_len: int


@dataclasses.dataclass(frozen=True)
class RaggedOperands:
    """A definition's packed inputs (validated at registration)."""

    graph: str
    packed: Tuple[Tuple[int, Ragged], ...]  # (input index, declaration), by input index

    @classmethod
    def declared(cls, graph: str, ragged: Optional[Mapping[int, Ragged]], num_inputs: Optional[int]) -> Optional["RaggedOperands"]:
        if ragged is None:
            return None
        if not isinstance(ragged, Mapping) or not ragged:
            raise TypeError(
                f"register_graph({graph!r}): ragged must be a dict {{input index: Ragged(offsets=..., max_seq_len=...)}}, "
                f"got {ragged!r}"
            )
        packed = []
        for index, declaration in sorted(ragged.items()):
            where = f"register_graph({graph!r}): ragged[{index!r}]"
            if not isinstance(index, int) or index < 0:
                raise TypeError(f"{where}: the key must be the index of a packed op input (an int >= 0)")
            if not isinstance(declaration, Ragged):
                raise TypeError(f"{where} must be Ragged(offsets=<input index>, max_seq_len=<int>), got {declaration!r}")
            if not isinstance(declaration.offsets, int) or declaration.offsets < 0 or declaration.offsets in ragged:
                raise ValueError(f"{where}: offsets={declaration.offsets!r} must be the index of another op input, one that is not packed itself")
            if not isinstance(declaration.max_seq_len, int) or declaration.max_seq_len < 1:
                raise ValueError(f"{where}: max_seq_len={declaration.max_seq_len!r} must be a positive int (the longest sequence)")
            for what, i in (("packed input", index), ("offsets input", declaration.offsets)):
                if num_inputs is not None and i >= num_inputs:
                    raise ValueError(f"{where}: the {what} {i} is past the builder's {num_inputs} inputs")
            packed.append((index, declaration))
        return cls(graph, tuple(packed))

    @property
    def offsets_inputs(self) -> Dict[int, int]:
        """offsets input -> the first packed input it serves."""
        first: Dict[int, int] = {}
        for index, declaration in self.packed:
            first.setdefault(declaration.offsets, index)
        return first

    def tokens_group(self, index: int) -> int:
        """The first packed input sharing ``index``'s offsets (``index`` itself if none before it)."""
        return self.offsets_inputs[dict(self.packed)[index].offsets]

    def call_specs(self, specs: Sequence[TensorSpec]) -> Tuple[TensorSpec, ...]:
        """The call's specs with each packed input's token count replaced by TOKENS: what
        keys and describes the graph. Refuses what cannot be packed or an offset."""
        out = list(specs)
        for index, declaration in self.packed:
            if index >= len(specs) or declaration.offsets >= len(specs):
                raise ValueError(
                    f"cudnn_fe.execute: graph {self.graph!r} takes input {max(index, declaration.offsets)} (a packed input or "
                    f"its ragged offsets), but the call has {len(specs)} inputs"
                )
            spec, offsets = specs[index], specs[declaration.offsets]
            if spec.host or len(spec.shape) != 3:
                raise ValueError(
                    f"cudnn_fe.execute: input {index} of graph {self.graph!r} is packed (ragged), so it must be a [T, H, D] "
                    f"GPU tensor, got {spec.describe()}; pass the token buffer itself (e.g. x.view(T, H, D))"
                )
            self._check_offsets(index, declaration.offsets, offsets)
            out[index] = dataclasses.replace(spec, shape=(TOKENS, *spec.shape[1:]))
        groups: Dict[int, int] = {}
        for index, declaration in self.packed:  # packed inputs sharing offsets hold the same tokens
            first = groups.setdefault(declaration.offsets, index)
            if specs[index].shape[0] != specs[first].shape[0]:
                raise ValueError(
                    f"cudnn_fe.execute: inputs {first} and {index} of graph {self.graph!r} share ragged offsets (input "
                    f"{declaration.offsets}) but hold {specs[first].shape[0]} and {specs[index].shape[0]} tokens; give "
                    "each buffer its own offsets input (ragged={..., i: Ragged(offsets=...)})"
                )
        return tuple(out)

    def tie_tokens(self, inputs: Sequence[torch.Tensor]) -> None:
        """Under symbolic sizes, tell torch that packed inputs sharing offsets hold one
        token count. torch.compile's automatic dynamic shapes give each buffer a symbol of
        its own (K's T and V's T as s0 and s1); ``torch._check(s0 == s1)`` guards the
        compiled frame on their equality (which every real call must have) and makes the
        shape environment replace one symbol by the other, so the fake kernel's probe
        (symbolic.py) moves them together and every output follows one symbol. Call it
        after describing the call at the sizes' hints, which refuses unequal counts with
        the fix (``call_specs``); a frame guarded here is recompiled for such a call, and
        refused there."""
        for index, _ in self.packed:
            first = self.tokens_group(index)
            if first == index or max(first, index) >= len(inputs):
                continue
            a, b = inputs[first].shape[0], inputs[index].shape[0]
            if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
                torch._check(
                    a == b,
                    lambda: f"cudnn_fe.execute: inputs {first} and {index} of graph {self.graph!r} share ragged offsets "
                    f"but hold {a} and {b} tokens",
                )

    def _check_offsets(self, index: int, at: int, spec: TensorSpec) -> None:
        fix = "ragged offsets are B + 1 int64 (or int32) elements on the GPU of the other inputs: (cumulative token counts * H * D).to(device)"
        if spec.host:
            raise ValueError(f"cudnn_fe.execute: input {at} of graph {self.graph!r}, the ragged offsets of input {index}, is on the CPU; {fix}")
        if spec.dtype not in (torch.int64, torch.int32) or _numel(spec.shape) < 2:
            raise ValueError(
                f"cudnn_fe.execute: input {at} of graph {self.graph!r}, the ragged offsets of input {index}, is {spec.describe()}; {fix}"
            )

    def describes_offsets(self, index: int) -> Optional[int]:
        """The packed input whose ragged offsets op input ``index`` is, or None."""
        return self.offsets_inputs.get(index)

    # -- the description ---------------------------------------------------------

    def graph_dims(self, index: int, specs: Sequence[TensorSpec]) -> Optional[Tuple[list, list]]:
        """The 4-D ``(dims, strides)`` cuDNN describes packed input ``index`` with; None
        for an input that is not packed. ``specs``: the call's T-free specs."""
        declaration = dict(self.packed).get(index)
        if declaration is None:
            return None
        spec = specs[index]
        _, heads, head_dim = spec.shape
        token_stride, head_stride, dim_stride = spec.stride
        batch = _numel(specs[declaration.offsets].shape) - 1
        seq = declaration.max_seq_len
        return [batch, heads, seq, head_dim], [seq * token_stride, head_stride, token_stride, dim_stride]

    def set_offsets(self, graph_inputs: Sequence) -> None:
        """Give each packed input's graph tensor its ragged offsets (before the builder runs)."""
        for index, declaration in self.packed:
            graph_inputs[index].set_ragged_offset(graph_inputs[declaration.offsets])

    def check_builder_kept(self, graph_inputs: Sequence) -> None:
        for index, declaration in self.packed:
            if graph_inputs[index].ragged_offset is not graph_inputs[declaration.offsets]:
                raise ValueError(
                    f"graph {self.graph!r}: the builder gave packed input {index} another ragged offset than input "
                    f"{declaration.offsets}, which register_graph(ragged=...) declares; the registry sets it, leave it"
                )

    def packed_output(self, position: int, tensor, spec: TensorSpec, graph_inputs: Sequence) -> Tuple[TensorSpec, int]:
        """An output's op spec and the input whose token count it has (-1: not ragged).
        A ragged output is described 4-D ``[B, H, S, D]``; the op returns it packed."""
        offsets = getattr(tensor, "ragged_offset", None)
        if offsets is None:
            return spec, -1
        if len(spec.shape) != 4:
            raise ValueError(
                f"graph {self.graph!r}: ragged output {position} is {spec.describe()}; a ragged tensor is [B, H, S, D] "
                "(o.set_dim(q.dim).set_stride(q.stride))"
            )
        at = next((i for i, t in enumerate(graph_inputs) if t is offsets), None)
        like = self.offsets_inputs.get(at) if at is not None else None
        if like is None and at is not None:
            # Offsets of its own (upstream's o_off, an sdpa's stats_off): as long as the
            # first packed input cuDNN describes with its B, H and S (q, for an sdpa's O
            # and statistics).
            like = next((i for i, _ in self.packed if tuple(graph_inputs[i].dim)[:3] == spec.shape[:3]), None)
        if like is None:
            raise ValueError(
                f"graph {self.graph!r}: ragged output {position} ({spec.describe()}) shares no packed input's offsets and "
                "has the [B, H, S] of none, so its token count is unknown; give it the offsets of the packed input whose "
                "tokens it holds (o.set_ragged_offset(q_off)), or that input's dims (o.set_dim(q.dim).set_stride(q.stride))"
            )
        return packed_of(spec), like


def packed_of(spec: TensorSpec) -> TensorSpec:
    """The packed ``[T, H, D]`` op spec of a ragged tensor cuDNN describes ``[B, H, S, D]``."""
    _, heads, _, head_dim = spec.shape
    _, head_stride, token_stride, dim_stride = spec.stride
    return TensorSpec((TOKENS, heads, head_dim), (token_stride, head_stride, dim_stride), spec.dtype)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
