"""The probe of Note [Pointwise broadcasts]: a grid of pointwise-only graphs with broadcast
operands (which dims broadcast, one to three operands, mul/add/sub/relu, fp16/bf16/fp32,
3-D and 4-D), each run twice on the GPU: as written (the workaround switched off: what
cuDNN computes for the broadcast itself) and through the op as it is (the broadcast
inputs materialized). Both are compared with torch in float64.

``pytest -s test/op/test_pointwise_broadcasts_gpu.py`` prints, per dtype, which patterns
cuDNN gets wrong as written; the assertions are that the op gets every pattern the rule
covers right, and that the rule covers every pattern cuDNN was seen to get wrong. A pattern
cuDNN refuses ("no engine") is reported as refused; it fails only if cuDNN serves it as
written but not as the op describes it.
"""

from __future__ import annotations

import cudnn
import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle.registry import describe as describing

pytestmark = pytest.mark.gpu

# Relative to the largest expected value: a rounding of the stored result is within these,
# a wrong broadcast (measured: off by up to 13.7 / 55.9 / 16.7) far outside them.
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5}

BINARY = {
    "mul": (lambda g, a, b: g.mul(a, b, name="op"), lambda a, b: a * b),
    "add": (lambda g, a, b: g.add(a, b, name="op"), lambda a, b: a + b),
    "sub": (lambda g, a, b: g.sub(a, b, name="op"), lambda a, b: a - b),
    "relu_add": (lambda g, a, b: g.relu(g.add(a, b, name="add"), name="relu"), lambda a, b: torch.relu(a + b)),
}

FULL = {3: (4, 64, 96), 4: (2, 8, 16, 96)}
SMALL = {
    3: [(1, 1, 96), (4, 1, 96), (4, 64, 1), (1, 64, 96), (1, 64, 1), (1, 1, 1)],
    4: [(1, 1, 1, 96), (2, 1, 16, 96), (2, 8, 16, 1), (1, 8, 1, 96), (1, 1, 1, 1)],
}


def _patterns():
    """(name, builder, torch function, input shapes, whether the rule covers it)."""
    found = []
    for rank, full in FULL.items():
        for small in SMALL[rank]:
            for op, (build, fn) in BINARY.items():
                if rank == 4 and op in ("sub", "relu_add"):
                    continue
                found.append((f"x{list(full)} {op} s{list(small)}", build, fn, [full, small], True))
            found.append((f"s{list(small)} mul x{list(full)} (broadcast first)", BINARY["mul"][0], BINARY["mul"][1], [small, full], True))
    for small in [(1, 1, 96), (4, 1, 96)]:
        found.append((f"x * s{list(small)} + y", lambda g, x, s, y: g.add(g.mul(x, s, name="mul"), y, name="add"),
                      lambda x, s, y: x * s + y, [FULL[3], small, FULL[3]], True))
    found.append(("x * s[1, 1, 96] + t[4, 64, 1]", lambda g, x, s, t: g.add(g.mul(x, s, name="mul"), t, name="add"),
                  lambda x, s, t: x * s + t, [FULL[3], (1, 1, 96), (4, 64, 1)], True))
    found.append(("(s[1, 1, 96] * t[1, 1, 96]) + x: a virtual broadcast", lambda g, s, t, x: g.add(g.mul(s, t, name="mul"), x, name="add"),
                  lambda s, t, x: s * t + x, [(1, 1, 96), (1, 1, 96), FULL[3]], True))
    return found


PATTERNS = _patterns()


def _inputs(shapes, dtype, seed):
    """Each input at the front of a buffer of the largest input's size: cuDNN's own broadcast of a
    small input may read it at the full shape (a wrong value, which the grid records), and once
    read past its end into unmapped memory (an illegal address, on an H100), which took down the
    process's CUDA context and every later test of it."""
    gen = torch.Generator().manual_seed(seed)
    room = max(torch.Size(shape).numel() for shape in shapes)
    values = [(torch.randn(*shape, generator=gen) * 2).to(dtype=dtype) for shape in shapes]
    return [torch.empty(room, dtype=dtype, device="cuda")[: v.numel()].view(v.shape).copy_(v) for v in values]


def _expected(inputs, fn, dtype) -> torch.Tensor:
    return fn(*(t.double() for t in inputs)).to(dtype).double()


