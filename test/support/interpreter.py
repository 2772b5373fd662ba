"""Helpers of the interpreter's tests: describe a builder the way the registry does and run
the description through the interpreter; dtype-derived tolerances.

``describe`` is registry/describe.py's ``describe`` on an ad-hoc definition, so a
one-element CPU tensor is a pass-by-value operand and every other CPU tensor an ordinary
(device) operand, exactly as the op describes a call.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from torch_cudnn_handle.interpreter import interpret_ordered
from torch_cudnn_handle import registry
from torch_cudnn_handle.registry import TensorSpec
from torch_cudnn_handle.registry.data_types import GraphDataTypes
from torch_cudnn_handle.registry.definition import Definition
from torch_cudnn_handle.registry.describe import describe as describe_definition


def definition(builder, *, io=None, intermediate=None, compute=None, **params) -> Definition:
    return Definition(
        graph_id=-1, name=getattr(builder, "__name__", "graph"), builder=builder, params=params, num_inputs=None,
        data_types=GraphDataTypes.chosen(io=io, intermediate=intermediate, compute=compute),
    )


def describe(builder, inputs: Sequence[torch.Tensor], **options):
    """(graph, input tensors, output tensors, layout) of ``builder`` for ``inputs``, as
    written: a broadcast operand stays a broadcast (the interpreter broadcasts it), where the
    op describes a pointwise graph's at full shape (Note [Pointwise broadcasts])."""
    return describe_definition(definition(builder, **options), [TensorSpec.of(t) for t in inputs], as_written=True)


def describe_registered(graph_id: int, inputs: Sequence[torch.Tensor]):
    """A registered graph's description for a call with ``inputs`` (its views, its ragged
    operands), as the op describes it; ``materialized(layout, inputs)`` gives the tensors it reads."""
    found = registry.definition(graph_id)
    return describe_definition(found, found.call_specs([TensorSpec.of(t) for t in inputs]))


def materialized(layout, inputs: Sequence[torch.Tensor]):
    """The inputs as a registered graph's description reads them (broadcasts.materialize)."""
    from torch_cudnn_handle.registry.broadcasts import materialize

    return materialize(inputs, layout.materialized)


def run(builder, inputs: Sequence[torch.Tensor], *, compute_dtype=torch.float32, round_virtual=False, **options):
    """The interpreter's outputs of ``builder`` on ``inputs``, in the builder's order."""
    graph, ins, outs, _ = describe(builder, inputs, **options)
    return interpret_ordered(graph, ins, outs, inputs, compute_dtype=compute_dtype, round_virtual=round_virtual)


def run_registered(graph_id: int, inputs: Sequence[torch.Tensor], **options):
    graph, ins, outs, layout = describe_registered(graph_id, inputs)
    return interpret_ordered(graph, ins, outs, materialized(layout, inputs), **options), layout


# Half a unit in the last place of each dtype, a few times over: what one rounding of a
# value computed exactly (in float32 or better) may leave, plus slack for the reference's
# own float32 arithmetic (float32: the rounding of a sum of a few hundred terms).
_EPS = {
    torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7,
    torch.float8_e4m3fn: 2 ** -3, torch.float8_e5m2: 2 ** -2,
}


def tolerance(dtype: torch.dtype, scale: float = 1.0) -> Tuple[float, float]:
    """(atol, rtol) for a result stored as ``dtype`` (integers and bool: exact)."""
    if not dtype.is_floating_point:
        return 0.0, 0.0
    eps = _EPS[dtype] * scale
    return eps, eps


def assert_close(got: torch.Tensor, expected: torch.Tensor, dtype: Optional[torch.dtype] = None, scale: float = 1.0) -> None:
    dtype = dtype or got.dtype
    atol, rtol = tolerance(dtype, scale)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if not dtype.is_floating_point:
        assert torch.equal(got.to(expected.dtype), expected), (got, expected)
        return
    torch.testing.assert_close(got.double(), expected.double(), atol=atol, rtol=rtol)


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0, shift=0.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator) * scale + shift).to(dtype)


def same_layout(got: torch.Tensor, desc) -> bool:
    """``got`` has the dims, strides (ignoring unit dims) and dtype ``desc`` declares."""
    from torch_cudnn_handle.registry.specs import torch_dtype_of

    if list(got.shape) != list(desc.dim) or got.dtype != torch_dtype_of(desc.data_type):
        return False
    return all(n == 1 or s == d for n, s, d in zip(got.shape, got.stride(), desc.stride))


# -- upstream graphs on the CPU -------------------------------------------------------

# cuDNN draws this graph's dropout mask with its Philox RNG (seed and offset inputs); the
# interpreter does not reproduce that stream, so it refuses the graph instead of guessing.
REFUSED = {"sdpa_forward_dropout": r"attribute 'dropout'.*Philox"}


def _layernorm_backward_float64(inputs):
    """layernorm_backward's gradients in float64 from the same dY, X, scale: the entry's own
    reference is torch's CPU float16 layer_norm backward, whose dScale/dBias sums are 2e-3
    off the float64 sum (measured), ten times the entry's tolerance; the GPU's are not."""
    dy, x, scale, _, _ = inputs
    bias = torch.zeros_like(scale)
    leaves = [t.double().requires_grad_() for t in (x, scale, bias)]
    F.layer_norm(leaves[0], [x.shape[-1]], leaves[1].reshape(-1), leaves[2].reshape(-1), eps=1e-3).backward(dy.double())
    return [t.grad.half() for t in leaves]


CPU_REFERENCE = {"layernorm_backward": _layernorm_backward_float64}


def assert_matches_entry(entry, got, expected, inputs) -> None:
    """``got`` (an upstream entry's outputs) against ``expected`` within the entry's
    tolerances, in the region of each output the graph defines."""
    from support import upstream_graphs as ug

    got_region = ug.compare_region(entry, got, inputs)
    expected_region = ug.compare_region(entry, [e if e is not None else g for e, g in zip(expected, got)], inputs)
    for i, (g, e, (atol, rtol)) in enumerate(zip(got_region, expected_region, entry.tolerances)):
        if expected[i] is None:
            continue
        torch.testing.assert_close(g.double(), e.double(), atol=atol, rtol=rtol, msg=lambda m, i=i: f"{entry.name} output {i}: {m}")
