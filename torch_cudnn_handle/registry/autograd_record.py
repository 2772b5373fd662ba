"""What a graph id's autograd node acts on: the graph's record, declared once in C++
(``csrc/op/graph_record.h``) when the id is registered.

The record says whether the graph has a backward and, for a declared one (a single
backward graph whose operands are ``BackwardOperand``\\ s), that graph and its
operands, or for declared steps (``backward_steps``: several graphs, run in order by
the node in C++), each step and where each input's gradient comes from; which inputs
and outputs the backward reads (the node saves those and nothing more); which
outputs are differentiable (the node marks the rest non-differentiable, so no gradient
can arrive that the backward would drop); whether a backward function gets zeros or None
for an output without a gradient; and which outputs the graph writes into which of its
inputs (in_place.py).
Derived here from the registration's arguments, checked, and handed to C++.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from .. import _C
from .specs import BackwardOperand, BackwardStep

_GRAD, _INPUT, _OUTPUT, _STEP = 0, 1, 2, 3


def declared_operands(backward_operands) -> Optional[Tuple[BackwardOperand, ...]]:
    """``backward_operands`` as a declaration, or None when it is a function (or absent)."""
    if backward_operands is None or callable(backward_operands) or isinstance(backward_operands, (str, bytes)):
        return None
    declared = _operand_sequence(backward_operands, "backward_operands")
    if not declared:
        raise TypeError(
            "register_graph: backward_operands must be a function (grad_outputs, inputs, outputs) -> operands, or a "
            "non-empty sequence of BackwardOperand.grad(i) / .input(i) / .output(i)"
        )
    return declared


def _operand_sequence(value, what: str) -> Tuple[BackwardOperand, ...]:
    try:
        operands = tuple(value)
    except TypeError:
        operands = None
    if operands is None or not all(isinstance(o, BackwardOperand) for o in operands):
        raise TypeError(f"register_graph: {what} must be a sequence of BackwardOperand.grad(i) / .input(i) / .output(i)")
    return operands


def check_declared_operands(name: str, declared, num_inputs: Optional[int], backward_arity: Optional[int]) -> None:
    """What can be checked before any call: input indices against the builder's arity,
    the operand count against the backward builder's. Output indices are checked per call."""
    _check_indices(name, declared, num_inputs)
    if backward_arity is not None and backward_arity != len(declared):
        raise ValueError(
            f"register_graph({name!r}): backward_operands declares {len(declared)} operands, but the backward builder "
            f"takes {backward_arity}"
        )


def _check_indices(name: str, operands, num_inputs: Optional[int]) -> None:
    for operand in operands:
        if operand.index < 0 or operand.strides_of_output < -1 or any(i < 0 for i in operand.for_grads):
            raise ValueError(f"register_graph({name!r}): {operand.describe()} has a negative index")
        named_inputs = ([operand.index] if operand.source == _INPUT else []) + list(operand.for_grads)
        if num_inputs is not None and any(i >= num_inputs for i in named_inputs):
            raise ValueError(f"register_graph({name!r}): {operand.describe()}, but the builder takes {num_inputs} inputs")


def declare(
    graph_id: int,
    name: str,
    *,
    num_inputs: Optional[int],
    backward_id: Optional[int],
    declared: Optional[Tuple[BackwardOperand, ...]],
    has_backward: bool,
    backward_reads,
    differentiable_outputs: Optional[Sequence[int]],
    materialize_grads: bool,
    steps: Optional[Sequence[BackwardStep]] = None,
    grads: Optional[Sequence[Optional[BackwardOperand]]] = None,
    in_place: Sequence[Tuple[int, int]] = (),
) -> None:
    """Derive graph ``graph_id``'s record and declare it (before the id is returned, so
    before any call can record a node). ``in_place``: (output, input) pairs sorted by
    input (in_place.py), which the record holds too."""
    if steps is not None:
        return _declare_steps(graph_id, name, num_inputs, steps, grads, backward_reads, differentiable_outputs, in_place)
    reads = None  # everything: what a backward function or computed operands may read is unknown
    if backward_reads is not None:
        if declared is not None:
            raise TypeError(f"register_graph({name!r}): backward_reads is for backward functions; declared backward_operands already say what is read")
        reads_declared = _operand_sequence(backward_reads, "backward_reads")
        if any(o.source == _GRAD for o in reads_declared):
            raise ValueError(f"register_graph({name!r}): backward_reads names inputs and outputs; gradients are always given")
        _check_indices(name, reads_declared, num_inputs)
        reads = [(o.source, o.index, list(o.for_grads)) for o in reads_declared]
    differentiable = None if differentiable_outputs is None else sorted({int(i) for i in differentiable_outputs})
    if differentiable is not None and any(i < 0 for i in differentiable):
        raise ValueError(f"register_graph({name!r}): differentiable_outputs has a negative index")
    operands = []
    if declared is not None:
        reads = [(o.source, o.index, list(o.for_grads)) for o in declared if o.source != _GRAD]
        taken = sorted({o.index for o in declared if o.source == _GRAD})
        if differentiable is None:
            differentiable = taken
        elif set(differentiable) - set(taken):
            raise ValueError(
                f"register_graph({name!r}): differentiable_outputs names output(s) {sorted(set(differentiable) - set(taken))}, "
                "but backward_operands takes no gradient of them, so it would be dropped; add BackwardOperand.grad(i) "
                "for each, or leave them non-differentiable"
            )
        operands = [(o.source, o.index, o.strides_of_output) for o in declared]
    elif not has_backward and (backward_reads is not None or differentiable_outputs is not None):
        raise TypeError(f"register_graph({name!r}): backward_reads and differentiable_outputs need a backward")
    _C.declare_graph(
        graph_id, has_backward, backward_id if declared is not None else -1, operands, reads, differentiable, bool(materialize_grads),
        in_place=list(in_place),
    )


