"""The padding check of a graph registered with ``buckets=``: zero padding leaves its outputs and gradients as they were.

Note [Size buckets] (registry/buckets.py) says when padding is exact. The op pads (eager.py),
so the op checks, before a layout's first padded call and when a trace meets the graph
(fake.py): the graph runs on the torch interpreter, on the CPU, through the op's own CPU
kernel and autograd, at ``CHECK_SIZE`` rows and at those rows padded to ``CHECK_BUCKET``,
and a graph whose outputs or gradients move is refused, naming the one that moved. The
check runs on a thread of its own (clean autograd state: the op's kernels run below
autograd), once per layout of the other dims, for the process (the result is kept).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Optional, Sequence, Tuple

import torch

from .. import registry
from ..registry import Buckets, TensorSpec

__all__ = ["CHECK_SIZE", "CHECK_BUCKET", "check_padding"]

CHECK_SIZE, CHECK_BUCKET = 3, 8  # the check's real size and the bucket it is padded to


def _example(spec: TensorSpec, shape, generator) -> torch.Tensor:
    if spec.host:
        return torch.ones(spec.shape, dtype=spec.dtype)
    if spec.dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(spec.dtype)
    if spec.dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    return torch.randint(0, 4, shape, generator=generator).to(spec.dtype)


def _mismatch(what: str, got: torch.Tensor, want: torch.Tensor) -> Optional[str]:
    if got.shape != want.shape:
        return f"{what} has shape {list(got.shape)} padded against {list(want.shape)} unpadded"
    got, want = got.detach(), want.detach()
    low_precision = want.dtype not in (torch.float32, torch.float64) and want.is_floating_point()
    scale = max(1.0, float(want.double().abs().nan_to_num().max())) if want.numel() else 1.0
    tolerance = (2e-2 if low_precision else 1e-4) * scale
    got, want = got.double(), want.double()
    differs = ~((got - want).abs() <= tolerance) & ~(got.isnan() & want.isnan())
    if bool(differs.any()):
        worst = float((got - want).abs().nan_to_num(float("inf")).max())
        return f"{what} changes when the bucketed dims are zero-padded (by up to {worst:.3g}, tolerance {tolerance:.3g})"
    return None


def _run_check(graph_id: int, name: str, buckets: Buckets, specs: Tuple[TensorSpec, ...], differentiable: bool) -> Optional[str]:
    """What moved when the bucketed dims were padded, or None (see the Note)."""
    generator = torch.Generator().manual_seed(0)
    dims = dict(buckets.inputs)
    real = []
    for index, spec in enumerate(specs):
        shape = list(spec.shape)
        if index in dims:
            shape[dims[index]] = CHECK_SIZE
        real.append(_example(spec, shape, generator))
    grads_of = [i for i, t in enumerate(real) if differentiable and t.is_floating_point() and not specs[i].host]
    for i in grads_of:
        real[i].requires_grad_(True)
    exact = torch.ops.cudnn_fe.execute(graph_id, real)  # CPU tensors: the op's interpreter kernel
    rule = (buckets.inputs, buckets.outputs, CHECK_BUCKET, buckets.per_doubling)  # CHECK_SIZE padded to CHECK_BUCKET
    inputs, size = registry.padded(name, rule, real)
    padded_outputs = registry.narrowed(rule, torch.ops.cudnn_fe.execute(graph_id, inputs), size)
    for k, (got, want) in enumerate(zip(padded_outputs, exact)):
        found = _mismatch(f"output {k}", got, want)
        if found:
            return found
    if not grads_of or not any(o.requires_grad for o in exact):
        return None
    weights = [torch.randn(o.shape, generator=generator) if o.is_floating_point() else None for o in exact]

    def grads(outputs):
        loss = sum((o.double() * w.double()).sum() for o, w in zip(outputs, weights) if w is not None and o.requires_grad)
        return torch.autograd.grad(loss, [real[i] for i in grads_of], allow_unused=True)

    for i, got, want in zip(grads_of, grads(padded_outputs), grads(exact)):
        if (got is None) != (want is None):
            return f"the gradient of input {i} is {'missing' if got is None else 'present'} padded only"
        found = want is not None and _mismatch(f"the gradient of input {i}", got, want)
        if found:
            return found
    return None


@functools.lru_cache(maxsize=None)
def _checked(graph_id: int, name: str, buckets: Buckets, specs: Tuple[TensorSpec, ...], differentiable: bool) -> Optional[str]:
    outcome = {}

    def run():  # a thread of its own: autograd's dispatch state clean (the op's kernels run below autograd)
        _checking.active = True
        try:
            outcome["moved"] = _run_check(graph_id, name, buckets, specs, differentiable)
        except Exception as error:  # noqa: BLE001 -- reported to the caller with the graph's name
            outcome["error"] = error

    thread = threading.Thread(target=run, name="cudnn_fe_bucket_check", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        error = outcome["error"]
        return (f"the check that padding leaves its outputs unchanged (the torch interpreter, on the CPU, at {CHECK_SIZE} and at "
                f"{CHECK_SIZE} padded to {CHECK_BUCKET} along the bucketed dims) failed with {type(error).__name__}: {error}. Name "
                "in Buckets(inputs=) every input whose dim takes the varying size")
    return outcome["moved"]


_checking = threading.local()  # set on a check's own thread: the calls it makes describe the graph unchecked


def check_padding(definition, specs: Sequence[TensorSpec]) -> None:
    """Refuse a bucketed graph whose outputs (or gradients) padding changes (the module
    docstring); checked once per layout of the other dims, for the process."""
    if getattr(_checking, "active", False):
        return
    graph_id, name, buckets = definition.graph_id, definition.name, definition.buckets
    dims = dict(buckets.inputs)
    key = tuple(
        dataclasses.replace(spec, shape=tuple(0 if d == dims[i] % len(spec.shape) else n for d, n in enumerate(spec.shape)), stride=())
        if i in dims else spec
        for i, spec in enumerate(specs)
    )
    moved = _checked(graph_id, name, buckets, key, definition.backward is not None)
    if moved:
        raise ValueError(
            f"cudnn_fe.execute: graph {name!r} cannot be bucketed: {moved}. Padding is exact only for outputs that zero rows "
            f"along the padded dims ({dict(buckets.inputs)}) leave unchanged (no softmax, mean or max over them; a sum is fine), "
            "each named in Buckets(outputs={output: dim}) when it follows them; register it without buckets= (a plan per size)"
        )
