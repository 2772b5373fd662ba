"""Output layouts with symbolic sizes: the fake kernel under ``torch.compile(dynamic=True)``.

A cuDNN graph is described (and built) for exact sizes, so the description cannot say
how an output's size follows the inputs' symbols. It is found by describing the graph
twice, never building it: once at the symbols' hints and once with every symbol given
another value (the hint times 2, 3, 4, ... per symbol, which keeps any divisibility a
hint has). An output dimension that is the same in both is a constant; one that moves
must move exactly as one input dimension does, and it is that input's SymInt. Output
strides are dense, in the dimension order the description reports, checked against
both descriptions. Nothing here evaluates a SymInt through a guard, so the trace does
not specialize: one compiled frame serves every size. An output that follows the
inputs some other way (a sum or product of sizes, padding) is refused with the fix:
``register_graph(..., output_shapes=fn)``.

A symbol torch knows to equal another (a replacement in its shape environment, such as
ragged.py's ``tie_tokens`` makes for packed inputs sharing offsets) is that other symbol
here: ``SymInt.node.expr`` applies the shape environment's replacements, so the probe
moves both together and an output follows one symbol.
"""

from __future__ import annotations

import math
from typing import Callable, List, Sequence, Tuple

import torch

from .specs import GraphLayout, TensorSpec, is_host_scalar

OutputLayout = Tuple[List, List, torch.dtype]  # sizes, strides (ints or SymInts), dtype


def _free_symbols(tensors: Sequence[torch.Tensor]) -> dict:
    """Every symbol in the inputs' sizes and strides, with its shape environment."""
    found = {}
    for tensor in tensors:
        for value in (*tensor.shape, *tensor.stride()):
            if isinstance(value, torch.SymInt):
                for symbol in value.node.expr.free_symbols:
                    found[symbol] = value.node.shape_env
    return found


def _hints(symbols: dict) -> dict:
    """Each symbol's hint (the size it was traced at), as its shape environment records it
    (``backed_var_to_val`` in newer torch, ``var_to_val`` before)."""
    return {
        symbol: (shape_env.backed_var_to_val if hasattr(shape_env, "backed_var_to_val") else shape_env.var_to_val)[symbol]
        for symbol, shape_env in symbols.items()
    }


def _at(value, values: dict) -> int:
    """``value`` (an int or a SymInt) with its symbols set to ``values``: no guard."""
    return int(value.node.expr.xreplace(values)) if isinstance(value, torch.SymInt) else int(value)


def hint_specs(tensors: Sequence[torch.Tensor]) -> Tuple[TensorSpec, ...]:
    """The tensors' specs at their symbols' hints, without specializing them."""
    return _specs_at(tensors, _hints(_free_symbols(tensors)))


def _specs_at(tensors: Sequence[torch.Tensor], values: dict) -> Tuple[TensorSpec, ...]:
    specs = []
    for t in tensors:
        shape = tuple(_at(n, values) for n in t.shape)
        # A host scalar, by the sizes here: is_host_scalar would compare a symbolic numel
        # (a CPU tensor under dynamic shapes) through a guard. A symbol is never 0 or 1.
        host = is_host_scalar(t) if not any(isinstance(n, torch.SymInt) for n in t.shape) else t.device.type == "cpu" and math.prod(shape) == 1
        specs.append(TensorSpec(shape, tuple(_at(n, values) for n in t.stride()), t.dtype, host))
    return tuple(specs)


