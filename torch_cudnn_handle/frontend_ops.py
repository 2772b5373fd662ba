"""``adopt_frontend_ops()``: the cuDNN frontend's own torch ops take their handles from the pool.

The frontend (``nvidia-cudnn-frontend`` 1.32, package ``cudnn``) ships torch ops that each
keep a private handle cache: ``cudnn.create_handle()`` on first use, kept in a per-thread
dict that dies with its thread without destroying the handle (sdpa, the norms, the
linear-attention ops) or in one module-global dict that every thread shares (MoE grouped
matmul, the SwiGLU ops; the SwiGLU MLP and the gated attention block's GEMMs keep one per
(device, stream)). A process with thread churn leaks a handle per thread per op family,
and the global dicts hand one handle to several threads, which cuDNN forbids.

Adoption replaces, in each op module, the one function that returns the cached handle
(the narrowest seam; the ops themselves are untouched) with a call to ``current_handle``
for the device the op's tensors are on: this thread's pooled handle, on torch's current
stream there (or the stream the op names), with the right CUDA context bound and left
bound (the frontend's rule for its own launches; see ``_pooled``).

Who owns the handles afterwards: the pool (``csrc/pool``), for the life of the process; a
thread borrows one per device until it exits; the ops create none. Handles the frontend
made before adoption stay in its caches, unused (it never destroys them either).

Why this is safe:
  * each seam's contract is "a handle this thread may use now, for this device, on this
    stream"; a pooled handle is exactly that, and never shared between live threads;
  * the ops build each graph once and run it on whichever thread's handle (the frontend
    already does this across its own threads), so graphs built before adoption run on
    pooled handles and the other way round;
  * per-stream state the ops keep (the SwiGLU MLP's plans and workspaces, the gated
    attention block's launch stream) stays keyed by the stream: the pooled handle is set
    to that stream on each call, by the thread that then uses it;
  * the ops read the seam as a module global at each call, so a call racing adoption (or
    ``restore_frontend_ops``) gets one seam or the other, and both are valid.

Before touching anything, adoption checks the frontend version and every seam (present,
a function of the expected module and signature, still the module's only handle factory)
and refuses with an error naming the seam if one changed: all sites or none.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
import types
import warnings
from dataclasses import dataclass
from typing import Callable

import cudnn
import torch

from .pool import bind_context, current_handle

__all__ = ["adopt_frontend_ops", "restore_frontend_ops", "check_frontend_version", "SEAMS", "WRITTEN_FOR"]

WRITTEN_FOR = "1.32"  # the nvidia-cudnn-frontend release series whose seams are listed below


# The replacements, one per calling convention. Each keeps the parameter names of the
# frontend function it stands in for, and its way of choosing the device.


def _pooled(device, stream=None):
    """This thread's pooled handle, the device's context left current: the op launches
    right after through the frontend's execute, in whatever context is current (the
    frontend's rule; the library's own entry points restore the caller's: Note [The
    context rule] in csrc/context/context_guard.h)."""
    handle = current_handle(device, stream)
    bind_context(handle.device.ordinal, handle.stream)
    return handle


def _handle_for_device(device):
    """sdpa, the norms and MoE grouped matmul pass the device of the op's tensors (q.device, ...)."""
    return _pooled(device)


def _handle_for_tensor(tensor):
    return _pooled(tensor.device)  # the SwiGLU MoE's wgrad passes a tensor


def _handle_and_stream_for_device(device):
    """The SwiGLU MLP wants ``(handle, stream)`` and keys its plans and workspaces by the
    stream: torch's current stream on ``device``, which the pool has just set the handle to."""
    handle = _pooled(device)
    return handle, handle.stream


def _handle_on_stream(device, stream=None):
    """The linear-attention ops name the launch stream (a torch stream or a raw handle);
    ``None`` is torch's current stream, and an index-less device the current device, as before."""
    if stream is not None and not isinstance(stream, torch.cuda.Stream):
        # Another stream object, or an int-like raw stream (a cuda-python CUstream, say).
        stream = int(stream.cuda_stream if hasattr(stream, "cuda_stream") else stream)
    return _pooled(device, stream)


def _handle_for_stream(device, stream):
    return _pooled(torch.device(device), int(stream))  # the gated attention block's GEMMs: a raw stream for out.device


@dataclass(frozen=True)
class Seam:
    """One frontend function that returns an op's cached handle, and what replaces it."""

    module: str  # the module whose global the ops look up at each call
    attribute: str
    defined_in: str  # where the frontend's function is defined (differs for a re-bound import)
    signature: str  # its parameters, without annotations
    replacement: Callable

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}"


