"""How close verify mode wants a built graph's outputs to the interpreter's: the tolerance
rule, derived from the graph's data types, and the comparison of one output.

The rule (per output; ``eps(t)`` is the type's machine epsilon, the gap above 1.0:
float64 2**-52, float32 2**-23, TF32 2**-10, float16 2**-10, bfloat16 2**-7, fp8 e4m3
2**-3, e5m2 2**-2). A floating output gets a unit, the largest of

  * ``eps`` of the output's own type (the one rounding every kernel makes when it stores);
  * ``eps(float32)``: no engine computes wider, and the reference computes in float32 at
    least;
  * ``eps`` of the graph's intermediate type and of each node's compute type where either
    is narrower than float32 (a kernel may keep values in it; the interpreter does not);
  * ``eps(TF32)`` when a matmul or convolution reads a float32 tensor (cuDNN may run it
    on TF32 tensor cores);
  * ``eps`` of the floating types a reducing node reads (a matmul, convolution, norm,
    reduction or attention): its kernels sum in another order, may compute a variance in
    one pass, and an attention rounds its probabilities (in the backward dP too) to its
    input type before the second product, so a float32 statistic of float16 data is
    held to float16's precision (upstream's own tolerances for such outputs are wider);
  * ``2**-11`` when a pointwise node evaluates a transcendental function (exp, tanh, erf,
    ... : kernels may use the hardware's approximate instructions);

and passes when ``|got - expected| <= atol + rtol * |expected|`` at every compared
element, with ``rtol = SLACK * unit`` and ``atol = SLACK * unit * max|expected| + tiny``
(``SLACK = 8``; ``tiny`` the type's smallest normal; ``max|expected|`` over the output's
finite elements). The absolute part scales with the output because the errors of
products and sums do: a value that cancels to near zero carries the error of the terms
it came from. NaN matches NaN and an infinity the same infinity. An integer output may be
off by 1 (a float rounded to an integer lands on either side of a tie); a boolean one may
have ``floor(1e-3 * numel)`` flipped elements (a comparison of values equal within
rounding). The rule is meant to catch a wrong result (a wrong broadcast, a wrong layout,
a wrong kernel), never a rounding difference: a wrong value is typically off by the size
of the values themselves, hundreds of units.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Sequence

import torch

from ..interpreter.description import node_kind
from ..registry import torch_dtype_of

__all__ = ["SLACK", "EPS", "OutputRule", "OutputCheck", "rules_for", "unit_of_types", "check_output"]

SLACK = 8.0
TF32_EPS = 2.0 ** -10
APPROXIMATE_EPS = 2.0 ** -11
BOOL_FLIPS = 1e-3

EPS = {
    torch.float64: 2.0 ** -52, torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7,
    **{getattr(torch, name): value for name, value in (("float8_e4m3fn", 2.0 ** -3), ("float8_e5m2", 2.0 ** -2), ("float8_e8m0fnu", 1.0))
       if hasattr(torch, name)},
}

# Pointwise modes whose kernels may use approximate instructions (the frontend's mode names).
APPROXIMATE_MODES = frozenset({
    "exp", "log", "tanh", "sigmoid", "gelu", "gelu_approx_tanh", "erf", "softplus", "swish", "elu", "sin", "cos", "tan", "pow",
    "rsqrt", "reciprocal", "sqrt", "tanh_backward", "sigmoid_backward", "gelu_backward", "gelu_approx_tanh_backward",
    "softplus_backward", "swish_backward", "elu_backward",
})


def _eps(dtype: Optional[torch.dtype]) -> float:
    return EPS.get(dtype, 0.0) if dtype is not None and dtype.is_floating_point else 0.0


@dataclasses.dataclass(frozen=True)
class OutputRule:
    """The tolerance of one output before its values are known: ``unit`` and why."""

    dtype: torch.dtype
    unit: float
    why: str

    def bounds(self, expected: torch.Tensor):
        """(atol, rtol) for this output given its expected values."""
        finite = expected.detach().double().abs()
        finite = finite[torch.isfinite(finite)]
        scale = float(finite.max()) if finite.numel() else 0.0
        tiny = torch.finfo(self.dtype).tiny if self.dtype.is_floating_point else 0.0
        return SLACK * self.unit * scale + tiny, SLACK * self.unit

    def describe(self, expected: torch.Tensor) -> str:
        if not self.dtype.is_floating_point:
            return "off by at most 1" if self.dtype != torch.bool else f"at most {BOOL_FLIPS:g} of the elements flipped"
        atol, rtol = self.bounds(expected)
        return f"atol {atol:.3g} + rtol {rtol:.3g} * |expected| (unit {self.unit:.3g}: {self.why})"


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def unit_of_types(output: torch.dtype, *, narrow_types: Sequence[torch.dtype] = (), tf32: bool = False,
                  reduced_types: Sequence[torch.dtype] = (), approximate: bool = False):
    """(unit, why) of a floating output (see the module docstring)."""
    terms = [(_eps(output), f"{_name(output)} output"), (_eps(torch.float32), "float32 compute")]
    terms += [(_eps(t), f"{_name(t)} intermediate") for t in narrow_types if _eps(t) > _eps(torch.float32)]
    if tf32:
        terms.append((TF32_EPS, "TF32 products of float32 inputs"))
    terms += [(_eps(t), f"a reduction over {_name(t)} data") for t in reduced_types]
    if approximate:
        terms.append((APPROXIMATE_EPS, "approximate transcendental functions"))
    unit, why = max(terms, key=lambda term: term[0])
    return unit, why


def _reduces(kind: str) -> bool:
    return kind in ("MATMUL", "REDUCTION", "GENSTATS", "SDPA", "SDPA_BWD") or kind.startswith("CONV_") or "NORM" in kind


def _dtype_of(data_type) -> Optional[torch.dtype]:
    return None if data_type is None else torch_dtype_of(data_type)


def rules_for(graph, outputs: Sequence, intermediate=None) -> List[OutputRule]:
    """The rule of each of ``outputs`` (the description's output tensors) of the
    validated description ``graph``; ``intermediate``: the graph's intermediate data type
    (a cudnn.data_type or torch dtype; the description does not say it)."""
    nodes = list(graph.nodes)
    virtual = [t for node in nodes for t in node.outputs.values() if t is not None and t.is_virtual]
    narrow = [_dtype_of(intermediate)] if virtual else []
    narrow += [_dtype_of(t.data_type) for t in virtual]
    narrow += [_dtype_of(getattr(node, "compute_data_type", None)) for node in nodes]
    narrow = [t for t in narrow if t is not None and t.is_floating_point]
    tf32 = attention = approximate = False
    reduced_types = []
    for node in nodes:
        kind = node_kind(node)
        reads = [_dtype_of(t.data_type) for t in node.inputs.values() if t is not None and not t.is_pass_by_value]
        if kind == "MATMUL" or kind.startswith("CONV_"):
            tf32 = tf32 or torch.float32 in reads
        if _reduces(kind):
            attention = attention or kind in ("SDPA", "SDPA_BWD")
            reduced_types += [t for t in reads if t is not None and t.is_floating_point and _eps(t) > _eps(torch.float32)]
        mode = node.params.get("mode") if kind == "POINTWISE" else None
        approximate = approximate or str(getattr(mode, "name", mode)).lower() in APPROXIMATE_MODES
    approximate = approximate or attention  # softmax's exp
    rules = []
    for tensor in outputs:
        dtype = _dtype_of(tensor.data_type)
        if dtype is None or not dtype.is_floating_point:
            rules.append(OutputRule(dtype or torch.float32, 0.0, "exact"))
            continue
        unit, why = unit_of_types(dtype, narrow_types=narrow, tf32=tf32, reduced_types=reduced_types, approximate=approximate)
        rules.append(OutputRule(dtype, unit, why))
    return rules


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    """One output compared: the largest errors, the bound, how many elements broke it."""

    index: int
    max_abs: float
    max_rel: float
    outside: int
    compared: int
    tolerance: str
    ignored: int = 0  # elements the plan left unwritten, or a padding mask leaves undefined

    @property
    def ok(self) -> bool:
        return self.outside == 0

    def describe(self) -> str:
        ignored = f", {self.ignored} left undefined by the graph not compared" if self.ignored else ""
        return (
            f"output {self.index}: max abs error {self.max_abs:.6g}, max rel error {self.max_rel:.6g}; tolerance "
            f"{self.tolerance}; {self.outside} of {self.compared} elements outside{ignored}"
        )


def check_output(index: int, rule: OutputRule, got: torch.Tensor, expected: torch.Tensor, compared: Optional[torch.Tensor] = None) -> OutputCheck:
    """Compare ``got`` with ``expected`` (same shape) at the elements ``compared`` holds
    True for (all when None), by ``rule``."""
    g, e = got.detach().double(), expected.detach().double().to(got.device)
    mask = torch.ones_like(g, dtype=torch.bool) if compared is None else compared.expand(g.shape)
    ignored = int((~mask).sum())
    both_nan = g.isnan() & e.isnan()
    same_inf = torch.isinf(g) & (g == e)
    difference = torch.where(both_nan | same_inf, torch.zeros_like(g), (g - e).abs()).nan_to_num(nan=math.inf)
    difference = torch.where(mask, difference, torch.zeros_like(difference))
    relative = torch.where((e != 0) & torch.isfinite(e), difference / e.abs(), torch.where(difference > 0, math.inf, 0.0))
    max_abs = float(difference.max()) if difference.numel() else 0.0
    max_rel = float(relative.max()) if relative.numel() else 0.0
    if rule.dtype == torch.bool:
        flips = int(((difference > 0) & mask).sum())
        outside = 0 if flips <= math.floor(BOOL_FLIPS * int(mask.sum())) else flips
    elif not rule.dtype.is_floating_point:
        outside = int(((difference > 1) & mask).sum())
    else:
        atol, rtol = rule.bounds(torch.where(mask, e, torch.zeros_like(e)))
        outside = int(((difference > atol + rtol * e.abs().nan_to_num(posinf=0.0, neginf=0.0)) & mask).sum())
    return OutputCheck(index, max_abs, max_rel, outside, int(mask.sum()), rule.describe(torch.where(mask, e, torch.zeros_like(e))), ignored)