def output_layouts(
    name: str, describe: Callable[[Tuple[TensorSpec, ...]], GraphLayout], inputs: Sequence[torch.Tensor]
) -> List[OutputLayout]:
    """The outputs of a call on ``inputs`` (fake tensors, sizes possibly symbolic), from
    the graph's descriptions (``describe(specs)``)."""
    symbols = _free_symbols(inputs)
    if not symbols:
        layout = describe(tuple(TensorSpec.of(t) for t in inputs))
        return [(list(s.shape), list(s.stride), s.dtype) for s in layout.outputs]
    hints = _hints(symbols)
    probe = {symbol: int(hints[symbol]) * (2 + i) for i, symbol in enumerate(sorted(symbols, key=str))}
    at_hints, at_probe = describe(_specs_at(inputs, hints)), describe(_specs_at(inputs, probe))
    candidates = [(_at(n, hints), _at(n, probe), n) for t in inputs for n in t.shape if isinstance(n, torch.SymInt)]
    layouts = []
    for i, (a, b) in enumerate(zip(at_hints.outputs, at_probe.outputs)):
        sizes = [_symbolic_size(name, i, axis, x, y, candidates) for axis, (x, y) in enumerate(zip(a.shape, b.shape))]
        strides = _dense_strides(name, i, sizes, a, b, hints, probe)
        layouts.append((sizes, strides, a.dtype))
    return layouts


def _symbolic_size(name: str, output: int, axis: int, at_hints: int, at_probe: int, candidates) -> object:
    if at_hints == at_probe:
        return at_hints
    matches = {str(n.node.expr): n for x, y, n in candidates if (x, y) == (at_hints, at_probe)}
    if len(matches) == 1:
        return next(iter(matches.values()))
    raise ValueError(
        f"cudnn_fe.execute: graph {name!r}: under torch.compile(dynamic=True), output {output}'s dimension {axis} "
        f"({at_hints} at the inputs' sizes) does not follow {'any one' if not matches else 'exactly one'} input "
        "dimension. Give the graph a shape function: register_graph(..., output_shapes=fn), fn(*input_shapes) -> "
        "one shape per output; or compile with dynamic=False."
    )


def _packed(sizes: Sequence, like: TensorSpec) -> list:
    """Packed strides of ``sizes`` (ints or SymInts) in the dimension order of ``like``'s
    strides, innermost first. A tie comes from a size-1 dimension: it goes inside its partner,
    so both keep the tied stride (as a head dim of 1 in a [B, S, H, D] layout does); other
    ties as row-major."""
    order = sorted(range(len(sizes)), key=lambda axis: (like.stride[axis], like.shape[axis] != 1, -axis))
    strides, acc = [0] * len(sizes), 1
    for axis in order:
        strides[axis] = acc
        acc = acc * sizes[axis]
    return strides


def _dense_strides(name: str, output: int, sizes, at_hints: TensorSpec, at_probe: TensorSpec, hints, probe) -> list:
    """The output's strides over its symbolic sizes, checked against both descriptions."""
    strides = _packed(sizes, at_hints)
    if tuple(_at(s, hints) for s in strides) != at_hints.stride or tuple(_at(s, probe) for s in strides) != at_probe.stride:
        raise ValueError(
            f"cudnn_fe.execute: graph {name!r}: under torch.compile(dynamic=True), output {output} is not laid out "
            f"densely ({at_hints.describe()}), so its strides cannot follow the inputs' sizes. Give the graph a shape "
            "function: register_graph(..., output_shapes=fn); or compile with dynamic=False."
        )
    return strides


def is_symbolic(tensors: Sequence[torch.Tensor]) -> bool:
    return bool(_free_symbols(tensors))


def shaped_outputs(name: str, shapes, inputs: Sequence[torch.Tensor], layout_at_hints: GraphLayout) -> List[OutputLayout]:
    """Outputs from a builder's shape function (``shapes``: one per output): its shapes,
    packed in the order the description at the hints reports, its dtypes; checked
    against that description."""
    shapes = [list(shape) for shape in shapes]
    hints = _hints(_free_symbols(inputs))
    described = [list(spec.shape) for spec in layout_at_hints.outputs]
    if [[_at(n, hints) for n in shape] for shape in shapes] != described:
        raise ValueError(
            f"cudnn_fe.execute: graph {name!r}: its output_shapes function gives "
            f"{[[_at(n, hints) for n in shape] for shape in shapes]} at the inputs' sizes, but the graph's description "
            f"says {described}"
        )
    return [(shape, _packed(shape, spec), spec.dtype) for shape, spec in zip(shapes, layout_at_hints.outputs)]
