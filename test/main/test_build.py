"""The extension links libstdc++ dynamically, to the copy torch runs with.

A toolchain that links libstdc++ statically into the extension (the GPU host's
/opt/gcc did) gives it a second copy of libstdc++'s locale machinery, and there
integer formatting through ostream (c10::str, torch's own error messages) crashed.
setup.py links the shared library; this checks the built file."""

import shutil
import subprocess

import pytest

from torch_cudnn_handle import _C

needs_binutils = pytest.mark.skipif(not (shutil.which("readelf") and shutil.which("nm")), reason="needs binutils (readelf, nm)")


@needs_binutils
def test_libstdcxx_is_a_shared_dependency():
    dynamic = subprocess.run(["readelf", "-d", _C.__file__], capture_output=True, text=True, check=True).stdout
    needed = [line.split("[")[-1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert "libstdc++.so.6" in needed, f"{_C.__file__} does not link libstdc++ dynamically; NEEDED: {needed}"


@needs_binutils
def test_the_extension_defines_no_libstdcxx_locale_of_its_own():
    symbols = subprocess.run(["nm", "-D", "--defined-only", _C.__file__], capture_output=True, text=True, check=True).stdout
    own_locale = [line for line in symbols.splitlines() if "_ZNSt6locale" in line or "_ZNKSt6locale" in line]
    assert not own_locale, f"{_C.__file__} carries libstdc++'s locale (statically linked): {own_locale[:5]}"
