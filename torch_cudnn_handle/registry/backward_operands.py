"""The vocabulary of a declared backward: ``BackwardOperand`` (a tensor a backward takes
from its forward call, named instead of computed) and ``BackwardStep`` (one graph of a
backward of several). ``backward.py`` puts them together into a graph's ``Backward``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class BackwardOperand:
    """A tensor a backward takes from its forward call, named instead of computed: the
    gradient of a forward output, a forward input, or a forward output.

    * As the operands of one backward graph (``Backward.graph(builder, operands=[...])``): the op's autograd node assembles them in C++, so
      when a native plan serves the backward graph it runs with no Python. A gradient
      autograd did not give is zeros like its output; a gradient is then made
      contiguous, or given the strides of the forward output ``strides_of_output``
      names (for a backward graph built for the output's layout, as the sdpa
      backward is). The outputs whose gradient is not among them are marked
      non-differentiable.
    * As what a backward function reads (``Backward.function(fn, reads=[...])``, inputs
      and outputs only): the node saves just those
      (Note [What a node saves] in csrc/op/autograd_kernels.cpp), and the function gets
      None for the others. ``for_grads`` narrows it further: the tensor is saved only
      when one of those forward inputs needs a gradient (``input(0, for_grads=[1])``:
      ``x`` is read only to compute ``dW``).
    """

    source: int  # 0: gradient of output `index`, 1: input `index`, 2: output `index`, 3: output `output` of step `index`
    index: int
    strides_of_output: int = -1
    for_grads: Tuple[int, ...] = ()
    step_output: int = 0  # source 3: which output of the step
    summed: bool = False  # as an input's gradient (Backward.steps grads): summed to that input's shape

    @classmethod
    def grad(cls, output: int, *, strides_of_output: Optional[int] = None) -> "BackwardOperand":
        return cls(0, int(output), -1 if strides_of_output is None else int(strides_of_output))

    @classmethod
    def input(cls, index: int, *, for_grads: Sequence[int] = ()) -> "BackwardOperand":
        return cls(1, int(index), for_grads=tuple(int(i) for i in for_grads))

    @classmethod
    def output(cls, index: int, *, for_grads: Sequence[int] = ()) -> "BackwardOperand":
        return cls(2, int(index), for_grads=tuple(int(i) for i in for_grads))

    @classmethod
    def step(cls, step: int, output: int = 0) -> "BackwardOperand":
        """Output ``output`` of an earlier step of a declared backward of several graphs
        (``Backward.steps``)."""
        return cls(3, int(step), step_output=int(output))

    def sum_to_input(self) -> "BackwardOperand":
        """As an input's gradient (``Backward.steps(..., grads=...)``): summed to that input's shape, as
        autograd reduces the gradient of a broadcast input (a bias)."""
        if self.source not in (0, 3):
            raise ValueError(f"{self.describe()}: only a gradient or a step's output can be summed to an input's shape")
        return dataclasses.replace(self, summed=True)

    def describe(self) -> str:
        what = ("grad", "input", "output", "step")[self.source]
        like = f", strides_of_output={self.strides_of_output}" if self.strides_of_output >= 0 else ""
        only = f", for_grads={list(self.for_grads)}" if self.for_grads else ""
        output = f", {self.step_output}" if self.source == 3 else ""
        summed = ".sum_to_input()" if self.summed else ""
        return f"BackwardOperand.{what}({self.index}{output}{like}{only}){summed}"


@dataclasses.dataclass(frozen=True)
class BackwardStep:
    """One graph of a declared backward of several (``Backward.steps([...], grads=[...])``):
    a registered graph id, its operands
    (``BackwardOperand``\\ s, ``BackwardOperand.step(s, k)`` for an earlier step's
    output), and the forward inputs whose gradient needs it (empty: always)."""

    graph: int
    operands: Tuple[BackwardOperand, ...]
    for_grads: Tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "operands", tuple(self.operands))
        object.__setattr__(self, "for_grads", tuple(int(i) for i in self.for_grads))
        if not all(isinstance(o, BackwardOperand) for o in self.operands):
            raise TypeError("BackwardStep: operands must be BackwardOperand.grad(i) / .input(i) / .output(i) / .step(s, k)")
