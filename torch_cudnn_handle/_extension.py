"""The C++ extension, ``_C``: this module loads it, once, and owns it; every module takes it from here.

``_C`` is compiled against one torch (its headers and libraries): missing, or loaded
into another torch, it fails deep inside Python's import machinery ("cannot import name
'_C' from partially initialized module ... circular import", "undefined symbol: ...") or,
worse, loads and misbehaves. Here each of those is an ImportError that names the cause
and the fix.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch  # before _C, which links against libtorch
import cudnn  # noqa: F401  -- loads libcudnn, which the pool takes its handles from

REBUILD = (
    "build it for this environment: in the repository, pip install --no-build-isolation --no-deps -e . "
    "(or without -e), with the torch you run"
)


def torch_mismatch(built_version: Optional[str], built_with_cuda: bool, running_version: str, running_cuda: Optional[str]) -> Optional[str]:
    """Why an extension compiled against torch ``built_version`` (its headers' "2.13.0";
    None: a build that did not record it), with or without CUDA, cannot run with torch
    ``running_version`` (``torch.__version__``) whose CUDA is ``running_cuda``; None if it can."""
    running_base = running_version.split("+")[0]
    if built_version is None:
        return f"it was built by an older torch_cudnn_handle that did not record its torch; this is torch {running_version}"
    if built_version != running_base:
        return f"it was built against torch {built_version}, but this is torch {running_version}"
    if built_with_cuda != (running_cuda is not None):
        built = "with CUDA" if built_with_cuda else "without CUDA (a CPU torch)"
        running = f"has CUDA {running_cuda}" if running_cuda else "has no CUDA"
        return f"it was built {built}, but this torch {running_version} {running}"
    return None


def load_extension():
    """The ``_C`` module, checked against the running torch."""
    package = __name__.rpartition(".")[0]
    try:
        extension = importlib.import_module(f"{package}._C")
    except ModuleNotFoundError as error:
        if error.name != f"{package}._C":
            raise
        raise ImportError(f"torch_cudnn_handle's C++ extension (_C) is not built next to {__file__}: {REBUILD}") from None
    except ImportError as error:  # found, but the dynamic loader refused it (e.g. an undefined torch symbol)
        raise ImportError(
            f"torch_cudnn_handle's C++ extension (_C) does not load with torch {torch.__version__}, most likely because "
            f"it was built against another torch ({error}); {REBUILD}"
        ) from error
    why = torch_mismatch(getattr(extension, "torch_version", None), extension.with_cuda, torch.__version__, torch.version.cuda)
    if why is not None:
        raise ImportError(f"torch_cudnn_handle's C++ extension ({extension.__file__}) does not match this torch: {why}; {REBUILD}")
    return extension


_C = load_extension()  # a clear ImportError when _C is missing or was built for another torch
