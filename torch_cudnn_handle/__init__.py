"""torch_cudnn_handle: the PyTorch side of the cuDNN frontend.

* ``current_handle(device, stream)``: this thread's pooled ``cudnn.Handle`` for a
  device, on torch's current stream there (``pool.py``, ``csrc/pool``, ``csrc/context``).
* ``build_scope(device)``: build graphs for a device (``build_scope.py``).
* ``register_graph(builder, ...)``: hand a graph builder (or a built graph) to the
  registry and get the int id ``torch.ops.cudnn_fe.execute`` takes (``registry/``,
  ``op.py``).
* ``adopt_frontend_ops()``: the frontend's own torch ops take their handles from the
  pool (``frontend_ops.py``).
"""

from ._version import __version__

import torch  # noqa: F401  -- before _C, which links against libtorch
import cudnn  # noqa: F401  -- loads libcudnn, which the pool takes its handles from

from ._extension import load_extension

_C = load_extension()  # a clear ImportError when _C is missing or was built for another torch

from .pool import PooledHandle, bind_context, current_handle, pool_stats, release_workspaces, with_cuda

__all__ = ["__version__", "PooledHandle", "bind_context", "current_handle", "pool_stats", "release_workspaces", "with_cuda"]

from .build_scope import build_scope
from .registry import (
    BackwardOperand, BackwardStep, OperandViews, Ragged, built_graphs, register_built_graph, register_graph, registry_stats, set_cache_capacity,
    set_dynamic_shapes, set_native_path,
    set_plan_cache,
)
from . import op  # noqa: E402  -- registers the kernels of torch.ops.cudnn_fe.*
from .op import execute, execute_, execute_out
from .plan_tuning import set_plan_tuning, tuning_stats
from .native import native_cuda_graph_stats, set_native_cuda_graphs
from .frontend_ops import adopt_frontend_ops, restore_frontend_ops

__all__ += [
    "build_scope",
    "register_graph",
    "BackwardOperand",
    "BackwardStep",
    "OperandViews",
    "Ragged",
    "register_built_graph",
    "registry_stats",
    "set_cache_capacity",
    "set_native_path",
    "set_native_cuda_graphs",
    "native_cuda_graph_stats",
    "set_dynamic_shapes",
    "set_plan_cache",
    "built_graphs",
    "execute",
    "execute_out",
    "execute_",
    "set_plan_tuning",
    "tuning_stats",
    "adopt_frontend_ops",
    "restore_frontend_ops",
]
