"""``Backward``: how a graph's forward call is differentiated, as one value.

A graph registered with ``register_graph(builder, backward=...)`` takes one of three:

  * ``Backward.graph(builder, operands=...)``: one backward graph. Its operands are named
    (``BackwardOperand``\\ s: the node assembles them in C++ and, once a native plan serves
    the backward graph, runs the backward with no Python), computed by a function
    ``(grad_outputs, inputs, outputs) -> operands`` (Python on every backward), or by
    default every gradient, input and output in that order;
  * ``Backward.steps([BackwardStep, ...], grads=[...])``: a declared backward of several
    graphs, run by the node in C++ in order;
  * ``Backward.function(fn, reads=...)``: torch-level code returning one gradient per input.

Exactly one kind, with only its own options, so no combination needs refusing. This module
checks a value against its forward (indices, arities) and lowers it to the graph's record
in C++ (``csrc/op/graph_record.h``), which the autograd node acts on: what it saves (Note
[What a node saves] in csrc/op/autograd_kernels.cpp), which outputs are differentiable,
whether a function gets zeros or None for a missing gradient. ``from_keywords`` turns
the options of earlier releases (``backward_operands=``, ``backward_fn=``, ...) into a
Backward, with a DeprecationWarning naming the new form.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

from .._extension import _C
from .backward_operands import BackwardOperand, BackwardStep
from .operand_views import OperandViews

__all__ = ["Backward", "OLD_KEYWORDS", "from_keywords", "declare", "all_operands"]

_GRAD, _INPUT, _OUTPUT, _STEP = 0, 1, 2, 3


def all_operands(grad_outputs, inputs, outputs):
    """A backward graph's default operands: every gradient, input and output, in that order."""
    return [*grad_outputs, *inputs, *outputs]


def _operand_tuple(value, what: str) -> Tuple[BackwardOperand, ...]:
    try:
        operands = tuple(value)
    except TypeError:
        operands = None
    if operands is None or not all(isinstance(o, BackwardOperand) for o in operands):
        raise TypeError(f"register_graph: {what} must be a sequence of BackwardOperand.grad(i) / .input(i) / .output(i)")
    return operands


def _indices(values, what: str) -> Optional[Tuple[int, ...]]:
    if values is None:
        return None
    indices = tuple(sorted({int(i) for i in values}))
    if any(i < 0 for i in indices):
        raise ValueError(f"register_graph: {what} has a negative index")
    return indices


@dataclasses.dataclass(frozen=True)
class Backward:
    """One of ``Backward.graph``, ``Backward.steps``, ``Backward.function`` (see the module docstring)."""

    kind: str  # "graph" | "steps" | "function"
    builder: Optional[Callable[..., Any]] = None  # graph: the backward graph's builder
    operands: Optional[Tuple[BackwardOperand, ...]] = None  # graph: named operands (None: computed)
    compute_operands: Optional[Callable[..., Sequence[Any]]] = None  # graph: (grads, inputs, outputs) -> operands
    ragged: Optional[Mapping[int, Any]] = None  # graph: its packed operands, by operand position (registry/ragged.py)
    views: Optional[OperandViews] = None  # graph: its natural operands (registry/operand_views.py)
    step_list: Tuple[BackwardStep, ...] = ()  # steps
    grads: Tuple[Optional[BackwardOperand], ...] = ()  # steps: where each input's gradient comes from
    fn: Optional[Callable[..., Sequence[Any]]] = None  # function
    reads: Optional[Tuple[BackwardOperand, ...]] = None  # function: what it reads (None: everything)
    materialize_grads: bool = True  # a function (or computed operands) gets zeros, not None, for a missing gradient
    differentiable_outputs: Optional[Tuple[int, ...]] = None  # None: the kind's default
    stand_in: Optional[Callable[..., Any]] = None  # graph: torch ops computing its outputs (register_graph's stand_in=)

    @classmethod
    def graph(cls, builder, *, operands=None, ragged=None, views=None, materialize_grads=True, differentiable_outputs=None,
              stand_in=None) -> "Backward":
        """One backward graph, ``builder(graph, *operands, **params)`` returning one gradient
        (or None) per forward input. ``operands``: ``BackwardOperand``\\ s, or a function
        ``(grad_outputs, inputs, outputs) -> tensors``, or None for all of them. With named
        operands the outputs whose gradient is not among them are non-differentiable.
        ``stand_in``: torch ops returning the backward graph's outputs from its operands, which
        serve a new layout's first calls as the forward's ``stand_in`` does."""
        if not callable(builder):
            raise TypeError(f"register_graph: backward must be callable, got {type(builder).__name__}")
        if views is not None and not isinstance(views, OperandViews):
            raise TypeError(f"register_graph: backward_views must be an OperandViews, got {type(views).__name__}")
        named = None
        if operands is not None and not callable(operands):
            if isinstance(operands, (str, bytes)) or not (named := _operand_tuple(operands, "backward_operands")):
                raise TypeError(
                    "register_graph: backward_operands must be a function (grad_outputs, inputs, outputs) -> operands, or a "
                    "non-empty sequence of BackwardOperand.grad(i) / .input(i) / .output(i)"
                )
        return cls(
            "graph", builder=builder, operands=named, compute_operands=None if named else (operands or all_operands),
            ragged=ragged, views=views, materialize_grads=bool(materialize_grads),
            differentiable_outputs=_indices(differentiable_outputs, "differentiable_outputs"), stand_in=stand_in,
        )

    @classmethod
    def steps(cls, steps, *, grads, differentiable_outputs=None) -> "Backward":
        """Several graphs run in order (``BackwardStep``\\ s); ``grads``: per forward input,
        ``BackwardOperand.step(s, k)``, ``.grad(i)`` (either ``.sum_to_input()``) or None."""
        steps = tuple(steps)
        if not steps or not all(isinstance(step, BackwardStep) for step in steps):
            raise TypeError("register_graph: backward_steps must be a non-empty sequence of BackwardStep(graph, operands)")
        if grads is None:
            raise TypeError("register_graph: backward_steps needs backward_grads (one BackwardOperand or None per input)")
        grads = tuple(grads)
        if not all(g is None or isinstance(g, BackwardOperand) for g in grads):
            raise TypeError("register_graph: backward_grads must hold BackwardOperand.step(s, k), .grad(i) or None")
        return cls("steps", step_list=steps, grads=grads, differentiable_outputs=_indices(differentiable_outputs, "differentiable_outputs"))

    @classmethod
    def function(cls, fn, *, reads=None, materialize_grads=True, differentiable_outputs=None) -> "Backward":
        """``fn(grad_outputs, inputs, outputs)`` returning one gradient (or None) per input;
        ``reads``: the inputs and outputs it reads (``BackwardOperand.input(i)`` /
        ``.output(i)``, optionally ``for_grads``), the only ones the node saves."""
        if not callable(fn):
            raise TypeError(f"register_graph: backward_fn must be callable, got {type(fn).__name__}")
        reads = None if reads is None else _operand_tuple(reads, "backward_reads")
        if reads is not None and any(o.source == _GRAD for o in reads):
            raise ValueError("register_graph: backward_reads names inputs and outputs; gradients are always given")
        return cls("function", fn=fn, reads=reads, materialize_grads=bool(materialize_grads),
                   differentiable_outputs=_indices(differentiable_outputs, "differentiable_outputs"))

    def graph_ids(self) -> Tuple[int, ...]:
        """The registered graphs a steps backward runs (checked to exist at registration)."""
        return tuple(step.graph for step in self.step_list)


