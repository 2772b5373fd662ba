"""``torch.ops.cudnn_fe.execute``, ``execute.out`` and ``execute_``: the op's Python face.

The schemas and the CUDA, autograd and in-place kernels are C++ (csrc/op). Here:

  * ``eager.py``: ``execute``, ``execute_out``, ``execute_``, the entries users call;
  * ``checks.py``: the one device rule, and what the op refuses;
  * ``python_path.py``: every CUDA call no native plan served (the C++ kernel sends it),
    and ``plan_ready`` for callers with a stand-in of their own;
  * ``reference.py``: the CPU kernels, on the reference interpreter, the CUDA calls sent
    there where asked (``reference=True``, the ``reference_path`` setting), and
    ``execute_reference``;
  * ``verify.py``, ``tolerance.py``: verify mode (the ``verify`` setting): each built
    graph's first execution checked against the interpreter;
  * ``fake.py``: the fake kernels (torch.compile, meta tensors, no GPU);
  * ``stand_in.py``: a call a stand-in serves while its plan builds (a graph's torch
    stand-in, else the interpreter); ``explain.py``: a call's route, asked without running it;
    ``bucket_check.py``: the padding check of size buckets;
  * ``backward.py``: the autograd node's Python backward;
  * ``bool_operands.py``, ``overlap.py``: torch.bool operands, memory overlap.

Importing this module registers the Python kernels with the extension and torch.library.
"""

from __future__ import annotations

from typing import List

import torch

from .._extension import _C
from . import backward, fake, python_path, reference
from .checks import call_device, refuse_off_gpu
from .eager import execute, execute_, execute_out
from .explain import explain, route_of
from .python_path import plan_ready
from .reference import execute_reference

__all__ = ["execute", "execute_out", "execute_", "execute_reference", "plan_ready", "route_of", "explain"]


def _refuse_off_gpu(graph: int, inputs: List[torch.Tensor], **_out):
    """Every dispatch that reaches neither the CUDA nor the CPU kernel: another backend, or
    no tensor at all (the dispatcher's Undefined slot, which CompositeExplicitAutograd fills)."""
    call_device(graph, inputs)  # no input, only host scalars, several devices: named
    refuse_off_gpu(graph, inputs)


def _refuse_off_gpu_in_place(graph: int, inputs: List[torch.Tensor], written: List[torch.Tensor]):
    _refuse_off_gpu(graph, _C.merge_in_place(graph, inputs, written))


_C._set_python_kernels(python_path.execute, python_path.execute_out, python_path.execute_in_place, backward.backward,
                       backward.run_declared_backward)
_lib = torch.library.Library("cudnn_fe", "IMPL")
_lib.impl("execute", reference.cpu_execute, "CPU")
_lib.impl("execute.out", reference.cpu_execute_out, "CPU")
_lib.impl("execute_", reference.cpu_execute_in_place, "CPU")
_lib.impl("execute", _refuse_off_gpu, "CompositeExplicitAutograd")
_lib.impl("execute.out", _refuse_off_gpu, "CompositeExplicitAutograd")
_lib.impl("execute_", _refuse_off_gpu_in_place, "CompositeExplicitAutograd")
torch.library.register_fake("cudnn_fe::execute", fake.execute, lib=_lib)
torch.library.register_fake("cudnn_fe::execute.out", fake.execute_out, lib=_lib)
torch.library.register_fake("cudnn_fe::execute_", fake.execute_in_place, lib=_lib)
