"""``python -m torch_cudnn_handle``: a diagnostic report, then the demo.

The report: torch, CUDA, the cuDNN backend and frontend versions; each GPU with the
frontend's device facts; the pool's state; whether the op is registered and traceable.
"""

from __future__ import annotations

import argparse
import platform
import sys

import cudnn
import torch

import torch_cudnn_handle as tch


def _line(label: str, value) -> None:
    print(f"  {label:<34} {value}")


def report() -> None:
    print("torch_cudnn_handle diagnostic report")
    _line("python", platform.python_version())
    _line("torch", f"{torch.__version__} (built with CUDA {torch.version.cuda})")
    _line("extension built with CUDA", tch.with_cuda)
    _line("cuDNN frontend (nvidia-cudnn-frontend)", cudnn.__version__)
    try:
        _line("cuDNN backend (libcudnn)", cudnn.backend_version_string())
    except Exception as error:  # noqa: BLE001 -- no libcudnn on this machine is a finding, not a crash
        _line("cuDNN backend (libcudnn)", f"not loadable here ({type(error).__name__})")
    if tch.with_cuda and torch.cuda.is_available():
        from cudnn import _env

        _line("CUDA driver / runtime", f"{_env.driver_version()} / {_env.runtime_version()}")
        _line("pool's libcudnn", tch._C.cudnn_library_path())
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _line("CUDA devices", count)
    for ordinal in range(count):
        info = cudnn.Handle(None, ordinal).device  # the frontend's DeviceInfo for the ordinal
        print(
            f"    cuda:{ordinal}: {info.device_name}, sm_{info.sm_version}, {info.sm_count} SMs, "
            f"{info.l2_cache_bytes >> 20} MiB L2, {info.shared_memory_per_block_optin >> 10} KiB smem/block"
        )
    _line("handle pool", tch.pool_stats())
    _line("graph registry", tch.registry_stats())
    op = torch.ops.cudnn_fe.execute.default
    _line("torch.ops.cudnn_fe.execute", op._schema)
    _line("  tags", ", ".join(sorted(str(t).replace("Tag.", "") for t in op.tags)))
    _line("  traceable (fake kernel, no GPU)", _traceable())


def _traceable() -> str:
    from torch._subclasses.fake_tensor import FakeTensorMode

    graph = tch.register_graph(lambda g, a, b: g.matmul(a, b), name="diagnostic_matmul")
    with FakeTensorMode():
        a = torch.empty(1, 16, 32, dtype=torch.float16, device="cuda")
        b = torch.empty(1, 32, 8, dtype=torch.float16, device="cuda")
        (c,) = torch.ops.cudnn_fe.execute(graph, [a, b])
    return f"yes: matmul [1,16,32]x[1,32,8] -> {list(c.shape)} stride {list(c.stride())} {c.dtype}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_cudnn_handle", description=__doc__)
    parser.add_argument("--report-only", action="store_true", help="print the report and skip the demo")
    args = parser.parse_args(argv)
    report()
    if args.report_only:
        return 0
    from . import demo

    return demo.main()


if __name__ == "__main__":
    sys.exit(main())
