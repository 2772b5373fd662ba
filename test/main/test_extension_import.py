"""The package says clearly when its C++ extension is missing or was built for another
torch, instead of Python's "partially initialized module ... circular import"."""

import os
import pathlib
import shutil
import subprocess
import sys

import torch

import torch_cudnn_handle
from torch_cudnn_handle import _C
from torch_cudnn_handle._extension import torch_mismatch


def test_a_package_without_its_extension_says_to_build_it(tmp_path):
    source = pathlib.Path(torch_cudnn_handle.__file__).parent
    for path in source.rglob("*.py"):  # the Python files only: no _C
        target = tmp_path / "torch_cudnn_handle" / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    # An editable install's finder would hand the copy the checkout's _C: leave it out.
    code = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in str(f)]; import torch_cudnn_handle"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])))
    assert result.returncode != 0
    assert "ImportError: torch_cudnn_handle's C++ extension (_C) is not built" in result.stderr, result.stderr
    assert "pip install --no-build-isolation --no-deps -e ." in result.stderr
    assert "circular import" not in result.stderr


def test_the_extension_records_the_torch_it_was_built_against():
    assert _C.torch_version == torch.__version__.split("+")[0]
    assert torch_mismatch(_C.torch_version, _C.with_cuda, torch.__version__, torch.version.cuda) is None


def test_another_torch_is_named():
    assert torch_mismatch("2.11.0", True, "2.13.0+cu130", "13.0") == "it was built against torch 2.11.0, but this is torch 2.13.0+cu130"
    assert torch_mismatch("2.13.0", False, "2.13.0+cu130", "13.0") == (
        "it was built without CUDA (a CPU torch), but this torch 2.13.0+cu130 has CUDA 13.0")
    assert torch_mismatch("2.13.0", True, "2.13.0+cpu", None) == "it was built with CUDA, but this torch 2.13.0+cpu has no CUDA"
    assert "did not record its torch" in torch_mismatch(None, False, "2.13.0+cpu", None)
    assert torch_mismatch("2.13.0", True, "2.13.0", "12.8") is None