def _check_indices(name: str, operands, num_inputs: Optional[int]) -> None:
    for operand in operands:
        if operand.index < 0 or operand.strides_of_output < -1 or any(i < 0 for i in operand.for_grads):
            raise ValueError(f"register_graph({name!r}): {operand.describe()} has a negative index")
        named_inputs = ([operand.index] if operand.source == _INPUT else []) + list(operand.for_grads)
        if num_inputs is not None and any(i >= num_inputs for i in named_inputs):
            raise ValueError(f"register_graph({name!r}): {operand.describe()}, but the builder takes {num_inputs} inputs")


def _dropped(name: str, differentiable, taken, by: str) -> None:
    if set(differentiable) - set(taken):
        raise ValueError(
            f"register_graph({name!r}): differentiable_outputs names output(s) {sorted(set(differentiable) - set(taken))}, "
            f"but {by} takes no gradient of them, so it would be dropped; add BackwardOperand.grad(i) for each, or leave "
            "them non-differentiable"
        )


def declare(graph_id: int, name: str, backward: Optional[Backward], *, num_inputs: Optional[int], backward_id: Optional[int],
            backward_arity: Optional[int], in_place: Sequence[Tuple[int, int]] = ()) -> None:
    """Check ``backward`` against its forward and declare graph ``graph_id``'s record in C++
    (before the id is returned, so before any call can record a node). ``backward_id``:
    the registered backward graph of a ``graph`` kind; ``in_place``: (output, input) pairs."""
    in_place = list(in_place)
    if backward is None:
        return _C.declare_graph(graph_id, False, -1, [], None, None, True, in_place=in_place)
    differentiable = None if backward.differentiable_outputs is None else list(backward.differentiable_outputs)
    if backward.kind == "function":
        reads = None
        if backward.reads is not None:
            _check_indices(name, backward.reads, num_inputs)
            reads = [(o.source, o.index, list(o.for_grads)) for o in backward.reads]
        return _C.declare_graph(graph_id, True, -1, [], reads, differentiable, backward.materialize_grads, in_place=in_place)
    if backward.kind == "graph":
        if backward.operands is None:  # computed: Python reads everything
            return _C.declare_graph(graph_id, True, -1, [], None, differentiable, backward.materialize_grads, in_place=in_place)
        _check_indices(name, backward.operands, num_inputs)
        if backward_arity is not None and backward_arity != len(backward.operands):
            raise ValueError(
                f"register_graph({name!r}): backward_operands declares {len(backward.operands)} operands, but the backward "
                f"builder takes {backward_arity}"
            )
        taken = sorted({o.index for o in backward.operands if o.source == _GRAD})
        if differentiable is None:
            differentiable = taken
        _dropped(name, differentiable, taken, "backward_operands")
        reads = [(o.source, o.index, list(o.for_grads)) for o in backward.operands if o.source != _GRAD]
        operands = [(o.source, o.index, o.strides_of_output) for o in backward.operands]
        return _C.declare_graph(graph_id, True, backward_id, operands, reads, differentiable, True, in_place=in_place)
    _declare_steps(graph_id, name, backward, num_inputs, differentiable, in_place)


