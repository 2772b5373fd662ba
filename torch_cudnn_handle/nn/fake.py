"""A module on fake CUDA tensors, to trace it on a machine without a GPU.

``torch.compile(model, backend="aot_eager", fullgraph=True)`` traces a model whose
parameters and inputs are fake CUDA tensors (``FakeTensorMode``): shapes, strides,
dtypes and devices, no storage; the op's fake kernel describes each cuDNN graph's
outputs, nothing is built or run. Building a module directly on fake CUDA fails on a CPU
torch (its initializers run real kernels), so it is built on ``meta`` and each parameter
and buffer is then swapped for a fake CUDA tensor of the same shape and dtype.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

__all__ = ["fake_cuda_module"]


def fake_cuda_module(cls: Callable[..., torch.nn.Module], *args, fake_mode: Optional[FakeTensorMode] = None, **kwargs) -> torch.nn.Module:
    """``cls(*args, device="meta", **kwargs)`` with its parameters and buffers made fake
    CUDA tensors of ``fake_mode`` (a new ``FakeTensorMode`` if None), ready to trace.

    Make the inputs in the same mode::

        fake_mode = FakeTensorMode()
        block = fake_cuda_module(TransformerBlock, 512, 8, fake_mode=fake_mode, dtype=torch.bfloat16)
        with fake_mode:
            x = torch.empty(8, 256, 512, dtype=torch.bfloat16, device="cuda")
        y = torch.compile(block, backend="aot_eager", fullgraph=True)(x)   # a fake [8, 256, 512]

    The parameters need no grad: a CPU build of torch cannot give fake CUDA tensors
    autograd metadata, so this traces the forward. To trace the backward too, use the
    module on ``meta`` as it is (``cls(..., device="meta")``, inputs on ``meta`` that
    require grad): the op takes meta tensors like CUDA ones.
    """
    module = cls(*args, device="meta", **kwargs)
    fake_mode = FakeTensorMode() if fake_mode is None else fake_mode
    with fake_mode:
        for owner in module.modules():
            for name, parameter in list(owner.named_parameters(recurse=False)):
                setattr(owner, name, torch.nn.Parameter(_fake_cuda_like(parameter), requires_grad=False))
            for name, buffer in list(owner.named_buffers(recurse=False)):
                if buffer is not None:
                    setattr(owner, name, _fake_cuda_like(buffer))
    return module


def _fake_cuda_like(tensor: torch.Tensor) -> torch.Tensor:
    """Inside a FakeTensorMode: an uninitialized CUDA tensor of ``tensor``'s shape and dtype (values do not exist in a trace)."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="cuda")
