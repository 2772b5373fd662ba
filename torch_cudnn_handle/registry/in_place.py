"""Outputs a graph writes into its own inputs (``register_graph(..., in_place={output: input})``).

Upstream's batchnorm forward writes the next running statistics into the running
statistics it read, and rope can rotate a tensor where it lies: the frontend binds the
output's uid to the input's buffer. The declaration is checked here when the graph is
registered, and held by the graph's record in C++ (``csrc/op/graph_record.h``, read back
with ``_C.in_place_writes``), which ``cudnn_fe.execute_`` and its kernels act on. Each
call's layouts are checked here too (``check_layouts``): an output can be written into
an input only if it has exactly the input's shape, strides and dtype (a stride of a
size-1 dimension addresses nothing, so it may differ: cuDNN strides batchnorm's
[1, C, 1, 1] statistics [C, 1, C, C], torch [C, 1, 1, 1]).
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Tuple

from .specs import TensorSpec


def declared_writes(name: str, in_place, num_inputs: Optional[int]) -> List[Tuple[int, int]]:
    """``in_place`` ({output index: input index}, or None) as (output, input) pairs sorted by input."""
    if in_place is None:
        return []
    fix = "pass in_place={output_index: input_index}, e.g. in_place={3: 3} for an output written into input 3"
    if not isinstance(in_place, Mapping):
        raise TypeError(f"register_graph({name!r}): in_place must be a dict, got {type(in_place).__name__}; {fix}")
    pairs = []
    for output, input_ in in_place.items():
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in (output, input_)):
            raise TypeError(f"register_graph({name!r}): in_place maps ints to ints, got {output!r}: {input_!r}; {fix}")
        if output < 0 or input_ < 0:
            raise ValueError(f"register_graph({name!r}): in_place has a negative index ({output}: {input_}); {fix}")
        if num_inputs is not None and input_ >= num_inputs:
            raise ValueError(
                f"register_graph({name!r}): in_place writes output {output} into input {input_}, but the builder takes "
                f"{num_inputs} inputs"
            )
        pairs.append((output, input_))
    inputs = [i for _, i in pairs]
    if len(set(inputs)) != len(inputs):
        twice = sorted({i for i in inputs if inputs.count(i) > 1})
        raise ValueError(f"register_graph({name!r}): in_place writes more than one output into input(s) {twice}; one output per input")
    return sorted(pairs, key=lambda pair: pair[1])


def same_memory_layout(a: TensorSpec, b: TensorSpec) -> bool:
    """Same shape and dtype, and the same stride in every dimension of more than one element."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and all(n == 1 or x == y for n, x, y in zip(a.shape, a.stride, b.stride))
    )


def check_layouts(name: str, outputs: Sequence[TensorSpec], inputs: Sequence[TensorSpec], writes: Sequence[Tuple[int, int]]) -> None:
    """Each output written in place has exactly its input's layout, and that input is a
    device tensor. ``outputs``: the call's output specs (``GraphLayout.outputs_for``)."""
    for output, input_ in writes:
        if output >= len(outputs):
            raise ValueError(
                f"cudnn_fe.execute_: graph {name!r} writes output {output} into input {input_} in place, but it has "
                f"{len(outputs)} outputs; fix in_place in register_graph"
            )
        given, written = inputs[input_], outputs[output]
        if given.host:
            raise ValueError(
                f"cudnn_fe.execute_: graph {name!r} writes output {output} into input {input_}, which is a host scalar "
                "(passed by value); only a device tensor can be written in place. Pass it as a CUDA tensor."
            )
        if not same_memory_layout(given, written):
            raise ValueError(
                f"cudnn_fe.execute_: graph {name!r} writes output {output} ({written.describe()}) in place into input "
                f"{input_} ({given.describe()}); an in-place output must have exactly its input's shape, strides and "
                "dtype. Give the output the input's layout in the builder (out.set_dim(list(x.dim)).set_stride("
                "list(x.stride)).set_data_type(x.data_type)), pass an input of the output's layout, or drop the output "
                "from in_place to get it as a new tensor."
            )
