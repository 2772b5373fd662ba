"""The main job, ``python -m torch_cudnn_handle``, run as a user runs it (a subprocess).

Without a GPU it reports, then traces the demo block: its output fits one screen, says
which graph ids the trace calls and that there was no graph break, and prints the FX
graph only with --verbose. --help is plain text, and the package has a PEP 440 version.
"""

import re
import subprocess
import sys

import cudnn
import pytest
import torch
from packaging.version import Version

import torch_cudnn_handle
from support.paths import REPO
from torch_cudnn_handle._version import __version__
from torch_cudnn_handle.demo import LABEL_WIDTH

ONE_SCREEN = 40


def run_main(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch_cudnn_handle", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def _has_gpu_path() -> bool:
    return torch.cuda.is_available() and torch_cudnn_handle.with_cuda


cpu_only = pytest.mark.skipif(_has_gpu_path(), reason="the no-GPU demo (a GPU machine trains instead)")


@pytest.fixture(scope="module")
def default_run():
    return run_main()


@pytest.fixture(scope="module")
def default_lines(default_run):
    assert default_run.returncode == 0, default_run.stdout + default_run.stderr
    return (default_run.stdout + default_run.stderr).splitlines()


def test_default_output_fits_one_screen(default_lines):
    assert len(default_lines) <= ONE_SCREEN, "\n".join(default_lines)


def test_values_share_one_column(default_lines):
    value_column = 2 + LABEL_WIDTH
    for line in default_lines:
        if line.startswith("  "):
            assert line[value_column - 1] == " " and line[value_column] != " ", f"misaligned: {line!r}"


@cpu_only
def test_default_summarizes_the_trace_without_the_graph(default_lines):
    text = "\n".join(default_lines)
    assert "no graph break" in text
    graph_rows = [line for line in default_lines if re.match(r"\s+graph \d+\s+\S+ x\d+$", line)]
    assert graph_rows, text
    assert "torch.ops.cudnn_fe.execute.default(" not in text


@cpu_only
def test_verbose_prints_the_fx_graph():
    result = run_main("--verbose")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torch.ops.cudnn_fe.execute.default(" in result.stdout
    assert "no graph break" in result.stdout


def test_help_is_plain_text():
    result = run_main("--help")
    assert result.returncode == 0, result.stderr
    assert "--verbose" in result.stdout and "--report-only" in result.stdout
    assert "``" not in result.stdout and "**" not in result.stdout
    assert not re.search(r":\w+:`", result.stdout), result.stdout  # RST roles such as :func:`x`


def _libcudnn_loads() -> bool:
    try:
        cudnn.backend_version_string()
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(_libcudnn_loads(), reason="libcudnn loads here: the report prints its version")
def test_report_names_why_libcudnn_is_not_loaded(default_lines):
    (line,) = [line for line in default_lines if line.strip().startswith("cuDNN backend (libcudnn)")]
    reason = line.split(")", 1)[1].strip()
    assert reason.startswith("not loaded: "), line
    assert not re.fullmatch(r"not loaded: \(?\w+\)?", reason), f"only an exception class: {line}"
    assert "libcudnn" in reason.removeprefix("not loaded: "), line


def test_version_is_pep_440():
    assert str(Version(__version__)) == __version__  # valid and in its normalized form
    assert run_main("--version").stdout.split() == ["torch_cudnn_handle", __version__]


def test_package_exports_the_version():
    if not hasattr(torch_cudnn_handle, "__version__"):
        pytest.skip("torch_cudnn_handle/__init__.py does not import __version__ from _version.py yet")
    assert torch_cudnn_handle.__version__ == __version__
