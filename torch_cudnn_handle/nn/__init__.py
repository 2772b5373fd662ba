"""``torch.nn`` building blocks on cuDNN graphs, forward and backward.

Each module runs its work through ``torch.ops.cudnn_fe.execute`` on graphs
registered once, when this package is imported (or, for a parameter that is part
of a graph, like RMSNorm's ``eps``, when the first module with that value is
built), so they trace under ``torch.compile(fullgraph=True)``, differentiate
through autograd and run on any thread (the handle pool and context guard of
``torch_cudnn_handle``):

* ``FusedLinear(in, out, activation)``: ``act(x @ W^T + b)``, one fused graph;
  its backward is three graphs (cuDNN fuses one matmul per graph) and a torch sum;
* ``RMSNorm(dim, eps)`` and ``LayerNorm(dim, eps)``: the rmsnorm / layernorm node, and one
  backward graph each;
* ``sdpa(q, k, v, causal)`` / ``Attention(dim, heads)``: the sdpa node (with its
  softmax stats) and one sdpa_backward graph;
* ``TransformerBlock(dim, heads, mlp_ratio)``: a pre-norm block of the above.

``fake_cuda_module(cls, *args, fake_mode=..., **kwargs)`` builds any of them with fake
CUDA parameters, to trace it under ``torch.compile`` without a GPU (``fake.py``).

``reference_of(module)`` is the same function in plain torch, with a copy of the
parameters (``reference.py``).
"""

from .attention import Attention, sdpa
from .block import TransformerBlock
from .fake import fake_cuda_module
from .linear import FusedLinear
from .norm import LayerNorm, RMSNorm
from .reference import (
    AttentionReference,
    LinearReference,
    RMSNormReference,
    TransformerBlockReference,
    reference_of,
    sdpa_reference,
)

__all__ = [
    "FusedLinear",
    "RMSNorm",
    "LayerNorm",
    "sdpa",
    "Attention",
    "TransformerBlock",
    "fake_cuda_module",
    "LinearReference",
    "RMSNormReference",
    "sdpa_reference",
    "AttentionReference",
    "TransformerBlockReference",
    "reference_of",
]