def _relative_error(out, expected) -> float:
    return float((out.double() - expected).abs().max()) / max(float(expected.abs().max()), 1e-6)


def _error(graph_id, inputs, fn) -> float:
    """The op's largest error against torch in float64, relative to the largest expected value."""
    (out,) = tch.execute(graph_id, inputs)
    return _relative_error(out, _expected(inputs, fn, out.dtype))


def _what_was_wrong(graph_id, inputs, fn, tol) -> str:
    """A wrong result described: the next two calls' errors (is it repeatable?) and, for the
    first of them, how many elements are off and how many of those are zero (never written?)."""
    (out,) = tch.execute(graph_id, inputs)
    torch.cuda.synchronize()
    expected = _expected(inputs, fn, out.dtype)
    scale = max(float(expected.abs().max()), 1e-6)
    off = (out.double() - expected).abs() > tol * scale
    zeros = off & (out == 0)
    (built,) = tch.built_graphs(graph_id)
    return (f"next call {_relative_error(out, expected):.3g} ({int(off.sum())} of {out.numel()} elements off, {int(zeros.sum())} of them 0), "
            f"the call after {_error(graph_id, inputs, fn):.3g}; route {built.route}, engine {built.engine}, native {built.native}")


def _error_or_refusal(graph_id, inputs, fn):
    """``_error``, or None where cuDNN offers no plan for the graph (a refusal, never a wrong value)."""
    try:
        return _error(graph_id, inputs, fn)
    except cudnn.cudnnGraphNotSupportedError:
        return None


def _verdict(error, tol) -> str:
    return "refused by cuDNN" if error is None else f"{'right' if error <= tol else 'WRONG'} ({error:.3g})"  # nan: WRONG


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_pointwise_broadcast_grid(dtype, monkeypatch):
    tol = TOLERANCE[dtype]
    rows, problems = [], []
    for index, (name, build, fn, shapes, covered) in enumerate(PATTERNS):
        inputs = _inputs(shapes, dtype, seed=index)

        def builder(graph, *tensors, _build=build):
            return _build(graph, *tensors)

        with monkeypatch.context() as patch:
            patch.setattr(describing, "broadcast_inputs", lambda *_: ())  # as written: cuDNN broadcasts itself
            raw = _error_or_refusal(tch.register_graph(builder, name=f"probe_raw_{index}_{dtype}"), inputs, fn)
        handled_id = tch.register_graph(builder, name=f"probe_{index}_{dtype}")
        handled = _error_or_refusal(handled_id, inputs, fn)
        if handled is None:  # cuDNN built no plan for the graph the op described
            rows.append((name, raw, handled, ()))
            if raw is not None:
                problems.append(f"{name}: cuDNN serves it as written but not as the op describes it")
            continue
        (built,) = tch.built_graphs(handled_id)
        materialized = built.layout.materialized
        rows.append((name, raw, handled, materialized))
        if covered and not materialized:
            problems.append(f"{name}: the rule does not materialize it")
        if not handled <= tol:  # nan included
            problems.append(f"{name}: the op's result is off by {handled:.3g} of the largest value (materialized {materialized}); "
                            + _what_was_wrong(handled_id, inputs, fn, tol))
            continue
        second = _error(handled_id, inputs, fn)  # the native plan on the materialized tensor (or the Python path)
        if not second <= tol:
            problems.append(f"{name}: the op's second call is off by {second:.3g} of the largest value (materialized {materialized}); "
                            + _what_was_wrong(handled_id, inputs, fn, tol))
    table = [f"Pointwise broadcasts on {torch.cuda.get_device_name()}, {str(dtype).replace('torch.', '')} "
             f"(error relative to the largest value; wrong above {tol:g}):",
             "| pattern | cuDNN as written | through the op | materialized |", "| --- | --- | --- | --- |"]
    table += [f"| {name} | {_verdict(raw, tol)} | {_verdict(handled, tol)} | {list(materialized) or '-'} |"
              for name, raw, handled, materialized in rows]
    wrong_as_written = [name for name, raw, _, _ in rows if raw is not None and not raw <= tol]
    table.append(f"cuDNN as written gets {len(wrong_as_written)} of {len(rows)} wrong")
    print("\n" + "\n".join(table))
    assert not problems, "\n".join(problems + table)
