"""Builds torch_cudnn_handle._C against the installed torch.

CUDA code paths are compiled only when that torch build has CUDA (torch.version.cuda),
never gated on torch.cuda.is_available(): a GPU-less build node with a CUDA torch must
still build them. Install with `pip install --no-build-isolation -e .` so the build
uses the torch already installed instead of pulling another one into an isolated env.
"""

import glob
import os

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
WITH_CUDA = torch.version.cuda is not None

# Files that need the CUDA toolkit and a CUDA torch; the rest builds everywhere.
CUDA_ONLY = {
    "csrc/backend/cudnn_library.cpp",
    "csrc/context/context_guard.cpp",
    "csrc/pool/cudnn_handle_pool.cpp",
    "csrc/op/execute_kernel.cpp",
    "csrc/op/native_plan.cpp",
    "csrc/op/native_breakdown.cpp",
}


def cudnn_include_dirs():
    """cudnn.h for the CUDA build: $CUDNN_INCLUDE_DIR, else the nvidia-cudnn wheel torch uses."""
    if os.environ.get("CUDNN_INCLUDE_DIR"):
        return [os.environ["CUDNN_INCLUDE_DIR"]]
    try:
        import nvidia.cudnn

        return [os.path.join(path, "include") for path in nvidia.cudnn.__path__ if os.path.exists(os.path.join(path, "include", "cudnn.h"))]
    except ImportError:
        return []

sources = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "**", "*.cpp"), recursive=True))
if not WITH_CUDA:
    sources = [s for s in sources if s not in CUDA_ONLY]

extension_kwargs = dict(
    name="torch_cudnn_handle._C",
    sources=sources,
    include_dirs=[os.path.join(HERE, "csrc")] + (cudnn_include_dirs() if WITH_CUDA else []),
    extra_compile_args={"cxx": ["-O3"]},
    define_macros=[("TORCH_CUDNN_HANDLE_WITH_CUDA", None)] if WITH_CUDA else [],
    libraries=["dl"],
    py_limited_api=False,
)
extension = CUDAExtension(**extension_kwargs) if WITH_CUDA else CppExtension(**extension_kwargs)

setup(
    name="torch_cudnn_handle",
    version="0.1.0",
    description="The PyTorch side of the cuDNN frontend: a device- and thread-aware cuDNN handle pool "
    "and a torch.compile-visible op for cuDNN frontend graphs",
    packages=find_packages(include=["torch_cudnn_handle", "torch_cudnn_handle.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.11", "nvidia-cudnn-frontend>=1.32,<1.33", "cuda-python"],
    extras_require={"test": ["pytest", "expecttest"]},
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
