"""How this repository compiles C++ against torch, for setup.py (the shipped _C) and for the
test- and bench-only extensions (test/support/csrc, bench/csrc) that never ship."""

import hashlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environment_tag() -> str:
    """What compiled objects depend on besides their sources: the Python, the torch, CUDA or
    not, and the environment itself (a hash of ``sys.prefix``: its include folder is on every
    compile line), e.g. "py311-torch2.13.0+cpu-cpu-1a2b3c4d". Each environment keeps its
    objects under a folder of this name in build/, so two never rebuild each other's."""
    import torch

    cuda = f"cuda{torch.version.cuda}" if torch.version.cuda else "cpu"
    prefix = hashlib.sha1(sys.prefix.encode()).hexdigest()[:8]
    return f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}-{cuda}-{prefix}"


def shared_libstdcxx() -> list:
    """The libstdc++.so.6 this process runs with (torch loaded it), named on the link line:
    some toolchains (the GPU host's /opt/gcc) link libstdc++ statically by default, and a
    second copy of its locale machinery inside an extension crashed integer formatting.
    test/main/test_build.py checks the shipped module."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libstdc++.so"):
                return [path]
    return []


def cudnn_include_dirs() -> list:
    """cudnn.h for a CUDA build: $CUDNN_INCLUDE_DIR, else the nvidia-cudnn wheel torch uses."""
    if os.environ.get("CUDNN_INCLUDE_DIR"):
        return [os.environ["CUDNN_INCLUDE_DIR"]]
    try:
        import nvidia.cudnn
    except ImportError:
        return []
    return [os.path.join(path, "include") for path in nvidia.cudnn.__path__ if os.path.exists(os.path.join(path, "include", "cudnn.h"))]


def load_auxiliary(name: str, sources: list, *, kind: str, with_cuda: bool, extra_cflags=("-O2",)):
    """A test- or bench-only extension (``kind``: "test" or "bench"), compiled on first use
    with torch.utils.cpp_extension.load (needs ninja) against csrc/'s headers, cached under
    build/<kind>_extensions/<environment_tag()>/<name> and rebuilt only when its sources or flags
    change."""
    import torch
    from torch.utils.cpp_extension import load

    build_directory = os.path.join(ROOT, "build", f"{kind}_extensions", environment_tag(), name)
    os.makedirs(build_directory, exist_ok=True)
    return load(
        name=f"torch_cudnn_handle_{name}",
        sources=[os.path.join(ROOT, source) for source in sources],
        extra_include_paths=[os.path.join(ROOT, "csrc")] + (cudnn_include_dirs() if with_cuda else []),
        extra_cflags=list(extra_cflags),
        extra_ldflags=shared_libstdcxx(),
        build_directory=build_directory,
        with_cuda=with_cuda,
        verbose=False,
    )


def load_cuda_bench(name: str, sources: list):
    """A bench-only extension that needs CUDA (bench/csrc), optimized; a clear error on a CPU torch."""
    import torch

    if torch.version.cuda is None:
        raise RuntimeError(f"the {name} benchmark needs a CUDA build of torch (this is {torch.__version__})")
    return load_auxiliary(name, sources, kind="bench", with_cuda=True, extra_cflags=("-O3",))