SEAMS = (
    # Per-thread dict {torch.device: handle}, set to torch's current stream on every call.
    Seam("cudnn.sdpa.fwd.torch_op", "_get_handle", "cudnn.sdpa.fwd.torch_op", "(device)", _handle_for_device),
    # rms_norm and layer_norm: one per-thread dict in _common, whose get_handle the two op
    # modules bound by `from ._common import get_handle`, so each binding is a seam.
    Seam("cudnn.ops.norm._common", "get_handle", "cudnn.ops.norm._common", "(device)", _handle_for_device),
    Seam("cudnn.ops.norm.rmsnorm", "get_handle", "cudnn.ops.norm._common", "(device)", _handle_for_device),
    Seam("cudnn.ops.norm.layernorm", "get_handle", "cudnn.ops.norm._common", "(device)", _handle_for_device),
    # One global dict {torch.device: handle} shared by all threads, the handle made on the
    # *current* device rather than the tensor's; set to torch's current stream per call.
    Seam("cudnn.gemm.ops.moe_grouped_matmul", "_get_handle", "cudnn.gemm.ops.moe_grouped_matmul", "(device)", _handle_for_device),
    # One global dict {ordinal: handle} shared by all threads (the wgrad of swiglu_moe).
    Seam("cudnn.gemm.ops.swiglu_moe", "_cudnn_handle", "cudnn.gemm.ops.swiglu_moe", "(tensor)", _handle_for_tensor),
    # One global dict {(ordinal, stream): handle}, the stream set once at creation.
    Seam("cudnn.gemm.ops.swiglu_mlp", "_handle", "cudnn.gemm.ops.swiglu_mlp", "(device)", _handle_and_stream_for_device),
    # Per-thread dict {ordinal: handle}, rebound to the launch stream on every call.
    Seam("cudnn.linear_attention.ops.common", "get_handle", "cudnn.linear_attention.ops.common", "(device, stream=None)", _handle_on_stream),
    # One global dict {(ordinal, stream): handle} for the graph route of the block's GEMMs.
    Seam(
        "cudnn.gated_attention_block.kernels.proj_gemm",
        "handle_for_stream",
        "cudnn.gated_attention_block.kernels.proj_gemm",
        "(device, stream)",
        _handle_for_stream,
    ),
)

# Held while adopting or restoring; the ops never take it.
_lock = threading.Lock()
# None: not adopted. Otherwise {seam: (module, the frontend's function)} for each adopted seam.
_adoption: dict[Seam, tuple[types.ModuleType, Callable]] | None = None


def check_frontend_version(version: str | None = None) -> None:
    """Raise unless ``version`` (default: the installed ``cudnn.__version__``) is in the
    release series this adoption was written for: its seams are private functions."""
    installed = cudnn.__version__ if version is None else version
    if installed.split(".")[:2] != WRITTEN_FOR.split("."):
        raise RuntimeError(
            f"torch_cudnn_handle.adopt_frontend_ops() was written for nvidia-cudnn-frontend {WRITTEN_FOR}.x, "
            f"but {installed} is installed: the private handle caches it replaces may have moved or changed. "
            f"Nothing was adopted. Install nvidia-cudnn-frontend=={WRITTEN_FOR}.* to adopt them, or leave the "
            f"frontend's ops on their own handles (do not call adopt_frontend_ops()) until torch_cudnn_handle "
            f"supports {installed}."
        )


def adopt_frontend_ops() -> list[str]:
    """Route the frontend's torch ops' handle caches to the pool; returns the adopted seams.

    Afterwards those ops get ``current_handle(device)`` for their tensors' device (one
    handle per (device, thread), on torch's current stream, returned when the thread
    exits) and create no handle of their own. A second call is a no-op. Raises, adopting
    nothing, on another frontend release or a seam that changed. A seam whose module
    cannot be imported for want of an optional dependency (its ops cannot run either) is
    skipped with a warning. Imports the op modules, which registers their torch ops.
    """
    global _adoption
    with _lock:
        if _adoption is None:
            check_frontend_version()
            found = {}
            for seam in SEAMS:
                module = _import_seam_module(seam)
                if module is not None:
                    found[seam] = (module, _verified_original(seam, module))
            for seam, (module, _original) in found.items():
                setattr(module, seam.attribute, seam.replacement)
            _adoption = found
        return [seam.name for seam in _adoption]


