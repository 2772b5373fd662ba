"""The main job, ``python -m torch_cudnn_handle``, run as a user runs it (a subprocess).

Without a GPU it reports, then traces the demo block: its output fits one screen, says
which graph ids the trace calls and that there was no graph break, and prints the FX
graph only with --verbose. --help is plain text, and the package has a PEP 440 version.
The stats are lines in words (no dict dumps); --json prints everything as one JSON
document; a reader that closes stdout early (| head) ends it quietly, status 0.
"""

import json
import os
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
from torch_cudnn_handle.summary import current_settings, current_stats, summary_rows

ONE_SCREEN = 40


def run_main(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch_cudnn_handle", *args], cwd=REPO, capture_output=True, text=True, timeout=600, env=env
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


SUBSYSTEM_LABELS = ("handles", "graphs", "plan store", "plan tuning", "native CUDA graphs")
STATS_KEYS = ("hand_overs", "phase_seconds", "set_stream_calls", "native_pending", "python_path", "write_errors", "routes")


def _assert_in_words(lines) -> None:
    for line in lines:
        assert not re.search(r"[{}]|\b[a-z_]+=[\w.{]", line), f"a raw dict or key=value dump: {line!r}"
        assert not any(key in line for key in STATS_KEYS), f"an internal counter's name: {line!r}"


def test_the_report_says_each_subsystem_in_words(default_lines):
    demo_starts = next((i for i, line in enumerate(default_lines) if line.startswith("demo:")), len(default_lines))
    report = default_lines[:demo_starts]  # the demo's lines name a module's arguments (mlp_ratio=4)
    labels = [line[2:2 + LABEL_WIDTH].strip() for line in report if line.startswith("  ")]
    for label in SUBSYSTEM_LABELS:
        assert label in labels, (label, labels)
    _assert_in_words(report)


def test_summary_rows_of_a_busy_process_say_where_graphs_came_from_and_how_they_run():
    """The rows of a process that built and ran graphs (stats as a GPU run leaves them; on
    this machine nothing can build): counts per plan source and per path, in words."""
    stats = current_stats()
    stats["graphs"].update(definitions=23, cached=9, native=8, python_path=1, native_pending=1, hits=120, misses=9, builds=7,
                           plan_sources={"static": 6, "plan_store": 2, "kernel_cache": 1}, plan_seconds=1.5,
                           phase_seconds={"build_plans": 1.0}, evictions=3)
    stats["plan_store"].update(hits=2, writes=7)
    stats["tuning"].update(tuned=3, cache_hits=1, tune_seconds=4.5)
    settings = current_settings()
    settings["plan_store"] = True
    rows = dict(summary_rows(stats, settings, active_only=True))
    assert rows["graphs"] == ("23 registered; 9 obtained in 1.50 s: 6 built, 2 loaded from the plan store, "
                              "1 built from a kernel cache (dynamic shapes)")
    assert rows["  in the cache"] == ("9 of at most 1024: 8 run natively (C++), 1 on the Python path "
                                      "(1 of them go native at their next call); 3 evicted")
    assert rows["plan store"].endswith(": 2 plans loaded, 7 written")
    assert rows["plan tuning"].startswith("off: heuristics pick each plan") and rows["plan tuning"].endswith("; 3 graphs timed, "
                                                                                                          "1 choices from the tuning cache")
    _assert_in_words(f"  {label:<{LABEL_WIDTH}}{value}" for label, value in rows.items())


def test_json_prints_everything_as_one_document():
    result = run_main("--json")
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)  # stdout holds the document alone; the demo's lines went to stderr
    assert document["torch_cudnn_handle"]["version"] == __version__
    assert document["torch"]["version"] == torch.__version__ and document["torch"]["cuda"] == torch.version.cuda
    assert document["cudnn_frontend"]["version"] == cudnn.__version__
    assert set(document["cudnn_backend"]) == {"loaded", "version", "not_loaded_because"}
    assert len(document["devices"]) == document["torch"]["device_count"]
    assert document["op"]["schema"].startswith("cudnn_fe::execute(")
    assert document["op"]["traceable"].startswith("yes")
    assert set(document["settings"]) == {setting.name for setting in torch_cudnn_handle.settings.SETTINGS}
    assert set(document["environment"]) >= {"platform", "machine", "cpus", "variables"}
    stats = current_stats()  # every stats dict, with every key the library's own functions give
    assert set(document["stats"]) == set(stats)
    for name, value in stats.items():
        assert set(document["stats"][name]) == set(value), name
    assert document["demo"]["exit_status"] == 0 and document["demo"]["checks_passed"] is True
    assert document["demo"]["stats_after"]["graphs"]["definitions"] > document["stats"]["graphs"]["definitions"]
    assert "demo:" in result.stderr


def test_json_report_only_skips_the_demo():
    result = run_main("--json", "--report-only")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["demo"] is None
    assert "demo:" not in result.stdout + result.stderr


def _assert_quiet(stderr: str) -> None:
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr, stderr


def test_piped_to_head_it_ends_quietly_with_status_0():
    """What a user runs: `python -m torch_cudnn_handle | head`, here with pipefail so the
    status is python's own."""
    command = f"set -o pipefail; {sys.executable} -m torch_cudnn_handle | head -n 3"
    result = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"torch_cudnn_handle {__version__} diagnostic report"
    assert len(result.stdout.splitlines()) == 3
    _assert_quiet(result.stderr)


@pytest.mark.parametrize("args", [("--report-only",), ("--json", "--report-only"), ("--help",)], ids=["report", "json", "help"])
def test_stdout_closed_before_the_first_write_ends_quietly(args):
    """The reader is gone before anything is written, so the first write meets the closed
    pipe, whatever the buffering (without the demo, which a GPU would spend minutes on)."""
    process = subprocess.Popen([sys.executable, "-m", "torch_cudnn_handle", *args], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=600) == 0, stderr
    _assert_quiet(stderr)


@pytest.mark.parametrize("variable, value", [("TORCH_CUDNN_HANDLE_PLAN_STORE", "maybe"), ("TORCH_CUDNN_HANDLE_GRAPH_CACHE_CAPACITY", "-5")])
def test_a_bad_setting_is_one_line_naming_it_and_its_fix_and_exit_status_2(variable, value):
    result = run_main("--report-only", env={**os.environ, variable: value})
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"python -m torch_cudnn_handle: {variable}={value!r} is not a valid value; it takes ") and "unset it" in line
