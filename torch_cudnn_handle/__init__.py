"""torch_cudnn_handle: cuDNN frontend graphs as torch ops, on a device-aware handle pool.

* ``register_graph(builder, ...)``: a graph builder in, the int id
  ``torch.ops.cudnn_fe.execute`` takes out (``registry/``); ``Backward`` makes it
  differentiable; ``execute`` / ``execute_out`` / ``execute_`` run it (``op/``): on
  CUDA tensors through cuDNN, on CPU tensors through the reference interpreter
  (``interpreter/``), which ``execute_reference`` runs on any device.
* ``current_handle(device)``: this thread's pooled ``cudnn.Handle`` for a device, on
  torch's current stream there (``pool.py``, ``csrc/pool``, ``csrc/context``);
  ``build_scope(device)``: build frontend graphs for a device (``build_scope.py``).
* ``adopt_frontend_ops()``: the frontend's own torch ops take their handles from the pool.
* ``settings``: every setting and its environment variable; ``stats``: what happened.
* ``torch_cudnn_handle.nn``: modules built on registered graphs.

docs/architecture.md draws the package.
"""

from ._version import __version__
from ._extension import _C  # noqa: F401  -- owned by _extension.py; here for tch._C, as before
from . import settings  # noqa: E402
from .pool import PooledHandle, bind_context, current_handle, release_workspaces, with_cuda  # noqa: E402
from .build_scope import build_scope  # noqa: E402
from .registry import Backward, BackwardOperand, BackwardStep, Buckets, OperandViews, Ragged, built_graphs, register_built_graph, register_graph  # noqa: E402
from . import op  # noqa: E402  -- registers the kernels of torch.ops.cudnn_fe.*
from .op import execute, execute_, execute_out, execute_reference, explain  # noqa: E402
from .frontend_ops import adopt_frontend_ops, restore_frontend_ops  # noqa: E402
from . import stats  # noqa: E402
from .prebuild import Prebuilt, prebuild  # noqa: E402
from ._deprecated import deprecated_attribute  # noqa: E402

__all__ = [
    "__version__",
    "register_graph", "register_built_graph", "Backward", "BackwardOperand", "BackwardStep", "Buckets", "OperandViews", "Ragged",
    "execute", "execute_out", "execute_", "execute_reference", "explain", "built_graphs",
    "current_handle", "bind_context", "build_scope", "PooledHandle", "release_workspaces", "with_cuda",
    "adopt_frontend_ops", "restore_frontend_ops",
    "prebuild", "Prebuilt", "settings", "stats",
]


def __getattr__(name: str):
    """The names of earlier releases, each with a DeprecationWarning naming its replacement (_deprecated.py)."""
    return deprecated_attribute(name)