def _declare_steps(
    graph_id: int, name: str, num_inputs: Optional[int], steps, grads, backward_reads, differentiable_outputs, in_place
) -> None:
    """A declared backward of several graphs: each step's operands name gradients, inputs,
    outputs and earlier steps' outputs; ``grads`` says where each input's gradient comes from."""
    steps = tuple(steps)
    if not steps or not all(isinstance(step, BackwardStep) for step in steps):
        raise TypeError(f"register_graph({name!r}): backward_steps must be a non-empty sequence of BackwardStep(graph, operands)")
    if grads is None:
        raise TypeError(f"register_graph({name!r}): backward_steps needs backward_grads (one BackwardOperand or None per input)")
    grads = tuple(grads)
    if not all(g is None or isinstance(g, BackwardOperand) for g in grads):
        raise TypeError(f"register_graph({name!r}): backward_grads must hold BackwardOperand.step(s, k), .grad(i) or None")
    if num_inputs is not None and len(grads) != num_inputs:
        raise ValueError(f"register_graph({name!r}): backward_grads gives {len(grads)} gradients, but the builder takes {num_inputs} inputs")
    if backward_reads is not None:
        raise TypeError(f"register_graph({name!r}): backward_reads is for backward functions; backward_steps already say what is read")
    for s, step in enumerate(steps):
        _check_indices(name, step.operands, num_inputs)
        if any(i < 0 or (num_inputs is not None and i >= num_inputs) for i in step.for_grads):
            raise ValueError(f"register_graph({name!r}): step {s} has for_grads {list(step.for_grads)} outside the builder's inputs")
        for operand in step.operands:
            if operand.source == _STEP and not 0 <= operand.index < s:
                raise ValueError(f"register_graph({name!r}): step {s} reads {operand.describe()}; a step reads earlier steps only")
    for i, grad in enumerate(grads):
        if grad is not None and grad.source not in (_GRAD, _STEP):
            raise ValueError(f"register_graph({name!r}): the gradient of input {i} is {grad.describe()}; give a step's output or a gradient")
        if grad is not None and grad.source == _STEP and not 0 <= grad.index < len(steps):
            raise ValueError(f"register_graph({name!r}): the gradient of input {i} is {grad.describe()}, but there are {len(steps)} steps")
    # What is read, and for which gradients: an operand's own for_grads, else its step's.
    reads = [
        (o.source, o.index, list(o.for_grads or step.for_grads)) for step in steps for o in step.operands if o.source in (_INPUT, _OUTPUT)
    ]
    taken = sorted({o.index for step in steps for o in step.operands if o.source == _GRAD} | {g.index for g in grads if g is not None and g.source == _GRAD})
    differentiable = taken if differentiable_outputs is None else sorted({int(i) for i in differentiable_outputs})
    if set(differentiable) - set(taken):
        raise ValueError(
            f"register_graph({name!r}): differentiable_outputs names output(s) {sorted(set(differentiable) - set(taken))}, "
            "but no backward step takes their gradient, so it would be dropped"
        )

    def as_tuple(o: BackwardOperand):
        return (o.source, o.index, o.strides_of_output, o.step_output, o.summed)

    _C.declare_graph(
        graph_id, True, -1, [], reads, differentiable, True,
        steps=[(step.graph, [as_tuple(o) for o in step.operands], list(step.for_grads)) for step in steps],
        grads=[None if g is None else as_tuple(g) for g in grads],
        in_place=list(in_place),
    )
