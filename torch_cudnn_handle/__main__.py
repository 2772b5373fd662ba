"""``python -m torch_cudnn_handle``: a diagnostic report, then the demo.

The report: torch, CUDA, the cuDNN backend and frontend versions (or why libcudnn is not
loaded); each GPU with the frontend's device facts; the pool's state; whether the op is
registered and traceable.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import os
import platform
import sys
import sysconfig

import cudnn
import torch

import torch_cudnn_handle as tch

from ._version import __version__
from .demo import format_stats, row

DESCRIPTION = (
    "Print a diagnostic report (versions, GPUs, the cuDNN handle pool, the cudnn_fe op), then run "
    "the demo. On a CUDA GPU a TransformerBlock whose matmuls, norms and attention are cuDNN graphs "
    "trains a few steps beside the same block in plain torch, and both are timed, eager and compiled. "
    "Without one the block is traced by torch.compile on fake CUDA tensors and the graph ids it calls "
    "are summarized."
)
EPILOG = "Exit status: 0 when the demo's checks pass (losses agree, or the trace has no graph break), 1 otherwise."


def report() -> None:
    print(f"torch_cudnn_handle {__version__} diagnostic report")
    row("python", platform.python_version())
    row("torch", f"{torch.__version__} (built with CUDA {torch.version.cuda})")
    row("extension built with CUDA", tch.with_cuda)
    row("cuDNN frontend", f"{cudnn.__version__} (nvidia-cudnn-frontend)")
    row("cuDNN backend (libcudnn)", libcudnn_status())
    if tch.with_cuda and torch.cuda.is_available():
        from cudnn import _env

        row("CUDA driver / runtime", f"{_env.driver_version()} / {_env.runtime_version()}")
        row("pool's libcudnn", tch._C.cudnn_library_path())
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    row("CUDA devices", count)
    for ordinal in range(count):
        info = cudnn.Handle(None, ordinal).device  # the frontend's DeviceInfo for the ordinal
        row(
            f"  cuda:{ordinal}",
            f"{info.device_name}, sm_{info.sm_version}, {info.sm_count} SMs, {info.l2_cache_bytes >> 20} MiB L2, "
            f"{info.shared_memory_per_block_optin >> 10} KiB smem/block",
        )
    row("handle pool", format_stats(tch.stats.pool()))
    row("graph registry", format_stats(tch.stats.graphs()))
    op = torch.ops.cudnn_fe.execute.default
    row("torch.ops.cudnn_fe.execute", op._schema)
    row("  tags", ", ".join(sorted(str(t).replace("Tag.", "") for t in op.tags)))
    row("  traceable (fake, no GPU)", _traceable())


def libcudnn_status() -> str:
    """The cuDNN backend's version, or one line saying why libcudnn is not loaded."""
    try:
        return cudnn.backend_version_string()
    except Exception as error:  # noqa: BLE001 -- no libcudnn on this machine is a finding, not a crash
        return f"not loaded: {_why_libcudnn_not_loaded(error)}"


def _frontend_search_hits() -> list[str]:
    """The libcudnn files the frontend would load on import, in its order (cudnn/__init__.py,
    _dlopen_cudnn): LD_LIBRARY_PATH, then nvidia/cudnn[_jit]/lib under sysconfig's purelib.
    Its last resort, dlopen("libcudnn.so.9") through the linker's path, is not listed."""
    hits = []
    for directory in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)):
        for name in ("libcudnn.so.9", "libcudnn.so"):
            if os.path.exists(os.path.join(directory, name)):
                hits.append(os.path.join(directory, name))
    for subdirectory in ("nvidia/cudnn/lib", "nvidia/cudnn_jit/lib"):
        hits += glob.glob(os.path.join(sysconfig.get_path("purelib"), subdirectory, "libcudnn.so.*[0-9]"))
    return hits


def _why_libcudnn_not_loaded(error: Exception) -> str:
    if _frontend_search_hits():
        # The frontend found and loaded a libcudnn (a failed load there fails `import cudnn`),
        # so the backend call itself failed: its own message is the reason.
        return f"{type(error).__name__}: {error}"
    wheel_library_dirs = _cudnn_wheel_library_dirs()
    if wheel_library_dirs:
        # An nvidia-cudnn wheel outside purelib (a --user or --target install) is invisible to the frontend.
        return f"libcudnn is in {wheel_library_dirs[0]}, where the frontend does not look; add it to LD_LIBRARY_PATH"
    # The frontend's last resort failed silently (it swallows the OSError and runs without a
    # backend, so its calls fail with "Unable to find symbol ..."). Repeat it to get dlopen's reason.
    try:
        ctypes.CDLL("libcudnn.so.9")
    except OSError as load_error:
        wheel = f"nvidia-cudnn-cu{torch.version.cuda.split('.')[0]}" if torch.version.cuda else "nvidia-cudnn-cu12/cu13"
        return f"{load_error}; install {wheel} (a CUDA torch brings it)"
    return f"{type(error).__name__}: {error}"


def _cudnn_wheel_library_dirs() -> list[str]:
    """The lib/ folders holding libcudnn of the nvidia-cudnn wheels importlib finds on sys.path."""
    spec = importlib.util.find_spec("nvidia.cudnn") if importlib.util.find_spec("nvidia") else None
    package_dirs = (spec.submodule_search_locations or []) if spec else []
    return [os.path.join(d, "lib") for d in package_dirs if glob.glob(os.path.join(d, "lib", "libcudnn.so.*[0-9]"))]


def _traceable() -> str:
    from torch._subclasses.fake_tensor import FakeTensorMode

    graph = tch.register_graph(lambda g, a, b: g.matmul(a, b), name="diagnostic_matmul")
    with FakeTensorMode():
        a = torch.empty(1, 16, 32, dtype=torch.float16, device="cuda")
        b = torch.empty(1, 32, 8, dtype=torch.float16, device="cuda")
        (c,) = torch.ops.cudnn_fe.execute(graph, [a, b])
    return f"yes: matmul [1,16,32]x[1,32,8] -> {list(c.shape)} stride {list(c.stride())} {c.dtype}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_cudnn_handle", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--report-only", action="store_true", help="print the report and skip the demo")
    parser.add_argument("--verbose", action="store_true", help="without a GPU, also print the traced FX graph")
    parser.add_argument("--version", action="version", version=f"torch_cudnn_handle {__version__}")
    args = parser.parse_args(argv)
    report()
    if args.report_only:
        return 0
    from . import demo

    return demo.main(verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
