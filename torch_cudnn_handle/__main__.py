"""``python -m torch_cudnn_handle``: a diagnostic report, then the demo.

The report: torch, CUDA, the cuDNN backend and frontend versions (or why libcudnn is not
loaded); each GPU with the frontend's device facts; a line or two per subsystem in words
(handles, graphs, plan store, plan tuning, native CUDA graphs); whether the op is
registered and traceable. ``--json`` prints all of it (every stats dict as it is, the
settings, the environment) as one JSON document instead. A reader that closes stdout
early (``| head``) ends it quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import importlib.util
import json
import os
import platform
import sys
import sysconfig

import cudnn
import torch

import torch_cudnn_handle as tch

from ._version import __version__
from .demo import row
from .summary import current_settings, current_stats, summary_rows

DESCRIPTION = (
    "Print a diagnostic report (versions, GPUs, the cuDNN handle pool, the cudnn_fe op), then run "
    "the demo. On a CUDA GPU a TransformerBlock whose matmuls, norms and attention are cuDNN graphs "
    "trains a few steps beside the same block in plain torch, and both are timed, eager and compiled. "
    "Without one the block is traced by torch.compile on fake CUDA tensors and the graph ids it calls "
    "are summarized."
)
EPILOG = (
    "Exit status: 0 when the demo's checks pass (losses agree, or the trace has no graph break), 1 otherwise; "
    "2 when a TORCH_CUDNN_HANDLE_* variable holds a value its setting does not take (one line each says which, and "
    "what it takes); 0 also when the reader closes stdout early (e.g. | head), which ends the run there."
)


def facts() -> dict:
    """Everything the report says, as data: versions, GPUs, the op, the library's settings
    and every stats dict, and the environment that decides them."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cuda = None
    if tch.with_cuda and torch.cuda.is_available():
        cuda = dict(driver=_cuda_version("driver"), runtime=_cuda_version("runtime"), pool_libcudnn=tch._C.cudnn_library_path())
    devices = []
    for ordinal in range(count):
        info = cudnn.Handle(None, ordinal).device  # the frontend's DeviceInfo for the ordinal
        devices.append(dict(ordinal=ordinal, name=info.device_name, sm_version=info.sm_version, sm_count=info.sm_count,
                            l2_cache_bytes=info.l2_cache_bytes, shared_memory_per_block_optin=info.shared_memory_per_block_optin))
    backend_version, backend_reason = _libcudnn()
    op = torch.ops.cudnn_fe.execute.default
    return {
        "torch_cudnn_handle": dict(version=__version__, package=os.path.dirname(os.path.abspath(tch.__file__)),
                                   extension=tch._C.__file__, extension_with_cuda=tch.with_cuda),
        "python": dict(version=platform.python_version(), implementation=platform.python_implementation(), executable=sys.executable),
        "torch": dict(version=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(), device_count=count),
        "cudnn_frontend": dict(version=cudnn.__version__, package="nvidia-cudnn-frontend"),
        "cudnn_backend": dict(loaded=backend_version is not None, version=backend_version, not_loaded_because=backend_reason),
        "cuda": cuda,
        "devices": devices,
        # Before the stats: the check registers a graph, which the registry's count includes.
        "op": dict(name="torch.ops.cudnn_fe.execute", schema=str(op._schema),
                   tags=sorted(str(t).replace("Tag.", "") for t in op.tags), traceable=_traceable()),
        "settings": current_settings(),
        "stats": current_stats(),
        "environment": dict(
            platform=platform.platform(), machine=platform.machine(), cpus=os.cpu_count(),
            variables={name: value for name, value in sorted(os.environ.items())
                       if name.startswith(("TORCH_CUDNN_HANDLE_", "CUDNN_", "CUDA_", "NVIDIA_")) or name in ("LD_LIBRARY_PATH", "PYTORCH_CUDA_ALLOC_CONF")},
        ),
    }