def restore_frontend_ops() -> list[str]:
    """Undo ``adopt_frontend_ops()``: put the frontend's own functions back (its caches
    resume where they were); returns the restored seams, [] when nothing was adopted.
    Meant for tests comparing before and after; handles lent meanwhile stay pooled."""
    global _adoption
    with _lock:
        if _adoption is None:
            return []
        for seam, (module, _original) in _adoption.items():
            if getattr(module, seam.attribute, None) is not seam.replacement:
                raise RuntimeError(
                    f"torch_cudnn_handle.restore_frontend_ops(): {seam.name} was replaced again after adoption; "
                    "not restoring over the newer replacement. Undo that one first."
                )
        for seam, (module, original) in _adoption.items():
            setattr(module, seam.attribute, original)
        restored, _adoption = [seam.name for seam in _adoption], None
        return restored


def _refuse(seam: Seam, problem: str) -> RuntimeError:
    return RuntimeError(
        f"torch_cudnn_handle.adopt_frontend_ops(): {seam.name} is not the handle cache this adoption was written "
        f"for (nvidia-cudnn-frontend {WRITTEN_FOR}.x; installed {cudnn.__version__}): {problem}. Nothing was "
        "adopted, the frontend's ops keep their own handles. Update torch_cudnn_handle/frontend_ops.py for this "
        "frontend, or do not call adopt_frontend_ops()."
    )


def _import_seam_module(seam: Seam) -> types.ModuleType | None:
    """The seam's module; None (with a warning) when a non-frontend dependency is missing."""
    try:
        loaded = seam.module in sys.modules
        module = importlib.import_module(seam.module)
    except ImportError as error:
        missing = error.name or ""
        if missing == "cudnn" or missing.startswith("cudnn."):
            raise _refuse(seam, f"importing {seam.module} failed ({error})") from error
        warnings.warn(
            f"torch_cudnn_handle.adopt_frontend_ops(): {seam.name} not adopted: {seam.module} needs {missing!r}, "
            f"which cannot be imported here ({error}), so its ops cannot run here either",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    if not loaded:
        _restore_lazy_export(seam.module, module)
    return module


def _restore_lazy_export(name: str, module: types.ModuleType) -> None:
    """Importing ``cudnn.gemm.ops.swiglu_mlp`` writes the module over the package's lazy
    export of the same name (its function); the package's ``__getattr__`` puts the
    function back once the attribute is gone, as it does when it imports the module itself."""
    parent_name, _, child = name.rpartition(".")
    parent = sys.modules.get(parent_name)
    if parent is not None and child in getattr(parent, "_LAZY_EXPORTS", {}) and parent.__dict__.get(child) is module:
        delattr(parent, child)
        getattr(parent, child)


def _verified_original(seam: Seam, module: types.ModuleType) -> Callable:
    """The frontend's function at ``seam``, after checking it is the one this was written for."""
    original = getattr(module, seam.attribute, None)
    if original is None:
        raise _refuse(seam, f"{seam.module} has no {seam.attribute}")
    if not inspect.isfunction(original) or original.__module__ != seam.defined_in:
        raise _refuse(seam, f"expected a function defined in {seam.defined_in}, found {original!r}")
    found = plain_signature(original)
    if found != seam.signature:
        raise _refuse(seam, f"expected {seam.attribute}{seam.signature}, found {seam.attribute}{found}")
    if not _calls_create_handle(original.__code__):
        raise _refuse(seam, "it no longer calls cudnn.create_handle, so it is not where the op makes its handles")
    # The seam must remain the module's only handle factory, or adopting it alone would
    # leave the ops making handles elsewhere.
    expected = {seam.attribute} if seam.defined_in == seam.module else set()
    others = sorted(handle_factories(module) - expected)
    if others:
        raise _refuse(seam, f"{seam.module} also makes handles in {', '.join(others)}")
    return original


def plain_signature(function: Callable) -> str:
    """``(device, stream=None)``: a function's parameters without annotations."""
    signature = inspect.signature(function)
    parameters = [parameter.replace(annotation=inspect.Parameter.empty) for parameter in signature.parameters.values()]
    return str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty))


def handle_factories(module: types.ModuleType) -> set[str]:
    """Names of the functions and methods defined in ``module`` that call ``create_handle``."""
    found = set()
    for name, value in vars(module).items():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(value):
            members = [(name, value)]
        elif inspect.isclass(value):
            members = [(f"{name}.{member}", getattr(raw, "fget", None) or getattr(raw, "__func__", raw)) for member, raw in vars(value).items()]
        else:
            continue
        for qualified, function in members:
            function = inspect.unwrap(function) if callable(function) else function
            if inspect.isfunction(function) and _calls_create_handle(function.__code__):
                found.add(qualified)
    return found


def _calls_create_handle(code: types.CodeType) -> bool:
    # Attribute and global names a function reads are in co_names; nested functions and
    # lambdas are code objects among its constants.
    return "create_handle" in code.co_names or any(isinstance(const, types.CodeType) and _calls_create_handle(const) for const in code.co_consts)
