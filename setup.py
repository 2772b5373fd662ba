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

try:
    import torch
except ModuleNotFoundError as error:
    if error.name != "torch":
        raise
    # pip's default isolated build env has setuptools and nothing else (pyproject.toml deliberately
    # lists no torch); stop here, before compiling, with the fix instead of a bare traceback.
    sys.exit(
        "torch_cudnn_handle: setup.py cannot import torch. The extension is compiled against the torch you run, so "
        "build it without pip's build isolation: `pip install --no-build-isolation .` (or `pip install "
        "--no-build-isolation -e .`), with torch installed; pip's isolated build env has no torch, and giving it "
        "one would download a multi-GB CUDA torch."
    )
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # PEP 517 backends do not put the project on the path
from tools.extension_build import cudnn_include_dirs, environment_tag, shared_libstdcxx  # noqa: E402
WITH_CUDA = torch.version.cuda is not None
# Release by default: optimized and without debug info (Python's own CFLAGS carry -g, which
# made a 30 MB module); TORCH_CUDNN_HANDLE_DEBUG=1 builds unoptimized with debug info.
DEBUG = os.environ.get("TORCH_CUDNN_HANDLE_DEBUG") == "1"
CXX_FLAGS = ["-O0", "-g"] if DEBUG else ["-O3", "-g0"]
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
    "csrc/native/native_plan_table.cpp",
    "csrc/native/native_plan_graphs.cpp",
    "csrc/native/native_scratch.cpp",
    "csrc/native/plan_graphs.cpp",
    "csrc/native/graph_keepalive.cpp",
    "csrc/native/bindings.cpp",
}


def default_jobs() -> int:
    """Parallel compiles for ninja when $MAX_JOBS is unset: the CPUs this process may use,
    at most one per 2 GiB of memory (one compile against torch's headers takes about 1 GiB)."""
    cpus = len(os.sched_getaffinity(0))
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(cpus, int(memory_gib // 2)))


class PersistentBuildExtension(BuildExtension):
    """Objects kept in build/temp.<environment>/ between installs, so that a re-install
    recompiles only what changed (pip otherwise builds in a fresh temporary folder every
    time) and two environments (another Python, torch, or CUDA) keep their own."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = os.path.join(HERE, "build", f"temp.{environment_tag()}{'-debug' if DEBUG else ''}")

    def build_extensions(self):
        os.environ.setdefault("MAX_JOBS", str(default_jobs()))  # torch's ninja build reads it
        # pip shows this and ninja's "[n/N] c++ ..." lines when run with -v.
        print(f"torch_cudnn_handle: {len(sources)} C++ sources, up to {os.environ['MAX_JOBS']} compiles at a time "
              f"({'debug' if DEBUG else 'release'}); objects in {os.path.relpath(self.build_temp, HERE)}, ninja recompiles what changed", flush=True)
        super().build_extensions()


sources = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "**", "*.cpp"), recursive=True))
if not WITH_CUDA:
    sources = [s for s in sources if s not in CUDA_ONLY]

extension_kwargs = dict(
    name="torch_cudnn_handle._C",
    sources=sources,
    include_dirs=[os.path.join(HERE, "csrc")] + (cudnn_include_dirs() if WITH_CUDA else []),
    extra_compile_args={"cxx": CXX_FLAGS},
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