def _declare_steps(graph_id: int, name: str, backward: Backward, num_inputs, differentiable, in_place) -> None:
    steps, grads = backward.step_list, backward.grads
    if num_inputs is not None and len(grads) != num_inputs:
        raise ValueError(f"register_graph({name!r}): backward_grads gives {len(grads)} gradients, but the builder takes {num_inputs} inputs")
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
    reads = [(o.source, o.index, list(o.for_grads or step.for_grads)) for step in steps for o in step.operands if o.source in (_INPUT, _OUTPUT)]
    taken = sorted({o.index for step in steps for o in step.operands if o.source == _GRAD} | {g.index for g in grads if g is not None and g.source == _GRAD})
    differentiable = taken if differentiable is None else differentiable
    _dropped(name, differentiable, taken, "no backward step")

    def as_tuple(o: BackwardOperand):
        return (o.source, o.index, o.strides_of_output, o.step_output, o.summed)

    _C.declare_graph(
        graph_id, True, -1, [], reads, differentiable, True,
        steps=[(step.graph, [as_tuple(o) for o in step.operands], list(step.for_grads)) for step in steps],
        grads=[None if g is None else as_tuple(g) for g in grads], in_place=list(in_place),
    )


OLD_KEYWORDS = frozenset({"backward_operands", "backward_fn", "backward_reads", "differentiable_outputs", "materialize_grads",
                          "backward_ragged", "backward_views", "backward_steps", "backward_grads"})  # what from_keywords reads


def _needs_builder(name: str, old: Mapping[str, Any]) -> None:
    """The options of one backward graph, given without its builder."""
    if old.get("backward_ragged") is not None:
        raise TypeError(f"register_graph({name!r}): backward_ragged declares the packed operands of a backward graph; give backward")
    for what in ("backward_operands", "backward_views"):
        if old.get(what) is not None:
            raise TypeError(f"register_graph: {what} needs a backward builder (backward=...)")


def from_keywords(name: str, backward, old: Mapping[str, Any]) -> Optional[Backward]:
    """``register_graph``'s ``backward=`` (a Backward, or an earlier release's builder) and
    the earlier options in ``old`` as one Backward (None: no backward). Earlier forms warn."""
    if isinstance(backward, Backward):
        if old:
            raise TypeError(f"register_graph({name!r}): give the backward as one Backward value; drop {', '.join(sorted(old))}")
        return backward
    if backward is None and not old:
        return None
    get = old.get
    if get("backward_steps") is not None:
        if backward is not None or get("backward_fn") is not None:
            raise TypeError("register_graph: give backward_steps (a declared backward of several graphs), backward or backward_fn, one of them")
        made, new = Backward.steps(get("backward_steps"), grads=get("backward_grads"), differentiable_outputs=get("differentiable_outputs")), "Backward.steps(steps, grads=...)"
    elif get("backward_grads") is not None:
        raise TypeError("register_graph: backward_grads needs backward_steps")
    elif get("backward_fn") is not None:
        if backward is not None:
            raise TypeError("register_graph: give backward (the builder of one backward graph) or backward_fn, not both")
        _needs_builder(name, old)
        made = Backward.function(get("backward_fn"), reads=get("backward_reads"), materialize_grads=get("materialize_grads", True),
                                 differentiable_outputs=get("differentiable_outputs"))
        new = "Backward.function(fn, reads=..., materialize_grads=...)"
    elif backward is not None:
        if get("backward_reads") is not None:
            raise TypeError(f"register_graph({name!r}): backward_reads is for backward functions; declared backward_operands already say what is read")
        made = Backward.graph(backward, operands=get("backward_operands"), ragged=get("backward_ragged"), views=get("backward_views"),
                              materialize_grads=get("materialize_grads", True), differentiable_outputs=get("differentiable_outputs"))
        new = "Backward.graph(builder, operands=..., ragged=..., views=...)"
    else:
        _needs_builder(name, old)
        if get("backward_reads") is not None or get("differentiable_outputs") is not None:
            raise TypeError(f"register_graph({name!r}): backward_reads and differentiable_outputs need a backward")
        return None  # materialize_grads alone: nothing to differentiate
    warnings.warn(
        f"register_graph({name!r}): backward={'builder' if callable(backward) else '...'} with "
        f"{', '.join(sorted(old)) or 'no other options'} is deprecated; pass backward={new}",
        DeprecationWarning, stacklevel=3,  # from_keywords -> register_graph -> its caller
    )
    return made
