"""A plain ``pip install .`` (or ``-e .``) stops before compiling with one line that
names ``pip install --no-build-isolation`` and why: pip's isolated build env has no torch
(pyproject.toml deliberately lists none: one would download a multi-GB CUDA torch), and
setup.py's first step is importing the torch the extension compiles against.

Run for real, against a copy of the project in a tmp dir: pip itself (its isolated build
env gets setuptools from the configured index; skipped when it cannot), and setup.py run
by a fresh venv's interpreter, which has no torch, like that env (needs no index)."""

import os
import shutil
import subprocess
import sys

import pytest
from support.paths import REPO

ROOT = REPO
PROJECT = ("setup.py", "pyproject.toml", "README.md", "LICENSE", "tools", "torch_cudnn_handle", "csrc")
MESSAGE_START = "torch_cudnn_handle: setup.py cannot import torch."
FIX = ("`pip install --no-build-isolation .`", "`pip install --no-build-isolation -e .`", "multi-GB CUDA torch")


def copy_project(destination: str) -> str:
    ignore = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info")
    os.makedirs(destination)
    for name in PROJECT:
        source = os.path.join(ROOT, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(destination, name), ignore=ignore)
        else:
            shutil.copy2(source, destination)
    return destination


def plain_environment() -> dict:
    """This environment as a user's shell has it: no PYTHONPATH (which pip's isolated
    build env would see), no PIP_NO_BUILD_ISOLATION (which would turn the isolation off)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_NO_BUILD_ISOLATION")}


def assert_names_the_fix(output: str) -> None:
    lines = [line.strip() for line in output.splitlines() if MESSAGE_START in line]
    assert len(lines) == 1, output
    assert lines[0].startswith(MESSAGE_START), lines[0]
    for words in FIX:
        assert words in lines[0], (words, lines[0])
    assert "Traceback" not in output and "ModuleNotFoundError" not in output, output


@pytest.mark.parametrize("editable", [False, True], ids=["install", "install -e"])
def test_pip_install_without_no_build_isolation_names_the_fix(tmp_path, editable):
    project = copy_project(str(tmp_path / "project"))
    target = tmp_path / "target"  # never the running environment, whatever happens
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), *(["-e"] if editable else []), "."]
    result = subprocess.run(command, cwd=project, env=plain_environment(), capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    if "Installing build dependencies: finished with status 'done'" not in output:
        pytest.skip(f"pip could not put setuptools into its isolated build env (no index?):\n{output[-2000:]}")
    assert result.returncode != 0, output
    assert_names_the_fix(output)
    assert "C++ sources" not in output, output  # setup.py's build_ext line: nothing was compiled
    assert not (target / "torch_cudnn_handle").exists()


def test_setup_py_without_torch_exits_with_one_line(tmp_path):
    project = copy_project(str(tmp_path / "project"))
    environment = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(environment)], check=True, timeout=120)
    python = str(environment / "bin" / "python")
    assert subprocess.run([python, "-c", "import torch"], env=plain_environment(), capture_output=True).returncode != 0
    result = subprocess.run([python, "setup.py", "--version"], cwd=project, env=plain_environment(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert_names_the_fix(result.stderr)