def report(found: dict) -> None:
    """The report of ``facts()``, a label and a value per line."""
    print(f"torch_cudnn_handle {__version__} diagnostic report")
    row("python", found["python"]["version"])
    row("torch", f"{torch.__version__} (built with CUDA {torch.version.cuda})")
    row("extension built with CUDA", tch.with_cuda)
    row("cuDNN frontend", f"{cudnn.__version__} (nvidia-cudnn-frontend)")
    backend = found["cudnn_backend"]
    row("cuDNN backend (libcudnn)", backend["version"] if backend["loaded"] else f"not loaded: {backend['not_loaded_because']}")
    if found["cuda"] is not None:
        row("CUDA driver / runtime", f"{found['cuda']['driver']} / {found['cuda']['runtime']}")
        row("pool's libcudnn", found["cuda"]["pool_libcudnn"])
    row("CUDA devices", found["torch"]["device_count"])
    for info in found["devices"]:
        row(
            f"  cuda:{info['ordinal']}",
            f"{info['name']}, sm_{info['sm_version']}, {info['sm_count']} SMs, {info['l2_cache_bytes'] >> 20} MiB L2, "
            f"{info['shared_memory_per_block_optin'] >> 10} KiB smem/block",
        )
    for line in summary_rows(found["stats"], found["settings"]):
        row(*line)
    row("torch.ops.cudnn_fe.execute", found["op"]["schema"])
    row("  tags", ", ".join(found["op"]["tags"]))
    row("  traceable (fake, no GPU)", found["op"]["traceable"])


def _cuda_version(which: str) -> str:
    """The CUDA driver's or runtime's version as "13.0", through cuda-python (cuda.bindings)."""
    try:
        if which == "driver":
            from cuda.bindings import driver

            _, version = driver.cuDriverGetVersion()
        else:
            from cuda.bindings import runtime

            _, version = runtime.cudaRuntimeGetVersion()
        return f"{int(version) // 1000}.{int(version) % 1000 // 10}"
    except Exception as error:  # noqa: BLE001 -- a report line, never a failure
        return f"unknown ({type(error).__name__}: {error})"


def _libcudnn() -> tuple:
    """(the cuDNN backend's version, None), or (None, one line saying why libcudnn is not loaded)."""
    try:
        return cudnn.backend_version_string(), None
    except Exception as error:  # noqa: BLE001 -- no libcudnn on this machine is a finding, not a crash
        return None, _why_libcudnn_not_loaded(error)


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
    parser.add_argument("--json", action="store_true", help="print the report as one JSON document (every stats dict, "
                        "the settings, versions and environment) for machines; the demo, unless --report-only, then runs "
                        "with its output on stderr, and its exit status and the stats after it are in the document")
    parser.add_argument("--version", action="version", version=f"torch_cudnn_handle {__version__}")
    args = parser.parse_args(argv)
    problems = tch.settings.check_all()  # every setting now, before anything depends on one
    if problems:
        for problem in problems:
            print(f"python -m torch_cudnn_handle: {problem}", file=sys.stderr)
        return 2
    if args.json:
        return _json_main(args)
    report(facts())
    if args.report_only:
        return 0
    from . import demo

    return demo.main(verbose=args.verbose)


def _json_main(args) -> int:
    document = facts()
    status = 0
    if args.report_only:
        document["demo"] = None
    else:
        from . import demo

        with contextlib.redirect_stdout(sys.stderr):  # stdout holds the JSON document alone
            status = demo.main(verbose=args.verbose)
        document["demo"] = dict(exit_status=status, checks_passed=status == 0, stats_after=current_stats())
    json.dump(document, sys.stdout, indent=1, default=str)
    print()
    return status


def run(argv=None) -> int:
    """``main``, ended quietly when the reader closes stdout early (``| head``): the
    Python docs' recipe (signal module, "Note on SIGPIPE"), stdout pointed at devnull so
    the interpreter's last flush cannot fail again; exit status 0, nothing went wrong here."""
    try:
        try:
            status = main(argv)
        except SystemExit:  # --help, --version, a usage error: their text may meet the closed pipe too
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, inside the try
        return status
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(run())
