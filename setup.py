"""Builds torch_cudnn_handle._C against the installed torch.

CUDA code paths are compiled only when that torch build has CUDA (torch.version.cuda),
never gated on torch.cuda.is_available(): a GPU-less build node with a CUDA torch must
still build them. Install with `pip install --no-build-isolation -e .` so the build
uses the torch already installed instead of pulling another one into an isolated env.
"""

import glob
import os
import runpy
import sys

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # PEP 517 backends do not put the project on the path
from tools.extension_build import cudnn_include_dirs, shared_libstdcxx  # noqa: E402
WITH_CUDA = torch.version.cuda is not None
VERSION = runpy.run_path(os.path.join(HERE, "torch_cudnn_handle", "_version.py"))["__version__"]

# Files that need the CUDA toolkit and a CUDA torch; the rest builds everywhere.
CUDA_ONLY = {
    "csrc/backend/cudnn_library.cpp",
    "csrc/backend/descriptors.cpp",
    "csrc/context/context_guard.cpp",
    "csrc/pool/cudnn_handle_pool.cpp",
    "csrc/pool/bindings.cpp",
    "csrc/op/cuda_kernels.cpp",
    "csrc/native/native_plan.cpp",
    "csrc/native/native_scratch.cpp",
    "csrc/native/graph_keepalive.cpp",
    "csrc/native/bindings.cpp",
}


class PersistentBuildExtension(BuildExtension):
    """Objects kept in build/ between installs, so that an editable re-install recompiles
    only what changed (pip otherwise builds in a fresh temporary folder every time)."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = os.path.join(HERE, "build", "temp")


sources = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "**", "*.cpp"), recursive=True))
if not WITH_CUDA:
    sources = [s for s in sources if s not in CUDA_ONLY]

extension_kwargs = dict(
    name="torch_cudnn_handle._C",
    sources=sources,
    include_dirs=[os.path.join(HERE, "csrc")] + (cudnn_include_dirs() if WITH_CUDA else []),
    extra_compile_args={"cxx": ["-O3"]},
    extra_link_args=shared_libstdcxx(),
    define_macros=[("TORCH_CUDNN_HANDLE_WITH_CUDA", None)] if WITH_CUDA else [],
    libraries=["dl"],
    py_limited_api=False,
)
extension = CUDAExtension(**extension_kwargs) if WITH_CUDA else CppExtension(**extension_kwargs)

with open(os.path.join(HERE, "README.md"), encoding="utf-8") as readme:
    LONG_DESCRIPTION = readme.read()

setup(
    name="torch_cudnn_handle",
    version=VERSION,
    description="The PyTorch side of the cuDNN frontend: a device- and thread-aware cuDNN handle pool "
    "and a torch.compile-visible op for cuDNN frontend graphs",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    keywords=["pytorch", "torch.compile", "cudnn", "cudnn-frontend", "cuda", "gpu"],
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Environment :: GPU :: NVIDIA CUDA",
        "Environment :: GPU :: NVIDIA CUDA :: 12",
        "Environment :: GPU :: NVIDIA CUDA :: 13",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: C++",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: Implementation :: CPython",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Software Development :: Libraries :: Python Modules",
    ],
    packages=find_packages(include=["torch_cudnn_handle", "torch_cudnn_handle.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.11", "nvidia-cudnn-frontend>=1.32,<1.33", "cuda-python"],
    extras_require={"test": ["pytest", "expecttest"]},
    ext_modules=[extension],
    cmdclass={"build_ext": PersistentBuildExtension.with_options(use_ninja=True)},
)
