"""The native path (the Python side of ``csrc/native``): backend-served plans executed from
C++, with no Python per call.

When the registry has built a graph whose selected plan is served by the cuDNN backend
(every plan on sm90), the graph's ``NativeBinding`` hands the plan to the extension
(binding.py, Note [The native hand-over]); the CUDA kernel of ``cudnn_fe.execute`` then
runs it directly: dispatcher -> pooled handle -> stream ->
context check -> ``cudnnBackendExecute``. Plans served by the frontend's Python
engines (frost) keep the Python path. What the frontend adds to a backend plan's call
(pass-by-value scalars such as an attention scale, workspace tensors it zeroes such as
an attention backward's accumulator, pointer replacements) the native path adds too;
what it cannot (workspace tensors filled with copied data, tensor dumps, a serialized
format it does not know) keeps the Python path (eligibility.py). The choice is per built
graph and visible (``BuiltGraph.native`` and ``path_reason``, ``stats.graphs()``).

A native plan is, in addition, launched as a CUDA graph when a call's addresses repeat
(populated by cuDNN where the engine supports its native CUDA graph API, otherwise
captured from one execute), which skips cuDNN's host path (serialized across threads):
Note [Native CUDA graph launch] in ``csrc/native/plan_graphs.h``; the
``native_cuda_graphs`` setting switches it.

How the plan crosses over, and why that is safe: ``pygraph.serialize()`` of a backend
plan is the frontend's documented serialized form (UBJSON, written by its C++
``Graph::serialize``), whose ``cudnn_backend_data`` field is the backend's own JSON
representation of the execution plan (``CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION``).
The extension deserializes that JSON into a plan with the cuDNN backend C API alone
(``cudnnBackend*`` from the one libcudnn the frontend loaded; see
``csrc/backend/cudnn_library.h``), on a pooled handle of the device it will run on. No
frontend C++ header is compiled into the extension, so nothing depends on which of two
cudnn_frontend copies (the wheel's, libtorch_cuda's) the dynamic linker binds.
"""

from __future__ import annotations

from .. import settings
from .._extension import _C
from .binding import HandOverSource, NativeBinding, capturing, last_used_ns
from .eligibility import NativePlanSpec, backend_plan_of
from .ubjson import decode_ubjson

__all__ = ["NativeBinding", "HandOverSource", "NativePlanSpec", "backend_plan_of", "decode_ubjson", "last_used_ns", "capturing", "cuda_graph_stats"]

if _C.with_cuda:  # the switch lives in C++ (plan_graphs.cpp); the setting is settings.py's (binding.py reads it first)
    settings.watch("native_cuda_graphs", lambda enabled: _C.set_native_cuda_graphs(bool(enabled)))


def cuda_graph_stats() -> dict:
    """The native path's CUDA graphs, every pooled handle together: ``populated`` (by
    cuDNN), ``captured`` (from an execute), ``launched``, ``failed`` (graphs cuDNN or CUDA
    would not make; those calls executed), ``kept`` (alive now), and ``enabled``."""
    if not _C.with_cuda:
        return dict(populated=0, captured=0, launched=0, failed=0, kept=0, enabled=False)
    return dict(_C.native_cuda_graph_counts(), enabled=bool(settings.get("native_cuda_graphs")))
